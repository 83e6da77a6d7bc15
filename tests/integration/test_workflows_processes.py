"""Jobs that wait for jobs and results on a real 3-node cluster with the AOF
on (docs/workflows.md): a child held on every node until its parent is
acknowledged elsewhere, queued once, learned by a node killed with -9 and
restarted; a result that survives kill -9 of the node that took the ACK;
a worker's handler that reads its parents' results."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import pytest

from clusterkit import Cluster

from disque.client import Client, Job
from disque.client.worker import App, Worker


@pytest.fixture
def cluster(tmp_path: Path):
    with Cluster(tmp_path, 3, "--appendonly", "yes", "--appendfsync", "always") as c:
        yield c


def queued(cluster: Cluster, job_id: str) -> list[int]:
    return [i for i, state in cluster.holders(job_id, cluster.live()).items() if state == "queued"]


def test_a_child_is_released_once_and_a_killed_node_learns_it_when_back(cluster):
    parent = cluster.addjob(0, "parents", "p", 5000, "REPLICATE", 3, "RETRY", 60)
    child = cluster.addjob(1, "children", "c", 5000, "REPLICATE", 3, "RETRY", 2, "AFTER", parent)
    assert set(cluster.holders(child).values()) == {"active"}
    assert cluster.show(2, child)["waits-for"] == [parent.encode()]
    cluster.kill(2)  # a holder of both jobs dies
    (fetched,) = cluster.call(0, "GETJOB", "FROM", "parents")
    assert fetched[1].decode() == parent
    assert cluster.call(0, "ACKJOB", parent, "RESULT", "from the parent") == 1
    cluster.wait(lambda: len(queued(cluster, child)) == 1, what="the child queued")
    cluster.restart(2)  # its AOF holds the child, still waiting
    cluster.wait(lambda: "waits-for" not in (cluster.show(2, child) or {}), timeout=15, what="node 2 learns the release")
    cluster.wait(lambda: cluster.call(2, "RESULT", parent) == b"from the parent", timeout=15, what="node 2 keeps the result")
    assert cluster.show(2, child)["after"] == [parent.encode()]  # the parents, kept by the AOF after the release
    (taken,) = cluster.call(0, "GETJOB", "TIMEOUT", 5000, "COUNT", 10, "FROM", "children")  # (wherever it is queued)
    assert taken[1].decode() == child and cluster.call(0, "ACKJOB", child) == 1
    cluster.wait(lambda: cluster.holders(child) == {}, timeout=15, what="every copy collected: none queued again")
    assert cluster.call(1, "RESULT", parent) == b"from the parent"


def test_a_result_survives_kill_9_of_the_node_that_took_the_ack(cluster):
    job_id = cluster.addjob(0, "q", "x", 5000, "REPLICATE", 1)
    (fetched,) = cluster.call(0, "GETJOB", "FROM", "q")
    assert cluster.call(0, "ACKJOB", fetched[1], "RESULT", "kept") == 1
    cluster.kill(0)
    cluster.restart(0)
    assert cluster.call(0, "RESULT", job_id) == b"kept"
    assert cluster.call(0, "WAITJOB", job_id, "WITHRESULTS") == [1, [b"kept"]]


def test_a_batch_callback_fires_once_and_a_node_killed_with_9_learns_it(cluster):
    def shown(i: int) -> dict[str, object]:
        reply = cluster.call(i, "BATCH", "SHOW", batch)
        return {k.decode(): v for k, v in zip(reply[::2], reply[1::2])}

    batch = cluster.call(0, "BATCH", "NEW", "ON-SUCCESS", "callbacks", "all good").decode()
    jobs = [cluster.addjob(i, "work", f"j{i}", 5000, "REPLICATE", 2, "RETRY", 2, "BATCH", batch) for i in range(3)]
    assert cluster.call(1, "BATCH", "CLOSE", batch) == b"OK"
    cluster.wait(lambda: all(shown(i)["closed"] == 1 and shown(i)["jobs"] == 3 for i in range(3)), what="known everywhere")
    cluster.kill(2)
    for _ in jobs:
        (taken,) = cluster.call(0, "GETJOB", "TIMEOUT", 5000, "FROM", "work")  # (a copy on node 2 is requeued elsewhere)
        assert cluster.call(0, "ACKJOB", taken[1]) == 1
    cluster.wait(lambda: shown(0)["success-fired"] == 1, timeout=15, what="the callback fired")
    cluster.restart(2)  # its AOF has the batch as it knew it; its peers tell it the rest
    cluster.wait(lambda: shown(2)["success-fired"] == 1 and shown(2)["pending"] == 0, timeout=15, what="node 2 learns it")
    (callback,) = cluster.call(1, "GETJOB", "TIMEOUT", 5000, "FROM", "callbacks")
    assert callback[2] == b"all good" and cluster.call(1, "ACKJOB", callback[1]) == 1
    cluster.wait(lambda: cluster.holders(callback[1].decode()) == {}, timeout=15, what="the callback collected")
    assert all(cluster.call(i, "QLEN", "callbacks") == 0 for i in range(3))  # fired once


def test_a_workers_handler_reads_its_parents_results(cluster):
    addresses = [f"{node.host}:{node.port}" for node in cluster.nodes]
    app = App(addresses)
    seen: list[dict[str, bytes | None] | None] = []

    @app.job("resize")
    def resize(job: Job) -> str:
        return f"{job.body.decode()}: 64x64"

    @app.job("zip", parent_results=True)
    def zip_all(job: Job) -> bytes:
        seen.append(job.parent_results)
        assert job.parent_results is not None
        return b"; ".join(result or b"?" for result in job.parent_results.values())

    producers = [Client(address) for address in addresses]
    try:  # each parent added, and so acknowledged, through its own node
        parts = [producer.add_job("resize", f"{name}.png") for producer, name in zip(producers, "abc")]
        final = producers[1].add_job("zip", "all", after=parts)

        async def main() -> bytes | None:
            worker = Worker(app)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(functools.partial(worker.run, signals=False))
                archive = await anyio.to_thread.run_sync(final.wait, 30)
                worker.stop()
            return archive

        assert anyio.run(main) == b"a.png: 64x64; b.png: 64x64; c.png: 64x64"
        assert seen == [dict(zip(parts, [b"a.png: 64x64", b"b.png: 64x64", b"c.png: 64x64"]))]
        assert [producer.result(part) for producer, part in zip(producers, parts)] == [b"a.png: 64x64", b"b.png: 64x64", b"c.png: 64x64"]
    finally:
        for producer in producers:
            producer.close()
        app.close()
