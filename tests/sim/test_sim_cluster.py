"""Cluster behaviour on the simulated network (tests/sim/network.py).

Every test runs a whole cluster in virtual time (pytest-trio's
`autojump_clock`), so waiting for a node timeout or a retry costs nothing.
"""

from __future__ import annotations

import dataclasses

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from disque.core import errors
from disque.testing.checker import check
from disque.cluster.messages import FAIL, LEAVING, PFAIL, Ping
from disque.core.types import NIL_ARRAY, Status
from sim.network import SimCluster
from sim.workload import FaultPlan, run_workload

T = 1000  # node timeout (ms) of every cluster here
# Expiry times are whole seconds and a job is deleted within the second after
# its etime; replies may be in flight on a slow simulated network.
TTL_GRACE_MS = 3000


def flags_of(cluster: SimCluster, observer: int, target: int) -> int:
    return cluster.core(observer).membership.nodes[cluster.node_id(target)].flags


def holders(cluster: SimCluster, job_id: bytes) -> dict[int, str]:
    """node index -> state name, for every live node holding the job."""
    out = {}
    for node in cluster.nodes:
        if node.alive and (job := node.core.jobs.get(job_id)) is not None:
            out[node.index] = job.state.name.lower()
    return out


async def add(cluster: SimCluster, i: int, *args, queue="q", body="b") -> bytes:
    reply = await cluster.call(i, "ADDJOB", queue, body, 0, *args)
    assert isinstance(reply, Status), reply
    return bytes(reply)


@pytest.fixture
async def c5():
    """A formed 5-node cluster (the test must request `autojump_clock`)."""
    async with SimCluster(5, seed=5, node_timeout=T) as cluster:
        await cluster.form()
        yield cluster


# ---------------------------------------------------------------- membership


async def test_chain_of_meets_forms_full_mesh(autojump_clock):
    async with SimCluster(5, seed=1, node_timeout=T) as cluster:
        for i in range(1, 5):
            await cluster.meet(i, i - 1)
        waited = await cluster.wait_for(cluster.meshed, timeout=10)
        assert waited < 5
        for i in range(5):
            info = (await cluster.call(i, "CLUSTER", "INFO")).decode()
            assert "cluster_reachable_nodes:4" in info and "cluster_size:5" in info
            assert cluster.nodes[i].conf_text.count("\n") == 5  # nodes.conf saved with every member


async def test_failure_detection_and_recovery(autojump_clock, c5):
    cluster = c5
    cluster.partition([[0, 1, 2, 3], [4]])
    waited = await cluster.wait_for(lambda: all(flags_of(cluster, i, 4) & FAIL for i in range(4)), timeout=10)
    assert waited <= 2 * T / 1000 + 1
    assert all(len(cluster.core(i).membership.reachable()) == 3 for i in range(4))
    assert flags_of(cluster, 4, 0) & (PFAIL | FAIL)  # the isolated node suspects everyone
    cluster.heal()
    await cluster.wait_for(cluster.meshed, timeout=5)
    assert not any(flags_of(cluster, i, j) & (PFAIL | FAIL) for i in range(5) for j in range(5) if i != j)


async def test_restart_keeps_identity_and_rejoins(autojump_clock, c5):
    cluster = c5
    node_id = cluster.node_id(2)
    cluster.kill(2)
    await cluster.wait_for(lambda: all(flags_of(cluster, i, 2) & FAIL for i in (0, 1, 3, 4)), timeout=10)
    await cluster.restart(2)
    assert cluster.node_id(2) == node_id
    await cluster.wait_for(cluster.meshed, timeout=10)


async def test_restarted_node_recovers_from_a_lost_first_ping(autojump_clock):
    """Regression: nodes.conf loads ping_sent == pong_received == now for a
    peer that had a ping outstanding; the stale-link check wanted
    pong_received < ping_sent, so when the first PING after the restart was
    lost the link was never recycled and the peer stayed FAIL forever."""
    async with SimCluster(3, seed=3, node_timeout=T) as cluster:
        await cluster.form()
        cluster.partition([[0], [1, 2]])
        await cluster.wait_for(lambda: flags_of(cluster, 1, 0) & FAIL, timeout=10)
        cluster.kill(1)
        cluster.heal()
        cluster.lose_next(1, 0, Ping)
        await cluster.restart(1)
        await cluster.wait_for(cluster.meshed, timeout=4 * T / 1000)
        assert not cluster.losses  # the PING was sent, and lost


