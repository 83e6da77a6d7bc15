"""Limits on real processes (docs/limits.md): a 3-node cluster with the AOF
on, consumers on every node, a queue at `concurrency 5`; how many jobs
were out at once is read from the consumers' own history (from the GETJOB
reply to the ACK sent), never from what the nodes report.  The limit holds
while the cluster is connected, and again after every node was killed with
SIGKILL and started from its AOF."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import anyio
import pytest
import redis
from client_helpers import queue, shared_node  # noqa: F401  (fixtures)

from clusterkit import Cluster
from disque.client import Client, Job
from disque.client.worker import App, BadSetting, Worker
from disque.testing.devcluster import NodeProcess

FAST = ("--cluster-node-timeout", "1000", "--appendonly", "yes")


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an interval closes before one opening at the same time)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def consume(
    cluster: Cluster, queue: str, per_node: int, seconds: float, hold: float, ids: dict[tuple[float, float], bytes] | None = None,
    where: dict[bytes, int] | None = None,
) -> list[tuple[float, float]]:
    """`per_node` consumers on each node take jobs for `seconds`, hold each
    `hold` seconds and acknowledge it: their (got, acknowledged) times (and
    the job of each in `ids`, the port that handed it out in `where`)."""
    history: list[tuple[float, float]] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def consumer(port: int) -> None:
        client = redis.Redis(port=port, socket_timeout=10)
        try:
            while time.monotonic() < stop:
                reply = client.execute_command("GETJOB", "TIMEOUT", 200, "FROM", queue)
                if not reply:
                    continue
                got = time.monotonic()
                time.sleep(hold)
                ended = time.monotonic()
                client.execute_command("ACKJOB", reply[0][1])
                with lock:
                    history.append((got, ended))
                    if ids is not None:
                        ids[got, ended] = reply[0][1]
                    if where is not None:
                        where[reply[0][1]] = port
        finally:
            client.close()

    threads = [threading.Thread(target=consumer, args=(node.port,)) for node in cluster.nodes for _ in range(per_node)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return history


def killed_and_restarted(cluster: Cluster) -> range:
    """Every node killed with SIGKILL, then started from its AOF: their indexes."""
    for i in cluster.indexes:
        cluster.kill(i)
    for i in cluster.indexes:
        cluster.restart(i)
    cluster.wait_healthy()
    return cluster.indexes


def setting(cluster: Cluster, i: int, queue: str, option: bytes) -> object:
    """QCONFIG GET's value of `option` on node `i`."""
    return dict(zip(*[iter(cluster.call(i, "QCONFIG", queue, "GET"))] * 2))[option]


def add_jobs(cluster: Cluster, queue: str, n: int) -> None:
    for i in range(n):
        # (RETRY counts from when a job was queued, and a retry that fires frees its slot: long enough
        # never to fire while a consumer holds a job for 20 ms)
        cluster.call(i % len(cluster), "ADDJOB", queue, f"job {i}", 5000, "REPLICATE", 2, "RETRY", 600)


@pytest.mark.slow
def test_concurrency_holds_on_a_real_cluster_and_after_kill_9(tmp_path: Path) -> None:
    with Cluster(tmp_path / "c3", 3, *FAST) as cluster:
        assert cluster.call(0, "QCONFIG", "reports", "SET", "concurrency", 5) == b"OK"
        cluster.wait(lambda: all(cluster.call(i, "QCONFIG", "LIST") == [b"reports"] for i in cluster.indexes), what="QSET everywhere")
        add_jobs(cluster, "reports", 2000)
        history = consume(cluster, "reports", per_node=10, seconds=12, hold=0.02)
        print(f"concurrency 5, 30 consumers: {len(history)} jobs in 12 s, at most {most_at_once(history)} out at once")
        assert most_at_once(history) <= 5
        assert len(history) >= 100, len(history)  # (not starved: the five slots kept busy)
        assert {setting(cluster, i, "reports", b"concurrency") for i in killed_and_restarted(cluster)} == {5}
        add_jobs(cluster, "reports", 2000)
        again = consume(cluster, "reports", per_node=10, seconds=8, hold=0.02)
        print(f"after kill -9 of every node: {len(again)} jobs in 8 s, at most {most_at_once(again)} out at once")
        assert most_at_once(again) <= 5 and len(again) >= 50, len(again)


