"""The least any Python RESP server pays per request: the single-node
benchmark's references for what Python itself costs.

One process, one epoll loop, non-blocking sockets, hiredis parsing.  Two
modes (usage: python bench/bare_server.py PORT [--jobs]):

* bare: a fixed 48-byte status reply (the size of an ADDJOB reply) to every
  request, no command logic at all.
* --jobs: ADDJOB keeps the job the way the node's store does, with nothing
  else: a 48-character ID from 128 random bits, a slotted record of the same
  fields, an index by ID, a queue per name, a timer bucket per expiry second,
  and the ID as the reply, with the collector frozen every second as the
  node does (gc_freeze.py).  No validation, errors, statistics, memory
  accounting, persistence hooks or replication decisions; any other request
  gets the fixed reply.  Only the options the benchmark sends are read.

The distance from `--jobs` to the node is what a complete ADDJOB costs on
top of keeping the job.
"""

from __future__ import annotations

import gc
import random
import select
import socket
import sys
import time
from collections import deque
from typing import Any

import hiredis

REPLY = b"+" + b"D" * 48 + b"\r\n"


class Job:
    __slots__ = ("id", "queue", "body", "state", "flags", "repl", "etime", "ctime", "delay", "retry", "nacks",
                 "deliv", "nodes_delivered", "qtime", "awake")  # fmt: skip

    def __init__(self, job_id: bytes, queue: bytes, body: bytes, etime: int, retry: int) -> None:
        self.id, self.queue, self.body, self.etime, self.retry = job_id, queue, body, etime, retry
        self.state, self.flags, self.repl, self.ctime, self.delay = 1, 0, 1, time.time_ns(), 0
        self.nacks = self.deliv = self.qtime = 0
        self.nodes_delivered = ()
        self.awake = etime * 1000


class Jobs:
    def __init__(self) -> None:
        self.by_id: dict[bytes, Job] = {}
        self.queues: dict[bytes, deque[Job]] = {}
        self.timer: dict[int, dict[Job, None]] = {}
        self.random = random.Random()

    def addjob(self, argv: list[bytes]) -> bytes:
        ttl, retry = 86400, 0
        for i in range(4, len(argv) - 1, 2):
            option = argv[i].lower()
            if option == b"ttl":
                ttl = int(argv[i + 1])
            elif option == b"retry":
                retry = int(argv[i + 1])
        job_id = b"DI%08x%032x%04xSQ" % (0xD15C0, self.random.getrandbits(128), min(ttl // 60, 0xFFFF))
        job = Job(job_id, argv[1], argv[2], int(time.time()) + ttl, retry)
        self.by_id[job_id] = job
        queue = self.queues.get(job.queue)
        if queue is None:
            queue = self.queues[job.queue] = deque()
        queue.append(job)
        self.timer.setdefault(job.etime, {})[job] = None
        return b"+%s\r\n" % job_id


def serve(port: int, keep_jobs: bool) -> None:
    listener = socket.create_server(("127.0.0.1", port), backlog=512)
    listener.setblocking(False)
    epoll = select.epoll()
    epoll.register(listener.fileno(), select.EPOLLIN)
    conns: dict[int, tuple[socket.socket, hiredis.Reader]] = {}
    handlers: dict[bytes, Any] = {b"addjob": Jobs().addjob} if keep_jobs else {}
    frozen = time.monotonic()
    while True:
        if keep_jobs and time.monotonic() - frozen >= 1:
            gc.collect(1)
            gc.freeze()
            frozen = time.monotonic()
        for fd, _ in epoll.poll():
            if fd == listener.fileno():
                sock, _ = listener.accept()
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns[sock.fileno()] = (sock, hiredis.Reader())
                epoll.register(sock.fileno(), select.EPOLLIN)
                continue
            sock, reader = conns[fd]
            data = sock.recv(65536)
            if not data:
                epoll.unregister(fd)
                del conns[fd]
                sock.close()
                continue
            reader.feed(data)
            replies = []
            while (argv := reader.gets()) is not False:
                handler = handlers.get(argv[0].lower())
                replies.append(REPLY if handler is None else handler(argv))
            sock.sendall(b"".join(replies))  # the benchmark's client reads everything: never blocks for long


if __name__ == "__main__":
    serve(int(sys.argv[1]), "--jobs" in sys.argv[2:])
