"""Security overhead: ADDJOB over TLS, and REPLICATE 3 latency with bus
authentication and with the bus over TLS, as ratios to plain in the same run.

* ADDJOB throughput: one node serving both its plain port and a tls-port
  (`tls-auth-clients no`); redis-benchmark, 50 clients, unpipelined and
  pipelined 16, `ADDJOB q <100-byte body> 0 RETRY 0` on the plain port and
  the same with `--tls` on the tls-port, twice each in the orders plain-TLS
  and TLS-plain (mean of the two).  Ratio: TLS / plain.
* REPLICATE 3 latency: three 3-node clusters side by side, plain, with a
  `cluster-secret` (handshake + HMAC on every frame) and with
  `tls-cluster yes`; one client sends `ADDJOB q <body> 0 REPLICATE 3` to node 0
  (plain client port), one at a time.  The clusters are measured in
  interleaved rounds so that load drift affects them alike.  Ratios: p50 and
  mean of each to the plain cluster's.

Certificates come from `disque.shell.tls.keygen` in a temporary directory.
Everything shares the machine's cores: the ratios are the figures to watch.
"""

from __future__ import annotations

import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import BODY, print_table, redis_benchmark

from disque.testing.devcluster import NodeProcess, free_port, join
from disque.shell.tls import keygen

HOST = "127.0.0.1"
PIPELINE = 16
SECRET = "benchmark cluster secret, 32 bytes or more"
ADDJOB = ["ADDJOB", "q", BODY, "0", "RETRY", "0"]


def _sizes(quick: bool) -> dict[str, int]:
    scale = 10 if quick else 1
    return {"unpipelined": 50_000 // scale, "pipelined": 200_000 // scale, "latency": 3000 // scale, "rounds": 3}


def _start(specs: list[tuple[Path, tuple[str, ...]]]) -> list[NodeProcess]:
    ports: set[int] = set()
    while len(ports) < len(specs):
        ports.add(free_port())
    nodes = [NodeProcess(port, workdir, *extra) for port, (workdir, extra) in zip(sorted(ports), specs)]
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda n: n.start(), nodes))
    return nodes


def _tls_args(certs: dict[str, Path]) -> tuple[str, ...]:
    return ("--tls-cert-file", str(certs["node.crt"]), "--tls-key-file", str(certs["node.key"]),
            "--tls-ca-cert-file", str(certs["ca.crt"]))  # fmt: skip


def _throughput(base: Path, certs: dict[str, Path], sizes: dict[str, int]) -> dict[str, float]:
    tls_port = free_port()
    node = _start([(base / "tls-node", (*_tls_args(certs), "--tls-port", str(tls_port), "--tls-auth-clients", "no"))])[0]
    out: dict[str, float] = {}
    try:
        runs = {"plain": (node.port,), "tls": (tls_port, "--tls", "--cacert", str(certs["ca.crt"]))}
        for pipeline, mode in ((1, "unpipelined"), (PIPELINE, "pipelined")):
            n = sizes[mode] // 2
            rates: dict[str, list[float]] = {"plain": [], "tls": []}
            for order in (("plain", "tls"), ("tls", "plain")):  # each side once first: no order bias
                for kind in order:
                    port, *options = runs[kind]
                    rates[kind].append(redis_benchmark(port, n, pipeline, *options, *ADDJOB))
            for kind, values in rates.items():
                out[f"{kind}_{mode}"] = statistics.fmean(values)
            out[f"tls_ratio_{mode}"] = out[f"tls_{mode}"] / out[f"plain_{mode}"]
    finally:
        node.stop()
    return out


class _Conn:
    """One request at a time; replies are single lines (status or error)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def call(self, request: bytes) -> bytes:
        self.sock.sendall(request)
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        if line.startswith(b"-"):
            raise RuntimeError(line.decode())
        return line

    def close(self) -> None:
        self.sock.close()


def _latencies(base: Path, certs: dict[str, Path], sizes: dict[str, int]) -> dict[str, dict[str, float]]:
    kinds = {"plain": (), "auth": ("--cluster-secret", SECRET), "tls": (*_tls_args(certs), "--tls-cluster", "yes")}
    specs = [(base / f"{kind}-{i}", extra) for kind, extra in kinds.items() for i in range(3)]
    nodes = _start(specs)
    try:
        clusters = {kind: nodes[3 * k : 3 * k + 3] for k, kind in enumerate(kinds)}
        for cluster in clusters.values():
            join(cluster)
        request = b"*6\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$%d\r\n%s\r\n$1\r\n0\r\n$9\r\nREPLICATE\r\n$1\r\n3\r\n" % (len(BODY), BODY)
        conns = {kind: _Conn(cluster[0].port) for kind, cluster in clusters.items()}
        samples: dict[str, list[float]] = {kind: [] for kind in kinds}
        per_round = sizes["latency"] // sizes["rounds"]
        try:
            for conn in conns.values():  # warm up: links, caches
                for _ in range(50):
                    conn.call(request)
            for _ in range(sizes["rounds"]):
                for kind, conn in conns.items():
                    for _ in range(per_round):
                        started = time.perf_counter()
                        conn.call(request)
                        samples[kind].append((time.perf_counter() - started) * 1e3)
        finally:
            for conn in conns.values():
                conn.close()
    finally:
        for node in nodes:
            node.stop()
    out: dict[str, dict[str, float]] = {}
    for kind, values in samples.items():
        values.sort()
        out[kind] = {"p50_ms": values[len(values) // 2], "p99_ms": values[int(len(values) * 0.99)],
                     "mean_ms": statistics.fmean(values)}  # fmt: skip
    for kind in ("auth", "tls"):
        out[kind]["p50_ratio"] = out[kind]["p50_ms"] / out["plain"]["p50_ms"]
        out[kind]["mean_ratio"] = out[kind]["mean_ms"] / out["plain"]["mean_ms"]
    return out


def run(quick: bool) -> dict[str, Any]:
    sizes = _sizes(quick)
    with tempfile.TemporaryDirectory(prefix="disque-bench-security-") as tmp:
        base = Path(tmp)
        certs = keygen(base / "certs")
        throughput = _throughput(base, certs, sizes)
        latency = _latencies(base, certs, sizes)
    print_table(
        "ADDJOB throughput, one node, 50 clients (ops/s)",
        ["mode", "plain", "TLS", "TLS / plain"],
        [[mode, throughput[f"plain_{mode}"], throughput[f"tls_{mode}"], throughput[f"tls_ratio_{mode}"]]
         for mode in ("unpipelined", "pipelined")],  # fmt: skip
    )
    print_table(
        "ADDJOB REPLICATE 3 latency, 3-node cluster, one client (ms)",
        ["bus", "p50", "p99", "mean", "p50 / plain", "mean / plain"],
        [[kind, v["p50_ms"], v["p99_ms"], v["mean_ms"], v.get("p50_ratio", 1.0), v.get("mean_ratio", 1.0)]
         for kind, v in (("plain", latency["plain"]), ("cluster-secret", latency["auth"]), ("tls-cluster", latency["tls"]))],  # fmt: skip
    )
    return {"addjob_throughput": throughput, "replicate3_latency": latency}


if __name__ == "__main__":
    import sys

    run("--quick" in sys.argv)
