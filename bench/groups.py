"""Consumer groups: QADD and QGET+QACK with 1, 4 and 16 groups, on one node
and on a 3-node cluster, next to ADDJOB and GETJOB+ACKJOB of the same run,
and against Redis Streams (XADD, XREADGROUP+XACK) on a redis-server started
here; then the memory an event and a group's progress entry cost.

The load generator runs WORKERS processes, one connection each, one request
at a time (a consumer cycle is two round trips: read, then acknowledge).
With G groups, worker k reads for group k mod G, so every group is read
concurrently; each group reads CYCLES / G events from the start of the
queue.  On the cluster, worker k talks to node k mod 3, so most QGETs claim
their event from the node that added it.  The generator shares the
machine's two cores with the servers: compare ratios.
"""

from __future__ import annotations

import multiprocessing
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import hiredis
from common import BODY, ServerProcess, print_table, rss_bytes, start_node

from disque.testing.devcluster import join

WORKERS = 4
MISSES = 1000  # empty answers in a row that end a consumer
GROUP_COUNTS = (1, 4, 16)
HOST = "127.0.0.1"


def _resp(*args: Any) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class _Conn:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=60)
        self.reader = hiredis.Reader()

    def call(self, *args: Any) -> Any:
        self.sock.sendall(_resp(*args))
        while (reply := self.reader.gets()) is False:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise RuntimeError("connection closed")
            self.reader.feed(chunk)
        if isinstance(reply, hiredis.ReplyError):
            raise RuntimeError(f"{args[0]!r}: {reply}")
        return reply

    def repeat(self, count: int, *args: Any) -> None:
        """One command `count` times, pipelined 1,000 at a time (replies read and dropped)."""
        for start in range(0, count, 1000):
            n = min(1000, count - start)
            self.sock.sendall(_resp(*args) * n)
            for _ in range(n):
                while self.reader.gets() is False:
                    self.reader.feed(self.sock.recv(1 << 16))


def _drive(task: tuple[list[int], str, int, int, str]) -> int:
    """One worker: `count` operations of `kind` (consumer cycles that found
    something; empty answers are retried, up to MISSES in a row)."""
    ports, kind, worker, count, group = task
    conn = _Conn(ports[worker % len(ports)])
    got = done = misses = 0
    while done < count and misses < MISSES:
        done += 1
        if kind == "qadd":
            conn.call("QADD", "orders", 3600, BODY)
        elif kind == "addjob":
            conn.call("ADDJOB", "jobs", BODY, 5000, "TTL", 3600)
        elif kind == "xadd":
            conn.call("XADD", "orders", "*", "b", BODY)
        elif kind == "qget":
            reply = conn.call("QGET", "orders", group, "EX", 30)
            if reply is not None:
                got += conn.call("QACK", "orders", group, reply[0])
        elif kind == "getjob":
            reply = conn.call("GETJOB", "NOHANG", "FROM", "jobs")
            if reply is not None:
                got += conn.call("ACKJOB", reply[0][1])
        else:  # xread
            reply = conn.call("XREADGROUP", "GROUP", group, f"c{worker}", "COUNT", 1, "STREAMS", "orders", ">")
            if reply:
                got += conn.call("XACK", "orders", group, reply[0][1][0][0])
        if kind in ("qget", "getjob", "xread"):
            if reply:
                misses = 0
            else:  # another consumer of the group took the event asked for: not a cycle
                done -= 1
                misses += 1
    return got


