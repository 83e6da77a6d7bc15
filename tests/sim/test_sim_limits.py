"""A queue's concurrency limit on the simulated network (docs/limits.md),
judged from the consumers' history by disque/testing/checker_limits.py:
never more jobs out at once than the limit while the cluster is connected;
what partitions and kills -9 (restarted from the AOF) cost is counted and
printed.  Hypothesis draws the cluster size and a plan of faults, each held
for a while and followed by a whole cluster for a while."""

from __future__ import annotations

import random

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from disque.core.limits import LEASE_MS, LEASE_SLACK
from disque.testing.checker_limits import ConcurrencyResult, check_concurrency
from sim.network import CONNECTION_LOST, SimCluster, now_ms

QUEUE = "limited"
LIMIT = 3
RETRY = 2  # s: the jobs a lost node handed out come back this soon
SETTLE_MS = LEASE_MS + LEASE_SLACK + RETRY * 1000 + 1000  # after a fault: leases lapse, jobs come back


async def run(n: int, steps: list[tuple[str, list, int, int]], seed: int) -> ConcurrencyResult:
    rng = random.Random(f"{seed}/limits")
    intervals: list[tuple[float, float]] = []
    faults: list[tuple[float, float]] = []
    async with SimCluster(n, seed) as cluster:
        await cluster.form()
        assert await cluster.call(0, "QCONFIG", QUEUE, "SET", "concurrency", LIMIT) == b"OK"
        await cluster.wait_for(lambda: all(QUEUE.encode() in c.core.limits.budgets for c in cluster.nodes), 5)
        for k in range(300):
            await cluster.call(k % n, "ADDJOB", QUEUE, f"job {k}", 0, "REPLICATE", 2, "RETRY", RETRY, "ASYNC")

        async def consumer() -> None:
            while True:
                node = rng.choice([c.index for c in cluster.nodes if c.alive])
                reply = await cluster.call(node, "GETJOB", "TIMEOUT", 300, "FROM", QUEUE)
                if not isinstance(reply, list):
                    await trio.sleep(0.05)
                    continue
                got = now_ms()
                # RETRY counts from when the job was queued (as in Disque) and a retry that fires frees
                # its slot: WORKING restarts it, so the job stays counted while it is worked on.
                await cluster.call(node, "WORKING", reply[0][1])
                await trio.sleep(rng.uniform(0.02, 0.1))
                intervals.append((got, now_ms()))  # done: before the ACK (once read, the slot may go to another)
                await cluster.call(node, "ACKJOB", reply[0][1])

        async with trio.open_nursery() as clients:
            for _ in range(3 * n):
                clients.start_soon(consumer)
            await trio.sleep(4)  # past the quiet time of the view the cluster formed with
            for fault, groups_or_node, hold, gap in steps:
                start = now_ms()
                if fault == "partition":
                    cluster.partition(groups_or_node)
                else:
                    cluster.kill(groups_or_node)
                await trio.sleep(hold / 1000)
                if fault == "partition":
                    cluster.heal()
                else:
                    await cluster.restart(groups_or_node, aof=True)
                faults.append((start, now_ms()))
                await trio.sleep(gap / 1000)
            await trio.sleep(5)
            clients.cancel_scope.cancel()
    return check_concurrency(intervals, LIMIT, faults, SETTLE_MS)


def judge(n: int, steps: list[tuple[str, list, int, int]], seed: int) -> ConcurrencyResult:
    result = trio.run(run, n, steps, seed, clock=MockClock(autojump_threshold=0))
    print(result.summary())
    assert result.valid, result.violations[:5]
    assert result.most == LIMIT  # the limit was reached: the consumers were kept busy
    return result


def test_concurrency_holds_while_connected_and_faults_are_counted():
    judge(3, [("partition", [[0], [1, 2]], 4000, 8000), ("kill", 1, 3000, 8000)], seed=1)


@st.composite
def plans(draw):
    n = draw(st.integers(3, 5))
    steps = []
    for _ in range(draw(st.integers(1, 2))):
        if draw(st.booleans()):
            nodes = draw(st.permutations(range(n)))
            cut = draw(st.integers(1, n - 1))
            steps.append(("partition", [nodes[:cut], nodes[cut:]], draw(st.integers(500, 5000)), 9000))
        else:
            steps.append(("kill", draw(st.integers(0, n - 1)), draw(st.integers(500, 5000)), 9000))
    return n, steps


@pytest.mark.slow
@pytest.mark.timeout(1200)
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(plans(), st.integers(0, 1000))
def test_random_fault_plans_never_break_the_limit_while_connected(plan, seed):
    judge(*plan, seed=seed)
