"""Python client for Disque: a synchronous `Client` and an `AsyncClient` on
anyio, so it runs under asyncio and trio alike.

Theory of operation
-------------------
Every decision is written once, as generators that yield four I/O
operations (`_Open` an address, `_Send` bytes, `_Receive` bytes, `_Close` a
connection) and get their results back; the two client classes differ only in
the small driver that carries those operations out (blocking sockets, or anyio
streams) and in how a worker runs a handler next to its WORKING heartbeats.
`disque.worker` builds the deployable worker on `AsyncClient`.  Under the generators
sit plain objects with no I/O: `encode_command` builds RESP requests, one
`hiredis.Reader` per connection decodes replies, `Hello` parses HELLO into
nodes sorted by priority, `NodePlanner` decides which node to try next, and
`Affinity` counts where consumed jobs were created.

The Disque client protocol:

* Connect to a random node among the configured ones, then ask HELLO for the
  whole cluster and a priority per node (lower is better).
* When the connection breaks, or the node answers -LEAVING, reconnect:
  HELLO's nodes by priority (random among equals), then the configured
  nodes, the failed one last.  The interrupted command is sent once more on
  the new node: a blocked GETJOB simply waits there, and an ADDJOB may be
  duplicated, which at-least-once queues already tolerate.
* Affinity (opt-in): a job ID carries the first 8 characters of the creating
  node's ID.  A consumer that receives most of its jobs from another node
  moves there, where they are queued without a federation hop.

Names (queues, IDs, nodes) are `str`; job bodies are `bytes`.  Text goes on
the wire as UTF-8 with surrogateescape, so any byte string round-trips.

Security: `password=` sends AUTH on every new connection; `tls=True` (with
`tls_ca_cert`, and `tls_cert`/`tls_key` for nodes that check client
certificates) or a ready `ssl_context=` wraps every connection in TLS, in
`_open`, checking the server's certificate and host name.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import hiredis

from disque.core.errors import DisqueError
from disque.store.ids import node_prefix

if TYPE_CHECKING:  # only annotations: disque.shell.tls makes the contexts, and importing ssl is slow
    import ssl

log = logging.getLogger("disque.client")

Address = tuple[str, int]
Arg = str | bytes | int | float
T = TypeVar("T")

DEFAULT_ADDRESS: Address = ("127.0.0.1", 7711)
FIRST_HEARTBEAT = 0.5  # RETRY is at least 1 s and jittered by 250 ms: beat before 0.75 s


class DisqueReplyError(DisqueError):
    """An error reply: `code` is its first word (ERR, NOREPL, PAUSED, ...)."""

    @classmethod
    def from_line(cls, line: str) -> DisqueReplyError:
        code, _, message = line.partition(" ")
        return cls(code, message)


class DisqueConnectionError(ConnectionError):
    """No node could be reached, or a connection broke; the text names the address."""


# --------------------------------------------------------------------------
# Wire format


def _to_bytes(arg: Arg) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode("utf-8", "surrogateescape")
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return str(arg).encode()
    raise TypeError(f"cannot send {type(arg).__name__} as a command argument")


def encode_command(args: Sequence[Arg]) -> bytes:
    parts = [_to_bytes(a) for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def _text(value: bytes | None) -> Any:
    return None if value is None else value.decode("utf-8", "surrogateescape")


def _pairs(reply: Sequence[Any]) -> dict[str, Any]:
    """A flat key/value array as a dict with Python names (`jobs-in` -> `jobs_in`)."""
    return {_text(reply[i]).replace("-", "_"): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def _build(cls: type[T], reply: Sequence[Any], texts: Iterable[str] = (), text_lists: Iterable[str] = ()) -> T:
    values = _pairs(reply)
    for name in texts:
        values[name] = _text(values[name])
    for name in text_lists:
        values[name] = [_text(v) for v in values[name]]
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in values.items() if k in known})


def parse_info(reply: bytes) -> dict[str, dict[str, str]]:
    """INFO text as {section title: {field: value}}."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in _text(reply).splitlines():
        if line.startswith("#"):
            current = sections.setdefault(line[1:].strip(), {})
        elif ":" in line:
            key, _, value = line.partition(":")
            current[key] = value
    return sections


