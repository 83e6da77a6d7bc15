"""Consumer groups on the simulated network (tests/sim/workload_groups.py):
the checker of disque/testing/checker_groups.py over random fault schedules."""

from __future__ import annotations

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from disque.testing.checker_groups import check_groups
from sim.test_sim_cluster import NETWORK_FAULTS, TTL_GRACE_MS, fault_plans
from sim.workload import FaultPlan
from sim.workload_groups import GROUPS, run_groups_workload


def judge(plan: FaultPlan, seed: int) -> dict:
    history = trio.run(run_groups_workload, plan, seed, clock=MockClock(autojump_threshold=0))
    result = check_groups(history, GROUPS, ttl_grace_ms=TTL_GRACE_MS)
    assert result.valid, result.to_json()
    assert result.counts["acknowledged"] > 0 and result.counts["acks"] > 0
    return result.counts


def test_groups_survive_a_partition_and_a_crash():
    plan = FaultPlan(
        nodes=3, dup=0.05, delay=(1.0, 30.0),
        steps=[("partition", [[0], [1, 2]], 3000), ("heal", 1000), ("kill", 1, 3000), ("restart", True, 1000)],
    )  # fmt: skip
    counts = judge(plan, 7)
    assert counts["deliveries"] >= counts["acknowledged"] * len(GROUPS)


def _with_aof(plan: FaultPlan) -> FaultPlan:
    """Restarts keep the AOF: an event is not copied again after a wipe
    (nor is a job), so wipes of every holder would lose it on purpose."""
    plan.steps = [("restart", True, step[-1]) if step[0] == "restart" else step for step in plan.steps]
    return plan


@pytest.mark.random_plans
@pytest.mark.timeout(300)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=fault_plans(kinds=NETWORK_FAULTS).map(_with_aof), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_the_group_guarantees(plan, seed):
    judge(plan, seed)
