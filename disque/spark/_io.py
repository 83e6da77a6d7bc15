"""The connector's I/O: every socket it opens is opened here.

The connector needs pipelining (100k ADDJOBs, ENQUEUE/ACKJOB/SHOW of whole
batches) and control over which node a command goes to (ENQUEUE and ACKJOB
where the job lives, JSCAN on every node).  `disque.client` supplies the
wire encoding and the reply types (`encode_command`, `Hello`, `Job`,
`JobInfo`); this module adds a small pipelined connection on top of a
`hiredis.Reader`.  Everything here is created lazily inside Spark callbacks,
never pickled.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import hiredis

from disque.client import (
    DisqueConnectionError,
    DisqueReplyError,
    Hello,
    Job,
    JobInfo,
    encode_command,
    format_address,
    parse_address,
)
from disque.spark.logic import COMMAND_CHUNK, chunks

CONNECT_TIMEOUT = 5.0
SOCKET_TIMEOUT = 60.0
PIPELINE_BYTES = 1 << 20  # flush a pipeline before it grows past this


class Conn:
    """One connection to one node; `pipeline` sends many commands per round trip."""

    def __init__(self, address: str, password: str | None = None, socket_timeout: float = SOCKET_TIMEOUT) -> None:
        host, port = parse_address(address)
        self.address = format_address((host, port))
        try:
            self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        except OSError as e:
            raise DisqueConnectionError(f"{self.address}: {e.strerror or e}") from e
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(socket_timeout)
        self.reader = hiredis.Reader()
        if password is not None:
            self.call("AUTH", password)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _replies(self, n: int) -> list[Any]:
        out: list[Any] = []
        try:
            while len(out) < n:
                reply = self.reader.gets()
                if reply is False:
                    data = self.sock.recv(1 << 16)
                    if not data:
                        raise DisqueConnectionError(f"{self.address}: connection closed by the server")
                    self.reader.feed(data)
                    continue
                out.append(DisqueReplyError.from_line(str(reply)) if isinstance(reply, hiredis.ReplyError) else reply)
        except OSError as e:
            self.close()
            raise DisqueConnectionError(f"{self.address}: {e.strerror or e}") from e
        return out

    def pipeline(self, commands: Iterable[Sequence[Any]], raise_errors: bool = True) -> list[Any]:
        """Replies to `commands` in order; with `raise_errors`, the first error
        reply is raised once every reply was read (the connection stays usable)."""
        replies: list[Any] = []
        buffer: list[bytes] = []
        size = 0
        pending = 0

        def flush() -> None:
            nonlocal size, pending
            if not pending:
                return
            try:
                self.sock.sendall(b"".join(buffer))
            except OSError as e:
                self.close()
                raise DisqueConnectionError(f"{self.address}: {e.strerror or e}") from e
            replies.extend(self._replies(pending))
            buffer.clear()
            size = pending = 0

        for args in commands:
            data = encode_command(args)
            buffer.append(data)
            size += len(data)
            pending += 1
            if pending >= COMMAND_CHUNK or size >= PIPELINE_BYTES:
                flush()
        flush()
        if raise_errors:
            for reply in replies:
                if isinstance(reply, DisqueReplyError):
                    raise reply
        return replies

    def call(self, *args: Any) -> Any:
        return self.pipeline([args])[0]


def connect_any(addresses: Sequence[str], password: str | None = None, shuffle: bool = True,
                socket_timeout: float = SOCKET_TIMEOUT) -> Conn:  # fmt: skip
    """A connection to the first node that answers, in random order (spreads tasks over nodes)."""
    order = list(dict.fromkeys(addresses))
    if shuffle:
        random.shuffle(order)
    failures = []
    for address in order:
        try:
            return Conn(address, password, socket_timeout)
        except DisqueConnectionError as e:
            failures.append(str(e))
    raise DisqueConnectionError("could not connect to any Disque node (" + "; ".join(failures) + ")")


def hello(conn: Conn) -> Hello:
    return Hello.from_reply(conn.call("HELLO"))


def cluster_addresses(conn: Conn) -> list[str]:
    """Every node of the cluster as "host:port" (a node that does not know its
    own host is reached on the host we used)."""
    host = parse_address(conn.address)[0]
    return [format_address((n.host or host, n.port)) for n in hello(conn).nodes]


def discover(seeds: Sequence[str], password: str | None = None) -> list[str]:
    """The seeds plus every node HELLO knows of, seeds first."""
    with connect_any(seeds, password, shuffle=False) as conn:
        found = cluster_addresses(conn)
    normal = [format_address(parse_address(s)) for s in seeds]
    return list(dict.fromkeys(normal + found))


# --------------------------------------------------------------------------
# Commands


def add_jobs(conn: Conn, commands: Iterable[Sequence[Any]]) -> list[str]:
    return [r.decode() for r in conn.pipeline(commands)]


def get_jobs(conn: Conn, queues: Sequence[str], count: int, timeout_ms: int) -> list[Job]:
    """GETJOB ... WITHCOUNTERS; waits up to `timeout_ms` for the first job (0: NOHANG)."""
    wait = ["TIMEOUT", timeout_ms] if timeout_ms > 0 else ["NOHANG"]
    reply = conn.call("GETJOB", *wait, "COUNT", count, "WITHCOUNTERS", "FROM", *queues)
    return [Job.from_entry(entry) for entry in reply or ()]


def qlen(conn: Conn, queues: Sequence[str]) -> int:
    return sum(conn.pipeline([("QLEN", q) for q in queues]))


def show(conn: Conn, ids: Sequence[str]) -> list[JobInfo | None]:
    out: list[JobInfo | None] = []
    for part in chunks(ids, 100):  # bodies may be large: keep each round trip moderate
        out += [None if r is None else JobInfo.from_reply(r) for r in conn.pipeline([("SHOW", i) for i in part])]
    return out


def jscan(conn: Conn, queue: str | None, state: str = "queued", count: int = 1000) -> Iterator[JobInfo]:
    """Every job of `queue` (all queues: None) in `state` on this node, with its body."""
    cursor = b"0"
    where = ["QUEUE", queue] if queue is not None else []
    while True:
        cursor, items = conn.call("JSCAN", cursor, "COUNT", count, *where, "STATE", state, "REPLY", "all")
        for item in items:
            yield JobInfo.from_reply(item)
        if cursor == b"0":
            return


def _on_holders(jobs: Mapping[str, Sequence[str]], others: Sequence[str], password: str | None,
               verb: str, working: bool) -> int:  # fmt: skip
    """`verb` (ENQUEUE or ACKJOB) for each node's IDs on that node.

    When that node cannot be reached, each ID is tried on the other nodes
    one by one until one of them counts it (a replica holds it).  WORKING
    first, when asked, makes replicas postpone their requeue by RETRY.
    Returns how many IDs were counted."""
    counted = 0
    for address, ids in jobs.items():
        if not ids:
            continue
        try:
            with Conn(address, password) as conn:
                commands = [["WORKING", i] for i in ids] if working else []
                commands += [[verb, *part] for part in chunks(ids)]
                replies = conn.pipeline(commands, raise_errors=False)
        except DisqueConnectionError as e:
            counted += _fallback([a for a in others if a != address], ids, password, verb, working, str(e))
            continue
        for command, reply in zip(commands, replies):
            if isinstance(reply, DisqueReplyError):
                if command[0] != "WORKING":  # WORKING may be TOOLATE: the job is queued all the same
                    raise reply
            elif command[0] == verb:
                counted += reply
    return counted


def _fallback(others: Sequence[str], ids: Sequence[str], password: str | None, verb: str, working: bool,
              first_failure: str) -> int:  # fmt: skip
    remaining = list(ids)
    failures = [first_failure]
    counted = 0
    for address in others:
        if not remaining:
            break
        try:
            with Conn(address, password) as conn:
                commands = [c for i in remaining for c in ([["WORKING", i]] if working else []) + [[verb, i]]]
                replies = conn.pipeline(commands, raise_errors=False)
        except DisqueConnectionError as e:
            failures.append(str(e))
            continue
        done = {c[1] for c, r in zip(commands, replies) if c[0] == verb and r == 1}
        counted += len(done)
        remaining = [i for i in remaining if i not in done]
    if len(failures) > len(others):
        raise DisqueConnectionError("no Disque node reachable (" + "; ".join(failures) + ")")
    return counted


def enqueue_where_held(jobs: Mapping[str, Sequence[str]], others: Sequence[str], password: str | None,
                       working: bool) -> int:  # fmt: skip
    return _on_holders(jobs, others, password, "ENQUEUE", working)


def ack_where_held(jobs: Mapping[str, Sequence[str]], others: Sequence[str], password: str | None) -> int:
    return _on_holders(jobs, others, password, "ACKJOB", False)


def group_backlog(conn: Conn, queues: Sequence[str], group: str) -> int:
    """Events of `queues` that `group` could read now (QSTATUS available + redo)."""
    total = 0
    for _, groups in conn.call("QSTATUS", *queues, "GROUPS", group):
        figures = dict(zip(groups[1][::2], groups[1][1::2]))
        total += figures[b"available"] + figures[b"redo"]
    return total


def get_events(conn: Conn, queue: str, group: str, count: int, ack_timeout: int) -> list[tuple[str, bytes]]:
    """Up to `count` events of `queue` for `group` (QGET ... EX, pipelined),
    as (event ID, body); fewer when the group has no more."""
    replies = conn.pipeline([["QGET", queue, group, "EX", ack_timeout]] * count)
    return [(reply[0].decode(), reply[1]) for reply in replies if reply is not None]


def ack_events(events: Mapping[str, Sequence[tuple[str, str]]], others: Sequence[str], group: str,
               password: str | None) -> int:  # fmt: skip
    """QACK (queue, event ID) pairs for `group`, on the node that delivered
    them or, if it is down, on another (any holder answers).  Returns how
    many the server acknowledged (an event past its ack timeout is not: it
    is redo, and will be read again)."""
    counted = 0
    for address, pairs in events.items():
        failures = []
        for candidate in [address] + [a for a in others if a != address]:
            try:
                with Conn(candidate, password) as conn:
                    replies = conn.pipeline([["QACK", queue, group, event_id] for queue, event_id in pairs])
            except DisqueConnectionError as e:
                failures.append(str(e))
                continue
            counted += sum(replies)
            break
        else:
            raise DisqueConnectionError("no Disque node reachable (" + "; ".join(failures) + ")")
    return counted