# --------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True, slots=True)
class Job:
    """A job as GETJOB or QPEEK returns it; the counters are None when not asked for."""

    id: str
    queue: str
    body: bytes
    nacks: int | None = None
    additional_deliveries: int | None = None

    @property
    def deliveries(self) -> int | None:
        """Deliveries so far, this one included, as Disque counts them (None without counters)."""
        if self.nacks is None or self.additional_deliveries is None:
            return None
        return self.nacks + self.additional_deliveries + 1

    @classmethod
    def from_entry(cls, entry: Sequence[Any]) -> Job:
        queue, job_id, body, *counters = entry
        return cls(_text(job_id), _text(queue), body, **_pairs(counters))


@dataclass(frozen=True, slots=True)
class JobInfo:
    """SHOW: everything a node knows about a job (times in s, `*_within` in ms)."""

    id: str
    queue: str | None
    state: str
    repl: int
    ttl: int
    ctime: int
    delay: int
    retry: int
    nacks: int
    additional_deliveries: int
    nodes_delivered: list[str]
    nodes_confirmed: list[str]
    next_requeue_within: int | None
    next_awake_within: int | None
    body: bytes | None

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> JobInfo:
        return _build(cls, reply, ("id", "queue", "state"), ("nodes_delivered", "nodes_confirmed"))


@dataclass(frozen=True, slots=True)
class QueueStats:
    """QSTAT."""

    name: str
    len: int
    age: int
    idle: int
    blocked: int
    import_from: list[str]
    import_rate: int
    jobs_in: int
    jobs_out: int
    pause: str

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> QueueStats:
        return _build(cls, reply, ("name", "pause"), ("import_from",))


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    host: str  # empty while the node does not know its own address
    port: int
    priority: int  # 1 ok, 5 no link, 10 PFAIL, 100 FAIL or leaving

    @property
    def address(self) -> Address:
        return (self.host, self.port)


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    node_id: str
    nodes: list[NodeInfo]  # best priority first

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Hello:
        version, node_id, *entries = reply
        nodes = [NodeInfo(_text(i), _text(h), int(p), int(pr)) for i, h, p, pr in entries]
        return cls(version, _text(node_id), sorted(nodes, key=lambda n: n.priority))

    def by_prefix(self, prefix: str) -> NodeInfo | None:
        return next((n for n in self.nodes if n.id.startswith(prefix)), None)


def _jobs(reply: list[Any] | None) -> list[Job]:
    return [Job.from_entry(entry) for entry in reply or ()]


def _optional(build: Callable[[Any], T]) -> Callable[[Any], T | None]:
    return lambda reply: None if reply is None else build(reply)


def _same(reply: Any) -> Any:
    return reply


def _options(flags: Iterable[tuple[str, bool]] = (), **values: Arg | None) -> list[Arg]:
    """`NAME value` for every value given, then `FLAG` for every flag set."""
    out: list[Arg] = []
    for name, value in values.items():
        if value is not None:
            out += [name.upper(), value]
    return out + [flag for flag, on in flags if on]


def parse_addresses(nodes: str | Address | Iterable[str | Address]) -> list[Address]:
    """One node (`"host:port"` or a pair) or several."""
    if isinstance(nodes, str) or (isinstance(nodes, tuple) and len(nodes) == 2 and isinstance(nodes[1], int)):
        return [parse_address(nodes)]  # type: ignore[arg-type]
    return [parse_address(n) for n in nodes]  # type: ignore[union-attr]


def parse_address(spec: str | Address) -> Address:
    """`host:port`, `[v6]:port` or a (host, port) pair."""
    if isinstance(spec, tuple):
        return (spec[0], int(spec[1]))
    host, _, port = spec.rpartition(":")
    return (host.strip("[]") or DEFAULT_ADDRESS[0], int(port))


