"""The cluster with real processes on loopback (spec/cluster.md, spec/commands.md).

Most tests share one 5-node cluster (module fixture `c5`): before each test
`heal()` restarts crashed nodes, resumes paused ones, clears LEAVING, waits
for a clean full mesh and flushes every node.  Tests that need persistence
across a crash start their own cluster.  Node timeout is 1000 ms everywhere
so failure detection takes about a second; every wait polls a condition
against a deadline.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from clusterkit import Cluster
from support import wait_for

FAST = ("--cluster-node-timeout", "1000")
NOREPL_REACH = "NOREPL Not enough reachable nodes for the requested replication level"
NOREPL_TIMEOUT = "NOREPL Timeout reached before replicating to the requested number of nodes"
LEAVING_ERR = "LEAVING This node is leaving the cluster, please connect to a different one"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("c5"), 5, *FAST) as cluster:
        yield cluster


@pytest.fixture
def c5(shared: Cluster) -> Cluster:
    try:
        shared.heal()
    except Exception:
        shared.rebuild()  # this test errors; the next one gets a fresh cluster
        raise
    return shared


@pytest.fixture
def new_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Start a cluster of its own (stopped at teardown)."""
    started: list[Cluster] = []

    def make(size: int, *extra: str) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(started)}", size, *FAST, *extra)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.stop()


def error_of(call: Callable[[], Any]) -> str:
    with pytest.raises(redis.ResponseError) as info:
        call()
    return str(info.value)


def ids_of(entries: list[Any]) -> list[str]:
    return [entry[1].decode() for entry in entries]


def non_holder(cluster: Cluster, job_id: str) -> int:
    return next(i for i in cluster.live() if cluster.show(i, job_id) is None)


def add_placed(cluster: Cluster, origin: int, repl: int, wanted: Callable[[set[int]], bool]) -> str:
    """ADDJOB REPLICATE `repl` RETRY 2 on `origin` until the copies land on
    nodes accepted by `wanted` (replicas are picked at random); FASTACK the
    misses."""
    for _ in range(50):
        job = cluster.addjob(origin, "placedq", "b", 5000, "REPLICATE", repl, "RETRY", 2)
        if wanted(set(cluster.holders(job))):
            return job
        assert cluster.call(origin, "FASTACK", job) == 1
        cluster.wait(lambda: not cluster.holders(job), 5, "the miss deleted")
    raise AssertionError("no job placed as wanted in 50 attempts")


# ---------------------------------------------------------------- membership


def test_chain_of_meets_forms_a_full_mesh(c5: Cluster) -> None:
    """Each node only met its predecessor: gossip found everyone else."""
    for i in c5.indexes:
        info = c5.info(i)
        assert (info["cluster_known_nodes"], info["cluster_reachable_nodes"], info["cluster_size"]) == ("5", "4", "5")
        view = c5.nodes_view(i)
        for j in c5.indexes:
            assert view[c5.ids[j]]["addr"] == f"127.0.0.1:{c5.nodes[j].port}"
        hello = c5.call(i, "HELLO")
        assert hello[0] == 1 and hello[1].decode() == c5.ids[i]
        entries = {e[0].decode(): (e[1], e[2], e[3]) for e in hello[2:]}
        assert entries == {c5.ids[j]: (b"127.0.0.1", str(c5.nodes[j].port).encode(), b"1") for j in c5.indexes}
        saved = (c5.nodes[i].workdir / "nodes.conf").read_text()
        assert all(node_id in saved for node_id in c5.ids)


def test_fail_is_flagged_by_everyone_then_cleared(c5: Cluster) -> None:
    c5.pause(4)
    started = time.monotonic()
    others = [0, 1, 2, 3]
    c5.wait(lambda: all("fail" in c5.flags(i, 4) for i in others), 10, "FAIL on node4 seen by every node")
    detected = time.monotonic() - started
    assert detected < 6, detected  # node timeout 1000 ms
    assert c5.info(0)["cluster_reachable_nodes"] == "3"
    assert c5.info(0)["cluster_size"] == "5"  # failing nodes still count
    priorities = {e[0].decode(): e[3] for e in c5.call(0, "HELLO")[2:]}
    assert priorities[c5.ids[4]] == b"100"
    # FAIL nodes are not replication targets; the default REPLICATE is still 3
    assert error_of(lambda: c5.addjob(0, "failq", "b", 5000, "REPLICATE", 5)) == NOREPL_REACH
    job = c5.addjob(0, "failq", "b", 5000, "REPLICATE", 4)
    assert set(c5.holders(job)) == {0, 1, 2, 3}
    job = c5.addjob(1, "failq")
    assert c5.show(1, job)["repl"] == 3
    c5.resume(4)
    c5.wait_healthy(10)  # any PONG clears FAIL


