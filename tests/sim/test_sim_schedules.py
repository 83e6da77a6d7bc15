"""Recurring jobs under random fault plans on the simulated network
(tests/sim/workload_schedules.py), judged by
disque/testing/checker_schedules.py: every tick of the run delivered, and
exactly once when neither its own window nor its delivery met a fault.

Hypothesis draws the cluster size, duplication and delay of the network and
a plan of partitions (some with a bridge node), kills (restarted from the
AOF) and clock jumps of one node (back by up to ten minutes, forward by up
to a minute: the fault lasts until the node's clock is past where it was),
each held for a while and followed by a whole cluster for a while."""

from __future__ import annotations

import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from disque.testing.checker_schedules import check_schedules
from sim.workload_schedules import GRACE, SchedulePlan, run_schedule_workload


@st.composite
def schedule_plans(draw, max_steps=3):
    n = draw(st.integers(3, 5))
    node = st.integers(0, n - 1)

    def partition():
        nodes = draw(st.permutations(range(n)))
        cut = draw(st.integers(1, n - 1))
        bridge = draw(st.booleans())  # the first node sees both sides
        return [nodes[:cut], nodes[cut:] + nodes[:1] if bridge else nodes[cut:]]

    params = {
        "partition": lambda: (partition(),),
        "kill": lambda: (draw(node),),
        "clock": lambda: (draw(node), draw(st.sampled_from((-600_000, -60_000, -3000, 3000, 60_000)))),
    }
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(sorted(params)))
        steps.append((kind, *params[kind](), draw(st.integers(500, 6000)), draw(st.integers(4000, 12000))))
    return SchedulePlan(
        nodes=n, dup=draw(st.sampled_from((0.0, 0.02))), delay=draw(st.sampled_from(((0.1, 2.0), (1.0, 30.0)))), steps=steps
    )


def judge(plan: SchedulePlan, seed: int) -> dict:
    history = trio.run(run_schedule_workload, plan, seed, clock=MockClock(autojump_threshold=0))
    result = check_schedules(history, grace_ms=GRACE, nodes=plan.nodes, settle_ms=2 * plan.node_timeout + GRACE)
    assert result.valid, result.to_json()
    assert result.counts["ticks"] >= 5
    return result.counts


def test_a_partition_a_kill_and_clock_jumps_keep_one_job_per_tick():
    plan = SchedulePlan(
        nodes=3,
        steps=[("partition", [[0], [1, 2]], 3000, 8000), ("kill", 1, 2000, 8000), ("clock", 2, 60_000, 3000, 8000),
               ("clock", 0, -60_000, 3000, 8000)],
    )  # fmt: skip
    counts = judge(plan, 7)
    assert counts["outside"] >= 10 and counts["deliveries"] >= counts["ticks"]


def test_a_tick_first_seen_late_still_gets_its_turns():
    """Nodes quiet for their first (default) grace see the first tick due
    late, while the one whose clock ran ahead fired only the latest missed
    tick: the late-seen tick must stay theirs to fire until its turns pass."""
    judge(SchedulePlan(nodes=3, steps=[("clock", 1, 3000, 500, 4000)]), 1)


@pytest.mark.random_plans
@pytest.mark.timeout(600)
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(plan=schedule_plans(max_steps=2), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_one_job_per_tick(plan, seed):
    judge(plan, seed)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=schedule_plans(max_steps=8), seed=st.integers(0, 2**32 - 1))
@example(  # two holders listing three holders each, not the same three: an ACK left a copy out
    plan=SchedulePlan(
        nodes=5, dup=0.02, delay=(1.0, 30.0), node_timeout=1000,
        steps=[("kill", 3, 3119, 4788), ("kill", 2, 5999, 5821), ("kill", 2, 2424, 4128),
               ("partition", [[3, 0, 2, 1], [4, 3]], 2366, 5527), ("clock", 2, -600000, 715, 4631),
               ("kill", 4, 500, 7487), ("kill", 0, 928, 4001)],
    ),
    seed=238633,
)  # fmt: skip
def test_random_faults_keep_one_job_per_tick_long(plan, seed):
    judge(plan, seed)
