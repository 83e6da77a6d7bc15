"""Local 3-node cluster: replication latency, throughput, ACK propagation.

A fresh 3-node cluster (default config, joined with CLUSTER MEET) on
loopback; every figure uses 100-byte bodies and synchronous replication
(`ADDJOB q <body> 0 REPLICATE 3`: the producer gets its ID once all three
nodes hold a copy).

* ADDJOB latency: one client, one command at a time, against node 0;
  p50 / p99 / mean of the round trip.
* ADDJOB throughput: redis-benchmark, 50 clients, unpipelined and pipelined
  16, synchronous and ASYNC, on node 0, next to a single node's ADDJOB
  REPLICATE 1 measured in the same run (the replication overhead ratio).
* ADDJOB latency under load: one client's round trips while redis-benchmark
  runs the synchronous ADDJOB with 50 clients.
* GETJOB + ACKJOB: N jobs are preloaded (REPLICATE 3) on node 0 (and, as
  the reference, REPLICATE 1 on the single node), then
  consumers on node 0 loop `GETJOB NOHANG` + `ACKJOB <id>` until the queue is
  empty; cycles per second, then the time until the acknowledged jobs are
  gone from every node (the GC finishing in the background).
* ACK propagation: ADDJOB REPLICATE 3 on node 0, ACKJOB on node 0, then poll
  SHOW on the three nodes until none knows the job; p50 / p99 of the time
  from sending ACKJOB until the last copy is gone.

Everything (3 nodes, redis-benchmark, the Python clients) shares the
machine's cores, so absolute figures depend on the machine.
"""

from __future__ import annotations

import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import BODY, CLIENTS, print_table, redis_benchmark, send_pipelined

from disque.testing.devcluster import NodeProcess, command, free_port, join

HOST = "127.0.0.1"
CONSUMERS = 8


def _sizes(quick: bool) -> dict[str, int]:
    scale = 5 if quick else 1
    return {
        "latency": 2000 // scale,
        "throughput": 100_000 // scale,  # a run of several seconds: shorter ones moved 20 % between runs
        "cycle": 10_000 // scale,
        "ack": 300 // scale,
    }


