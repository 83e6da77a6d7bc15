"""Parents and children (ADDJOB ... AFTER) and results under fault plans on
the simulated network (tests/sim/workload_workflows.py), judged by
disque/testing/checker_workflows.py: no child delivered before an ACK of
each of its parents was sent, none left behind once its parents are
acknowledged, no result lost for an acknowledged job, the batch's callback
delivered at least once, and once when no fault came after the close."""

from __future__ import annotations

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from disque.testing.checker_workflows import check_workflows
from sim.test_sim_schedules import schedule_plans
from sim.workload_schedules import SchedulePlan
from sim.workload_workflows import run_workflow_workload


def judge(plan: SchedulePlan, seed: int) -> dict:
    history = trio.run(run_workflow_workload, plan, seed, clock=MockClock(autojump_threshold=0))
    result = check_workflows(history, settle_ms=2 * plan.node_timeout)
    assert result.valid, result.to_json()
    assert result.counts["children"] >= 10 and result.counts["results"] >= 20 and result.counts["batches"] == 1
    return result.counts


def test_a_partition_and_a_kill_keep_children_behind_their_parents():
    plan = SchedulePlan(nodes=3, steps=[("partition", [[0], [1, 2]], 3000, 4000), ("kill", 1, 2000, 4000)])
    judge(plan, 7)


@pytest.mark.random_plans
@pytest.mark.timeout(600)
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(plan=schedule_plans(max_steps=2), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_children_behind_their_parents(plan, seed):
    judge(plan, seed)