@pytest.mark.slow
def test_concurrency_per_key_holds_on_a_real_cluster(tmp_path: Path) -> None:
    with Cluster(tmp_path / "k3", 3, *FAST) as cluster:
        cluster.call(0, "QCONFIG", "customers", "SET", "concurrency-per-key", 1)
        cluster.wait(lambda: all(cluster.call(i, "QCONFIG", "LIST") == [b"customers"] for i in cluster.indexes), what="QSET everywhere")
        keys = {}
        for k in range(600):
            job_id = cluster.call(k % 3, "ADDJOB", "customers", "x", 5000, "REPLICATE", 2, "RETRY", 600, "KEY", f"c{k % 6}")
            keys[job_id] = k % 6
        ids: dict[tuple[float, float], bytes] = {}
        history = consume(cluster, "customers", per_node=4, seconds=10, hold=0.02, ids=ids)
        worst = max(most_at_once([span for span in history if keys[ids[span]] == key]) for key in range(6))
        print(f"concurrency-per-key 1, 6 keys, 12 consumers: {len(history)} jobs in 10 s, at most {worst} of a key "
              f"and {most_at_once(history)} in all out at once")  # fmt: skip
        assert worst == 1 and most_at_once(history) > 1 and len(history) >= 60


def ordered_run(cluster: Cluster, per_key: int, seconds: float) -> tuple[int, int]:
    """Jobs of 6 keys on the ordered queue `payments`, each of five keys'
    added on one node, the sixth's on each node in turn; consumers on every node.  (jobs served, the most out at once
    in all), once the history shows one job of a key out at a time, in
    creation order (a key's jobs move between nodes together, and its home
    lets out its oldest wherever it is queued), and some
    handed out by a node other than the one they were added to."""
    order: dict[bytes, tuple[int, int]] = {}  # job ID -> (key, its place among the key's)
    for n in range(per_key * 6):
        key = n % 6
        job_id = cluster.call(key % 3 if key < 5 else n // 6 % 3, "ADDJOB", "payments", f"{key}.{n // 6}", 5000, "REPLICATE", 2, "RETRY", 600, "KEY", f"k{key}")
        order[job_id] = key, n // 6
    ids: dict[tuple[float, float], bytes] = {}
    where: dict[bytes, int] = {}
    history = consume(cluster, "payments", per_node=4, seconds=seconds, hold=0.02, ids=ids, where=where)
    for key in range(6):
        spans = sorted(span for span in history if order[ids[span]][0] == key)
        assert most_at_once(spans) == 1, key
        assert [order[ids[span]][1] for span in spans] == list(range(per_key)), key
    assert len(history) == len(order)  # every job served, none twice
    assert any(where[job_id] != cluster.nodes[key % 3].port for job_id, (key, _) in order.items() if key < 5)  # (they moved)
    return len(history), most_at_once(history)


@pytest.mark.slow
def test_ordered_keys_hold_on_a_real_cluster_and_after_kill_9(tmp_path: Path) -> None:
    with Cluster(tmp_path / "o3", 3, *FAST) as cluster:
        cluster.call(0, "QCONFIG", "payments", "SET", "ordered", "yes")
        cluster.wait(lambda: all(cluster.call(i, "QCONFIG", "LIST") == [b"payments"] for i in cluster.indexes), what="QSET everywhere")
        served, most = ordered_run(cluster, 40, 10)
        print(f"ordered, 6 keys, 12 consumers: {served} jobs, one of a key out at a time, {most} in all at once")
        assert most > 1  # the keys went in parallel
        assert {setting(cluster, i, "payments", b"ordered") for i in killed_and_restarted(cluster)} == {b"yes"}
        served, most = ordered_run(cluster, 20, 8)
        print(f"after kill -9 of every node: {served} jobs, one of a key out at a time, {most} in all at once")


def test_a_workers_limits_become_the_queues_setting(shared_node: NodeProcess, queue: str) -> None:
    with pytest.raises(ValueError, match="rate must be"):
        App().job("x", rate="100/day")
    app = App(f"{shared_node.host}:{shared_node.port}")
    seen: list[bytes] = []
    worker: Worker | None = None

    @app.job(queue, rate="100/s", concurrency=5, ordered=True)
    async def stripe(job: Job) -> None:
        seen.append(job.body)
        assert worker is not None
        worker.stop()

    assert app.limits == {queue: ["rate-limit", "100/s", "concurrency", 5, "ordered", "yes"]}
    with Client(app.nodes) as c:
        c.add_job(queue, "charge")
        worker = Worker(app)
        anyio.run(functools.partial(worker.run, signals=False))
        limits = dict(zip(*[iter(c.execute_command("QCONFIG", queue, "GET"))] * 2))
        assert seen == [b"charge"] and limits[b"rate-limit"] == b"100/s" and limits[b"concurrency"] == 5
        assert limits[b"ordered"] == b"yes"
        c.execute_command("QCONFIG", queue, "DEL")


def test_a_refused_limit_stops_the_worker_with_its_queue(shared_node: NodeProcess, queue: str) -> None:
    app = App(f"{shared_node.host}:{shared_node.port}")
    app.job(queue, concurrency=-1)(lambda job: None)
    with pytest.raises(BadSetting, match=f"the limits of queue '{queue}': concurrency must be a number"):
        anyio.run(functools.partial(Worker(app).run, signals=False))