def test_forget_blacklists_the_node_for_gossip(c5: Cluster) -> None:
    forgotten = c5.ids[4]
    for i in range(4):
        assert c5.call(i, "CLUSTER", "FORGET", forgotten) == b"OK"
    for i in range(4):
        assert forgotten not in c5.nodes_view(i)
        assert (c5.info(i)["cluster_known_nodes"], c5.info(i)["cluster_reachable_nodes"]) == ("4", "3")
    # node4 starts over and meets node0 only: node0's gossip about it must not
    # make nodes 1-3 shake hands with a blacklisted ID
    assert c5.call(4, "CLUSTER", "RESET", "SOFT") == b"OK"
    assert c5.call(4, "CLUSTER", "MEET", "127.0.0.1", c5.nodes[0].port) == b"OK"
    c5.wait(lambda: "noflags" in c5.flags(0, 4) and len(c5.nodes_view(4)) == 5, 5, "node4 known to node0, and knowing all")
    deadline = time.monotonic() + 1.5  # a few gossip rounds (one ping every T/2 = 500 ms)
    while time.monotonic() < deadline:
        assert all(forgotten not in c5.nodes_view(i) for i in (1, 2, 3))
        time.sleep(0.1)
    # an explicit MEET is trusted even for a blacklisted ID
    for i in (1, 2, 3):
        assert c5.call(i, "CLUSTER", "MEET", "127.0.0.1", c5.nodes[4].port) == b"OK"
    c5.wait_healthy(10)


# ---------------------------------------------------------------- replication


def test_synchronous_replication_reaches_the_requested_level(c5: Cluster) -> None:
    for n in range(1, 6):
        origin = n % 5
        job = c5.addjob(origin, "replq", f"body{n}", 5000, "REPLICATE", n)
        holders = c5.holders(job)  # replicas confirmed before the producer got the ID
        # (one more copy is possible: a target slower than 50 ms gets company)
        assert len(holders) >= n and holders[origin] == "queued"
        assert all(state == "active" for i, state in holders.items() if i != origin)
        owners = {x.decode() for x in c5.show(origin, job)["nodes-delivered"]}
        c5.wait(lambda: {c5.ids[i] for i in c5.holders(job)} == owners, 5, "a copy on every node in nodes-delivered")
        for i in holders:
            info = c5.show(i, job)
            assert {x.decode() for x in info["nodes-delivered"]} <= owners
            assert (info["repl"], info["body"], info["queue"]) == (n, f"body{n}".encode(), b"replq")
    default = c5.addjob(2, "replq")
    assert len(c5.holders(default)) >= 3 and c5.show(2, default)["repl"] == 3


def test_pipelined_addjobs_replicate_together_and_answer_in_order(c5: Cluster) -> None:
    """A pipeline of synchronous ADDJOBs goes on while earlier ones wait for
    their replicas; the answers come back in request order, errors
    included, and any other command waits for every ADDJOB before it."""
    from rawsock import Error, Raw, pack

    conn = Raw(("127.0.0.1", c5.nodes[0].port))
    try:
        requests = [pack("ADDJOB", "pipeq", f"b{i}", 5000, "REPLICATE", 3) for i in range(40)]
        requests.insert(20, pack("ADDJOB", "pipeq", "bad", 5000, "REPLICATE", 99))  # refused at once
        requests += [pack("QLEN", "pipeq"), pack("ADDJOB", "pipeq", "last", 5000, "REPLICATE", 3), pack("QLEN", "pipeq")]
        conn.send(b"".join(requests))
        replies = [conn.read() for _ in requests]
    finally:
        conn.close()
    assert isinstance(replies[20], Error) and replies[41] == 40 and replies[43] == 41
    ids = replies[:20] + replies[21:41] + [replies[42]]
    assert [c5.show(0, job_id)["body"] for job_id in ids] == [f"b{i}".encode() for i in range(40)] + [b"last"]


def test_client_pause_does_not_stop_the_cluster_bus(c5: Cluster) -> None:
    """While CLIENT PAUSE holds a node's clients, the node still answers its
    peers: nobody flags it, and it confirms the jobs others replicate to it."""
    from rawsock import Raw, pack

    c5.call(0, "CLIENT", "PAUSE", 3000)
    waiting = Raw(("127.0.0.1", c5.nodes[0].port))
    try:
        waiting.send(pack("QLEN", "pq"))  # read, and held until the pause ends
        started = time.monotonic()
        while time.monotonic() - started < 2.5:
            job = c5.addjob(1, "pq", "during the pause", 2000, "REPLICATE", 5)
            assert 0 in c5.holders(job)
            assert not any({"PFAIL", "FAIL"} & c5.flags(i, 0) for i in range(1, 5))
        assert waiting.read() == 0  # served once the pause is over (node 0 holds the copies, active)
    finally:
        waiting.close()


