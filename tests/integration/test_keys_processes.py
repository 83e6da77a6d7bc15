"""Job keys (ADDJOB ... KEY, docs/keys.md) on real processes: a 3-node
cluster whose replicas and AOF keep a job's key through kill -9 and a
restart, and the Python client and worker that set and read it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import anyio
import dramatiq
from clusterkit import Cluster
from support import wait_for

from disque.client import Client, Job
from disque.client.worker import App, Worker
from disque.contrib.dramatiq import DisqueBroker
from disque.core.homes import ranked
from disque.testing.devcluster import NodeProcess, free_port
from test_metrics import samples


def test_replicas_and_the_aof_keep_the_key_through_kill_9_and_a_restart(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, "--appendonly", "yes", "--appendfsync", "always") as cluster:
        keyed = cluster.addjob(0, "kq", "body", 5000, "REPLICATE", 3, "RETRY", 1, "KEY", "customer-7")
        for i in cluster.indexes:  # every copy has it
            assert cluster.show(i, keyed)["key"] == b"customer-7"
        cluster.kill(0)
        cluster.restart(0)  # its AOF replayed
        shown = wait_for(lambda: cluster.show(0, keyed), timeout=10, what="the replayed job")
        assert shown["key"] == b"customer-7"
        _, found = cluster.call(0, "JSCAN", "KEY", "customer-7")
        assert found == [keyed.encode()]


def test_the_client_and_the_worker_see_the_key(spawn: Callable[..., NodeProcess]) -> None:
    node = spawn()
    address = f"{node.host}:{node.port}"
    with Client([address]) as client:
        job_id = client.add_job("cq", "x", key="tenant-1")
        assert client.show(job_id).key == "tenant-1"
        client.add_job("wq", "y", key="tenant-2")
    seen: list[str | None] = []
    app = App([address])

    @app.job("wq")
    def handle(job: Job) -> None:
        seen.append(job.key)

    worker = Worker(app, burst=True)
    anyio.run(functools.partial(worker.run, signals=False))
    app.close()
    assert seen == ["tenant-2"]


def test_dedup_holds_across_nodes_kill_9_and_restarts(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, "--appendonly", "yes", "--appendfsync", "always") as cluster:
        first = cluster.addjob(0, "dq", "a", 5000, "KEY", "order-9", "DEDUP", 600_000)
        assert [cluster.addjob(i, "dq", "b", 5000, "KEY", "order-9", "DEDUP", 600_000) for i in (1, 2, 0)] == [first] * 3
        home = cluster.index_of(ranked(b"dq\0order-9", cluster.ids)[0])
        cluster.kill(home)  # the standby answers once the home is flagged
        other = next(i for i in cluster.indexes if i != home)
        assert wait_for(
            lambda: cluster.addjob(other, "dq", "c", 5000, "KEY", "order-9", "DEDUP", 600_000) == first, timeout=20,
            what="the standby's answer",
        )
        cluster.restart(home)  # its AOF holds the hold
        assert cluster.addjob(home, "dq", "d", 5000, "KEY", "order-9", "DEDUP", 600_000) == first
        assert sum(int(cluster.call(i, "INFO", "keys")["dedup_hits"]) for i in cluster.live()) >= 1


def test_the_client_sends_dedup_and_metrics_count_the_hits(spawn: Callable[..., NodeProcess]) -> None:
    port = free_port()
    node = spawn("--metrics-port", str(port))
    with Client([f"{node.host}:{node.port}"]) as client:
        first = client.add_job("cq", "x", key="k", dedup=60_000)
        assert client.add_job("cq", "y", key="k", dedup=60_000) == first
        active = client.add_job("cq", "z", key="a", dedup="active")
        assert client.add_job("cq", "w", key="a", dedup="active") == active
        client.ack(active)
        assert client.add_job("cq", "v", key="a", dedup="active") != active
    broker = DisqueBroker([f"{node.host}:{node.port}"])
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="dq", broker=broker)
    def task(n: int) -> None:
        pass

    for n in range(3):
        task.send_with_options(args=(n,), key="order-7", dedup=60_000)
    with Client([f"{node.host}:{node.port}"]) as client:
        assert client.execute_command("QLEN", "dq") == 1
    got = samples(port)
    assert got[("disque_dedup_hits_total", ())] == 4 and got[("disque_keys_held", ())] == 3
    assert got[("disque_dedup_released_total", ())] == 1 and got[("disque_keys_waiting", ())] == 0


def test_keys_take_turns_after_kill_9_and_a_restart(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, "--appendonly", "yes", "--appendfsync", "always") as cluster:
        for n in range(5):
            cluster.addjob(0, "fq", f"big-{n}", 5000, "REPLICATE", 1, "RETRY", 1, "KEY", "big")
        for n in range(2):
            cluster.addjob(0, "fq", f"small-{n}", 5000, "REPLICATE", 1, "RETRY", 1, "KEY", "small")
        cluster.kill(0)
        cluster.restart(0)  # its AOF replayed: the jobs queued again by their retry
        wait_for(lambda: cluster.qlen(0, "fq") == 7, timeout=20, what="the jobs queued again")
        got = [e[2].decode() for e in cluster.call(0, "GETJOB", "COUNT", 7, "FROM", "fq")]
        keys = [body.split("-")[0] for body in got]
        assert keys[:4] in (["big", "small"] * 2, ["small", "big"] * 2) and keys[4:] == ["big"] * 3, got
        assert [b for b in got if b.startswith("big")] == [f"big-{n}" for n in range(5)]  # each key in creation order


def _runs(cluster: Cluster, queue: str) -> list[tuple[str, str]]:
    """Every job of `queue` queued on a live node now, taken and acknowledged: (ID, body)."""
    got = []
    for i in cluster.live():
        for _, job_id, body in cluster.call(i, "GETJOB", "NOHANG", "COUNT", 100, "FROM", queue) or []:
            cluster.call(i, "ACKJOB", job_id)
            got.append((job_id.decode(), body.decode()))
    return got


def test_debounce_runs_the_last_body_across_nodes_kill_9_of_the_home_and_a_restart(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, "--appendonly", "yes", "--appendfsync", "always", "--cluster-node-timeout", "2000") as cluster:
        opts = ("KEY", "doc-3", "RETRY", 2, "REPLICATE", 2)
        ids = [cluster.addjob(i, "bq", f"v{n}", 5000, *opts, "DEBOUNCE", 1500) for n, i in enumerate((0, 1, 2, 0))]
        assert len(set(ids)) == 4 and sum(cluster.qlen(i, "bq") for i in cluster.indexes) == 0
        assert cluster.wait(lambda: _runs(cluster, "bq"), timeout=10, what="the burst's one job") == [(ids[-1], "v3")]
        assert all(cluster.show(i, j) is None for i in cluster.indexes for j in ids[:-1])
        # The home killed with a job pending: its standby supersedes it, and the
        # copy the home keeps in its AOF goes when it comes back.
        home, standby = (cluster.index_of(n) for n in ranked(b"bq\0doc-3", cluster.ids)[:2])
        pending = cluster.addjob(home, "bq", "w0", 5000, *opts, "DEBOUNCE", 8000)
        cluster.kill(home)
        cluster.wait(lambda: cluster.flags(standby, home) & {"fail?", "fail"}, timeout=20, what="the home flagged")
        last = cluster.addjob(standby, "bq", "w1", 5000, *opts, "DEBOUNCE", 8000)
        assert int(cluster.call(standby, "INFO", "keys")["debounce_superseded"]) >= 1
        cluster.restart(home)
        runs = cluster.wait(lambda: _runs(cluster, "bq"), timeout=15, what="the second burst's job")
        assert runs == [(last, "w1")]
        cluster.wait(lambda: cluster.show(home, pending) is None, timeout=10, what="the superseded copy dropped")
        assert _runs(cluster, "bq") == [] and all(cluster.show(i, pending) is None for i in cluster.indexes)


def test_the_client_and_the_dramatiq_broker_send_debounce(spawn: Callable[..., NodeProcess]) -> None:
    node = spawn()
    address = f"{node.host}:{node.port}"
    broker = DisqueBroker([address])
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="bdq", broker=broker)
    def task(n: int) -> None:
        pass

    for n in range(3):
        task.send_with_options(args=(n,), key="doc-1", debounce=300)
    with Client([address]) as client:
        first = client.add_job("bcq", "x", key="k", debounce=300)
        last = client.add_job("bcq", "y", key="k", debounce=300)
        assert first != last and client.show(first) is None
        wait_for(lambda: client.execute_command("QLEN", "bcq") == 1, timeout=5, what="the last job queued")
        assert client.show(last).body == b"y"
        wait_for(lambda: client.execute_command("QLEN", "bdq") == 1, timeout=5, what="the last message queued")
        [[_, _, body]] = client.execute_command("GETJOB", "FROM", "bdq")
        assert list(dramatiq.Message.decode(body).args) == [2]
    broker.close()