def _rate(ports: list[int], kind: str, total: int, groups: int = 1, prefix: str = "") -> float:
    """Operations (or cycles) per second of WORKERS workers sharing `total`."""
    tasks = [(ports, kind, k, total // WORKERS, f"{prefix}g{k % groups}") for k in range(WORKERS)]
    with multiprocessing.Pool(WORKERS) as pool:
        started = time.perf_counter()
        got = pool.map(_drive, tasks)
        elapsed = time.perf_counter() - started
    if kind in ("qget", "getjob", "xread") and sum(got) < total // WORKERS * WORKERS:
        raise RuntimeError(f"{kind}: only {sum(got)} of {total} cycles found something")
    return total // WORKERS * WORKERS / elapsed


def _measure(ports: list[int], cycles: int, streams: int | None) -> dict[str, float]:
    """Every figure of one setup: `ports` are our nodes; `streams` a redis-server port."""
    out = {"QADD": _rate(ports, "qadd", cycles), "ADDJOB": _rate(ports, "addjob", cycles)}
    out["GETJOB+ACKJOB"] = _rate(ports, "getjob", cycles)
    for g in GROUP_COUNTS:
        out[f"QGET+QACK {g}"] = _rate(ports, "qget", cycles, g, prefix=f"n{g}")
    if streams is not None:
        out["XADD"] = _rate([streams], "xadd", cycles)
        for g in GROUP_COUNTS:
            for k in range(g):
                _Conn(streams).call("XGROUP", "CREATE", "orders", f"n{g}g{k}", "0")
            out[f"XREADGROUP+XACK {g}"] = _rate([streams], "xread", cycles, g, prefix=f"n{g}")
    return out


def _memory(workdir: Path, events: int) -> dict[str, float]:
    """RSS per event held, and per group progress entry (one group reading every event)."""
    node = start_node(workdir)
    try:
        conn = _Conn(node.port)
        conn.call("QADD", "warm", 60, BODY)
        before = rss_bytes(node.pid)
        conn.repeat(events, "QADD", "orders", 3600, BODY)
        added = rss_bytes(node.pid)
        conn.repeat(events, "QGET", "orders", "g", "EX", 0)
        read = rss_bytes(node.pid)
    finally:
        node.stop()
    return {"bytes_per_event": (added - before) / events, "bytes_per_group_entry": (read - added) / events}


def run(quick: bool) -> dict[str, Any]:
    cycles = 4_000 if quick else 16_000
    figures: dict[str, Any] = {"cycles": cycles, "workers": WORKERS}
    with tempfile.TemporaryDirectory(prefix="disque-bench-groups-") as tmp:
        base = Path(tmp)
        redis = ServerProcess(base / "redis").start()
        single = start_node(base / "single")
        try:
            figures["single"] = _measure([single.port], cycles, redis.port)
        finally:
            single.stop()
            redis.stop()
        nodes = [start_node(base / f"n{i}") for i in range(3)]
        try:
            join(nodes)
            figures["cluster"] = _measure([n.port for n in nodes], cycles, None)
        finally:
            for node in nodes:
                node.stop()
        figures["memory"] = _memory(base / "memory", 20_000 if quick else 100_000)
    single, cluster = figures["single"], figures["cluster"]
    rows = [["QADD", single["QADD"], single["QADD"] / single["ADDJOB"], single["QADD"] / single["XADD"],
             cluster["QADD"], cluster["QADD"] / cluster["ADDJOB"]]]  # fmt: skip
    for g in GROUP_COUNTS:
        name = f"QGET+QACK {g}"
        rows.append([f"QGET+QACK, {g} group{'s' * (g > 1)}", single[name], single[name] / single["GETJOB+ACKJOB"],
                     single[name] / single[f"XREADGROUP+XACK {g}"], cluster[name], cluster[name] / cluster["GETJOB+ACKJOB"]])  # fmt: skip
    print_table(
        f"Consumer groups, {WORKERS} connections, 100-byte events, {cycles:,} operations or cycles per figure",
        ["operation", "1 node ops/s", "to ADDJOB / GETJOB+ACKJOB", "to Redis Streams", "3 nodes ops/s", "to ADDJOB / GETJOB+ACKJOB"],
        rows,
    )
    print_table(
        "References of the same run (ops or cycles per second)",
        ["figure", "1 node", "3 nodes"],
        [[k, single[k], cluster.get(k, "")] for k in ("ADDJOB", "GETJOB+ACKJOB", "XADD", *(f"XREADGROUP+XACK {g}" for g in GROUP_COUNTS))],
    )
    memory = figures["memory"]
    print(f"\nMemory (RSS): {memory['bytes_per_event']:,.0f} bytes per 100-byte event held, "
          f"{memory['bytes_per_group_entry']:,.0f} bytes per group progress entry")  # fmt: skip
    return figures


if __name__ == "__main__":
    run(quick=True)