def test_asynchronous_replication(c5: Cluster) -> None:
    job = c5.addjob(1, "asyncq", "b", 0, "REPLICATE", 4, "ASYNC")
    assert c5.show(1, job)["state"] == b"queued"  # queued at once, no waiting for replicas
    c5.wait(lambda: len(c5.holders(job)) == 4, 5, "4 asynchronous copies")
    holders = c5.holders(job)
    assert sorted(holders.values()) == ["active", "active", "active", "queued"]
    assert c5.call(1, "GETJOB", "NOHANG", "FROM", "asyncq")[0][1].decode() == job


def test_impossible_replication_levels_answer_norepl(c5: Cluster) -> None:
    assert error_of(lambda: c5.addjob(0, "noq", "b", 1000, "REPLICATE", 6)) == NOREPL_REACH
    assert error_of(lambda: c5.addjob(0, "noq", "b", 1000, "REPLICATE", 100, "ASYNC")) == NOREPL_REACH
    assert error_of(lambda: c5.addjob(0, "noq", "b", 1000, "RETRY", 0)).startswith("With RETRY set to 0")
    assert c5.raw(0, "ADDJOB", "noq", "b", "0", "REPLICATE", "6") == f"-{NOREPL_REACH}\r\n".encode()
    assert all(c5.registered_jobs(i) == 0 for i in c5.indexes)
    assert c5.call(0, "QLEN", "noq") == 0


def test_nodes_killed_just_before_addjob(c5: Cluster) -> None:
    c5.kill(3)
    c5.kill(4)
    # Not flagged yet (node timeout 1 s): still counted reachable, but dead.
    reply = error_of(lambda: c5.addjob(0, "killq", "b", 700, "REPLICATE", 5))
    assert reply in (NOREPL_TIMEOUT, NOREPL_REACH), reply
    c5.wait(lambda: all(c5.registered_jobs(i) == 0 for i in c5.live()), 5, "the failed job deleted everywhere")
    job = c5.addjob(1, "killq", "b", 5000, "REPLICATE", 3)
    assert set(c5.holders(job)) == {0, 1, 2}
    c5.wait(lambda: "fail" in c5.flags(0, 3) and "fail" in c5.flags(0, 4), 10, "FAIL on the killed nodes")
    assert error_of(lambda: c5.addjob(2, "killq", "b", 700, "REPLICATE", 4)) == NOREPL_REACH
    c5.restart(3)
    c5.restart(4)
    c5.wait_healthy()
    job = c5.addjob(4, "killq", "b", 5000, "REPLICATE", 5)
    assert len(c5.holders(job)) == 5


@pytest.mark.parametrize("mode", ["HARD", "SOFT"])
def test_replicated_jobs_after_cluster_reset_and_a_new_meet(new_cluster: Callable[..., Cluster], mode: str) -> None:
    """Every node reset, then joined again: replicated jobs stay queued on the
    node that created them, as in a fresh cluster (a node reset HARD used to
    drop its own copy, keyed by its old ID)."""
    c = new_cluster(3)
    old = list(c.ids)
    for i in c.indexes:
        assert c.call(i, "CLUSTER", "RESET", mode) == b"OK"
    c.ids = [c.call(i, "CLUSTER", "MYID").decode() for i in c.indexes]
    assert all((new == was) == (mode == "SOFT") for new, was in zip(c.ids, old))
    for i in (1, 2):
        assert c.call(i, "CLUSTER", "MEET", c.nodes[0].host, c.nodes[0].port) == b"OK"
    c.wait_healthy()
    jobs = []
    for origin, opts in ((0, ("REPLICATE", 3)), (1, ())):  # explicit and default replication
        job = c.addjob(origin, "resetq", "body", 5000, *opts)
        assert job[2:10] == c.ids[origin][:8]
        assert c.holders(job) == {i: "queued" if i == origin else "active" for i in c.indexes}
        assert sorted(n.decode() for n in c.show(origin, job)["nodes-delivered"]) == sorted(c.ids)
        jobs.append(job)
    assert ids_of(c.call(0, "GETJOB", "NOHANG", "FROM", "resetq")) == [jobs[0]]


def test_synchronous_replication_waits_for_a_node_that_comes_back(new_cluster: Callable[..., Cluster]) -> None:
    """kill -9 a node, ADDJOB REPLICATE 3 at once, restart the node after the
    others flagged it: the producer gets its ID once the node is back (REPLJOB
    is sent again until the ADDJOB timeout), not NOREPL."""
    c = new_cluster(3)
    c.kill(1)
    result: list[str] = []
    producer = redis.Redis(host="127.0.0.1", port=c.nodes[0].port, protocol=2, socket_timeout=40)

    def produce() -> None:
        try:
            result.append(producer.execute_command("ADDJOB", "backq", "b", 30000, "REPLICATE", 3).decode())
        except redis.ResponseError as e:
            result.append(str(e))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        c.wait(lambda: c.call(0, "INFO", "clients")["blocked_clients"] == 1, 5, "the ADDJOB waiting")
        c.wait(lambda: "fail" in c.flags(0, 1), 10, "node1 flagged failing")
        assert not result
        c.restart(1)
        thread.join(15)
    finally:
        producer.close()
    assert len(result) == 1 and result[0].startswith("DI"), result
    assert c.holders(result[0]) == {0: "queued", 1: "active", 2: "active"}


