"""Delivery latency on real processes, for the paths test_delivery.py does not
time: a memcache `get q/t=...` (pymemcache), QNOTIFY + QGET, a `disque
worker --concurrency 1` and a Dramatiq worker, each connected to one node of
an idle 3-node cluster and fed from another; a Dramatiq worker started on a
queue filled on another node; and INFO federation and its metrics after
pushes.  The bounds are generous (a loaded machine) yet well under what
asking alone gave (a NEEDJOBS broadcast: 0.5 s at the median, seconds at
worst); bench/delivery.py has the figures (docs/performance.md)."""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pymemcache.client.base import Client as Memcache
from support import wait_for

from disque.testing.devcluster import NodeProcess, free_port, join

PAIRS = [(a, b) for a in range(3) for b in range(3) if a != b]  # (consumer's node, producer's node)


class Nodes:
    """Three joined nodes, each with a memcache port (keys echoed, for
    pymemcache) and a metrics port."""

    def __init__(self, base: Path) -> None:
        self.mports = [free_port() for _ in range(3)]
        self.hports = [free_port() for _ in range(3)]
        self.nodes = [
            NodeProcess(free_port(), base / f"node{i}", "--memcache-port", str(self.mports[i]),
                        "--memcache-value-key", "echo", "--metrics-port", str(self.hports[i]))
            for i in range(3)
        ]  # fmt: skip
        self.clients: list[redis.Redis] = []

    def r(self, i: int) -> redis.Redis:
        return self.clients[i]

    def blocked(self, i: int) -> int:
        return int(self.r(i).info("clients")["blocked_clients"])

    def address(self, i: int) -> str:
        return f"{self.nodes[i].host}:{self.nodes[i].port}"


@pytest.fixture(scope="module")
def c3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    nodes = Nodes(tmp_path_factory.mktemp("paths"))
    try:
        for node in nodes.nodes:
            node.start()
        join(nodes.nodes)
        nodes.clients = [redis.Redis(n.host, n.port, protocol=2) for n in nodes.nodes]
        yield nodes
    finally:
        for client in nodes.clients:
            client.close()
        for node in nodes.nodes:
            node.stop()


def sample(blocks: Callable[[], Any], blocked: Callable[[], bool], produce: Callable[[], Any]) -> float:
    """Seconds from `produce()` to `blocks()` returning, once `blocked()`."""
    done: list[float] = []
    thread = threading.Thread(target=lambda: done.append(time.monotonic()) if blocks() else None)
    thread.start()
    wait_for(blocked, what="the consumer to block")
    time.sleep(random.uniform(0.02, 0.08))  # an idle cluster: the producer comes later
    start = time.monotonic()
    produce()
    thread.join(30)
    assert done, "the consumer got nothing"
    return done[0] - start


def assert_fast(seconds: list[float]) -> None:
    assert statistics.median(seconds) < 0.1 and max(seconds) < 1.0, seconds


def test_a_memcache_get_waiting_on_one_node_gets_an_item_set_on_another(c3: Nodes) -> None:
    def one(a: int, b: int) -> float:
        reader, writer = (Memcache(("127.0.0.1", c3.mports[i]), timeout=30) for i in (a, b))
        before = c3.blocked(a)
        try:
            return sample(lambda: reader.get("mq/t=20000") == b"x", lambda: c3.blocked(a) > before,
                          lambda: writer.set("mq", b"x", noreply=False))  # fmt: skip
        finally:
            reader.close()
            writer.close()

    assert_fast([one(a, b) for a, b in PAIRS])


def test_qnotify_then_qget_on_one_node_gets_an_event_added_on_another(c3: Nodes) -> None:
    def take(a: int) -> Any:
        while True:  # as a consumer does: QNOTIFY says an event may be there, QGET may still find none
            c3.r(a).execute_command("QNOTIFY", "g", 20, "gq")
            if (got := c3.r(a).execute_command("QGET", "gq", "g", "EX", 0)) is not None:
                return got

    def one(a: int, b: int) -> float:
        before = c3.blocked(a)
        return sample(lambda: take(a), lambda: c3.blocked(a) > before, lambda: c3.r(b).execute_command("QADD", "gq", 3600, "x"))

    assert_fast([one(a, b) for a, b in PAIRS])


WORKER_APP = '''
import time
from disque.client.worker import App

app = App(["{node}"])


@app.job("wq")
def note(job):
    with open("{out}", "a") as f:
        f.write("%f\\n" % (time.time() - float(job.body.decode())))
'''

