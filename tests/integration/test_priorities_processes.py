"""Job priorities on real processes: a 3-node cluster whose replicas and AOF
keep a job's priority through kill -9 and restarts, the serving order after
them, and the clients that set one (the Python client and worker, the
Dramatiq broker, memcache SET with a queue's default)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import dramatiq
import redis
from clusterkit import Cluster
from support import wait_for

from disque.client import Client
from disque.client.worker import App
from disque.contrib.dramatiq import DisqueBroker
from disque.testing.devcluster import NodeProcess, free_port

JOBS = {"low": 1, "high": 9, "plain": None, "urgent": 8}  # body -> PRIORITY (None: the default, 5)
ORDER = [b"high", b"urgent", b"plain", b"low"]


def priority_of(shown: dict) -> int:
    return int(shown.get("priority", 5))


def peek_priorities(cluster: Cluster, i: int, queue: str) -> list[int]:
    return [int(e[4]) if len(e) > 3 else 5 for e in cluster.call(i, "QPEEK", queue, 100)]


def test_replicas_and_the_aof_keep_priorities_through_kill_9_and_restarts(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, "--appendonly", "yes", "--appendfsync", "always", "--priority-aging", "0") as cluster:
        ids = {}
        for body, priority in JOBS.items():
            opts = ("REPLICATE", 3, "RETRY", 1, *(("PRIORITY", priority) if priority is not None else ()))
            ids[body] = cluster.addjob(0, "pq", body, 5000, *opts)
        assert [e[2] for e in cluster.call(0, "QPEEK", "pq", 10)] == ORDER
        for i in cluster.indexes:  # every copy agrees
            assert {b: priority_of(cluster.show(i, job_id)) for b, job_id in ids.items()} == {b: p or 5 for b, p in JOBS.items()}

        cluster.kill(0)  # the replicas queue the jobs again after RETRY, each keeping its priority
        wait_for(lambda: sum(cluster.qlen(i, "pq") for i in (1, 2)) >= len(JOBS), timeout=20, what="the replicas to requeue")
        for i in (1, 2):
            priorities = peek_priorities(cluster, i, "pq")
            assert priorities == sorted(priorities, reverse=True), (i, priorities)

        cluster.restart(0)  # its AOF replayed: the priorities are those it wrote
        for body, job_id in ids.items():
            shown = wait_for(lambda: cluster.show(0, job_id), timeout=10, what="the replayed job")
            assert priority_of(shown) == (JOBS[body] or 5)

        cluster.restart_all()  # a clean restart of every node: queued again in serving order
        queued = lambda: {e[2] for i in cluster.indexes for e in cluster.call(i, "QPEEK", "pq", 100)}  # noqa: E731
        wait_for(lambda: queued() >= set(ORDER), timeout=20, what="every job queued again somewhere")
        for i in cluster.indexes:
            priorities = peek_priorities(cluster, i, "pq")
            assert priorities == sorted(priorities, reverse=True), (i, priorities)
        got: set[bytes] = set()

        def take() -> bool:  # a copy may move to a node already asked (NEEDJOBS): ask again until all came
            for i in cluster.indexes:
                got.update(e[2] for e in cluster.call(i, "GETJOB", "NOHANG", "COUNT", 10, "FROM", "pq") or [])
            return got == set(ORDER)

        wait_for(take, timeout=20, what="every job served")
        assert cluster.call(0, "ACKJOB", *ids.values()) >= 1


def test_the_client_the_worker_and_dramatiq_set_it(spawn: Callable[..., NodeProcess], tmp_path: Path) -> None:
    node = spawn("--priority-aging", "0")
    address = f"{node.host}:{node.port}"
    with Client([address]) as client:
        low = client.add_job("cq", "low", priority=0)
        high = client.add_job("cq", "high", priority=9)
        assert (client.show(low).priority, client.show(high).priority) == (0, 9)
        assert [job.body for job in client.get_jobs("cq", count=2)] == [b"high", b"low"]

    app = App([address])

    @app.job("wq", priority=7)
    def handle(job):  # the handler is not run here: only its jobs are sent
        pass

    sent = handle.send("x")
    overridden = handle.send("y", priority=2)
    with Client([address]) as client:
        assert (client.show(sent).priority, client.show(overridden).priority) == (7, 2)
    app.close()

    broker = DisqueBroker([address])
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="dq", broker=broker)
    def task(n):
        pass

    task.send_with_options(args=(1,), broker_priority=3)
    task.send_with_options(args=(2,), broker_priority=42)  # held to 9
    task.send(3)
    broker.close()
    with redis.Redis(host=node.host, port=node.port, protocol=2) as r:
        entries = r.execute_command("QPEEK", "dq", 10)
        assert [e[3:] for e in entries] == [[b"priority", 9], [], [b"priority", 3]]
        assert r.execute_command("QSTAT", "dq")[-1] == [9, 1, 5, 1, 3, 1]


def test_memcache_set_takes_the_queues_default(spawn: Callable[..., NodeProcess]) -> None:
    port = free_port()
    node = spawn("--queue", "urgent", "priority", "8", "--memcache-port", str(port), "--memcache-auth", "loopback")
    with socket.create_connection((node.host, port), timeout=10) as sock:
        sock.sendall(b"set urgent 0 0 2\r\nhi\r\n")
        assert sock.recv(100) == b"STORED\r\n"
    with redis.Redis(host=node.host, port=node.port, protocol=2) as r:
        [entry] = r.execute_command("QPEEK", "urgent", 1)
        assert entry[2:] == [b"hi", b"priority", 8]