async def test_leaving_flag_propagates_and_stops_replicas(autojump_clock, c5):
    cluster = c5
    assert await cluster.call(2, "CLUSTER", "LEAVING", "yes") == b"OK"
    leaving = cluster.node_id(2)
    waited = await cluster.wait_for(
        lambda: all(flags_of(cluster, i, 2) & LEAVING for i in (0, 1, 3, 4)), timeout=5
    )
    assert waited <= 2
    assert f"{leaving} 10.0.0.3:7711 leaving" in cluster.nodes[0].conf_text
    for _ in range(10):
        job_id = await add(cluster, 0, "REPLICATE", 4)
        assert 2 not in holders(cluster, job_id)
    assert await cluster.call(0, "ADDJOB", "q", "b", 0, "REPLICATE", 5) == errors.norepl_reach()


async def test_pause_bcast_reaches_every_node(autojump_clock, c5):
    cluster = c5
    assert await cluster.call(0, "PAUSE", "pq", "in", "bcast") == b"in"
    await trio.sleep(0.1)
    assert [await cluster.call(i, "PAUSE", "pq", "state") for i in range(5)] == [b"in"] * 5
    assert await cluster.call(3, "ADDJOB", "pq", "b", 0) == errors.paused()


# ---------------------------------------------------------------- replication


async def test_addjob_replicates_to_requested_copies(autojump_clock, c5):
    cluster = c5
    job_id = await add(cluster, 0, "REPLICATE", 3)
    copies = holders(cluster, job_id)
    assert len(copies) == 3 and copies[0] == "queued"
    assert sorted(copies.values()) == ["active", "active", "queued"]
    show = await cluster.call(0, "SHOW", job_id)  # RESP2: a flat key/value array
    assert len(dict(zip(show[::2], show[1::2]))[b"nodes-delivered"]) == 3


async def test_addjob_norepl_without_enough_reachable_nodes(autojump_clock, c5):
    cluster = c5
    cluster.partition([[0, 1], [2, 3, 4]])
    await cluster.wait_for(lambda: len(cluster.core(0).membership.reachable()) == 1, timeout=10)
    reply = await cluster.call(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3)
    assert reply == errors.norepl_reach()
    job_id = await add(cluster, 0, "REPLICATE", 2)
    assert set(holders(cluster, job_id)) == {0, 1}


async def test_addjob_times_out_when_targets_vanish(autojump_clock, c5):
    cluster = c5
    replies = []

    async def producer():
        replies.append(await cluster.call(0, "ADDJOB", "q", "b", 500, "REPLICATE", 3))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.sleep(0)  # the ADDJOB is waiting for its GOTJOBs
        cluster.partition([[0], [1, 2, 3, 4]])
    assert replies == [errors.norepl_timeout()]
    assert len(cluster.core(0).jobs) == 0
    cluster.heal()
    await cluster.wait_for(cluster.meshed, timeout=10)
    await trio.sleep(1)
    assert all(len(cluster.core(i).jobs) == 0 for i in range(5))  # DELJOB or never received


# ---------------------------------------------------------------- requeue


async def test_requeue_when_queueing_node_is_partitioned(autojump_clock, c5):
    cluster = c5
    job_id = await add(cluster, 0, "REPLICATE", 3, "RETRY", 2)
    replicas = sorted(i for i in holders(cluster, job_id) if i != 0)
    cluster.partition([[0], [1, 2, 3, 4]])
    await trio.sleep(5)  # two retry periods
    states = holders(cluster, job_id)
    assert [states[i] for i in replicas].count("queued") == 1, states  # WILLQUEUE/QUEUED: one requeue
    consumer = next(i for i in (1, 2, 3, 4) if i not in replicas)  # gets it through federation
    got = await cluster.call(consumer, "GETJOB", "TIMEOUT", 10_000, "FROM", "q")
    assert got[0][1] == job_id
    assert await cluster.call(consumer, "ACKJOB", job_id) == 1
    await trio.sleep(1)
    # Regression: the importer once left itself out of nodes_delivered, so
    # its GC completed without the partitioned holder and node 0 kept the
    # job queued forever.
    assert holders(cluster, job_id)[consumer] == "acked"
    cluster.heal()
    await cluster.wait_for(lambda: not holders(cluster, job_id), timeout=30)


# ---------------------------------------------------------------- acks


