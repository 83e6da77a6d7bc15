"""Waiting consumers (cluster/federation.py, spec/cluster.md §9.5): nodes
announce their blocked consumers (WAITING), and a job queued where nobody
waits goes at once (YOURJOBS) to a node where somebody does.

End-to-end flows run on the fake-clock mesh (tests/inprocess/mesh.py), whose bus
is instant: a delivery that needs no timer happens with the clock standing
still.  The edges of the bookkeeping drive one core whose peers are fakes
(`Node` below), feeding WAITING frames as the shell would and reading what
it sends from its effects.
"""

from __future__ import annotations

from typing import Any

import pytest

from disque.cluster import messages as m
from disque.store.records import job_to_wire
from disque.core.federation import WAIT_BATCH, WAIT_MAX_QUEUES, WAIT_REFRESH_MS, WAIT_TTL_MS
from disque.core.effects import Reply, Send
from disque.core.types import BLOCKED, Status
from disque.store.job import Job
from invariants import advance, check_core
from mesh import Mesh
from support import NODE_ID, Session, linked_core

T = 1000  # node timeout (ms)
PEER = "b0" * 20
PEER2 = "c1" * 20
PORTS = {PEER: 7712, PEER2: 7713}


# ---------------------------------------------------------------- the mesh: whole nodes


def formed(n: int = 3) -> Mesh:
    mesh = Mesh(n, node_timeout=T)
    for i in range(1, n):
        mesh.meet(i, 0)
    mesh.wait_for(lambda: all(len(c.membership.reachable()) == n - 1 for c in mesh.cores if c is not None), 5000)
    mesh.advance(WAIT_REFRESH_MS)  # past the first refresh of every node
    return mesh


def add(mesh: Mesh, i: int, *args: Any) -> bytes:
    """ADDJOB on node i; a replicated one is answered once the bus carried its copies."""
    reply = mesh.call(i, "ADDJOB", *args)
    if isinstance(reply, int):
        reply = mesh.reply(reply)
    assert isinstance(reply, Status), reply
    return bytes(reply)


def state(mesh: Mesh, i: int, job_id: bytes) -> str | None:
    job = mesh.core(i).jobs.get(job_id)
    return None if job is None else job.state.name.lower()


@pytest.mark.parametrize("opts", [(), ("REPLICATE", 1), ("REPLICATE", 1, "RETRY", 0)], ids=["repl3", "repl1", "retry0"])
def test_a_blocked_consumer_gets_a_job_added_elsewhere_with_no_timer(opts):
    mesh = formed()
    waiting = mesh.call(0, "GETJOB", "TIMEOUT", 20_000, "FROM", "lq")
    assert mesh.reply(waiting) is None
    start = mesh.clock.ms
    job_id = add(mesh, 2, "lq", "hello", 0, *opts)
    assert mesh.reply(waiting) == [[b"lq", job_id, b"hello"]]
    assert mesh.clock.ms == start  # no timer, no cron: the bus alone carried it
    if opts[-1:] == (0,):
        assert state(mesh, 2, job_id) is None  # at-most-once: moved for good
    else:
        # at-least-once: still covered by the producer's node, which knows where it went
        assert state(mesh, 2, job_id) == "active"
        assert mesh.my_id(0) in mesh.core(2).jobs.get(job_id).nodes_delivered
    for core in mesh.cores:
        check_core(core)


def test_jobs_queued_before_the_consumer_blocks_come_at_once():
    """A consumer that starts on another node than the queued jobs (a
    worker starting on a non-empty queue) is served as it blocks."""
    mesh = formed()
    ids = [add(mesh, 2, "lq", f"b{n}", 0, "REPLICATE", 1) for n in range(3)]
    mesh.advance(5000)
    start = mesh.clock.ms
    waiting = mesh.call(0, "GETJOB", "FROM", "lq")  # blocks: nothing is queued on node 0
    assert mesh.clock.ms == start and mesh.reply(waiting)[0][1] == ids[0]
    # The NEEDJOBS that GETJOB broadcast as well (spec/cluster.md §9.1) was
    # answered with one more job: it waits on node 0 for its next consumer.
    assert mesh.call(0, "QLEN", "lq") + mesh.call(2, "QLEN", "lq") == 2


