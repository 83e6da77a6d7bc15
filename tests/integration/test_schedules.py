"""Recurring jobs on a real 3-node cluster (docs/schedules.md): every tick
becomes one job, known to every node; the ticks go on when a node is killed
with -9, and a node restarted from its AOF keeps its schedules and adds no
tick twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterkit import Cluster
from disque.store.ids import tick_job_id

EVERY = 1000
TTL = 600


@pytest.fixture
def cluster(tmp_path: Path):
    with Cluster(tmp_path, 3, "--appendonly", "yes", "--appendfsync", "always", "--schedule-grace", "500") as c:
        yield c


def show(cluster: Cluster, i: int, name: str = "s") -> dict[str, object]:
    reply = cluster.call(i, "SCHEDULE", "SHOW", name)
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2])}


def jobs_of(cluster: Cluster, ticks: range) -> dict[int, set[int]]:
    """Tick -> the live nodes holding its job."""
    held: dict[int, set[int]] = {}
    for t in ticks:
        job_id = tick_job_id(b"s", t, TTL, 1).decode()
        held[t] = {i for i in cluster.live() if cluster.call(i, "SHOW", job_id) is not None}
    return held


def fired(cluster: Cluster) -> int:
    return sum(cluster.call(i, "INFO", "schedules")["schedule_ticks_fired"] for i in cluster.live())


@pytest.mark.slow
def test_ticks_survive_kill_9_and_restart(cluster):
    assert cluster.call(0, "SCHEDULE", "ADD", "s", "q", "tick", "EVERY", EVERY, "TTL", TTL, "REPLICATE", 2) == b"OK"
    cluster.wait(lambda: all(cluster.call(i, "SCHEDULE", "LIST") == [b"s"] for i in range(3)), what="replicated")
    first = cluster.wait(lambda: show(cluster, 1)["last-tick"], what="a first tick")
    cluster.wait(lambda: show(cluster, 2)["last-tick"] >= first + 3 * EVERY, what="three more ticks")
    assert cluster.call(1, "SCHEDULE", "PAUSE", "s") == b"OK"  # the ticks stop: count them
    cluster.wait(lambda: all(show(cluster, i)["paused"] == 1 for i in range(3)), what="paused everywhere")
    last = max(show(cluster, i)["last-tick"] for i in range(3))
    held = jobs_of(cluster, range(first - 2 * EVERY, last + EVERY, EVERY))
    made = {t: nodes for t, nodes in held.items() if nodes}
    assert all(len(nodes) == 2 for nodes in made.values()), held  # each tick's job, with its 2 copies
    assert sorted(made) == list(range(min(made), last + EVERY, EVERY))  # no tick skipped
    assert fired(cluster) == len(made)  # and each made by one node only
    assert cluster.call(2, "SCHEDULE", "RESUME", "s") == b"OK"

    cluster.kill(0)  # a crash: the others go on
    killed_at = show(cluster, 1)["last-tick"]
    cluster.wait(lambda: show(cluster, 1)["last-tick"] >= killed_at + 4 * EVERY, what="ticks without node 0")
    cluster.restart(0)
    cluster.wait(lambda: show(cluster, 0)["last-tick"] >= killed_at + 6 * EVERY, what="node 0 back with the schedule")
    assert cluster.call(0, "SCHEDULE", "PAUSE", "s") == b"OK"  # a change after the restart reaches every node
    cluster.wait(lambda: all(show(cluster, i)["paused"] == 1 for i in range(3)), what="paused everywhere")
    last = max(show(cluster, i)["last-tick"] for i in range(3))
    ticks = range(first, last + EVERY, EVERY)
    held = jobs_of(cluster, ticks)
    missing = [t for t, nodes in held.items() if not nodes and t > killed_at + EVERY]
    assert not missing, missing  # (a tick whose only copies were on node 0 and were fired as it died may be lost)
    infos = [cluster.call(i, "INFO", "schedules") for i in range(3)]
    fired_now = sum(int(info["schedule_ticks_fired"]) for info in infos)
    assert fired_now - sum(int(info["schedule_ticks_collapsed"]) for info in infos) <= len(ticks) + 1