async def test_ackjob_deletes_every_copy(autojump_clock, c5):
    cluster = c5
    job_id = await add(cluster, 1, "REPLICATE", 3)
    got = await cluster.call(1, "GETJOB", "FROM", "q")
    assert got[0][1] == job_id
    assert await cluster.call(1, "ACKJOB", job_id) == 1
    waited = await cluster.wait_for(lambda: not holders(cluster, job_id), timeout=5, step=0.01)
    assert waited < 0.3


async def test_ackjob_on_a_replica_deletes_every_copy(autojump_clock, c5):
    cluster = c5
    job_id = await add(cluster, 1, "REPLICATE", 3)
    replica = next(i for i in holders(cluster, job_id) if i != 1)
    assert await cluster.call(replica, "ACKJOB", job_id) == 1
    await cluster.wait_for(lambda: not holders(cluster, job_id), timeout=5)


async def test_dummy_ack_is_collected(autojump_clock, c5):
    cluster = c5
    job_id = await add(cluster, 1, "REPLICATE", 1)  # RETRY > 0: the ID's TTL field is odd
    assert await cluster.call(1, "DELJOB", job_id) == 1
    assert await cluster.call(3, "ACKJOB", job_id) == 0
    waited = await cluster.wait_for(lambda: len(cluster.core(3).jobs) == 0, timeout=5, step=0.01)
    assert waited < 0.5


async def test_fastack_deletes_every_copy_at_once(autojump_clock, c5):
    cluster = c5
    job_id = await add(cluster, 2, "REPLICATE", 3)
    assert await cluster.call(2, "FASTACK", job_id) == 1
    await trio.sleep(0.05)
    assert not holders(cluster, job_id)


# ---------------------------------------------------------------- federation


async def test_jobs_from_every_node_consumed_on_one(autojump_clock, c5):
    cluster = c5
    produced = {}
    for n in range(20):
        i = n % 5
        job_id = await add(cluster, i, "REPLICATE", 1, "RETRY", 30, body=f"job-{n}")
        produced[job_id] = f"job-{n}".encode()
    consumed = {}
    with trio.fail_after(60):
        while len(consumed) < len(produced):
            got = await cluster.call(0, "GETJOB", "TIMEOUT", 1000, "FROM", "q")
            if got is NIL_ARRAY:
                continue
            (_, job_id, body), = got
            consumed[job_id] = body
            await cluster.call(0, "ACKJOB", job_id)
    assert consumed == produced


async def test_a_job_moved_between_nodes_many_times_expires_on_time(autojump_clock, c5):
    """Regression (found by jepsen-lite): the bus carried the remaining TTL in
    whole seconds rounded up, so every move to another node (YOURJOBS here)
    stretched the job's life and it was delivered after its TTL."""
    cluster = c5
    job_id = await add(cluster, 0, "REPLICATE", 1, "RETRY", 300, "TTL", 90)
    deadline = trio.current_time() + 90
    moves = 0
    while trio.current_time() < deadline - 20:
        consumer = moves % 4 + 1  # never the node holding it: it has to travel
        got = await cluster.call(consumer, "GETJOB", "TIMEOUT", 15_000, "FROM", "q")
        assert got[0][1] == job_id, got
        assert await cluster.call(consumer, "NACK", job_id) == 1
        moves += 1
        await trio.sleep(5)  # a hop to a waiting consumer takes milliseconds: spread them over the TTL
    assert moves >= 5, moves
    await trio.sleep(max(0.0, deadline - trio.current_time()) + 1.0)  # expiry runs within the second after etime
    assert not holders(cluster, job_id)