# ---------------------------------------------------------------- requeue and durability


def test_requeue_when_the_queueing_node_dies(c5: Cluster) -> None:
    taken = c5.addjob(0, "rq", "taken", 5000, "REPLICATE", 3, "RETRY", 1)
    assert ids_of(c5.call(0, "GETJOB", "NOHANG", "FROM", "rq")) == [taken]  # a consumer has it, never acks
    queued = c5.addjob(0, "rq", "queued", 5000, "REPLICATE", 3, "RETRY", 1)  # still in node0's queue
    # While node0 lives, the replicas' WILLQUEUE gets a QUEUED answer: they
    # postpone their requeue instead of queueing a duplicate.
    replicas = [i for i in c5.holders(queued) if i != 0]
    initial = {i: time.time() * 1000 + c5.show(i, queued)["next-requeue-within"] for i in replicas}
    c5.wait(
        lambda: all(time.time() * 1000 + c5.show(i, queued)["next-requeue-within"] > initial[i] + 300 for i in replicas),
        5, "the replicas postponed their requeue",
    )  # fmt: skip
    assert c5.holders(queued) == {0: "queued", **{i: "active" for i in replicas}}
    c5.kill(0)
    survivors = {job: [i for i in c5.holders(job) if i != 0] for job in (queued, taken)}
    assert all(len(s) >= 2 for s in survivors.values())
    for job, owners in survivors.items():  # exactly one of them keeps it queued
        c5.wait(lambda: list(c5.holders(job, owners).values()).count("queued") == 1, 6, f"{job} requeued by one replica")
    seen: dict[str, Any] = {}
    consumer = survivors[taken][0]

    def fetch() -> bool:
        for entry in c5.call(consumer, "GETJOB", "TIMEOUT", 200, "COUNT", 2, "WITHCOUNTERS", "FROM", "rq") or []:
            seen[entry[1].decode()] = entry
        return len(seen) == 2

    c5.wait(fetch, 10, "both jobs delivered again from the replicas")
    assert seen[taken][2] == b"taken" and seen[taken][6] >= 1  # additional-deliveries counted


def test_nack_delay_holds_the_job_back_on_every_node(c5: Cluster) -> None:
    """NACK ... DELAY 4 on the node that delivered a job with RETRY 1 and
    three copies: for the delay no copy is queued anywhere (without the delay
    in QUEUED, the replicas would requeue it after their RETRY), then it is
    queued once, with one NACK counted everywhere."""
    job = c5.addjob(0, "nd", "later", 5000, "REPLICATE", 3, "RETRY", 1)
    assert ids_of(c5.call(0, "GETJOB", "NOHANG", "FROM", "nd")) == [job]
    nacked = time.monotonic()
    assert c5.call(0, "NACK", job, "DELAY", 4) == 1
    holders = list(c5.holders(job))
    while time.monotonic() - nacked < 3.5:
        assert "queued" not in c5.holders(job, holders).values(), f"queued {time.monotonic() - nacked:.1f} s after NACK DELAY 4"
        time.sleep(0.1)
    c5.wait(lambda: list(c5.holders(job, holders).values()).count("queued") == 1, 5, "the job queued again after the delay")
    assert time.monotonic() - nacked >= 3.9
    assert all(c5.show(i, job)["nacks"] == 1 for i in holders)


def test_maxattempts_dead_letters_once_after_the_third_nack(c5: Cluster) -> None:
    """MAXATTEMPTS 3 on a job with three copies: a consumer that always NACKs
    sees it three times; then exactly one copy of it is in the dead-letter
    queue, carrying its old ID, and the old job is gone from every node."""
    job = c5.addjob(0, "ma", "body", 5000, "REPLICATE", 3, "RETRY", 60, "MAXATTEMPTS", 3, "DEADLETTER", "ma-dead")
    holders = list(c5.holders(job))
    seen = 0
    while got := c5.call(0, "GETJOB", "TIMEOUT", 500, "FROM", "ma"):
        assert got[0][1].decode() == job
        seen += 1
        assert c5.call(0, "NACK", job) == 1
    assert seen == 3
    c5.wait(lambda: not c5.holders(job, holders), 5, "the old job deleted everywhere")
    dead = [(i, c5.call(i, "QPEEK", "ma-dead", 10)) for i in range(len(c5.nodes))]
    queued = [(i, entry) for i, entries in dead for entry in entries]
    assert len(queued) == 1, queued
    i, (_, dead_id, body) = queued[0]
    assert body == b"body" and c5.show(i, dead_id.decode())["dead-letter-of"] == job.encode()


