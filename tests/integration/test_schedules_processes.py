"""Recurring jobs on a real 3-node cluster (docs/schedules.md): every tick
becomes one job, known to every node; the ticks go on when a node is killed
with -9, and a node restarted from its AOF keeps its schedules and adds no
tick twice; and the worker's decorators that register schedules."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import pytest
from client_helpers import queue, shared_node  # noqa: F401  (fixtures)

from clusterkit import Cluster
from disque.client import Client, Job
from disque.client.worker import App, BadSetting, Worker, parse_period
from disque.testing.devcluster import NodeProcess
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


# ---------------------------------------------------------------- the worker's decorators


def test_periods_and_decorators_make_the_schedule_add_arguments() -> None:
    assert [parse_period(p) for p in ("250ms", "90s", "5m", "1h", "1d", " 1.5H", 2, 1.5)] == [
        250, 90_000, 300_000, 3_600_000, 86_400_000, 5_400_000, 2000, 1500]  # fmt: skip
    for bad in ("soon", "5", "", "m", "5 minutes"):  # a string says its unit
        with pytest.raises(ValueError, match=r"not a period: .* \(a number and its unit: 250ms, 90s, 5m, 1h, 1d\)"):
            parse_period(bad)
    app = App("127.0.0.1:7711")

    @app.every("5m")
    def cleanup(job: Job) -> None: ...

    @app.cron("0 3 * * *", "reports", tz="Europe/Paris", name="nightly", body="go", ttl=600, retries=2,
              dead_letter="dl")  # fmt: skip
    def nightly(job: Job) -> None: ...

    assert app.handlers["cleanup"].fn is cleanup.fn and app.handlers["reports"].max_attempts == 3
    assert app.schedules == {
        "cleanup": ["cleanup", "", "EVERY", 300_000],
        "nightly": ["reports", "go", "CRON", "0 3 * * *", "TZ", "Europe/Paris", "TTL", 600, "MAXATTEMPTS", 3,
                    "DEADLETTER", "dl"],
    }  # fmt: skip


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_worker_registers_its_schedule_and_runs_the_ticks(backend: str, shared_node: NodeProcess, queue: str) -> None:
    app = App(f"{shared_node.host}:{shared_node.port}")
    seen: list[bytes] = []
    worker: Worker | None = None

    @app.every("200ms", queue, name=queue, body="tick")
    async def tick(job: Job) -> None:
        seen.append(job.body)
        if len(seen) == 3:
            assert worker is not None
            worker.stop()

    worker = Worker(app)
    try:
        anyio.run(functools.partial(worker.run, signals=False), backend=backend)
        assert seen[:3] == [b"tick"] * 3 and worker.processed >= 3
        with Client(app.nodes) as c:
            assert c.execute_command("SCHEDULE", "LIST").count(queue.encode()) == 1
    finally:
        with Client(app.nodes) as c:
            c.execute_command("SCHEDULE", "DEL", queue)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_refused_schedule_stops_the_worker_with_its_name(backend: str, shared_node: NodeProcess, queue: str) -> None:
    app = App(f"{shared_node.host}:{shared_node.port}")
    app.cron("0 25 * * *", queue, name="nightly")(lambda job: None)
    with pytest.raises(BadSetting) as info:  # the error itself, not the task groups' ExceptionGroup
        anyio.run(functools.partial(Worker(app).run, signals=False), backend=backend)
    assert str(info.value) == (f"schedule 'nightly' (queue '{queue}'): invalid CRON expression: the hour field \"25\" must be 0-23; "
                               "5 fields: minute hour day month weekday")  # fmt: skip
