"""Keyed jobs against plain ones on one node, in process (docs/keys.md).

    python bench/keys.py [ROUNDS]
    python bench/keys.py instructions [ROUNDS]    # and per request, under callgrind

Both print the CPU and the core in use first (compiled or pure Python:
disque/compiled.py; DISQUE_PURE=1 for the pure one), then the rates.

A real `Server` whose `TcpClients` serves one end of a socketpair (as
bench/instructions.py), requests pipelined PIPELINE deep, 100-byte bodies:

* ADDJOB plain: `ADDJOB q <body> 0 REPLICATE 1 RETRY 0`;
* ADDJOB KEY: the same with `KEY k<n % KEYS>` (KEYS keys taking turns);
* ADDJOB KEY DEDUP: `KEY u<n> DEDUP 60000` (a new key each time: every
  request claims a hold at its home, this node);
* GETJOB: `GETJOB NOHANG FROM q` taking the plain jobs, then the keyed ones.

Each figure is the best of ROUNDS runs of N requests (requests per second
of the whole path: parse, core, reply); the keyed ones also as a ratio to
their plain counterpart.  Against a build without KEY (an older tree on
PYTHONPATH) the keyed rows read n/a, so the plain rows compare the two.

Requests per second move with the machine's load; `instructions` counts
what one request costs instead, which does not: `valgrind --tool=callgrind`
on this file running LOW and HIGH requests of a kind (`one KIND N`: GETJOB
from PREFILL jobs added first), the difference of the totals over HIGH -
LOW, with the hash seed fixed (the layout of the dicts moves a count by a
few thousand from one run to the next).  The start-up cancels out, and so
does making the requests' bytes: both runs make HIGH (a keyed request has
more arguments to make, the client's work).  The process ends without
freeing what the requests left (jobs, lanes, holds): a node does that when
each ends (the ACK, a hold's end), not in the request.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from common import cpu_model
from disque import compiled
from disque.core.config import Config
from disque.shell.server import Server

BODY = b"x" * 100
N = 20_000
PIPELINE = 16
KEYS = 100
LOW, HIGH, PREFILL = 1600, 4800, 8000


def resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def plain(n: int, queue: bytes) -> bytes:
    return resp(b"ADDJOB", queue, BODY, b"0", b"REPLICATE", b"1", b"RETRY", b"0")


def keyed(n: int, queue: bytes) -> bytes:
    return resp(b"ADDJOB", queue, BODY, b"0", b"REPLICATE", b"1", b"RETRY", b"0", b"KEY", b"k%d" % (n % KEYS))


def dedup(n: int, queue: bytes) -> bytes:
    return resp(b"ADDJOB", queue, BODY, b"0", b"REPLICATE", b"1", b"RETRY", b"0", b"KEY", b"u%d" % n, b"DEDUP", b"60000")


def getjob(n: int, queue: bytes) -> bytes:
    return resp(b"GETJOB", b"NOHANG", b"FROM", queue)


class Node:
    def __init__(self) -> None:
        os.chdir(tempfile.mkdtemp())  # nodes.conf
        self.server = Server(Config())
        self.tcp = self.server.tcp
        ours, self.peer = socket.socketpair()
        ours.setblocking(False)
        self.conn = self.tcp.add(ours, "127.0.0.1:1", "127.0.0.1:2", trusted=True)

    def run(self, make: Callable[[int, bytes], bytes], queue: bytes, n: int, built: int = 0) -> float | None:
        """Requests per second of `n` requests made by `make` (None: refused);
        max(n, `built`) are made, before the clock starts."""
        made = [b"".join(make(i + j, queue) for j in range(PIPELINE)) for i in range(0, max(n, built), PIPELINE)]
        batches = made[: n // PIPELINE]
        start = time.perf_counter()
        for data in batches:
            self.peer.sendall(data)
            self.tcp._read(self.conn)
            replies = self.peer.recv(1 << 22)
            if replies.startswith(b"-"):
                return None
        return n / (time.perf_counter() - start)


KINDS: dict[str, tuple[Callable[[int, bytes], bytes], Callable[[int, bytes], bytes] | None]] = {
    "ADDJOB plain": (plain, None), "ADDJOB KEY": (keyed, None), "ADDJOB KEY DEDUP": (dedup, None),
    "GETJOB plain": (getjob, plain), "GETJOB KEY": (getjob, keyed),
}  # name -> (the request, what a GETJOB takes from)


def one(kind: str, n: int) -> None:
    """`n` requests of `kind` (a KINDS name), for callgrind to count."""
    make, filled_by = KINDS[kind]
    node = Node()
    if filled_by is not None:
        node.run(filled_by, b"q", PREFILL)
    assert node.run(make, b"q", n, HIGH) is not None  # HIGH made in both runs: making them cancels out


def instructions() -> None:
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is needed (make tools-valgrind)")
    print(f"instructions per request (callgrind, {HIGH} - {LOW} requests)")
    counts: dict[str, float] = {}
    for kind in KINDS:
        totals = []
        for n in (LOW, HIGH):
            argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, "one", kind, str(n)]
            done = subprocess.run(argv, capture_output=True, text=True, env=os.environ | {"PYTHONHASHSEED": "0"})
            totals.append(int(re.findall(r"Collected : (\d+)", done.stderr)[-1]) if done.returncode == 0 else 0)
        if not all(totals):  # refused (a build without KEY)
            print(f"{kind:18} {'n/a':>10}")
            continue
        counts[kind] = (totals[1] - totals[0]) / (HIGH - LOW)
        base = counts[kind.split()[0] + " plain"]
        print(f"{kind:18} {counts[kind]:10,.0f}  {base / counts[kind]:.2f}x plain's rate")


def rates(rounds: int) -> None:
    best: dict[str, float | None] = {}
    for r in range(rounds):
        node = Node()
        queues = {"ADDJOB plain": b"pq", "ADDJOB KEY": b"kq%d" % r, "ADDJOB KEY DEDUP": b"dq%d" % r,
                  "GETJOB plain": b"pq", "GETJOB KEY": b"kq%d" % r}  # fmt: skip
        figures = {kind: node.run(KINDS[kind][0], queues[kind], N) for kind in KINDS}
        for name, value in figures.items():
            best[name] = None if value is None or best.get(name, 0) is None else max(value, best.get(name) or 0)
    print(f"requests per second, best of {rounds} x {N} requests")
    for name, value in best.items():
        if value is None:
            print(f"{name:18} {'n/a':>10}")
            continue
        base = best[name.split()[0] + " plain"]
        ratio = f"  {value / base:.2f}x plain" if base and not name.endswith("plain") else ""
        print(f"{name:18} {value:10,.0f}/s{ratio}")


def main() -> None:
    if sys.argv[1:2] == ["one"]:
        one(sys.argv[2], int(sys.argv[3]))
        os._exit(0)  # no teardown: freeing what the requests left is the work of their end (ACK, a hold's end)
    counting = sys.argv[1:2] == ["instructions"]
    args = sys.argv[2:] if counting else sys.argv[1:]
    core = "compiled" if compiled.active() else "pure Python"
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); the {core} core; one node, in process, pipelined {PIPELINE}")
    rates(int(args[0]) if args else 5)
    if counting:
        instructions()


if __name__ == "__main__":
    main()