def test_waitjob_on_a_batch_returns_when_the_last_is_acknowledged_elsewhere(c5: Cluster) -> None:
    """A producer adds 1,000 jobs on node 0 and waits for them there; a
    consumer on node 1 takes and acknowledges them.  WAITJOB answers 1,000
    after the last ACK and not before."""
    ids = [c5.addjob(0, "batch", f"j{i}", 5000, "REPLICATE", 2) for i in range(1000)]
    answer: list[Any] = []
    last_ack = [0.0]
    waiter = threading.Thread(target=lambda: answer.append((c5.raw(0, "WAITJOB", *ids, "TIMEOUT", 60000), time.monotonic())))
    waiter.start()
    taken = 0
    while taken < len(ids):
        got = c5.call(1, "GETJOB", "TIMEOUT", 2000, "COUNT", 100, "FROM", "batch") or []
        assert got, "node 1 ran out of jobs to take"
        assert not answer, "WAITJOB answered before every job was acknowledged"
        c5.call(1, "ACKJOB", *[entry[1] for entry in got])
        last_ack[0] = time.monotonic()
        taken += len(got)
    waiter.join(30)
    [(reply, when)] = answer
    assert reply == b":1000\r\n" and when >= last_ack[0] - 0.05


def test_jobs_replicated_n_times_survive_n_minus_1_crashes(c5: Cluster) -> None:
    rng = random.Random(3)
    three = {c5.addjob(rng.randrange(5), "surv", f"r3-{k}", 5000, "REPLICATE", 3, "RETRY", 1): f"r3-{k}" for k in range(10)}
    five = c5.addjob(2, "surv", "r5", 5000, "REPLICATE", 5, "RETRY", 1)
    c5.kill(0)
    c5.kill(1)  # any job with 3 copies keeps at least one
    expected = {**three, five: "r5"}
    got: dict[str, bytes] = {}

    def drain(node: int, wanted: dict[str, str]) -> Callable[[], bool]:
        def step() -> bool:
            for entry in c5.call(node, "GETJOB", "TIMEOUT", 300, "COUNT", 20, "FROM", "surv") or []:
                got[entry[1].decode()] = entry[2]
            return set(wanted) <= set(got)

        return step

    c5.wait(drain(4, expected), 20, "every job fetched from node4 after 2 crashes")
    assert {job: got[job].decode() for job in expected} == expected
    c5.kill(2)
    c5.kill(3)  # 4 of the 5 copies of `five` gone: the last one requeues it
    got.clear()
    c5.wait(drain(4, {five: "r5"}), 10, "the 5-copy job delivered again by the last node")


# ---------------------------------------------------------------- acknowledgements


def test_ackjob_on_any_owner_removes_every_copy(c5: Cluster) -> None:
    for where in ("creator", "replica"):
        job = c5.addjob(1, "ackq", "b", 5000, "REPLICATE", 3)
        holders = c5.holders(job)
        node = 1 if where == "creator" else next(i for i in holders if i != 1)
        assert c5.call(node, "ACKJOB", job) == 1
        c5.wait(lambda: not c5.holders(job), 5, f"every copy gone after ACKJOB on the {where}")


def test_ackjob_on_a_node_without_a_copy(c5: Cluster) -> None:
    job = c5.addjob(0, "ackq", "b", 5000, "REPLICATE", 2)
    stranger = non_holder(c5, job)
    assert c5.call(stranger, "ACKJOB", job) == 0  # a dummy ACK does not count
    c5.wait(lambda: not c5.holders(job), 5, "every copy and the dummy ACK gone")
    # an ID nobody knows: the dummy ACK asks everyone, then goes away
    ghost = "DI" + c5.ids[0][:8] + "ab" * 16 + "05a1SQ"
    assert c5.call(3, "ACKJOB", ghost) == 0
    c5.wait(lambda: c5.show(3, ghost) is None, 5, "the dummy ACK collected")


def test_fastack(c5: Cluster) -> None:
    job = c5.addjob(2, "fastq", "b", 5000, "REPLICATE", 3)
    replica = next(i for i in c5.holders(job) if i != 2)
    assert c5.call(replica, "FASTACK", job) == 1
    c5.wait(lambda: not c5.holders(job), 5, "every copy gone after FASTACK on a replica")
    job = c5.addjob(2, "fastq", "b", 5000, "REPLICATE", 3)
    stranger = non_holder(c5, job)
    assert c5.call(stranger, "FASTACK", job) == 0  # unknown here: DELJOB to everyone
    c5.wait(lambda: not c5.holders(job), 5, "every copy gone after FASTACK on a node without a copy")


