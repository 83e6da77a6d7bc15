"""The replicated ADDJOB path, for instruction counts: a real 3-node cluster
whose first two nodes (the one the clients talk to, and a replica) run under
`valgrind --tool=callgrind`, N jobs of `ADDJOB r3 <100 B> 0 REPLICATE 3`.

    python bench/cluster_instructions.py N [MODE]

MODE is `one` (one client, one request at a time), `sync` (redis-benchmark,
50 clients, unpipelined: the default) or `async` (50 clients, pipelined 16,
ASYNC).  After a warm-up the counters of both nodes are zeroed
(`callgrind_control -z`), the N jobs run, and each node dumps its profile
(bench/results/callgrind.<node>.<pid>.1, for callgrind_annotate
--inclusive=yes); the instructions per job are printed, the node's idle
work while the jobs ran (its crons, measured before) taken out.

Every node runs on a clock 20 times slower than the machine's (libfaketime,
FAKETIME=+0 x0.05, which slows down their timers and trio's waits alike): a
node under callgrind runs some 50 times slower than usual, and on a real
clock its jobs would wait long enough for the replication retry (50 ms) to
send every REPLJOB again, which a node at full speed does not do.
"""

from __future__ import annotations

import glob
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import BODY, CLIENTS, RESULTS_DIR

from disque.testing.devcluster import NodeProcess, free_port, join

SPEED = 0.05
WARMUP = 300
IDLE_SECONDS = 10
REQUEST = b"*6\r\n$6\r\nADDJOB\r\n$2\r\nr3\r\n$100\r\n" + BODY + b"\r\n$1\r\n0\r\n$9\r\nREPLICATE\r\n$1\r\n3\r\n"


def _adds(port: int, n: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(n):
            s.sendall(REQUEST)
            reply = s.recv(1000)
            assert reply.startswith(b"+D"), reply


def _counts(pids: list[str], tag: str) -> list[int]:
    """Dump both nodes' counters, then zero them; the instructions of each."""
    subprocess.run(["callgrind_control", "-d", tag, *pids], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-z", *pids], check=True, capture_output=True)
    counts = []
    for pid in pids:
        dump = max(glob.glob(str(RESULTS_DIR / f"callgrind.*.{pid}.*")), key=lambda p: Path(p).stat().st_mtime)
        counts.append(next(int(line.split()[1]) for line in open(dump) if line.startswith("summary:")))
    return counts


def main() -> None:
    n = int(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "sync"
    faketime = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not faketime:
        sys.exit("libfaketime is missing: `make tools-clock` installs it")
    RESULTS_DIR.mkdir(exist_ok=True)
    base = Path(tempfile.mkdtemp())
    wrapper = base / "callgrind.sh"
    nodes: list[NodeProcess] = []
    real = sys.executable
    env = {"LD_PRELOAD": faketime[0], "FAKETIME": f"+0 x{SPEED}"}
    try:
        for i, name in enumerate(("client-facing", "replica", "other")):
            if i < 2:
                wrapper = base / f"callgrind-{name}.sh"
                out = RESULTS_DIR / f"callgrind.{name}.%p"
                wrapper.write_text(f'#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={out} {real} "$@"\n')
                wrapper.chmod(0o755)
                sys.executable = str(wrapper)  # what NodeProcess starts
            else:
                sys.executable = real
            nodes.append(NodeProcess(free_port(), base / name, env=env).start(wait=120))
        sys.executable = real
        join(nodes, timeout=600)
        _adds(nodes[0].port, WARMUP)
        pids = [str(node.pid) for node in nodes[:2]]  # the shell script execs valgrind, which runs the node
        _counts(pids, "warmup")
        time.sleep(IDLE_SECONDS)
        idle = [c / IDLE_SECONDS for c in _counts(pids, "idle")]
        started = time.monotonic()
        if mode == "one":
            _adds(nodes[0].port, n)
        else:
            args = ["ADDJOB", "r3", BODY.decode(), "0", "REPLICATE", "3"]
            pipeline = ["-P", "16", *args, "ASYNC"] if mode == "async" else args
            subprocess.run(["redis-benchmark", "-p", str(nodes[0].port), "-c", str(CLIENTS), "-n", str(n), "-q", *pipeline],
                           check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        time.sleep(2)  # the last GOTJOBs
        elapsed = time.monotonic() - started
        for name, count, rate in zip(("client-facing", "replica"), _counts(pids, "jobs"), idle):
            print(f"{name}: {count / n:,.0f} instructions per job ({(count - rate * elapsed) / n:,.0f} without its idle work)")
    finally:
        sys.executable = real
        for node in nodes:
            node.stop(timeout=60)


if __name__ == "__main__":
    main()