async def test_sync_replication_waits_for_a_replica_that_comes_back(autojump_clock):
    """A replica killed just before ADDJOB and restarted (with its AOF)
    before the ADDJOB timeout gets REPLJOB again: the client gets the ID."""
    async with SimCluster(3, seed=3, node_timeout=T) as cluster:
        await cluster.form()
        cluster.kill(2)
        replies = []

        async def producer():
            replies.append(await cluster.call(0, "ADDJOB", "q", "b", 30_000, "REPLICATE", 3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.sleep(2 * T / 1000)  # node 2 is FAIL by now
            assert not replies and flags_of(cluster, 0, 2) & FAIL
            await cluster.restart(2, aof=True)
        (job_id,) = replies
        assert isinstance(job_id, Status), job_id
        assert sorted(holders(cluster, bytes(job_id)).values()) == ["active", "active", "queued"]


# ---------------------------------------------------------------- administration


def known_everywhere(cluster: SimCluster, node_id: str) -> list[int]:
    """Indexes of the live nodes whose table still has `node_id`."""
    return [n.index for n in cluster.nodes if n.alive and node_id in n.core.membership.nodes]


async def test_reset_hard_and_meet_make_a_fresh_node(autojump_clock, c5):
    cluster = c5
    old = cluster.node_id(1)
    await add(cluster, 1, "REPLICATE", 3)
    assert await cluster.call(1, "CLUSTER", "RESET", "HARD") == b"OK"
    new = cluster.node_id(1)
    assert new != old and not cluster.core(1).jobs and known_everywhere(cluster, new) == [1]
    for i in (0, 2, 3, 4):
        assert await cluster.call(i, "CLUSTER", "FORGET", old) == b"OK"
    await cluster.meet(1, 0)
    await cluster.wait_for(cluster.meshed, timeout=10)
    assert known_everywhere(cluster, old) == [] and f"{new} 10.0.0.2:7711" in cluster.nodes[3].conf_text
    single = await add(cluster, 1, "REPLICATE", 1)
    assert single.decode()[2:10] == new[:8]  # the ID prefix names the node
    assert cluster.core(1).jobs.get(single).nodes_delivered == (new,)
    replicated = await add(cluster, 1, "REPLICATE", 3)
    copies = holders(cluster, replicated)
    assert copies.get(1) == "queued" and sorted(copies.values()) == ["active", "active", "queued"]
    assert new in cluster.core(1).jobs.get(replicated).nodes_delivered


async def test_reset_soft_keeps_the_id_drops_jobs_and_peers_until_a_meet(autojump_clock, c5):
    cluster = c5
    node_id = cluster.node_id(1)
    job_id = await add(cluster, 0, "REPLICATE", 5)
    assert await cluster.call(1, "CLUSTER", "RESET", "SOFT") == b"OK"
    assert cluster.node_id(1) == node_id and not cluster.core(1).jobs
    assert list(cluster.core(1).membership.nodes) == [node_id]
    assert cluster.nodes[1].conf_text.count("\n") == 1  # saved at once
    await trio.sleep(3 * T / 1000)
    assert not cluster.meshed()  # the others' PINGs do not make it accept them
    await cluster.meet(1, 4)
    await cluster.wait_for(cluster.meshed, timeout=10)
    assert set(holders(cluster, job_id)) == {0, 2, 3, 4}


async def test_restart_with_aof_brings_the_jobs_back_and_requeues_them(autojump_clock, c5):
    cluster = c5
    job_id = await add(cluster, 0, "REPLICATE", 1, "RETRY", 2)
    cluster.kill(0)
    await cluster.restart(0, aof=True)
    assert holders(cluster, job_id) == {0: "active"}  # held, not trusted to be queued
    await trio.sleep(2.5)
    assert holders(cluster, job_id) == {0: "queued"}
    assert (await cluster.call(0, "GETJOB", "NOHANG", "FROM", "q"))[0][1] == job_id


async def test_restart_without_aof_or_after_a_flushall_has_no_jobs(autojump_clock, c5):
    cluster = c5
    lost = await add(cluster, 0, "REPLICATE", 1)
    cluster.kill(0)
    await cluster.restart(0, aof=False)
    assert not cluster.core(0).jobs and not cluster.nodes[0].aof
    flushed = await add(cluster, 0, "REPLICATE", 1)
    assert await cluster.call(0, "DEBUG", "FLUSHALL") == b"OK"
    cluster.kill(0)
    await cluster.restart(0, aof=True)  # the flush logged DELJOB
    assert not holders(cluster, lost) and not holders(cluster, flushed)
    assert b"DELJOB" in cluster.nodes[0].aof


async def test_config_set_node_timeout_paces_failure_detection(autojump_clock, c5):
    cluster = c5
    for i in range(5):
        assert await cluster.call(i, "CONFIG", "SET", "cluster-node-timeout", 5000) == b"OK"
    cluster.partition([[0, 1, 2, 3], [4]])
    waited = await cluster.wait_for(lambda: all(flags_of(cluster, i, 4) & FAIL for i in range(4)), timeout=20)
    assert 5 <= waited <= 2 * 5 + 1


async def test_leaving_no_makes_the_node_a_replica_again(autojump_clock, c5):
    cluster = c5
    assert await cluster.call(2, "CLUSTER", "LEAVING", "yes") == b"OK"
    await cluster.wait_for(lambda: all(flags_of(cluster, i, 2) & LEAVING for i in (0, 1, 3, 4)), timeout=5)
    assert await cluster.call(2, "GETJOB", "FROM", "q") == errors.leaving()
    assert await cluster.call(2, "CLUSTER", "LEAVING", "no") == b"OK"
    await cluster.wait_for(lambda: not any(flags_of(cluster, i, 2) & LEAVING for i in (0, 1, 3, 4)), timeout=5)
    job_id = await add(cluster, 0, "REPLICATE", 5)
    assert holders(cluster, job_id)[2] == "active"


async def test_a_forgotten_peer_comes_back_through_gossip_after_the_blacklist(autojump_clock, c5):
    cluster = c5
    forgotten = cluster.node_id(1)
    assert await cluster.call(0, "CLUSTER", "FORGET", forgotten) == b"OK"
    assert known_everywhere(cluster, forgotten) == [1, 2, 3, 4]
    job_id = await add(cluster, 0, "REPLICATE", 4)
    assert 1 not in holders(cluster, job_id)
    waited = await cluster.wait_for(lambda: 0 in known_everywhere(cluster, forgotten), timeout=120)
    assert 60 - 1 <= waited <= 60 + 10  # the 60 s blacklist, then the next gossip
    await cluster.wait_for(cluster.meshed, timeout=10)


# ---------------------------------------------------------------- random faults
#
# Hypothesis draws a cluster size, a fault mix (drop, duplication, delay) and
# a schedule of network faults (partitions, some with a bridge node, heals),
# crashes (kill, restart with or without the AOF) and administration
# (DEBUG FLUSHALL, CLUSTER RESET SOFT|HARD with re-MEET, CLUSTER FORGET,
# CLUSTER LEAVING, CONFIG SET cluster-node-timeout), plus a seed for every
# random choice of the run.  After each run the checker requires: no
# acknowledged at-least-once job lost after the network healed (unless its
# TTL passed, or it was wiped on purpose on as many nodes as it had copies),
# nothing unexpected, no RETRY 0 job delivered twice, nothing delivered after
# its TTL, every acknowledged job collected everywhere; the simulation itself
# asserts the structural invariants of every core each simulated second
# (queues hold exactly the queued jobs, ...) and that no dummy ACK survives.

NETWORK_FAULTS = ("partition", "heal", "kill", "restart")
DISK_FAULTS = ("disk", "kill", "restart", "heal")
ADMIN_FAULTS = ("flushall", "reset", "forget", "leaving", "timeout", "kill", "restart")


@st.composite
def fault_plans(draw, max_steps=6, kinds=NETWORK_FAULTS + ADMIN_FAULTS):
    n = draw(st.integers(3, 5))
    node = st.integers(0, n - 1)
    order = st.permutations(range(n))

    def partition():
        nodes = draw(order)
        cut = draw(st.integers(1, n - 1))
        bridge = draw(st.booleans()) and n > 2  # the first node sees both sides
        return [nodes[:cut], nodes[cut:] + nodes[:1] if bridge else nodes[cut:]]

    params = {
        "partition": lambda: (partition(),),
        "heal": lambda: (),
        "kill": lambda: (draw(node),),
        "restart": lambda: (draw(st.booleans()),),  # with the AOF?
        "flushall": lambda: (draw(node),),
        "reset": lambda: (draw(node), draw(st.sampled_from(("soft", "hard")))),
        "forget": lambda: (draw(node), draw(node)),
        "leaving": lambda: (draw(node), draw(st.sampled_from(("yes", "no")))),
        "timeout": lambda: (draw(node), draw(st.sampled_from((200, 500, 3000, 10_000)))),
        "disk": lambda: (draw(node), draw(st.sampled_from(("lose-tail", "torn", "bitflip", "full")))),
    }
    steps = []
    for _ in range(draw(st.integers(0, max_steps))):
        kind = draw(st.sampled_from(kinds))
        steps.append((kind, *params[kind](), draw(st.integers(500, 8000))))
    return FaultPlan(
        nodes=n,
        drop=draw(st.sampled_from((0.0, 0.01, 0.05))),
        dup=draw(st.sampled_from((0.0, 0.02, 0.1))),
        delay=draw(st.sampled_from(((0.1, 2.0), (1.0, 30.0), (5.0, 200.0)))),
        steps=steps,
    )


def judge(plan: FaultPlan, seed: int, extensions: bool = False) -> list:
    history = trio.run(run_workload, plan, seed, extensions, clock=MockClock(autojump_threshold=0))
    result = check(history, ttl_grace_ms=TTL_GRACE_MS)
    assert result.valid, result.to_json()
    assert result.counts["acknowledged"] > 0
    return history


@pytest.mark.random_plans
@pytest.mark.timeout(300)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=fault_plans(kinds=NETWORK_FAULTS), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_queue_guarantees(plan, seed):
    judge(plan, seed)


@pytest.mark.random_plans
@pytest.mark.timeout(300)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=fault_plans(kinds=ADMIN_FAULTS), seed=st.integers(0, 2**32 - 1))
def test_administration_keeps_queue_guarantees(plan, seed):
    judge(plan, seed)


@pytest.mark.random_plans
@pytest.mark.timeout(300)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=fault_plans(kinds=NETWORK_FAULTS), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_the_extensions_guarantees(plan, seed):
    """NACK ... DELAY, MAXATTEMPTS with a dead-letter queue, PRIORITY and
    WAITJOB in the workload (the cores' invariants check each level of a
    queue after every step): nothing lost (a dead-lettered job is delivered from its
    queue under the same body), no WAITJOB answers for a job nobody
    acknowledged."""
    history = judge(plan, seed, extensions=True)
    assert any(r["op"] == "waitjob" for r in history)


@pytest.mark.random_plans
@pytest.mark.timeout(300)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=fault_plans(kinds=NETWORK_FAULTS), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_minrepl_guarantees(plan, seed):
    """At-least-once jobs REPLICATE 3 MINREPL 2: a producer answered with
    two copies loses its job only when both holders are wiped (a node
    restarted without its AOF); with one wiped, it is delivered."""
    judge(dataclasses.replace(plan, minrepl=True), seed)


def test_minrepl_jobs_added_while_a_node_is_down_survive_a_wiped_holder():
    """Three nodes, one killed then restarted without its AOF, then another
    killed: the jobs added meanwhile settle for two copies (a producer
    never waits for the dead node) and none is lost."""
    plan = FaultPlan(
        nodes=3, minrepl=True,
        steps=[("kill", 2, 4000), ("restart", False, 3000), ("kill", 1, 3000), ("restart", True, 2000)],
    )  # fmt: skip
    history = judge(plan, 7)
    assert not [r for r in history if r["op"] == "enqueue" and r["type"] == "info"]  # every add answered


@pytest.mark.random_plans
@pytest.mark.timeout(300)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=fault_plans(kinds=DISK_FAULTS), seed=st.integers(0, 2**32 - 1))
def test_disks_that_lie_keep_queue_guarantees(plan, seed):
    """A node's AOF loses its unsynced tail, gets its last record torn or bits
    flipped (the node is killed, and loads what is left when it restarts),
    or fills up: no acknowledged at-least-once job lost, no body altered."""
    judge(plan, seed)