def test_ack_with_owners_down_completes_after_restart(new_cluster: Callable[..., Cluster]) -> None:
    c = new_cluster(5, "--appendonly", "yes")
    # `acked`: 3 copies, 2 owners crash, ACKJOB on the surviving owner.
    acked = add_placed(c, 0, 3, lambda owners: len(owners) == 3)
    down = sorted(set(c.holders(acked)) - {0})
    # `dummy`: both owners crash (the same two nodes), ACKJOB on a node that never had it.
    dummy = add_placed(c, down[0], 2, lambda owners: owners == set(down))
    crashed = down
    stranger = next(i for i in c.indexes if i not in crashed and i != 0)
    for i in crashed:
        c.kill(i)
    assert c.call(0, "ACKJOB", acked) == 1
    assert c.call(stranger, "ACKJOB", dummy) == 0
    # the owners still up cannot finish: the crashed owners never confirm
    assert c.show(0, acked)["state"] == b"acked"
    assert c.show(stranger, dummy)["state"] == b"acked"
    restored = set()
    for i in crashed:
        c.restart(i)  # the AOF brings their copies back (looked at before any GC can reach them)
        restored |= {job for job in (acked, dummy) if c.show(i, job) is not None}
    assert restored == {acked, dummy}, "the AOF did not restore the copies"
    c.wait(lambda: not c.holders(acked) and not c.holders(dummy), 25, "both jobs gone everywhere after the restarts")


def test_whole_cluster_restart_with_aof(new_cluster: Callable[..., Cluster]) -> None:
    c = new_cluster(5, "--appendonly", "yes")
    jobs = {c.addjob(k % 5, "fullq", f"b{k}", 5000, "REPLICATE", 3, "RETRY", 1): f"b{k}" for k in range(10)}
    c.restart_all()  # same IDs (checked by restart), peers from nodes.conf, jobs from the AOF
    c.wait_healthy()
    got: dict[str, str] = {}

    def fetch() -> bool:
        for entry in c.call(2, "GETJOB", "TIMEOUT", 300, "COUNT", 10, "FROM", "fullq") or []:
            got[entry[1].decode()] = entry[2].decode()
        return set(jobs) <= set(got)

    c.wait(fetch, 15, "every job delivered after the restart")
    assert {job: got[job] for job in jobs} == jobs
    assert c.call(2, "ACKJOB", *jobs) == len(jobs)
    c.wait(lambda: all(c.registered_jobs(i) == 0 for i in c.indexes), 15, "every copy collected")


# ---------------------------------------------------------------- federation


def test_federation_100_jobs_from_random_nodes_fetched_from_one(c5: Cluster) -> None:
    rng = random.Random(7)
    jobs = {c5.addjob(rng.randrange(5), "fedq", f"job-{k}", 5000): f"job-{k}" for k in range(100)}
    assert len(jobs) == 100
    got: dict[str, str] = {}

    def fetch() -> bool:
        entries = c5.call(0, "GETJOB", "TIMEOUT", 500, "COUNT", 100, "FROM", "fedq") or []
        for entry in entries:
            job = entry[1].decode()
            assert job not in got, f"{job} delivered twice"
            got[job] = entry[2].decode()
        if entries:
            assert c5.call(0, "ACKJOB", *ids_of(entries)) == len(entries)
        return len(got) == 100

    c5.wait(fetch, 30, "100 jobs fetched from node0")
    assert got == jobs
    c5.wait(lambda: all(c5.registered_jobs(i) == 0 for i in c5.indexes), 15, "every acked job collected on every node")


def test_blocked_consumer_gets_a_job_queued_on_another_node(c5: Cluster) -> None:
    result: list[Any] = []
    consumer = redis.Redis(host="127.0.0.1", port=c5.nodes[1].port, protocol=2, socket_timeout=30)
    thread = threading.Thread(
        target=lambda: result.append(consumer.execute_command("GETJOB", "TIMEOUT", 15000, "FROM", "bq")), daemon=True
    )
    thread.start()
    try:
        c5.wait(lambda: c5.call(1, "INFO", "clients")["blocked_clients"] == 1, 5, "the GETJOB blocked")
        # the first NEEDJOBS broadcast found nothing; the next one (2 s backoff, doubling) does
        job = c5.addjob(3, "bq", "far", 5000, "REPLICATE", 1)
        thread.join(15)
    finally:
        consumer.close()
    assert ids_of(result[0]) == [job]


