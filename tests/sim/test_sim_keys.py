"""Keyed jobs' deduplication and ordered keys under random fault plans on
the simulated network (tests/sim/workload_keys.py), judged by
disque/testing/checker_keys.py: one job per key, and one job of an
ordered key out at a time in creation order, and one run of each
DEBOUNCE burst with its last body, while the cluster is whole; no job
lost; the keys split, the jobs out at once, the order breaks and the
bursts' extra runs inside the fault windows counted (printed: `pytest -s` shows them).

The plans are the schedules' (tests/sim/test_sim_schedules.py):
partitions (some with a bridge node), kills restarted from the AOF and
clock jumps of one node, each held for a while and followed by a whole
cluster for a while."""

from __future__ import annotations

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from disque.testing.checker_keys import check_debounce, check_keys, check_ordered
from sim.test_sim_schedules import schedule_plans
from sim.workload_keys import DEBOUNCE_MS, run_key_workload
from sim.workload_schedules import SchedulePlan


def judge(plan: SchedulePlan, seed: int) -> dict:
    history = trio.run(run_key_workload, plan, seed, clock=MockClock(autojump_threshold=0))
    result = check_keys(history, settle_ms=2 * plan.node_timeout)
    print(f"keys: {result.to_json()}")
    assert result.valid, result.to_json()
    assert result.counts["keys"] == 60 and result.counts["adds"] >= result.counts["keys"] - result.counts["split_inside"]
    ordered = check_ordered(history, settle_ms=2 * plan.node_timeout)
    print(f"ordered: {ordered.to_json()}")
    assert ordered.valid, ordered.to_json()
    assert ordered.counts["ordered_keys"] == 8
    debounced = check_debounce(history, settle_ms=2 * plan.node_timeout, debounce_ms=DEBOUNCE_MS)
    print(f"debounce: {debounced.to_json()}")
    assert debounced.valid, debounced.to_json()
    assert debounced.counts["bursts"] == 12 and debounced.counts["runs"] >= 12
    return result.counts | ordered.counts | debounced.counts


def test_a_partition_and_a_kill_keep_one_job_per_key_outside_them():
    plan = SchedulePlan(nodes=3, steps=[("partition", [[0], [1, 2]], 3000, 4000), ("kill", 1, 2000, 4000)])
    counts = judge(plan, 7)
    assert counts["outside"] >= 5 and counts["adds"] > counts["keys"]
    assert counts["ordered_outside"] >= 1 and counts["ordered_jobs"] >= 50
    assert counts["bursts_outside"] >= 3 and counts["debounce_adds"] > counts["bursts"]


@pytest.mark.random_plans
@pytest.mark.timeout(600)
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(plan=schedule_plans(max_steps=2), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_one_job_per_key(plan, seed):
    judge(plan, seed)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=schedule_plans(max_steps=8), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_one_job_per_key_long(plan, seed):
    judge(plan, seed)
