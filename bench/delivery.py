"""Delivery latency: from the producer's request to the consumer's hands, on
an idle cluster (cluster/federation.py: nodes announce their blocked
consumers, and a job queued where nobody waits goes to them at once).

Every sample: a consumer blocks on node A, the producer waits until A
reports it blocked plus a random idle gap (0-100 ms, as a user's producer
comes later), then adds one job on node B and the clock runs until the
consumer has it.  Measured for GETJOB on one node (A = B, the reference),
GETJOB across a 3-node cluster (every ordered pair of nodes in turn, the
default REPLICATE 3, next to ADDJOB's own round trip, and REPLICATE 1
RETRY 0), memcache `get q/t=...`
(Kestrel SET on another node), consumer groups (QNOTIFY then QGET on A,
QADD on B), a `disque worker --concurrency 1` and a Dramatiq worker
(processes of their own, connected to A only; the job carries its send
time and the handler notes its age), and how long a Dramatiq worker
started on A takes to run its first message when the queue's messages were
added on B before it started, next to the same with them added on A.
"""

from __future__ import annotations

import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from common import print_table

from disque.testing.devcluster import NodeProcess, command, free_port, join

HOST = "127.0.0.1"
GAP_S = 0.1  # the idle time between a consumer blocking and the job coming: uniform in [0, GAP_S]
TARGETS = {"p50_ms": 5.0, "p99_ms": 50.0}  # cross-node GETJOB, idle cluster


def _percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def _blocked(port: int) -> int:
    info = command(HOST, port, "INFO", "clients").decode()
    return int(info.split("blocked_clients:")[1].split()[0])


def _wait(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.001)


def _sample(block: Callable[[], Any], blocked: Callable[[], bool], produce: Callable[[], Any]) -> float:
    """ms from `produce()` starting to `block()` returning, once `blocked()`."""
    done: list[float] = []

    def consumer() -> None:
        got = block()
        done.append(time.perf_counter())
        assert got, got

    thread = threading.Thread(target=consumer)
    thread.start()
    _wait(blocked)
    time.sleep(random.uniform(0, GAP_S))
    start = time.perf_counter()
    produce()
    thread.join(30)
    return (done[0] - start) * 1000


def _flush(nodes: list[NodeProcess]) -> None:
    """No job left anywhere: every sample starts from empty queues."""
    for node in nodes:
        command(HOST, node.port, "DEBUG", "FLUSHALL")


def _getjob(nodes: list[NodeProcess], count: int, pairs: list[tuple[int, int]], *opts: Any) -> list[float]:
    conns = [redis.Redis(HOST, node.port, protocol=2) for node in nodes]
    samples = []
    for n in range(count):
        a, b = pairs[n % len(pairs)]
        before = _blocked(nodes[a].port)
        samples.append(_sample(
            lambda: conns[a].execute_command("GETJOB", "TIMEOUT", 20_000, "FROM", "lq"),
            lambda: _blocked(nodes[a].port) > before,
            lambda: conns[b].execute_command("ADDJOB", "lq", "x", 0, *opts),
        ))  # fmt: skip
        _flush(nodes)
    for conn in conns:
        conn.close()
    return samples


def _addjob_alone(nodes: list[NodeProcess], count: int, *opts: Any) -> list[float]:
    """The reference for the replicated rows: ADDJOB's own round trip, nobody waiting."""
    conns = [redis.Redis(HOST, node.port, protocol=2) for node in nodes]
    samples = []
    for n in range(count):
        start = time.perf_counter()
        conns[n % len(conns)].execute_command("ADDJOB", "alone", "x", 0, *opts)
        samples.append((time.perf_counter() - start) * 1000)
        time.sleep(random.uniform(0, GAP_S) / 10)
    _flush(nodes)
    for conn in conns:
        conn.close()
    return samples


