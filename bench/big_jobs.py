"""Big jobs on a local 3-node cluster: how long a job of 1, 10 and 50 MB
takes to replicate, and what the other clients see meanwhile.

A fresh 3-node cluster (default config); for each size one producer sends
`ADDJOB q <body> 0 REPLICATE 3` to node 0 (the reply comes once all three
nodes hold a copy) while a second client sends PING to node 0 in a loop:
the table prints the ADDJOB's round trip, the PINGs' worst and median
round trip meanwhile, and the node's CPU seconds and RSS afterwards.

    python bench/big_jobs.py            (bench/run.py --only big-jobs)
    python bench/big_jobs.py --sizes 1,10,50,60

Everything shares the machine's cores: the PING figures are the ones to
watch (a node that copies a big frame in one go stalls every client).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import subprocess
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table  # noqa: E402

from disque.client import encode_command  # noqa: E402
from disque.testing.devcluster import NodeProcess, command, free_port, join  # noqa: E402

MB = 1 << 20


def _reply(sock: socket.socket) -> bytes:
    """One RESP status, error or bulk reply (enough for PING and ADDJOB)."""
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


PING_LOOP = """
import json, select, socket, sys, time
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
pings = []
while not select.select([sys.stdin], [], [], 0)[0]:  # until the parent closes our stdin
    started = time.perf_counter()
    sock.sendall(b"PING\\r\\n")
    data = b""
    while not data.endswith(b"\\r\\n"):
        data += sock.recv(100)
    pings.append((time.perf_counter() - started) * 1000)
    time.sleep(0.005)
print(json.dumps(pings))
"""


def replicate_one(node: NodeProcess, size: int) -> dict[str, float]:
    """One ADDJOB of `size` bytes while another process PINGs the node (a
    process of its own: a thread here would wait for this one's GIL)."""
    assert node.proc is not None
    request = encode_command((b"ADDJOB", b"bigq", b"x" * size, b"0", b"REPLICATE", b"3"))
    cpu_before = cpu_seconds(node.proc.pid)
    pinger = subprocess.Popen(
        [sys.executable, "-c", PING_LOOP, node.host, str(node.port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert pinger.stdout is not None and pinger.stdin is not None
        pinger.stdout.readline()
        time.sleep(0.05)
        with socket.create_connection((node.host, node.port)) as sock:
            started = time.perf_counter()
            sock.sendall(request)
            reply = _reply(sock)
            elapsed = time.perf_counter() - started
        time.sleep(0.05)
        pinger.stdin.close()
        pings = json.loads(pinger.stdout.read())
    finally:
        pinger.kill()
        pinger.wait()
    if not reply.startswith(b"+"):
        raise RuntimeError(f"ADDJOB of {size} bytes: {reply!r}")
    command(node.host, node.port, "DEBUG", "FLUSHALL")
    return {
        "mb": size / MB,
        "seconds": elapsed,
        "ping_max_ms": max(pings),
        "ping_p50_ms": statistics.median(pings),
        "pings": len(pings),
        "cpu_s": cpu_seconds(node.proc.pid) - cpu_before,
        "rss_mb": rss_mb(node.proc.pid),
    }


def run(quick: bool, sizes: tuple[int, ...] = (1, 10, 50)) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        nodes = [NodeProcess(free_port(), Path(tmp) / f"node{i}").start() for i in range(3)]
        try:
            join(nodes)
            rows = [replicate_one(nodes[0], mb * MB) for mb in sizes]
        finally:
            for node in nodes:
                node.stop()
    print_table(
        "Big jobs: ADDJOB REPLICATE 3 on node 0, PING from another client meanwhile",
        ["job", "replicated in", "PING max", "PING p50", "PINGs", "node 0 CPU", "node 0 RSS"],
        [
            [f"{r['mb']:.0f} MB", f"{r['seconds']:.2f} s", f"{r['ping_max_ms']:.1f} ms", f"{r['ping_p50_ms']:.1f} ms",
             str(r["pings"]), f"{r['cpu_s']:.2f} s", f"{r['rss_mb']:.0f} MB"]
            for r in rows
        ],
    )  # fmt: skip
    return {"jobs": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,50", help="job sizes in MB, comma-separated")
    args = parser.parse_args()
    run(False, tuple(int(s) for s in args.sizes.split(",")))


if __name__ == "__main__":
    main()
