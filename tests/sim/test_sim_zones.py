"""The loss of a whole zone (docs/zones.md) under random plans: six nodes in
three zones of two, at-least-once jobs added with REPLICATE 2 or 3 and
ZONES 2, and a nemesis that cuts a zone off or kills both its nodes, heals,
and restarts the dead with their AOF or without it (their jobs wiped).
A job whose copies span two zones survives the loss of any one zone, so
the checker must find no acknowledged job lost, although a wipe of a zone
excuses nothing (every job had a copy outside it)."""

from __future__ import annotations

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from disque.testing.checker import ENQUEUE, INVOKE, OK, WIPE, check
from sim.workload import FaultPlan, run_workload
from sim.test_sim_cluster import TTL_GRACE_MS

ZONES = ("a", "a", "b", "b", "c", "c")


@st.composite
def zone_plans(draw, max_steps=4):
    params = {
        "zone": lambda: (draw(st.sampled_from("abc")), draw(st.sampled_from(("isolate", "kill")))),
        "heal": lambda: (),
        "restart": lambda: (draw(st.booleans()),),  # with the AOF?
    }
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(tuple(params)))
        steps.append((kind, *params[kind](), draw(st.integers(500, 6000))))
    return FaultPlan(
        nodes=len(ZONES), zones=ZONES, drop=draw(st.sampled_from((0.0, 0.01))), delay=(0.1, 2.0), steps=steps,
        consumers=draw(st.sampled_from((0, 2))),  # none: the jobs pile up until the drain
    )  # fmt: skip


def judge(plan: FaultPlan, seed: int) -> tuple[list, dict]:
    history = trio.run(run_workload, plan, seed, clock=MockClock(autojump_threshold=0))
    result = check(history, ttl_grace_ms=TTL_GRACE_MS)
    assert result.valid, result.to_json()
    assert result.counts["acknowledged"] > 0
    return history, result.counts


def test_a_zone_killed_and_wiped_loses_no_acknowledged_job():
    plan = FaultPlan(nodes=6, zones=ZONES, consumers=0, steps=[  # the jobs pile up: the drain takes them at the end
        ("heal", 3000), ("zone", "c", "kill", 4000), ("restart", False, 0), ("restart", False, 2000)])
    history, counts = judge(plan, 7)
    wiped = [r for r in history if r["op"] == WIPE]
    assert len(wiped) == 2 and all(r["value"]["held"] for r in wiped)  # zone c came back empty
    copies = {}  # at-least-once job ID -> REPLICATE
    invoked = {}
    for r in history:
        if r["op"] == ENQUEUE and r["type"] == INVOKE:
            invoked[r["process"]] = r["value"]["replicate"]
        elif r["op"] == ENQUEUE and r["type"] == OK and invoked[r["process"]] > 1:
            copies[r["job"]] = invoked[r["process"]]
    in_zone_c = [job for r in wiped for job in r["value"]["held"] if job in copies]
    assert in_zone_c  # zone c held copies of acknowledged jobs ...
    assert all(in_zone_c.count(job) < copies[job] for job in in_zone_c)  # ... never all of a job's
    assert counts["lost"] == 0 and counts["dequeued"] >= len(copies) // 2


@pytest.mark.timeout(300)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=zone_plans(), seed=st.integers(0, 2**32 - 1))
def test_zone_faults_keep_queue_guarantees(plan, seed):
    judge(plan, seed)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=zone_plans(max_steps=10), seed=st.integers(0, 2**32 - 1))
def test_zone_faults_keep_queue_guarantees_long(plan, seed):
    judge(plan, seed)
