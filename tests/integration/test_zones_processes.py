"""Zones on real processes (docs/zones.md): six nodes in three zones of two.
REPLICATE 3 puts one copy in each zone; with a whole zone killed, ZONES 3
gets -NOREPL while ZONES 2 still works, and every job acknowledged before
is still there, delivered by the two zones left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from clusterkit import Cluster

ZONES = ("z0", "z0", "z1", "z1", "z2", "z2")


@pytest.fixture
def c6(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, 6, "--cluster-node-timeout", "1000") as cluster:
        for i, zone in enumerate(ZONES):
            assert cluster.call(i, "CONFIG", "SET", "zone", zone) == b"OK"
        cluster.wait(
            lambda: all(sorted(n["zone"] for n in cluster.nodes_view(i).values()) == list(ZONES) for i in range(6)),
            what="every node knows every zone",
        )
        yield cluster


@pytest.mark.timeout(120)
def test_a_cluster_in_three_zones_survives_the_loss_of_one(c6: Cluster) -> None:
    hello = c6.call(0, "HELLO")
    assert sorted(entry[4].decode() for entry in hello[2:]) == sorted(ZONES)
    assert c6.info(0)["cluster_reachable_zones"] == "3"
    assert b"zone:z0\r\n" in c6.raw(0, "INFO", "server")
    jobs = []
    for n in range(12):
        job_id = c6.addjob(n % 6, "zq", f"job {n}", 5000, "REPLICATE", 3, "RETRY", 2)
        holders = c6.holders(job_id)
        assert sorted(ZONES[i] for i in holders) == ["z0", "z1", "z2"], holders  # one copy per zone
        jobs.append(job_id)
    for i in (4, 5):  # zone z2, at once
        c6.kill(i)
    c6.wait(lambda: all("fail" in c6.flags(0, i) for i in (4, 5)), timeout=15, what="zone z2 flagged failing")
    with pytest.raises(redis.ResponseError, match="NOREPL Not enough reachable zones"):
        c6.addjob(0, "zq", "needs three zones", 5000, "REPLICATE", 3, "ZONES", 3)
    late = c6.addjob(2, "zq", "two zones", 5000, "REPLICATE", 3, "ZONES", 2, "RETRY", 2)
    assert sorted({ZONES[i] for i in c6.holders(late)}) == ["z0", "z1"]
    assert all(c6.holders(job_id, among=range(4)) for job_id in jobs)  # a copy of each in the zones left
    got: set[str] = set()

    def delivered() -> bool:  # those queued in zone z2 come back after their RETRY
        for i in range(4):
            reply = c6.call(i, "GETJOB", "NOHANG", "COUNT", 100, "FROM", "zq") or []
            got.update(job[1].decode() for job in reply)
        return got >= {*jobs, late}

    c6.wait(delivered, timeout=20, what="every acknowledged job delivered by the zones left")
    assert got == {*jobs, late}