DRAMATIQ_APP = '''
import os
import time

import dramatiq
from disque.contrib.dramatiq import DisqueBroker

dramatiq.set_broker(DisqueBroker(["{node}"]))


@dramatiq.actor(queue_name="{queue}")
def note(sent):
    with open("{out}", "a") as f:
        f.write("%f %f\\n" % (time.time() - sent, time.time()))
'''


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def noted(argv: list[str], cwd: Path, out: Path, produce: Callable[[int], Any], count: int) -> list[float]:
    """The ages a worker process noted for `count` jobs, one at a time
    (`produce(n)` on a node of its choice), after a first one that tells
    the worker runs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        produce(0)
        wait_for(lambda: lines(out), 60, what="the worker to run")
        for n in range(1, count + 1):
            time.sleep(random.uniform(0.05, 0.1))  # the worker is blocked again, and the cluster idle
            produce(n)
            wait_for(lambda: len(lines(out)) > n, what=f"job {n} to be run")
        return [float(line.split()[0]) for line in lines(out)[1:]]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_disque_worker_on_one_node_runs_jobs_added_on_the_others(c3: Nodes, tmp_path: Path) -> None:
    out = tmp_path / "ages.txt"
    (tmp_path / "paths_tasks.py").write_text(WORKER_APP.format(node=c3.address(0), out=out))
    argv = [sys.executable, "-m", "disque.cli", "worker", "paths_tasks:app", "--concurrency", "1"]
    ages = noted(argv, tmp_path, out, lambda n: c3.r(1 + n % 2).execute_command("ADDJOB", "wq", str(time.time()), 0), 6)
    assert_fast(ages)


DRAMATIQ = [sys.executable, "-m", "dramatiq", "paths_actors", "--processes", "1", "--threads", "1"]


def send(c3: Nodes, i: int, queue: str) -> None:
    from dramatiq import Message

    message = Message(queue_name=queue, actor_name="note", args=(time.time(),), kwargs={}, options={})
    c3.r(i).execute_command("ADDJOB", queue, message.encode(), 0)


def test_a_dramatiq_worker_on_one_node_runs_messages_sent_on_the_others(c3: Nodes, tmp_path: Path) -> None:
    pytest.importorskip("dramatiq")
    out = tmp_path / "ages.txt"
    (tmp_path / "paths_actors.py").write_text(DRAMATIQ_APP.format(node=c3.address(0), queue="dq", out=out))
    assert_fast(noted(DRAMATIQ, tmp_path, out, lambda n: send(c3, 1 + n % 2, "dq"), 6))


def test_a_dramatiq_worker_started_on_a_queue_filled_on_another_node_runs_it_at_once(c3: Nodes, tmp_path: Path) -> None:
    """From the moment its consumer is connected (named
    `dramatiq:<host>:<pid>:<queue>`, in CLIENT LIST) to its first message
    run: the messages wait on node 1, the worker is on node 0."""
    pytest.importorskip("dramatiq")
    out = tmp_path / "runs.txt"
    (tmp_path / "paths_actors.py").write_text(DRAMATIQ_APP.format(node=c3.address(0), queue="sq", out=out))
    for _ in range(10):
        send(c3, 1, "sq")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(DRAMATIQ, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def connected() -> float | None:
            names = [c["name"] for c in c3.r(0).client_list()]
            return time.time() if any(n.endswith(":sq") and n.startswith("dramatiq:") for n in names) else None

        since = wait_for(connected, 60, interval=0.005, what="the worker's consumer to connect")
        wait_for(lambda: len(lines(out)) >= 10, 30, what="every message to be run")
        first_run = min(float(line.split()[1]) for line in lines(out))
        assert first_run - since < 1.0, first_run - since
    finally:
        proc.terminate()
        proc.wait(30)


def test_info_federation_and_its_metrics_count_the_pushes(c3: Nodes) -> None:
    def fields(i: int) -> dict[str, int]:
        return {k: int(v) for k, v in c3.r(i).info("federation").items()}

    before = [fields(i) for i in range(3)]
    assert all(f["peers_without_waiting"] == 0 for f in before)
    seconds = sample(lambda: c3.r(0).execute_command("GETJOB", "TIMEOUT", 20_000, "FROM", "fq"), lambda: c3.blocked(0) > 0,
                     lambda: c3.r(1).execute_command("ADDJOB", "fq", "x", 0, "REPLICATE", 1, "RETRY", 0))  # fmt: skip
    assert seconds < 1.0
    consumer, producer = fields(0), fields(1)
    assert consumer["jobs_pushed_in"] == before[0]["jobs_pushed_in"] + 1
    assert producer["jobs_pushed_out"] == before[1]["jobs_pushed_out"] + 1
    assert consumer["waiting_sent"] > before[0]["waiting_sent"] and producer["waiting_received"] > before[1]["waiting_received"]

    def metrics() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{c3.hports[1]}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("disque_federation_"))}

    # rendered at most once a second: the push shows within one
    got = wait_for(lambda: m if (m := metrics())["disque_federation_jobs_pushed_out_total"] == producer["jobs_pushed_out"] else None)
    assert got["disque_federation_peers_without_waiting"] == 0
    assert got["disque_federation_waiting_received_total"] >= producer["waiting_received"]