def format_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --------------------------------------------------------------------------
# Client-protocol decisions (no I/O)


class NodePlanner:
    """Which addresses to try, in order; owns the last HELLO and the randomness."""

    def __init__(self, seeds: list[Address], rng: random.Random) -> None:
        self.seeds = seeds
        self.rng = rng
        self.hello: Hello | None = None

    def learn(self, hello: Hello, address: Address) -> Hello:
        """Keep `hello`, filling in our node's address if it does not know it yet."""
        nodes = [replace(n, host=address[0]) if n.id == hello.node_id and not n.host else n for n in hello.nodes]
        self.hello = replace(hello, nodes=nodes)
        return self.hello

    def plan(self, failed: Address | None = None) -> list[Address]:
        learned = [n for n in (self.hello.nodes if self.hello else []) if n.host]
        self.rng.shuffle(learned)
        learned.sort(key=lambda n: n.priority)  # stable: random among equal priorities
        seeds = list(self.seeds)
        self.rng.shuffle(seeds)
        order = list(dict.fromkeys([n.address for n in learned] + seeds))
        if failed in order:
            order.remove(failed)
            order.append(failed)
        return order


class Affinity:
    """Counts the creating node of consumed jobs, by the node prefix in their IDs.

    After each window of `window` jobs, a node that created more than half of
    them, and is not the one we are connected to, is where to move.  Counts
    restart with every window, so the choice follows the producers."""

    def __init__(self, window: int = 100) -> None:
        self.window = window
        self.counts: Counter[str] = Counter()

    def observe(self, job_ids: Iterable[str], current_prefix: str) -> str | None:
        self.counts.update(node_prefix(i.encode()) for i in job_ids)
        seen = self.counts.total()
        if seen < self.window:
            return None
        prefix, count = self.counts.most_common(1)[0]
        self.counts.clear()
        return prefix if prefix != current_prefix and count * 2 > seen else None


def _next_heartbeat(retry: int) -> float | None:
    """Seconds until the next WORKING, given the RETRY it returned (0: at-most-once)."""
    return retry / 2 if retry > 0 else None


def _queue_list(queues: str | Iterable[str]) -> list[str]:
    return [queues] if isinstance(queues, str) else list(queues)


# --------------------------------------------------------------------------
# The shared client: generators yielding I/O operations


@dataclass(slots=True)
class _Link:
    address: Address
    transport: Any
    reader: Any
    node_id: str = ""


@dataclass(frozen=True, slots=True)
class _Open:
    address: Address


@dataclass(frozen=True, slots=True)
class _Send:
    link: _Link
    data: bytes


@dataclass(frozen=True, slots=True)
class _Receive:
    link: _Link


@dataclass(frozen=True, slots=True)
class _Close:
    transport: Any


Ops = Generator[Any, Any, T]
HELLO = encode_command(["HELLO"])


def _failure(address: Address, exc: BaseException) -> DisqueConnectionError:
    while isinstance(exc.__cause__, BaseException):  # anyio and trio wrap the socket error
        exc = exc.__cause__.exceptions[0] if isinstance(exc.__cause__, BaseExceptionGroup) else exc.__cause__
    errno = getattr(exc, "errno", None)
    reason = os.strerror(errno) if errno else str(exc) or type(exc).__name__
    return DisqueConnectionError(f"{format_address(address)}: {reason}")


class _Scan:
    """One JSCAN/QSCAN iteration: the cursor, and how to read a page."""

    def __init__(self, verb: str, options: list[Arg], item: Callable[[Any], Any]) -> None:
        self.verb, self.options, self.item = verb, options, item
        self.cursor = "0"
        self.done = False

    def request(self) -> list[Arg]:
        return [self.verb, self.cursor, *self.options]

    def page(self, reply: list[Any]) -> list[Any]:
        cursor, items = reply
        self.cursor = _text(cursor)
        self.done = self.cursor == "0"
        return [self.item(i) for i in items]