def test_each_node_gets_as_many_jobs_as_it_has_consumers_waiting():
    mesh = formed()
    on_0 = [mesh.call(0, "GETJOB", "FROM", "lq") for _ in range(2)]
    on_1 = mesh.call(1, "GETJOB", "FROM", "lq")
    reply = mesh.call(2, "ADDJOB", "lq", "b", 0, "REPLICATE", 1)
    reply = [reply, *(mesh.call(2, "ADDJOB", "lq", "b", 0, "REPLICATE", 1) for _ in range(3))]
    assert all(mesh.reply(c) is not None for c in (*on_0, on_1))
    assert mesh.call(2, "QLEN", "lq") == 1  # four jobs, three consumers


def test_a_consumer_that_went_away_attracts_no_more_jobs():
    mesh = formed()
    waiting = mesh.call(0, "GETJOB", "TIMEOUT", 500, "FROM", "lq")
    mesh.advance(600)
    assert mesh.reply(waiting) is not None  # timed out: WAITING with a count of 0 went out
    assert all(not c.federation.wanted for c in mesh.cores)
    add(mesh, 2, "lq", "b", 0, "REPLICATE", 1)
    assert mesh.call(2, "QLEN", "lq") == 1 and mesh.call(0, "QLEN", "lq") == 0


def test_a_lost_announcement_is_made_again_by_the_refresh():
    mesh = formed()
    mesh.lose_next(2, m.Waiting)
    waiting = mesh.call(0, "GETJOB", "FROM", "lq")
    assert not mesh.losses  # node 2 never heard of the consumer
    add(mesh, 2, "lq", "b", 0, "REPLICATE", 1)
    took = mesh.wait_for(lambda: mesh.reply(waiting) is not None, 2 * WAIT_REFRESH_MS)
    assert took <= WAIT_REFRESH_MS + 100


def test_a_job_is_not_pushed_to_a_node_that_cannot_be_reached():
    """A RETRY 0 job handed to a node cut off would be lost: it stays."""
    mesh = formed()
    mesh.call(0, "GETJOB", "FROM", "lq")
    mesh.core(2).membership.nodes[mesh.my_id(0)].flags |= m.PFAIL
    job_id = add(mesh, 2, "lq", "b", 0, "REPLICATE", 1, "RETRY", 0)
    assert state(mesh, 2, job_id) == "queued"


# ---------------------------------------------------------------- one core, fake peers