def test_at_most_once_jobs_move_for_good(c5: Cluster) -> None:
    jobs = {c5.addjob(3, "amoq", f"m{k}", 5000, "REPLICATE", 1, "RETRY", 0) for k in range(4)}
    got: set[str] = set()

    def fetch() -> bool:
        got.update(ids_of(c5.call(0, "GETJOB", "TIMEOUT", 300, "COUNT", 4, "FROM", "amoq") or []))
        return got == jobs

    c5.wait(fetch, 15, "the at-most-once jobs fetched from node0")
    assert all(c5.show(3, job) is None for job in jobs)  # handed over, not kept
    assert all(c5.show(0, job)["state"] == b"active" for job in jobs)
    assert c5.call(0, "ENQUEUE", *jobs) == 0  # never queued again


def test_pause_broadcast(c5: Cluster) -> None:
    assert c5.call(2, "PAUSE", "pq", "in", "bcast") == b"in"
    c5.wait(lambda: all(c5.call(i, "PAUSE", "pq", "state") == b"in" for i in c5.indexes), 5, "the pause everywhere")
    assert error_of(lambda: c5.addjob(4, "pq")) == "PAUSED Queue paused in input, try later"
    assert c5.call(2, "PAUSE", "pq", "none", "bcast") == b"none"
    c5.wait(lambda: all(c5.call(i, "PAUSE", "pq", "state") == b"none" for i in c5.indexes), 5, "the pause lifted")


# ---------------------------------------------------------------- LEAVING


def test_leaving(c5: Cluster) -> None:
    drain = [c5.addjob(4, "drainq", f"d{k}", 5000, "REPLICATE", 1) for k in range(3)]
    blocked: list[Any] = []
    waiter = redis.Redis(host="127.0.0.1", port=c5.nodes[4].port, protocol=2, socket_timeout=30)

    def block() -> None:
        try:
            blocked.append(waiter.execute_command("GETJOB", "TIMEOUT", 20000, "FROM", "emptyq"))
        except redis.ResponseError as e:
            blocked.append(str(e))

    thread = threading.Thread(target=block, daemon=True)
    thread.start()
    c5.wait(lambda: c5.call(4, "INFO", "clients")["blocked_clients"] == 1, 5, "the GETJOB blocked")
    assert c5.call(4, "CLUSTER", "LEAVING", "yes") == b"OK"
    assert c5.call(4, "CLUSTER", "LEAVING") == b"yes"
    thread.join(5)
    waiter.close()
    assert blocked == [LEAVING_ERR]
    c5.wait(lambda: all("leaving" in c5.flags(i, 4) for i in range(4)), 5, "LEAVING seen by every node")
    assert "myself,leaving" in (c5.nodes[4].workdir / "nodes.conf").read_text()
    assert c5.info(0)["cluster_reachable_nodes"] == "3"
    assert {e[0].decode(): e[3] for e in c5.call(0, "HELLO")[2:]}[c5.ids[4]] == b"100"
    assert {e[0].decode(): e[3] for e in c5.call(4, "HELLO")[2:]}[c5.ids[4]] == b"100"
    # nobody replicates onto a leaving node
    assert error_of(lambda: c5.addjob(0, "leaveq", "b", 1000, "REPLICATE", 5)) == NOREPL_REACH
    job = c5.addjob(0, "leaveq", "b", 5000, "REPLICATE", 4)
    assert set(c5.holders(job)) == {0, 1, 2, 3}
    # the leaving node keeps no copy: external replication, queued elsewhere
    job = c5.addjob(4, "leaveq", "ext", 5000, "REPLICATE", 2)
    holders = c5.holders(job)
    assert 4 not in holders and len(holders) >= 2
    c5.wait(lambda: "queued" in c5.holders(job).values(), 5, "the external job queued on a replica")
    assert error_of(lambda: c5.addjob(4, "leaveq", "b", 1000, "REPLICATE", 5)).endswith("I'm leaving the cluster")
    once = c5.addjob(4, "leaveq", "once", 5000, "REPLICATE", 1, "RETRY", 0)  # at-most-once, queued remotely
    c5.wait(lambda: "queued" in c5.holders(once).values(), 5, "the at-most-once job queued on a replica")
    assert 4 not in c5.holders(once)
    # blocking GETJOB refused, no dummy ACKs
    assert error_of(lambda: c5.call(4, "GETJOB", "TIMEOUT", 100, "FROM", "emptyq")) == LEAVING_ERR
    ghost = "DI" + c5.ids[0][:8] + "cd" * 16 + "05a1SQ"
    assert c5.call(4, "ACKJOB", ghost) == 0 and c5.show(4, ghost) is None
    # it still serves its own queue to the others (NEEDJOBS), so it drains
    got: set[str] = set()

    def fetch() -> bool:
        got.update(ids_of(c5.call(1, "GETJOB", "TIMEOUT", 300, "COUNT", 3, "FROM", "drainq") or []))
        return got == set(drain)

    c5.wait(fetch, 15, "node4's queue drained through node1")
    # the flag survives a restart
    c5.nodes[4].stop()
    c5.restart(4)
    assert c5.call(4, "CLUSTER", "LEAVING") == b"yes"
    c5.wait(lambda: c5.info(0)["cluster_reachable_nodes"] == "3" and "leaving" in c5.flags(0, 4), 5, "node4 back, leaving")
    assert c5.call(4, "CLUSTER", "LEAVING", "no") == b"OK"
    c5.wait_healthy(5)