def _memcache(port: int, line: bytes) -> bytes:
    with socket.create_connection((HOST, port), timeout=30) as sock:
        sock.sendall(line)
        data = b""
        while not data.endswith((b"END\r\n", b"STORED\r\n")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def _memcache_get(nodes: list[NodeProcess], mports: list[int], count: int, pairs: list[tuple[int, int]]) -> list[float]:
    samples = []
    for n in range(count):
        a, b = pairs[n % len(pairs)]
        before = _blocked(nodes[a].port)
        samples.append(_sample(
            lambda: b"VALUE" in _memcache(mports[a], b"get mq/t=20000\r\n"),
            lambda: _blocked(nodes[a].port) > before,
            lambda: _memcache(mports[b], b"set mq 0 0 1\r\nx\r\n"),
        ))  # fmt: skip
    return samples


def _groups(nodes: list[NodeProcess], count: int, pairs: list[tuple[int, int]]) -> list[float]:
    conns = [redis.Redis(HOST, node.port, protocol=2) for node in nodes]
    samples = []
    for n in range(count):
        a, b = pairs[n % len(pairs)]

        def take() -> Any:
            while True:  # as a consumer does: QNOTIFY says an event may be there, QGET may still find none
                conns[a].execute_command("QNOTIFY", "g", 20, "gq")
                if (got := conns[a].execute_command("QGET", "gq", "g", "EX", 0)) is not None:
                    return got

        before = _blocked(nodes[a].port)
        samples.append(_sample(take, lambda: _blocked(nodes[a].port) > before,
                               lambda: conns[b].execute_command("QADD", "gq", 3600, "x")))  # fmt: skip
    for conn in conns:
        conn.close()
    return samples


_WORKER_APP = '''
import time
from disque.client.worker import App

app = App(["{node}"])


@app.job("wq")
def note(job):
    with open("{out}", "a") as f:
        f.write("%f\\n" % ((time.time() - float(job.body.decode())) * 1000))
'''

_DRAMATIQ_APP = '''
import os
import time

import dramatiq
from disque.contrib.dramatiq import DisqueBroker

dramatiq.set_broker(DisqueBroker([os.environ["DELIVERY_NODE"]]))


@dramatiq.actor(queue_name="dq")
def note(sent):
    with open("{out}", "a") as f:
        f.write("%f %f\\n" % ((time.time() - sent) * 1000, time.time()))
'''


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _process_samples(argv: list[str], cwd: Path, out: Path, produce: Callable[[], Any], count: int,
                     env: dict[str, str]) -> list[float]:  # fmt: skip
    """Latency figures noted by a worker process: one job at a time, the next
    once the worker noted the last (its consumer is blocked again by then, or
    soon: the idle gap covers it)."""
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        produce()  # the first job tells when the worker runs
        _wait(lambda: len(_lines(out)) >= 1, 60)
        for n in range(count):
            time.sleep(0.05 + random.uniform(0, GAP_S))
            produce()
            _wait(lambda: len(_lines(out)) >= n + 2)
        return [float(line.split()[0]) for line in _lines(out)[1:]]
    finally:
        proc.terminate()
        proc.wait(30)


def _worker(nodes: list[NodeProcess], tmp: Path, count: int) -> list[float]:
    out = tmp / "worker.txt"
    (tmp / "delivery_tasks.py").write_text(_WORKER_APP.format(node=f"{HOST}:{nodes[0].port}", out=out))
    producer = redis.Redis(HOST, nodes[1].port, protocol=2)
    argv = [str(Path(sys.executable).with_name("disque")), "worker", "delivery_tasks:app", "--concurrency", "1"]
    try:
        return _process_samples(argv, tmp, out, lambda: producer.execute_command("ADDJOB", "wq", str(time.time()), 0),
                                count, {"PYTHONPATH": str(tmp)})  # fmt: skip
    finally:
        producer.close()


def _dramatiq_argv() -> list[str]:
    return [sys.executable, "-m", "dramatiq", "delivery_actors", "--processes", "1", "--threads", "1"]


def _dramatiq(nodes: list[NodeProcess], tmp: Path, count: int) -> list[float]:
    from disque.contrib.dramatiq import DisqueBroker

    out = tmp / "dramatiq.txt"
    (tmp / "delivery_actors.py").write_text(_DRAMATIQ_APP.format(out=out))
    broker = DisqueBroker([f"{HOST}:{nodes[1].port}"])
    env = {"PYTHONPATH": str(tmp), "DELIVERY_NODE": f"{HOST}:{nodes[0].port}"}
    try:
        return _process_samples(_dramatiq_argv(), tmp, out, lambda: _send(broker, time.time()), count, env)
    finally:
        broker.close()


def _send(broker: Any, sent: float) -> None:
    """The worker's `note` actor, sent from here through `broker`."""
    import dramatiq

    if "note" not in broker.actors:
        dramatiq.actor(lambda sent: None, actor_name="note", queue_name="dq", broker=broker)
    broker.get_actor("note").send(sent)


def _dramatiq_start(nodes: list[NodeProcess], tmp: Path, on: int) -> float:
    """Seconds from starting a Dramatiq worker on node 0 to its first message
    run, with 10 messages added on node `on` before it started."""
    from disque.contrib.dramatiq import DisqueBroker

    out = tmp / f"start-{on}.txt"
    (tmp / "delivery_actors.py").write_text(_DRAMATIQ_APP.format(out=out))
    broker = DisqueBroker([f"{HOST}:{nodes[on].port}"])
    try:
        broker.declare_queue("dq")
        for _ in range(10):
            _send(broker, time.time())
    finally:
        broker.close()
    time.sleep(3)  # an idle cluster: every NEEDJOBS backoff has grown
    env = {"PYTHONPATH": str(tmp), "DELIVERY_NODE": f"{HOST}:{nodes[0].port}"}
    started = time.time()
    proc = subprocess.Popen(_dramatiq_argv(), cwd=tmp, env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait(lambda: len(_lines(out)) >= 10, 60)
        return float(_lines(out)[0].split()[1]) - started
    finally:
        proc.terminate()
        proc.wait(30)


def _have_dramatiq() -> bool:
    try:
        import dramatiq  # noqa: F401
    except ImportError:
        return False
    return True


def run(quick: bool) -> dict[str, Any]:
    count = 30 if quick else 200
    cross = [(a, b) for a in range(3) for b in range(3) if a != b]
    rows: dict[str, list[float]] = {}
    start_figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="disque-bench-delivery-") as tmp:
        base = Path(tmp)
        single = NodeProcess(free_port(), base / "single").start()
        try:
            rows["GETJOB, one node"] = _getjob([single], count, [(0, 0)])
        finally:
            single.stop()
        mports = [free_port() for _ in range(3)]
        nodes = [NodeProcess(free_port(), base / f"node{i}", "--memcache-port", str(mports[i])) for i in range(3)]
        try:
            for node in nodes:
                node.start()
            join(nodes)
            rows["ADDJOB alone, 3 nodes, REPLICATE 3 (reference)"] = _addjob_alone(nodes, count)
            rows["GETJOB, 3 nodes, REPLICATE 3"] = _getjob(nodes, count, cross)
            rows["GETJOB, 3 nodes, REPLICATE 1 RETRY 0"] = _getjob(nodes, count, cross, "REPLICATE", 1, "RETRY", 0)
            rows["memcache get /t=, 3 nodes"] = _memcache_get(nodes, mports, count, cross)
            rows["QNOTIFY + QGET, 3 nodes"] = _groups(nodes, count, cross)
            rows["disque worker --concurrency 1, 3 nodes"] = _worker(nodes, base, count // 2)
            if _have_dramatiq():
                rows["Dramatiq worker, 3 nodes"] = _dramatiq(nodes, base, count // 2)
                start_figures["dramatiq_start_same_node_s"] = _dramatiq_start(nodes, base, 0)
                start_figures["dramatiq_start_other_node_s"] = _dramatiq_start(nodes, base, 1)
        finally:
            for node in nodes:
                node.stop()
    figures: dict[str, Any] = {"samples": count, **start_figures}
    table = []
    for name, samples in rows.items():
        p50, p99 = _percentile(samples, 0.50), _percentile(samples, 0.99)
        figures[name] = {"p50_ms": p50, "p99_ms": p99, "max_ms": max(samples), "mean_ms": statistics.fmean(samples)}
        table.append([name, len(samples), p50, p99, max(samples)])
    print_table("Delivery latency, idle cluster (ms from the producer's request to the consumer's reply)",
                ["consumer", "samples", "p50", "p99", "max"], table)  # fmt: skip
    if start_figures:
        print_table("A Dramatiq worker started on a non-empty queue: s to its first message", ["messages added on", "s"],
                    [["the worker's node", start_figures["dramatiq_start_same_node_s"]],
                     ["another node", start_figures["dramatiq_start_other_node_s"]]])  # fmt: skip
    cross_getjob = figures["GETJOB, 3 nodes, REPLICATE 3"]
    met = {key: cross_getjob[key] <= goal for key, goal in TARGETS.items()}
    print_table("Targets (GETJOB across nodes)", ["figure", "target", "measured", "met"],
                [[key, f"<= {goal}", cross_getjob[key], "yes" if met[key] else "NO"] for key, goal in TARGETS.items()])  # fmt: skip
    figures["targets_met"] = met
    return figures


if __name__ == "__main__":
    run("--quick" in sys.argv)
