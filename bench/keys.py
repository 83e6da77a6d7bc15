"""Keyed jobs against plain ones on one node, in process (docs/keys.md).

    python bench/keys.py [ROUNDS]

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
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable

from disque.core.config import Config
from disque.shell.server import Server

BODY = b"x" * 100
N = 20_000
PIPELINE = 16
KEYS = 100


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

    def run(self, make: Callable[[int, bytes], bytes], queue: bytes, n: int) -> float | None:
        """Requests per second of `n` requests made by `make` (None: refused)."""
        batches = [b"".join(make(i + j, queue) for j in range(PIPELINE)) for i in range(0, n, PIPELINE)]
        start = time.perf_counter()
        for data in batches:
            self.peer.sendall(data)
            self.tcp._read(self.conn)
            replies = self.peer.recv(1 << 22)
            if replies.startswith(b"-"):
                return None
        return n / (time.perf_counter() - start)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    best: dict[str, float | None] = {}
    for r in range(rounds):
        node = Node()
        figures = {
            "ADDJOB plain": node.run(plain, b"pq", N),
            "ADDJOB KEY": node.run(keyed, b"kq%d" % r, N),
            "ADDJOB KEY DEDUP": node.run(dedup, b"dq%d" % r, N),
            "GETJOB plain": node.run(getjob, b"pq", N),
            "GETJOB KEY": node.run(getjob, b"kq%d" % r, N),
        }
        for name, value in figures.items():
            best[name] = None if value is None or best.get(name, 0) is None else max(value, best.get(name) or 0)
    base = {"ADDJOB KEY": "ADDJOB plain", "ADDJOB KEY DEDUP": "ADDJOB plain", "GETJOB KEY": "GETJOB plain"}
    print(f"one node, in process, pipelined {PIPELINE}, best of {rounds} x {N} requests")
    for name, value in best.items():
        if value is None:
            print(f"{name:18} {'n/a':>10}")
            continue
        ratio = f"  {value / best[base[name]]:.2f}x plain" if name in base and best[base[name]] else ""  # type: ignore[operator]
        print(f"{name:18} {value:10,.0f}/s{ratio}")


if __name__ == "__main__":
    main()