def test_producer_waiting_for_replication_gets_leaving(c5: Cluster) -> None:
    c5.pause(3)  # hung, not flagged yet: the job cannot reach 5 copies
    result: list[str] = []
    producer = redis.Redis(host="127.0.0.1", port=c5.nodes[1].port, protocol=2, socket_timeout=30)

    def produce() -> None:
        try:
            result.append(producer.execute_command("ADDJOB", "lq", "b", 0, "REPLICATE", 5))
        except redis.ResponseError as e:
            result.append(str(e))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        c5.wait(lambda: c5.call(1, "INFO", "clients")["blocked_clients"] == 1, 5, "the ADDJOB waiting")
        assert c5.call(1, "CLUSTER", "LEAVING", "yes") == b"OK"
        thread.join(5)
    finally:
        producer.close()
    assert result == [LEAVING_ERR]
    c5.wait(lambda: all(c5.registered_jobs(i) == 0 for i in (0, 1, 2, 4)), 5, "the job deleted everywhere")


def test_ttl_expires_every_copy(c5: Cluster) -> None:
    job = c5.addjob(0, "ttlq", "b", 5000, "REPLICATE", 3, "TTL", 1)
    assert len(c5.holders(job)) >= 3
    c5.wait(lambda: not c5.holders(job), 5, "every copy expired")


# ---------------------------------------------------------------- WORKING and NACK


def test_working_on_one_node_postpones_requeue_on_the_others(c5: Cluster) -> None:
    retry = 4000
    job = c5.addjob(0, "wq", "b", 5000, "REPLICATE", 3, "RETRY", retry // 1000)
    replica, other = [i for i in c5.holders(job) if i != 0][:2]

    def requeue_at(i: int) -> float:
        """Absolute time (unix ms) of the next requeue of `job` on node i."""
        return time.time() * 1000 + c5.show(i, job)["next-requeue-within"]

    def let_time_pass(since_requeue_at: float) -> None:
        """Until 1.5 s have passed since that requeue time was set (it was set
        to "now + retry + jitter", jitter within +-250 ms)."""
        wait_for(lambda: time.time() * 1000 > since_requeue_at - retry + 250 + 1500, 5, what="time passing")

    before = requeue_at(replica)
    let_time_pass(before)
    # WORKING on a replica: the queueing node dequeues the job and every copy postpones
    assert c5.call(replica, "WORKING", job) == 4
    c5.wait(lambda: c5.show(0, job)["state"] == b"active", 5, "node0 dequeued the job")
    assert c5.qlen(0, "wq") == 0
    assert requeue_at(replica) > before + 500
    c5.wait(lambda: requeue_at(0) > before + 500 and requeue_at(other) > before + 500, 5, "every copy postponed")
    # WORKING on node0 after a GETJOB there reaches the replicas the same way
    assert c5.call(0, "ENQUEUE", job) == 1
    assert ids_of(c5.call(0, "GETJOB", "NOHANG", "FROM", "wq")) == [job]
    first = requeue_at(other)
    let_time_pass(first)
    assert c5.call(0, "WORKING", job) == 4
    c5.wait(lambda: requeue_at(other) > first + 500, 5, "the replica postponed its requeue")


def test_nack_across_nodes(c5: Cluster) -> None:
    job = c5.addjob(1, "nq", "b", 5000, "REPLICATE", 3, "RETRY", 30)
    assert ids_of(c5.call(1, "GETJOB", "NOHANG", "FROM", "nq")) == [job]
    assert c5.call(1, "NACK", job) == 1  # back in node1's queue, every copy counts the NACK
    replicas = [i for i in c5.holders(job) if i != 1]
    c5.wait(lambda: all(c5.show(i, job)["nacks"] == 1 for i in replicas), 5, "the NACK counted on the replicas")
    entry = c5.call(1, "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "nq")[0]
    assert (entry[1].decode(), entry[4], entry[6]) == (job, 1, 0)
    # NACK on a replica: queued there, node1 (which handed it out) counts it too
    assert c5.call(replicas[0], "NACK", job) == 1
    c5.wait(lambda: c5.show(1, job)["nacks"] == 2, 5, "the second NACK counted on node1")
    entry = c5.call(replicas[0], "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "nq")[0]
    assert (entry[1].decode(), entry[4]) == (job, 2)