class _Base:
    """State and protocol logic shared by `Client` and `AsyncClient`.

    Public methods return `self._run(generator)` (`_drive` for `close`, which
    must not wait behind a blocked request): the value itself for `Client`,
    an awaitable for `AsyncClient`."""

    def __init__(
        self,
        nodes: str | Address | Iterable[str | Address] = (DEFAULT_ADDRESS,),
        *,
        password: str | None = None,
        tls: bool = False,
        tls_ca_cert: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        failover: bool = True,
        affinity: bool = False,
        affinity_window: int = 100,
        connect_timeout: float = 5.0,
        socket_timeout: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        seeds = parse_addresses(nodes)
        if not seeds:
            raise ValueError("no Disque node given")
        self.password = password
        if ssl_context is None and tls:
            from disque.shell.tls import client_context

            ssl_context = client_context(ca=tls_ca_cert, cert=tls_cert, key=tls_key)
        elif ssl_context is None and (tls_ca_cert or tls_cert or tls_key):
            raise ValueError("TLS files given without tls=True")
        self.ssl_context = ssl_context  # TLS on every connection when set (server certificate and name checked)
        self.failover = failover
        self.connect_timeout = connect_timeout
        self.socket_timeout = socket_timeout
        self._planner = NodePlanner(seeds, rng or random.Random())
        self._affinity = Affinity(affinity_window) if affinity else None
        self._link: _Link | None = None
        self._lock = self._new_lock()  # one request at a time on the connection

    # What the drivers provide.
    _new_lock: Callable[[], Any]

    def _run(self, ops: Ops[T]) -> Any:
        raise NotImplementedError

    def _drive(self, ops: Ops[T]) -> Any:
        raise NotImplementedError

    def _iterate(self, scan: _Scan) -> Any:
        raise NotImplementedError

    @property
    def address(self) -> Address | None:
        """The node this client is connected to, if any."""
        return self._link.address if self._link else None

    @property
    def node_id(self) -> str | None:
        """ID of the connected node (known once HELLO has been asked)."""
        return (self._link.node_id or None) if self._link else None

    @property
    def cluster(self) -> Hello | None:
        """The last HELLO seen."""
        return self._planner.hello

    def connect(self) -> Any:
        """Connect now rather than at the first command."""

        def ensure() -> Ops[None]:
            if self._link is None:
                yield from self._connect(self._planner.plan())

        return self._run(ensure())

    def close(self) -> Any:
        """Close the connection (awaited for `AsyncClient`); the next command connects again."""
        return self._drive(self._disconnect())

    def _disconnect(self) -> Ops[None]:
        link, self._link = self._link, None
        if link is not None:
            yield _Close(link.transport)

    # -- connection management

    def _roundtrip(self, link: _Link, payload: bytes) -> Ops[Any]:
        yield _Send(link, payload)
        return (yield from self._reply(link))

    def _reply(self, link: _Link) -> Ops[Any]:
        """The next reply on the link, read as far as it takes."""
        try:
            while (reply := link.reader.gets()) is False:
                data = yield _Receive(link)
                if not data:
                    raise DisqueConnectionError(f"{format_address(link.address)}: connection closed by the server")
                link.reader.feed(data)
        except hiredis.ProtocolError as e:
            raise DisqueConnectionError(f"{format_address(link.address)}: protocol error ({e})") from e
        if isinstance(reply, hiredis.ReplyError):
            raise DisqueReplyError.from_line(str(reply))
        return reply

    def _connect(self, candidates: list[Address]) -> Ops[None]:
        """Connect to the first candidate that answers AUTH and HELLO."""
        failures = []
        for address in candidates:
            try:
                link = _Link(address, (yield _Open(address)), hiredis.Reader())
            except DisqueConnectionError as e:
                failures.append(str(e))
                continue
            try:
                if self.password is not None:
                    yield from self._roundtrip(link, encode_command(["AUTH", self.password]))
                if self.failover or self._affinity:
                    hello = Hello.from_reply((yield from self._roundtrip(link, HELLO)))
                    link.node_id = self._planner.learn(hello, address).node_id
            except DisqueConnectionError as e:
                yield _Close(link.transport)
                failures.append(str(e))
                continue
            except BaseException:
                yield _Close(link.transport)
                raise
            self._link = link
            return
        if len(failures) == 1:
            raise DisqueConnectionError(f"Could not connect to Disque at {failures[0]}")
        raise DisqueConnectionError("Could not connect to any Disque node (" + "; ".join(failures) + ")")

    def _command(self, args: Sequence[Arg], convert: Callable[[Any], T] = _same) -> Ops[T]:
        """Send one command, failing over once to another node if needed."""
        payload = encode_command(args)
        failed: Address | None = None
        while True:
            if self._link is None:
                yield from self._connect(self._planner.plan(failed))
            link = self._link
            assert link is not None
            try:
                reply = yield from self._roundtrip(link, payload)
            except DisqueReplyError as e:
                if not (e.code == "LEAVING" and self.failover and failed is None):
                    raise
                yield from self._disconnect()
                failed = link.address
                continue
            except DisqueConnectionError:
                yield from self._disconnect()
                if not self.failover or failed is not None:
                    raise
                failed = link.address
                continue
            except BaseException:
                yield from self._disconnect()  # interrupted mid-request: replies would be out of step
                raise
            return convert(reply)

    def _consume(self, args: Sequence[Arg]) -> Ops[list[Job]]:
        """GETJOB, then move towards the producers if affinity says so."""
        jobs = yield from self._command(args, _jobs)
        if self._affinity is not None and jobs and self._link is not None:
            prefix = self._affinity.observe([j.id for j in jobs], self._link.node_id[:8])
            if prefix is not None:
                yield from self._move(prefix)
        return jobs

    def _move(self, prefix: str) -> Ops[None]:
        node = self._planner.hello.by_prefix(prefix) if self._planner.hello else None
        if node is None:  # a node that joined after our last HELLO
            hello = yield from self._command(["HELLO"], self._hello)
            node = hello.by_prefix(prefix)
        old = self._link
        if node is None or not node.host or old is None:
            return
        try:
            yield from self._connect([node.address])
        except DisqueConnectionError as e:
            log.info("staying on %s: %s", format_address(old.address), e)
            return
        yield _Close(old.transport)

    def _hello(self, reply: list[Any]) -> Hello:
        assert self._link is not None
        return self._planner.learn(Hello.from_reply(reply), self._link.address)

    # -- commands

    def execute_command(self, *args: Arg) -> Any:
        """Any command; the reply as hiredis decodes it (bytes, int, list, None)."""
        return self._run(self._command(args))

    def ping(self) -> Any:
        return self._run(self._command(["PING"], _text))

    def add_job(
        self,
        queue: str,
        body: str | bytes,
        *,
        timeout_ms: int = 0,
        replicate: int | None = None,
        delay: int | None = None,
        retry: int | None = None,
        ttl: int | None = None,
        maxlen: int | None = None,
        max_attempts: int | None = None,
        dead_letter: str | None = None,
        asynchronous: bool = False,
    ) -> Any:
        """ADDJOB; returns the job ID.  `timeout_ms` bounds synchronous
        replication; after `max_attempts` failed deliveries the job moves to
        the `dead_letter` queue (the server's default one if None)."""
        options = _options(
            [("ASYNC", asynchronous)],
            replicate=replicate, delay=delay, retry=retry, ttl=ttl, maxlen=maxlen,
            maxattempts=max_attempts, deadletter=dead_letter,
        )  # fmt: skip
        return self._run(self._command(["ADDJOB", queue, body, timeout_ms, *options], _text))

    def _getjob(self, queues: Sequence[str], count: int, timeout_ms: int | None, nohang: bool) -> Ops[list[Job]]:
        if not queues:
            raise ValueError("GETJOB needs at least one queue")
        options = _options([("NOHANG", nohang), ("WITHCOUNTERS", True)], timeout=timeout_ms, count=count)
        return self._consume(["GETJOB", *options, "FROM", *queues])

    def get_jobs(self, *queues: str, count: int = 1, timeout_ms: int | None = None, nohang: bool = False) -> Any:
        """Up to `count` jobs (waiting for at least one unless `nohang` or timed out)."""
        return self._run(self._getjob(queues, count, timeout_ms, nohang))

    def get_job(self, *queues: str, timeout_ms: int | None = None, nohang: bool = False) -> Any:
        """One job, or None on timeout / with `nohang` when nothing is queued."""

        def first() -> Ops[Job | None]:
            jobs = yield from self._getjob(queues, 1, timeout_ms, nohang)
            return jobs[0] if jobs else None

        return self._run(first())

    def _ids(self, verb: str, ids: Sequence[str]) -> Any:
        return self._run(self._command([verb, *ids]))

    def ack(self, *ids: str) -> Any:
        """ACKJOB; the number of jobs newly acknowledged."""
        return self._ids("ACKJOB", ids)

    def fast_ack(self, *ids: str) -> Any:
        return self._ids("FASTACK", ids)

    def nack(self, *ids: str, delay: int | None = None) -> Any:
        """NACK: queue again, counting a failed delivery; with `delay`, not
        handed out again before that many seconds."""
        return self._run(self._command(["NACK", *ids, *_options(delay=delay)]))

    def wait_job(self, *ids: str, timeout_ms: int | None = None) -> Any:
        """WAITJOB: block until every job is acknowledged, or `timeout_ms`
        passes; the number acknowledged."""
        return self._run(self._command(["WAITJOB", *ids, *_options(timeout=timeout_ms)]))

    def enqueue(self, *ids: str) -> Any:
        return self._ids("ENQUEUE", ids)

    def dequeue(self, *ids: str) -> Any:
        return self._ids("DEQUEUE", ids)

    def del_job(self, *ids: str) -> Any:
        return self._ids("DELJOB", ids)

    def working(self, job_id: str) -> Any:
        """WORKING: postpone the next delivery; returns the job's RETRY in seconds."""
        return self._run(self._command(["WORKING", job_id]))

    def show(self, job_id: str) -> Any:
        """SHOW as a `JobInfo`, or None for an unknown job."""
        return self._run(self._command(["SHOW", job_id], _optional(JobInfo.from_reply)))

    def qlen(self, queue: str) -> Any:
        return self._run(self._command(["QLEN", queue]))

    def qstat(self, queue: str) -> Any:
        """QSTAT as `QueueStats`, or None for a queue that does not exist."""
        return self._run(self._command(["QSTAT", queue], _optional(QueueStats.from_reply)))

    def qpeek(self, queue: str, count: int) -> Any:
        """The oldest `count` jobs (the newest first when negative), left queued."""
        return self._run(self._command(["QPEEK", queue, count], _jobs))

    def pause(self, queue: str, *options: str) -> Any:
        """PAUSE queue in|out|all|none|state|bcast...; returns the resulting state."""
        return self._run(self._command(["PAUSE", queue, *(options or ("state",))], _text))

    def hello(self) -> Any:
        return self._run(self._command(["HELLO"], self._hello))

    def info(self, section: str | None = None) -> Any:
        return self._run(self._command(["INFO", *([section] if section else [])], parse_info))

    def jscan(
        self,
        queue: str | None = None,
        states: Iterable[str] = (),
        *,
        count: int | None = None,
        busyloop: bool = False,
        details: bool = False,
    ) -> Any:
        """Every job ID (a `JobInfo` each with `details`), following the cursor
        to the end; an async iterator for `AsyncClient`."""
        options = _options([("BUSYLOOP", busyloop)], count=count, queue=queue)
        options += [a for state in states for a in ("STATE", state)]
        if details:
            return self._iterate(_Scan("JSCAN", [*options, "REPLY", "all"], JobInfo.from_reply))
        return self._iterate(_Scan("JSCAN", options, _text))

    def qscan(
        self,
        *,
        minlen: int | None = None,
        maxlen: int | None = None,
        import_rate: int | None = None,
        count: int | None = None,
        busyloop: bool = False,
    ) -> Any:
        """Every queue name, following the cursor to the end; an async iterator for `AsyncClient`."""
        options = _options([("BUSYLOOP", busyloop)], count=count, minlen=minlen, maxlen=maxlen, importrate=import_rate)
        return self._iterate(_Scan("QSCAN", options, _text))


class Client(_Base):
    """Blocking client; safe to share between threads (one request at a time).

    >>> with Client(["127.0.0.1:7711", "127.0.0.1:7712"]) as c:
    ...     c.add_job("q", b"hello")
    """

    _new_lock = staticmethod(threading.Lock)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, ops: Ops[T]) -> T:
        with self._lock:
            return self._drive(ops)

    def _drive(self, ops: Ops[T]) -> T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = ops.send(value) if error is None else ops.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                value = self._perform(op)
            except BaseException as e:
                error = e

    def _perform(self, op: _Open | _Send | _Receive | _Close) -> Any:
        if isinstance(op, _Close):
            return op.transport.close()
        address = op.address if isinstance(op, _Open) else op.link.address
        try:
            if isinstance(op, _Open):
                return self._open(address)
            if isinstance(op, _Send):
                return op.link.transport.sendall(op.data)
            return op.link.transport.recv(1 << 16)
        except OSError as e:
            raise _failure(address, e) from e

    def _open(self, address: Address) -> socket.socket:
        """The one place sockets are made, and wrapped in TLS when configured."""
        sock = socket.create_connection(address, timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=address[0])  # handshakes now
            except BaseException:
                sock.close()
                raise
        sock.settimeout(self.socket_timeout)
        return sock

    def _iterate(self, scan: _Scan) -> Iterator[Any]:
        while not scan.done:
            yield from self._run(self._command(scan.request(), scan.page))

    def monitor(self) -> Iterator[str]:
        """MONITOR.  Returns once the node has answered (every command it
        runs from then on is seen), an iterator of one line per command.  The
        connection stays a monitor: close the client to stop."""
        self._run(self._command(["MONITOR"]))
        return self._monitor_lines()

    def _monitor_lines(self) -> Iterator[str]:
        link = self._link
        assert link is not None  # MONITOR was just answered on it
        while True:
            yield _text(self._run(self._reply(link)))

    def worker(
        self,
        queues: str | Iterable[str],
        handler: Callable[[Job], object],
        *,
        max_jobs: int | None = None,
        first_heartbeat: float | None = FIRST_HEARTBEAT,
    ) -> int:
        """Consume forever (or `max_jobs` jobs): ACK when `handler(job)` returns,
        NACK when it raises.  While the handler runs, WORKING is sent after
        `first_heartbeat` seconds, then every RETRY/2 (None: never)."""
        names = _queue_list(queues)
        done = 0
        while max_jobs is None or done < max_jobs:
            for job in self.get_jobs(*names):
                stop = threading.Event()
                beats = threading.Thread(target=self._heartbeat, args=(job.id, stop, first_heartbeat), daemon=True)
                beats.start()
                try:
                    handler(job)
                    ok = True
                except Exception:
                    log.exception("handler failed on job %s", job.id)
                    ok = False
                finally:
                    stop.set()
                    beats.join()
                (self.ack if ok else self.nack)(job.id)
                done += 1
        return done

    def _heartbeat(self, job_id: str, stop: threading.Event, delay: float | None) -> None:
        while delay is not None and not stop.wait(delay):
            try:
                delay = _next_heartbeat(self.working(job_id))
            except (DisqueReplyError, DisqueConnectionError) as e:
                log.warning("WORKING %s: %s", job_id, e)
                return


