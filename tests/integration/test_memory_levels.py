"""Memory levels on real processes: upstream's cluster test "ADDJOB, single
node in OOM, external replication (REPL 1)" and "(REPL 2)".  One node of
seven gets `maxmemory 3mb` and ADDJOBs until SHOW there no longer finds the
job just added: past 75 % of maxmemory (the warning level) it keeps no copy
and places the job on REPLICATE other nodes, where it is queued.  With the
limit reset, it keeps local copies again.  Then consumer groups: their
memory is counted, and a new one is refused at the refusal level."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from clusterkit import Cluster
from disque.testing.devcluster import NodeProcess
from integration.rawsock import rss as rss_bytes

FAST = ("--cluster-node-timeout", "1000")
BATCH = 100  # ADDJOBs pipelined at a time (each one still waits for its replicas)


@pytest.fixture(scope="module")
def c7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("c7"), 7, *FAST) as cluster:
        yield cluster


def memory(cluster: Cluster, i: int) -> dict[str, object]:
    return cluster.client(i).info("memory")


def add_until_placed_elsewhere(cluster: Cluster, i: int, repl: int) -> str:
    """ADDJOB REPLICATE `repl` on node i until SHOW there misses the job it
    just added; every ADDJOB must be answered with an ID."""
    for _ in range(600):  # read-behind moves jobs to disk: a slot each stays (88 B)
        pipe = cluster.client(i).pipeline(transaction=False)
        for _ in range(BATCH):
            pipe.execute_command("ADDJOB", "oomq", "myjob", 5000, "REPLICATE", repl)
        ids = [job_id.decode() for job_id in pipe.execute()]  # an error reply raises
        assert all(job_id.startswith("DI") for job_id in ids), ids
        pipe = cluster.client(i).pipeline(transaction=False)
        for job_id in ids:
            pipe.execute_command("SHOW", job_id)
        missing = [job_id for job_id, shown in zip(ids, pipe.execute()) if shown is None]
        if missing:
            return missing[0]
    raise AssertionError(f"node {i} kept a copy of every job: {memory(cluster, i)}")


@pytest.mark.parametrize("repl", [1, 2])
def test_a_node_past_the_warning_level_places_new_jobs_on_other_nodes(c7: Cluster, repl: int) -> None:
    c7.heal()
    full = 3
    assert c7.call(full, "CONFIG", "SET", "maxmemory", 3 << 20) == b"OK"
    try:
        job_id = add_until_placed_elsewhere(c7, full, repl)
        fields = memory(c7, full)  # at the edge: the records waiting for their replicas come and go
        assert fields["used_memory_peak"] > (3 << 20) // 100 * 75 and fields["mem_level"] < 2, fields
        others = [i for i in c7.live() if i != full]

        def placed() -> dict[int, str] | None:
            holders = c7.holders(job_id, others)
            states = set(holders.values())
            return holders if len(holders) >= repl and states <= {"queued", "active"} and "queued" in states else None

        holders = c7.wait(placed, 10, f"job {job_id} queued on {repl} other node(s)")
        assert full not in holders and c7.show(full, job_id) is None
        assert c7.call(full, "INFO", "jobs")["registered_jobs"] > 0  # the copies it took before the warning level
    finally:
        assert c7.call(full, "CONFIG", "SET", "maxmemory", "1gb") == b"OK"
    assert memory(c7, full)["mem_level_name"] == "ok"
    job_id = c7.addjob(full, "oomq", "myjob", 5000, "REPLICATE", repl)
    assert c7.show(full, job_id)["state"] == b"queued"  # a local copy again


def test_new_consumer_groups_are_counted_and_refused_at_the_refusal_level(spawn: Callable[..., NodeProcess]) -> None:
    """QGETs with new group names fill the account until a new group is
    refused with -OOM (the process grew with it, as much as the account
    says, give or take 20 %); the groups made before keep reading."""
    node = spawn("--maxmemory", "16mb")
    r = redis.Redis(port=node.port)
    for body in ("a", "b"):
        r.execute_command("QADD", "events", 600, body)
    made, refusal = 0, None
    while refusal is None and made < 200_000:
        pipe = r.pipeline(transaction=False)
        for i in range(1000):
            pipe.execute_command("QGET", "events", "g%d" % (made + i), "EX", 0)
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception):
                refusal = str(reply)
                break
            made += 1
    fields = r.info("memory")
    assert refusal == "command not allowed when used memory > 'maxmemory'." and fields["mem_level_name"] == "oom"
    assert made > 20_000 and r.info("groups")["consumer_groups"] == made
    grown = rss_bytes(node.pid) - fields["used_memory_startup"]
    assert abs(grown - fields["used_memory"]) <= 0.2 * fields["used_memory"], (grown, fields)
    assert r.execute_command("QGET", "events", "g0", "EX", 0)[1] == b"b"
    r.close()
