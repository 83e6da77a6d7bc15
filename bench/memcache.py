"""The memcache (Kestrel) port: SET and GET next to RESP ADDJOB/GETJOB on
the same node, and memcached's SET/GET as the reference of the protocol's
cost, all driven by the same load generator in the same run.

The generator (no memcache benchmark tool is packaged for Debian) runs
WORKERS processes, one connection each, every one sending its requests in
batches of `pipeline` and reading the replies of a batch before the next;
it shares the machine's cores with the server, so compare ratios.  SET and
ADDJOB add 100-byte bodies to one queue, then GET (which takes the item for
good here; memcached only reads it) and GETJOB NOHANG take them back.
"""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from common import BODY, print_table, start_node

from disque.testing.devcluster import free_port

WORKERS = 4
PIPELINES = (1, 16)
HOST = "127.0.0.1"


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


# name -> (request, the reply's ending, how many endings one reply holds)
REQUESTS = {
    "SET": (b"set q 0 0 %d\r\n%s\r\n" % (len(BODY), BODY), b"STORED\r\n", 1),
    "GET": (b"get q\r\n", b"END\r\n", 1),
    "ADDJOB": (_resp(b"ADDJOB", b"q", BODY, b"0", b"RETRY", b"0"), b"\r\n", 1),
    "GETJOB": (_resp(b"GETJOB", b"NOHANG", b"FROM", b"q"), b"\r\n", 7),
}


def _drive(args: tuple[int, str, int, int]) -> None:
    port, name, pipeline, count = args
    request, end, per_reply = REQUESTS[name]
    with socket.create_connection((HOST, port), timeout=60) as s:
        done = 0
        while done < count:
            n = min(pipeline, count - done)
            s.sendall(request * n)
            want, got = n * per_reply, 0
            tail = b""
            while got < want:
                chunk = s.recv(1 << 20)
                if not chunk:
                    raise RuntimeError("connection closed")
                data = tail + chunk
                got += data.count(end)
                tail = data[-len(end) + 1 :]
            done += n


def throughput(port: int, name: str, pipeline: int, requests: int) -> float:
    per_worker = requests // WORKERS
    with multiprocessing.Pool(WORKERS) as pool:
        started = time.perf_counter()
        pool.map(_drive, [(port, name, pipeline, per_worker)] * WORKERS)
        elapsed = time.perf_counter() - started
    return per_worker * WORKERS / elapsed


def run(quick: bool) -> dict[str, Any]:
    requests = 20_000 if quick else 100_000
    figures: dict[str, Any] = {"requests": requests, "workers": WORKERS}
    with tempfile.TemporaryDirectory(prefix="disque-bench-memcache-") as tmp:
        memcache_port = free_port()
        node = start_node(Path(tmp) / "node", "--memcache-port", str(memcache_port))
        memcached_port = free_port()
        memcached = subprocess.Popen(["memcached", "-U", "0", "-p", str(memcached_port), "-l", HOST, "-u", "root"])
        try:
            for _ in range(100):
                try:
                    socket.create_connection((HOST, memcached_port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            rows = []
            for pipeline in PIPELINES:
                ops = {
                    "SET": throughput(memcache_port, "SET", pipeline, requests),
                    "GET": throughput(memcache_port, "GET", pipeline, requests),
                    "ADDJOB": throughput(node.port, "ADDJOB", pipeline, requests),
                    "GETJOB": throughput(node.port, "GETJOB", pipeline, requests),
                    "memcached SET": throughput(memcached_port, "SET", pipeline, requests),
                    "memcached GET": throughput(memcached_port, "GET", pipeline, requests),
                }
                figures[f"ops_per_sec_p{pipeline}"] = ops
                for ours, resp, reference in (("SET", "ADDJOB", "memcached SET"), ("GET", "GETJOB", "memcached GET")):
                    rows.append([ours, f"-P {pipeline}", ops[ours], resp, ops[resp], ops[ours] / ops[resp],
                                 ops[reference], ops[ours] / ops[reference]])  # fmt: skip
        finally:
            memcached.terminate()
            memcached.wait()
            node.stop()
    print_table(
        f"The memcache port, {WORKERS} connections, 100-byte items, {requests:,} requests per figure",
        ["memcache", "pipeline", "ops/s", "RESP", "RESP ops/s", "ratio to RESP", "memcached ops/s", "ratio to memcached"],
        rows,
    )
    return figures


if __name__ == "__main__":
    run(quick=True)