class AsyncClient(_Base):
    """The same client for asyncio or trio (through anyio): every command
    method, and `close`, is awaited.  Safe to share between tasks of one
    event loop (one request at a time).

    >>> async with AsyncClient("127.0.0.1:7711") as c:
    ...     await c.add_job("q", b"hello")
    """

    @staticmethod
    def _new_lock() -> anyio.Lock:
        return anyio.Lock()  # not anyio.Lock itself: naming it loads half of anyio, slowing every import of this module

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, ops: Ops[T]) -> T:
        async with self._lock:
            return await self._drive(ops)

    async def _drive(self, ops: Ops[T]) -> T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = ops.send(value) if error is None else ops.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                value = await self._perform(op)
            except BaseException as e:
                error = e

    async def _perform(self, op: _Open | _Send | _Receive | _Close) -> Any:
        if isinstance(op, _Close):
            return await anyio.aclose_forcefully(op.transport)
        address = op.address if isinstance(op, _Open) else op.link.address
        try:
            if isinstance(op, _Open):
                return await self._open(address)
            if isinstance(op, _Send):
                return await op.link.transport.send(op.data)
            with anyio.fail_after(self.socket_timeout):
                return await op.link.transport.receive(1 << 16)
        except anyio.EndOfStream:
            return b""
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as e:  # TimeoutError is an OSError
            raise _failure(address, e) from e

    async def _open(self, address: Address) -> anyio.abc.ByteStream:
        """The one place streams are made, and wrapped in TLS when configured."""
        with anyio.fail_after(self.connect_timeout):
            # not standard_compatible: closing does not wait for the server's close_notify
            return await anyio.connect_tcp(*address, ssl_context=self.ssl_context, tls_standard_compatible=False)

    async def _iterate(self, scan: _Scan) -> AsyncIterator[Any]:
        while not scan.done:
            for item in await self._run(self._command(scan.request(), scan.page)):
                yield item

    async def monitor(self) -> AsyncIterator[str]:
        """MONITOR, as `Client.monitor`: an async iterator once answered."""
        await self._run(self._command(["MONITOR"]))
        return self._monitor_lines()

    async def _monitor_lines(self) -> AsyncIterator[str]:
        link = self._link
        assert link is not None  # MONITOR was just answered on it
        while True:
            yield _text(await self._run(self._reply(link)))

    async def worker(
        self,
        queues: str | Iterable[str],
        handler: Callable[[Job], Awaitable[object]],
        *,
        max_jobs: int | None = None,
        first_heartbeat: float | None = FIRST_HEARTBEAT,
    ) -> int:
        """`Client.worker` for an async handler."""
        names = _queue_list(queues)
        done = 0
        while max_jobs is None or done < max_jobs:
            for job in await self.get_jobs(*names):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self.heartbeat, job.id, first_heartbeat)
                    try:
                        await handler(job)
                        ok = True
                    except Exception:
                        log.exception("handler failed on job %s", job.id)
                        ok = False
                    tasks.cancel_scope.cancel()
                await (self.ack if ok else self.nack)(job.id)
                done += 1
        return done

    async def heartbeat(self, job_id: str, delay: float | None = FIRST_HEARTBEAT) -> None:
        """Send WORKING for `job_id` after `delay` seconds, then every RETRY/2,
        until cancelled (None: never).  Gives up, with a warning, once the
        node cannot be reached or no longer knows the job."""
        while delay is not None:
            await anyio.sleep(delay)
            try:
                with anyio.CancelScope(shield=True):  # never cut a request in half
                    delay = _next_heartbeat(await self.working(job_id))
            except (DisqueReplyError, DisqueConnectionError) as e:
                log.warning("WORKING %s: %s", job_id, e)
                return