class Conn:
    """A minimal RESP client: one request at a time, replies parsed enough
    for the commands used here (status, error, integer, bulk, arrays)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, *args: bytes | str) -> None:
        parts = [a if isinstance(a, bytes) else a.encode() for a in args]
        self.sock.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))

    def call(self, *args: bytes | str) -> Any:
        self.send(*args)
        return self.read()

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    raise ConnectionError("connection closed")
                self.buf += chunk
            data, self.buf = self.buf[:n], self.buf[n + 2 :]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")


def _percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def _flush(nodes: list[NodeProcess]) -> None:
    for node in nodes:
        command(HOST, node.port, "DEBUG", "FLUSHALL")


def _registered_jobs(node: NodeProcess) -> int:
    for line in command(HOST, node.port, "INFO", "jobs").decode().split("\r\n"):
        if line.startswith("registered_jobs:"):
            return int(line.split(":")[1])
    raise RuntimeError("no registered_jobs in INFO")


def _wait_no_jobs(nodes: list[NodeProcess], timeout: float = 120.0) -> float:
    started = time.perf_counter()
    while any(_registered_jobs(n) for n in nodes):
        if time.perf_counter() - started > timeout:
            raise RuntimeError("acknowledged jobs still around after %.0f s" % timeout)
        time.sleep(0.01)
    return time.perf_counter() - started


def addjob_latency(port: int, count: int) -> list[float]:
    conn = Conn(port)
    samples = []
    try:
        for _ in range(count):
            t = time.perf_counter()
            conn.call("ADDJOB", "lat", BODY, "0", "REPLICATE", "3")
            samples.append((time.perf_counter() - t) * 1000)
    finally:
        conn.close()
    return samples


def cycle_throughput(nodes: list[NodeProcess], count: int) -> tuple[float, float]:
    """(GETJOB+ACKJOB cycles per second, seconds until the GC is done); the
    jobs are replicated to every node given."""
    port = nodes[0].port
    send_pipelined(port, [b"ADDJOB", b"cyc", BODY, b"0", b"REPLICATE", str(len(nodes)).encode()], count, batch=200)
    done = [0] * CONSUMERS
    errors: list[BaseException] = []

    def consume(slot: int) -> None:
        conn = Conn(port)
        try:
            while True:
                reply = conn.call("GETJOB", "NOHANG", "FROM", "cyc")
                if reply is None:
                    return
                conn.call("ACKJOB", reply[0][1])
                done[slot] += 1
        except BaseException as e:  # reported by the caller
            errors.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(CONSUMERS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    if sum(done) != count:
        raise RuntimeError(f"consumed {sum(done)} jobs out of {count}")
    return count / elapsed, _wait_no_jobs(nodes)


def ack_propagation(nodes: list[NodeProcess], count: int) -> list[float]:
    """ms from sending ACKJOB on node 0 until no node knows the job."""
    producer = Conn(nodes[0].port)
    watchers = [Conn(n.port) for n in nodes]
    samples = []
    try:
        for _ in range(count):
            job = producer.call("ADDJOB", "ackq", BODY, "0", "REPLICATE", "3")
            assert all(w.call("SHOW", job) is not None for w in watchers), "replica missing before the ACK"
            t = time.perf_counter()
            assert producer.call("ACKJOB", job) == 1
            pending = list(watchers)
            while pending:
                pending = [w for w in pending if w.call("SHOW", job) is not None]
            samples.append((time.perf_counter() - t) * 1000)
    finally:
        for conn in [producer, *watchers]:
            conn.close()
    return samples


def loaded_latency(port: int, count: int, load: list[str | bytes], requests: int) -> tuple[list[float], float]:
    """ADDJOB REPLICATE 3 round trips of one client while redis-benchmark
    (50 clients) runs `load`; (samples in ms, the load's ops/s)."""
    result: list[float] = []
    bench = threading.Thread(target=lambda: result.append(redis_benchmark(port, requests, 1, *load)))
    bench.start()
    time.sleep(0.2)  # let the 50 clients connect before sampling
    samples = []
    conn = Conn(port)
    try:
        while bench.is_alive() and len(samples) < count:
            t = time.perf_counter()
            conn.call("ADDJOB", "lat", BODY, "0", "REPLICATE", "3")
            samples.append((time.perf_counter() - t) * 1000)
    finally:
        conn.close()
        bench.join()
    return samples, result[0]


TARGETS = {  # README, Performance: replication overhead and latency
    "r3_over_single": (">=", 0.45),
    "r3_pipelined_over_unpipelined": (">=", 2.0),
    "r3_latency_p99_ms": ("<=", 1.5),
}


def run(quick: bool) -> dict[str, Any]:
    sizes = _sizes(quick)
    load_before = os.getloadavg()[0]
    r3 = ["ADDJOB", "tput", BODY, "0", "REPLICATE", "3"]
    with tempfile.TemporaryDirectory(prefix="disque-bench-cluster-") as tmp:
        base = Path(tmp)
        single = NodeProcess(free_port(), base / "single").start()
        try:  # the reference of the same run: one node, ADDJOB REPLICATE 1
            r1 = ["ADDJOB", "tput", BODY, "0", "REPLICATE", "1"]
            single_ops = {p: redis_benchmark(single.port, sizes["throughput"], p, *r1) for p in (1, 16)}
            _flush([single])
            single_cycles, _ = cycle_throughput([single], sizes["cycle"])
        finally:
            single.stop()
        nodes = [NodeProcess(free_port(), base / f"node{i}") for i in range(3)]
        try:
            for node in nodes:
                node.start()
            join(nodes)
            latency = addjob_latency(nodes[0].port, sizes["latency"])
            _flush(nodes)
            throughput = {p: redis_benchmark(nodes[0].port, sizes["throughput"], p, *r3) for p in (1, 16)}
            _flush(nodes)
            async_ops = redis_benchmark(nodes[0].port, sizes["throughput"], 1, *r3, "ASYNC")
            _flush(nodes)
            loaded, _ = loaded_latency(nodes[0].port, sizes["latency"], r3, sizes["throughput"])
            _flush(nodes)
            cycles, gc_seconds = cycle_throughput(nodes, sizes["cycle"])
            _flush(nodes)
            ack = ack_propagation(nodes, sizes["ack"])
        finally:
            for node in nodes:
                node.stop()
    figures: dict[str, Any] = {
        "addjob_r3_latency_p50_ms": _percentile(latency, 0.50),
        "addjob_r3_latency_p99_ms": _percentile(latency, 0.99),
        "addjob_r3_latency_mean_ms": statistics.fmean(latency),
        "addjob_r3_loaded_latency_p50_ms": _percentile(loaded, 0.50),
        "addjob_r3_loaded_latency_p99_ms": _percentile(loaded, 0.99),
        "addjob_r3_ops_per_sec_50_clients": throughput[1],
        "addjob_r3_ops_per_sec_50_clients_p16": throughput[16],
        "addjob_r3_async_ops_per_sec_50_clients": async_ops,
        "single_addjob_r1_ops_per_sec": single_ops[1],
        "single_addjob_r1_ops_per_sec_p16": single_ops[16],
        "getjob_ackjob_cycles_per_sec": cycles,
        "single_getjob_ackjob_cycles_per_sec": single_cycles,
        "getjob_ackjob_consumers": CONSUMERS,
        "gc_drain_seconds": gc_seconds,
        "ack_to_gone_p50_ms": _percentile(ack, 0.50),
        "ack_to_gone_p99_ms": _percentile(ack, 0.99),
        "sizes": sizes,
        "load_average_before": load_before,
    }
    n = sizes["throughput"]
    print_table(
        f"Throughput, {CLIENTS} clients, 100-byte bodies, {n} requests each (ratio = ours / single node REPLICATE 1, same pipelining)",
        ["command", "pipeline", "ops/s", "ratio"],
        [
            ["single node ADDJOB REPLICATE 1", "-P 1", single_ops[1], 1.0],
            ["single node ADDJOB REPLICATE 1", "-P 16", single_ops[16], 1.0],
            ["3 nodes ADDJOB REPLICATE 3", "-P 1", throughput[1], throughput[1] / single_ops[1]],
            ["3 nodes ADDJOB REPLICATE 3", "-P 16", throughput[16], throughput[16] / single_ops[16]],
            ["3 nodes ADDJOB REPLICATE 3 ASYNC", "-P 1", async_ops, async_ops / single_ops[1]],
        ],
    )
    print_table(
        f"3-node cluster, REPLICATE 3 (synchronous); load average before the run {load_before:.1f}",
        ["measure", "value", "unit", "how"],
        [
            ["ADDJOB latency p50", figures["addjob_r3_latency_p50_ms"], "ms", f"1 client, {sizes['latency']} sequential, idle"],
            ["ADDJOB latency p99", figures["addjob_r3_latency_p99_ms"], "ms", ""],
            ["ADDJOB latency p50, loaded", figures["addjob_r3_loaded_latency_p50_ms"], "ms", f"1 client next to {CLIENTS} redis-benchmark clients"],
            ["ADDJOB latency p99, loaded", figures["addjob_r3_loaded_latency_p99_ms"], "ms", f"{len(loaded)} samples"],
            ["GETJOB+ACKJOB cycles", cycles, "cycles/s", f"{CONSUMERS} consumers, {sizes['cycle']} jobs"],
            ["... on a single node", single_cycles, "cycles/s", f"REPLICATE 1; ratio {cycles / single_cycles:.2f}"],
            ["GC of those acked jobs", gc_seconds, "s", "after the last ACKJOB, until no node holds any"],
            ["ACKJOB -> gone, p50", figures["ack_to_gone_p50_ms"], "ms", f"{sizes['ack']} jobs, polled with SHOW on every node"],
            ["ACKJOB -> gone, p99", figures["ack_to_gone_p99_ms"], "ms", ""],
        ],
    )  # fmt: skip
    measured = {
        "r3_over_single": throughput[1] / single_ops[1],
        "r3_pipelined_over_unpipelined": throughput[16] / throughput[1],
        "r3_latency_p99_ms": figures["addjob_r3_latency_p99_ms"],
    }
    met = {key: measured[key] >= goal if op == ">=" else measured[key] <= goal for key, (op, goal) in TARGETS.items()}
    print_table(
        "Targets",
        ["figure", "target", "measured", "met"],
        [[key, f"{op} {goal}", measured[key], "yes" if met[key] else "NO"] for key, (op, goal) in TARGETS.items()],
    )
    figures["targets_met"] = met
    return figures


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