def test_each_disk_fault_in_turn():
    """The disk faults one after the other on a fixed plan (the pure core's
    pass runs it: the random plans run on the compiled core only)."""
    plan = FaultPlan(nodes=3, steps=[
        ("heal", 6000), ("disk", 1, "bitflip", 2000), ("restart", True, 3000), ("disk", 2, "lose-tail", 2000), ("restart", True, 3000),
        ("disk", 0, "torn", 2000), ("restart", True, 3000), ("disk", 1, "full", 3000)])  # fmt: skip
    history = judge(plan, 7)
    assert any(r["op"] == "dequeue" for r in history)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=fault_plans(max_steps=15), seed=st.integers(0, 2**32 - 1))
def test_random_faults_keep_queue_guarantees_long(plan, seed):
    judge(plan, seed)


def test_a_seed_replays_the_same_history():
    plan = FaultPlan(
        nodes=3, drop=0.05, dup=0.05, delay=(1.0, 30.0),
        steps=[
            ("partition", [[0], [1, 2]], 2000), ("kill", 1, 1000), ("heal", 500), ("restart", False, 1000),
            ("reset", 2, "soft", 1000), ("flushall", 0, 500), ("kill", 0, 500), ("restart", True, 500),
        ],
    )  # fmt: skip
    first, second = (trio.run(run_workload, plan, 42, clock=MockClock(autojump_threshold=0)) for _ in range(2))
    assert first == second and len(first) > 100