class Node:
    """A core whose peers PEER and PEER2 are linked fakes."""

    def __init__(self) -> None:
        lines = [f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n"]
        lines += [f"{p} 127.0.0.1:{port} noflags 0 0 disconnected\n" for p, port in PORTS.items()]
        self.core, self.clock, _ = linked_core("".join(lines), PORTS)
        for peer in PORTS:
            self.pong(peer)
        self.s = Session(self.core)

    def key(self, peer: str) -> int:
        return self.core.membership.nodes[peer].key

    def pong(self, peer: str, features: int = m.FEATURES) -> None:
        """The peer answers a PING on our link to it, saying what it reads."""
        self.core.handle_bus(m.Header(peer, PORTS[peer], 0), m.Pong((), features), key=self.key(peer))

    def from_(self, sender: str, *entries: tuple[str, int]) -> None:
        msg = m.Waiting(tuple(m.WaitEntry(q.encode(), n) for q, n in entries))
        self.core.handle_bus(m.Header(sender, PORTS[sender], 0), msg)

    def sent(self) -> list[tuple[str, Any]]:
        """(peer, message) sent since the last call, PINGs left out."""
        out = [(self.core.membership.by_key[e.key].id, e.msg) for e in self.core.out.effects
               if isinstance(e, Send) and not isinstance(e.msg, m.Ping)]  # fmt: skip
        self.core.out.effects.clear()
        return out

    def waiting_sent(self) -> dict[str, list[tuple[bytes, int]]]:
        """peer -> the WAITING entries it was sent since the last call."""
        out: dict[str, list[tuple[bytes, int]]] = {}
        for peer, msg in self.sent():
            if isinstance(msg, m.Waiting):
                out.setdefault(peer, []).extend((e.queue, e.count) for e in msg.entries)
        return out

    def pushed(self) -> dict[str, int]:
        """peer -> jobs sent to it with YOURJOBS since the last call."""
        out: dict[str, int] = {}
        for peer, msg in self.sent():
            if isinstance(msg, m.YourJobs):
                out[peer] = out.get(peer, 0) + len(msg.jobs)
        return out

    def add(self, n: int = 1, queue: str = "q") -> None:
        for _ in range(n):
            assert isinstance(self.s("ADDJOB", queue, "b", 0, "REPLICATE", 1), Status)

    def wait(self, ms: int) -> None:
        advance(self.core, self.clock, ms)


def test_blocked_clients_are_announced_as_their_number_grows_and_when_none_is_left():
    node = Node()
    first, second = Session(node.core), Session(node.core)
    assert first("GETJOB", "FROM", "q") is BLOCKED
    assert node.waiting_sent() == {PEER: [(b"q", 1)], PEER2: [(b"q", 1)]}
    assert second("GETJOB", "FROM", "q") is BLOCKED
    assert node.waiting_sent() == {PEER: [(b"q", 2)], PEER2: [(b"q", 2)]}
    node.add()  # serves the first: a decrease is not announced
    assert node.waiting_sent() == {}
    assert Session(node.core)("GETJOB", "FROM", "q") is BLOCKED  # back to 2: announced again
    assert node.waiting_sent() == {PEER: [(b"q", 2)], PEER2: [(b"q", 2)]}
    node.add(2)
    assert node.waiting_sent() == {PEER: [(b"q", 0)], PEER2: [(b"q", 0)]}
    node.wait(2 * WAIT_REFRESH_MS)
    assert node.waiting_sent() == {}  # nothing left to refresh
    check_core(node.core)


def test_announcements_are_refreshed_and_given_to_a_link_that_comes_up():
    node = Node()
    assert Session(node.core)("GETJOB", "FROM", "q", "r") is BLOCKED
    assert node.waiting_sent()[PEER] == [(b"q", 1), (b"r", 1)]
    node.wait(WAIT_REFRESH_MS)
    assert node.waiting_sent()[PEER] == [(b"q", 1), (b"r", 1)]
    node.core.lifecycle.set_pause(b"r", 2)  # paused for output: jobs from elsewhere would not serve it
    node.wait(WAIT_REFRESH_MS)
    assert node.waiting_sent()[PEER] == [(b"q", 1), (b"r", 0)]
    node.wait(WAIT_REFRESH_MS)
    assert node.waiting_sent()[PEER] == [(b"q", 1)]
    node.core.link_closed(node.key(PEER), connect_failed=False)
    node.core.link_connected(node.key(PEER))
    assert node.waiting_sent() == {}  # the other end may be another process now: it says what it reads first
    node.pong(PEER)
    assert node.waiting_sent() == {PEER: [(b"q", 1)]}


def test_announcements_are_capped_and_batched():
    node = Node()
    names = [f"q{i}" for i in range(WAIT_MAX_QUEUES + 10)]
    assert Session(node.core)("GETJOB", "FROM", *names) is BLOCKED
    frames = [msg for peer, msg in node.sent() if peer == PEER and isinstance(msg, m.Waiting)]
    assert [len(f.entries) for f in frames] == [WAIT_BATCH] * (WAIT_MAX_QUEUES // WAIT_BATCH)
    assert [e.queue for f in frames for e in f.entries] == [n.encode() for n in names[:WAIT_MAX_QUEUES]]
    node.wait(WAIT_REFRESH_MS)
    assert len(node.waiting_sent()[PEER]) == WAIT_MAX_QUEUES  # the others get NEEDJOBS only


def test_jobs_go_to_announced_peers_oldest_first_up_to_their_counts():
    node = Node()
    node.from_(PEER, ("q", 2))
    node.from_(PEER2, ("q", 1))
    node.add(4)
    assert node.pushed() == {PEER: 2, PEER2: 1}
    assert node.s("QLEN", "q") == 1 and not node.core.federation.wanted
    check_core(node.core)


def test_an_announcement_takes_what_is_queued_for_nobody_here():
    node = Node()
    node.add(3)
    node.sent()
    node.from_(PEER, ("q", 2), ("other", 1))
    assert node.pushed() == {PEER: 2}
    assert node.s("QLEN", "q") == 1
    assert list(node.core.federation.wanted) == [b"other"]


def test_local_consumers_come_first():
    node = Node()
    node.from_(PEER, ("q", 1))
    local = Session(node.core)
    assert local("GETJOB", "FROM", "q") is BLOCKED
    node.add()
    assert [e.value[0][0] for e in node.core.out.effects if isinstance(e, Reply)] == [b"q"]
    assert node.pushed() == {}


def test_a_count_of_zero_or_an_expired_entry_stops_the_pushes():
    node = Node()
    node.from_(PEER, ("q", 5), ("r", 5))
    node.from_(PEER, ("q", 0), ("unknown", 0))
    node.add(queue="q")
    assert node.pushed() == {}
    node.wait(WAIT_TTL_MS + WAIT_REFRESH_MS)
    assert not node.core.federation.wanted  # "r" was never repeated: the cron forgot it
    node.add(queue="r")
    assert node.pushed() == {}


def test_an_expired_entry_met_by_a_push_is_dropped():
    node = Node()
    node.from_(PEER, ("q", 1))
    node.clock.ms += WAIT_TTL_MS  # no tick: the cron has not dropped it yet
    node.add()
    assert node.pushed() == {} and not node.core.federation.wanted


def test_a_repeated_entry_replaces_the_count_and_keeps_it_alive():
    node = Node()
    node.from_(PEER, ("q", 1))
    node.wait(WAIT_TTL_MS - 500)
    node.from_(PEER, ("q", 3))
    node.wait(1000)  # past the first entry's expiry
    node.add(4)
    assert node.pushed() == {PEER: 3}


def test_jobs_left_over_by_local_consumers_stay_when_nobody_else_waits():
    node = Node()
    assert Session(node.core)("GETJOB", "FROM", "q") is BLOCKED
    node.sent()
    now = node.clock.ms
    two = tuple(
        job_to_wire(Job(b"DI" + PEER[:8].encode() + b"%032x" % n + b"0005SQ", b"q", b"b", etime=now // 1000 + 300,
                        ctime=now * 1_000_000, retry=2, nodes_delivered=(PEER,)), now)
        for n in range(2)
    )  # fmt: skip
    node.core.handle_bus(m.Header(PEER, PORTS[PEER], 0), m.YourJobs(two))
    assert node.s("QLEN", "q") == 1 and node.pushed() == {}


def test_an_announcement_takes_nothing_from_a_queue_paused_for_output():
    node = Node()
    node.add()
    node.s("PAUSE", "q", "out")
    node.sent()
    node.from_(PEER, ("q", 1))
    assert node.pushed() == {} and node.s("QLEN", "q") == 1


@pytest.mark.parametrize("why", ["no link", "leaving", "paused"])
def test_no_push_to_an_unreachable_or_leaving_peer_nor_from_a_paused_queue(why):
    node = Node()
    node.from_(PEER, ("q", 1))
    if why == "no link":
        node.core.link_closed(node.key(PEER), connect_failed=False)
    elif why == "leaving":
        node.core.membership.nodes[PEER].flags |= m.LEAVING
    else:
        node.s("PAUSE", "q", "out")
    node.add()
    assert node.pushed() == {} and node.s("QLEN", "q") == 1


def test_a_peer_keeps_at_most_the_cap_of_queues_here():
    node = Node()
    entries = [(f"q{i}", 1) for i in range(WAIT_MAX_QUEUES + 1)]
    node.from_(PEER, *entries)
    assert len(node.core.federation.wanted) == WAIT_MAX_QUEUES
    node.from_(PEER2, entries[-1])  # another peer has room of its own
    node.add(queue=entries[-1][0])
    assert node.pushed() == {PEER2: 1}
    node.from_(PEER, ("q0", 0))
    node.from_(PEER, entries[-1])  # a slot came free
    assert b"q%d" % WAIT_MAX_QUEUES in node.core.federation.wanted
