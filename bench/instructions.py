"""The request path in process, for instruction counts: a real `Server`
whose `TcpClients` serves one end of a socketpair, N requests.

    python bench/instructions.py KIND N [PIPELINE]

KIND is ping, addjob (`ADDJOB q <100 B> 0 REPLICATE 1 RETRY 0`), getjob
(`GETJOB NOHANG FROM q`), qadd (`QADD g 3600 <100 B>`) or qget (`QGET g grp
EX 0`); getjob and qget take from PREFILL jobs or events added before the
count starts (the same number whatever N, so that the adds cancel out).
Under `valgrind --tool=callgrind` the instructions of one request are the
difference between two runs with different N, divided by the difference
of N (the start-up and the warm-up cancel out):

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/instructions.py ping 2000   # and 6000

Each request (or pipeline of PIPELINE requests) is one `send` by the peer,
one pass of the client loop's handling of a readable socket, and one
`recv` of the replies; the peer checks the reply count on the last.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

from disque.core.config import Config
from disque.shell.server import Server

BODY = b"x" * 100
REQUESTS = {
    "ping": b"*1\r\n$4\r\nPING\r\n",
    "addjob": b"*8\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$100\r\n" + BODY + b"\r\n$1\r\n0\r\n$9\r\nREPLICATE\r\n$1\r\n1\r\n$5\r\nRETRY\r\n$1\r\n0\r\n",
    "getjob": b"*4\r\n$6\r\nGETJOB\r\n$6\r\nNOHANG\r\n$4\r\nFROM\r\n$1\r\nq\r\n",
    "qadd": b"*4\r\n$4\r\nQADD\r\n$1\r\ng\r\n$4\r\n3600\r\n$100\r\n" + BODY + b"\r\n",
    "qget": b"*5\r\n$4\r\nQGET\r\n$1\r\ng\r\n$3\r\ngrp\r\n$2\r\nEX\r\n$1\r\n0\r\n",
}
FILLED_BY = {"getjob": "addjob", "qget": "qadd"}  # what a taking kind takes from
WARMUP = 200
PREFILL = 10_000


def main() -> None:
    kind, n = sys.argv[1], int(sys.argv[2])
    pipeline = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    os.chdir(tempfile.mkdtemp())  # nodes.conf
    server = Server(Config())
    tcp = server.tcp
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    conn = tcp.add(ours, "127.0.0.1:1", "127.0.0.1:2", trusted=True)

    def serve(request: bytes, times: int) -> bytes:
        data = request * pipeline
        replies = b""
        for _ in range(times):
            peer.sendall(data)
            tcp._read(conn)
            replies = peer.recv(1 << 20)
        return replies

    if kind in FILLED_BY:
        assert WARMUP + n * pipeline <= PREFILL, "N too large to take from PREFILL"
        if kind == "qget":
            serve(REQUESTS[kind], 1)  # the group starts reading from here
        serve(REQUESTS[FILLED_BY[kind]], PREFILL // pipeline)
    request = REQUESTS[kind]
    serve(request, WARMUP)
    last = serve(request, n)
    assert last and not last.startswith(b"-"), last


def per_request(kind: str, pipeline: int = 1, low: int = 2000, high: int = 6000) -> float | None:
    """Instructions of one request of `kind` (pipelined `pipeline` deep):
    callgrind's totals for `high` and `low` rounds, their difference over
    the requests between; None without valgrind (`make tools-valgrind`)."""
    if shutil.which("valgrind") is None:
        return None
    totals = []
    for n in (low, high):
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, kind, str(n), str(pipeline)]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        totals.append(int(re.search(r"Collected : (\d+)", done.stderr).group(1)))  # type: ignore[union-attr]
    return (totals[1] - totals[0]) / ((high - low) * pipeline)


if __name__ == "__main__":
    main()
