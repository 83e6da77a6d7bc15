"""Edge cases of the cluster core: bus message handlers, replication,
federation, membership and the bus handshake.

Most tests drive one real `NodeCore` that knows a few peers from a nodes.conf
(the peers' links are up unless a test says otherwise): bus messages are fed
with `handle_bus` exactly as the shell delivers them, and everything the node
sends comes out of `core.out.effects`.  Flows that only make sense end to end
(a LEAVING node handing its new jobs to replicas) run on the simulated
network of tests/sim/network.py.
"""

from __future__ import annotations

import os

import logging
import random
from typing import Any

import pytest

from disque.core import errors
from disque.cluster import messages as m
from disque.cluster.auth import PREFIX, AuthError, AuthLink, Keyring
from disque.store.records import job_to_wire
from disque.core.federation import YOURJOBS_MAX_BYTES
from disque.cluster.membership import ConfError, Membership
from disque.cluster.messages import FAIL, HANDSHAKE, LEAVING, NOADDR, PFAIL, GossipEntry
from disque.core.effects import Answer, DropLink, Send
from disque.core.types import BLOCKED, Status
from disque.store.job import BCAST_WILLQUEUE, Job
from invariants import advance, check_core
from sim.network import SimCluster
from support import NODE_ID, Session, linked_core

PEER = "b0" * 20
PEER2 = "c1" * 20
PEER3 = "d2" * 20
PEER4 = "e3" * 20
STRANGER = "f4" * 20  # a node nobody here knows
PORTS = {PEER: 7712, PEER2: 7713, PEER3: 7714, PEER4: 7715}
ODD_ID = b"DI" + b"f" * 40 + b"05a1SQ"  # unknown, at-least-once TTL field
OK = Status(b"OK")


# ---------------------------------------------------------------- harness


class Node:
    """A core whose nodes.conf lists `peers` (id -> flags text) on 127.0.0.1;
    the links to the peers not in `unlinked` are up."""

    def __init__(self, peers: Any = (PEER,), *, unlinked: tuple[str, ...] = (), **config: Any) -> None:
        if not isinstance(peers, dict):
            peers = {p: "noflags" for p in peers}
        lines = [f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n"]
        for peer, flags in peers.items():
            addr = ":0" if "noaddr" in flags else f"127.0.0.1:{PORTS[peer]}"
            lines.append(f"{peer} {addr} {flags} 0 0 disconnected\n")
        linked = [peer for peer, flags in peers.items() if peer not in unlinked and "noaddr" not in flags]
        self.core, self.clock, self.host = linked_core("".join(lines), linked, **config)
        self.s = Session(self.core)

    @property
    def membership(self) -> Membership:
        return self.core.membership

    def peer(self, node_id: str) -> Any:
        return self.membership.nodes[node_id]

    def key(self, node_id: str) -> int:
        return self.membership.nodes[node_id].key

    def handshakes(self) -> list[Any]:
        return [n for n in self.membership.nodes.values() if n.flags & HANDSHAKE]

    def from_(self, sender: str, msg: Any, **kw: Any) -> None:
        """`msg` from a peer: PONGs on our link to it, the rest on its link to us."""
        if isinstance(msg, m.Pong):
            kw.setdefault("key", self.key(sender))
        self.core.handle_bus(m.Header(sender, PORTS.get(sender, 7730), 0), msg, **kw)

    def take(self, kind: type) -> list[Any]:
        out = [e for e in self.core.out.effects if isinstance(e, kind)]
        self.core.out.effects[:] = [e for e in self.core.out.effects if not isinstance(e, kind)]
        return out

    def sent(self) -> list[tuple[str, Any]]:
        """(destination node ID, message) of the bus messages sent since the
        last call, PINGs left out."""
        out = []
        for e in self.take(Send):
            if not isinstance(e.msg, m.Ping):
                target = self.membership.by_key.get(e.key)
                out.append((target.id if target else e.key, e.msg))
        return out

    def drops(self) -> list[int]:
        return [e.key for e in self.take(DropLink)]

    def add(self, *opts: Any, queue: str = "q", body: Any = "x") -> bytes:
        reply = self.s("ADDJOB", queue, body, 0, *opts)
        assert isinstance(reply, Status), reply
        return bytes(reply)

    def show(self, job_id: bytes) -> dict[str, Any] | None:
        return self.s.show(job_id)

    def state(self, job_id: bytes) -> str | None:
        shown = self.show(job_id)
        return None if shown is None else shown["state"]

    def wait(self, ms: int, on_tick: Any = None) -> None:
        advance(self.core, self.clock, ms, on_tick)


def origin_job(node: Node, n: int, *, retry: int = 2, delivered: tuple[str, ...] = (PEER, NODE_ID)) -> Job:
    """A job created by PEER, as PEER would replicate it."""
    job_id = b"DI" + PEER[:8].encode() + b"%032x" % n + (b"0005" if retry else b"0004") + b"SQ"
    now = node.clock.ms
    return Job(job_id, b"q", b"body", etime=now // 1000 + 300, ctime=now * 1_000_000, retry=retry,
               repl=len(delivered), nodes_delivered=delivered)  # fmt: skip


def replica(node: Node, n: int, **kw: Any) -> bytes:
    """Make `node` hold an active copy of a job of PEER; returns its ID."""
    job = origin_job(node, n, **kw)
    node.from_(PEER, m.ReplJob(job_to_wire(job, node.clock.ms)))
    assert node.sent() == [(PEER, m.GotJob(job.id))]
    return job.id


@pytest.fixture(autouse=True)
def handlers_do_not_fail(caplog: pytest.LogCaptureFixture) -> Any:
    """handle_bus logs and swallows a failing handler: that must not happen here."""
    yield
    errors_logged = [r.getMessage() for r in caplog.get_records("call") if r.levelno >= logging.ERROR]
    assert errors_logged == []


# ---------------------------------------------------------------- REPLJOB


@pytest.mark.parametrize("condition", ["healthy", "leaving", "out of memory"])
def test_repljob_is_ignored_by_a_leaving_or_full_node(condition):
    node = Node(maxmemory=100_000 if condition == "out of memory" else 1 << 30)  # the empty node: 90 %
    if condition == "leaving":
        assert node.s("CLUSTER", "LEAVING", "yes") == OK
    job = origin_job(node, 1)
    node.from_(PEER, m.ReplJob(job_to_wire(job, node.clock.ms)))
    if condition == "healthy":
        assert node.sent() == [(PEER, m.GotJob(job.id))] and node.state(job.id) == "active"
    else:  # no GOTJOB: the producer must find another replica
        assert node.sent() == [] and node.show(job.id) is None


def test_repljob_for_a_queue_paused_for_input_is_ignored():
    node = Node()
    node.s("PAUSE", "q", "in")
    job = origin_job(node, 1)
    wire = job_to_wire(job, node.clock.ms)
    node.from_(PEER, m.ReplJob(wire))
    assert node.sent() == [] and node.show(job.id) is None
    node.s("PAUSE", "q", "none")
    node.from_(PEER, m.ReplJob(wire))
    assert node.sent() == [(PEER, m.GotJob(job.id))] and node.state(job.id) == "active"


@pytest.mark.parametrize("noreply", [False, True])
def test_repljobs_keeps_every_copy_it_carries(noreply):
    """REPLJOBS (a step's REPLJOBs to one peer, in one body) is a REPLJOB for
    each of its jobs: each kept, and answered unless `noreply`."""
    node = Node()
    jobs = [origin_job(node, n) for n in (1, 2, 3)]
    node.from_(PEER, m.ReplJobs(tuple(job_to_wire(job, node.clock.ms) for job in jobs), noreply))
    assert node.sent() == ([] if noreply else [(PEER, m.GotJob(job.id)) for job in jobs])
    assert [node.state(job.id) for job in jobs] == ["active"] * 3


def test_repeated_repljob_merges_the_known_holders_only():
    node = Node(peers=(PEER, PEER2))
    job_id = replica(node, 1, delivered=(PEER, NODE_ID))
    wider = origin_job(node, 1, delivered=(PEER, NODE_ID, STRANGER, PEER2))
    node.from_(PEER, m.ReplJob(job_to_wire(wider, node.clock.ms)))
    assert node.sent() == [(PEER, m.GotJob(job_id))]  # duplicates are answered too
    shown = node.show(job_id)
    assert shown["nodes-delivered"] == [PEER, NODE_ID, PEER2] and shown["state"] == "active"


# ---------------------------------------------------------------- ENQUEUE


def test_enqueue_for_an_unknown_or_acked_job_is_ignored():
    node = Node()
    job_id = replica(node, 1)
    node.from_(PEER, m.Enqueue(origin_job(node, 2).id, 0))
    assert len(node.core.jobs) == 1 and node.s("QLEN", "q") == 0
    assert node.s("ACKJOB", job_id) == 1
    node.sent()
    node.from_(PEER, m.Enqueue(job_id, 0))
    assert node.state(job_id) == "acked" and node.s("QLEN", "q") == 0


def test_enqueue_waits_while_the_queue_is_paused_for_input():
    node = Node()
    job_id = replica(node, 1)
    node.s("PAUSE", "q", "in")
    node.from_(PEER, m.Enqueue(job_id, 0))
    assert node.state(job_id) == "active" and node.s("QLEN", "q") == 0
    node.s("PAUSE", "q", "none")
    node.from_(PEER, m.Enqueue(job_id, 0))
    assert node.state(job_id) == "queued" and node.sent() == []  # the first queueing is silent


def test_enqueue_of_an_at_most_once_replica_queues_it():
    """The upstream defect fixed: a RETRY 0 copy has no qtime, ENQUEUE gives it one."""
    node = Node()
    job_id = replica(node, 1, retry=0)
    assert node.show(job_id)["next-requeue-within"] is None
    node.from_(PEER, m.Enqueue(job_id, 0))
    assert node.state(job_id) == "queued"
    assert node.s("GETJOB", "NOHANG", "FROM", "q") == [[b"q", job_id, b"body"]]
    node.wait(10_000)
    assert node.state(job_id) == "active" and node.sent() == []  # never queued again


@pytest.mark.parametrize("retry", [2, 0])
def test_enqueue_with_a_delay_queues_the_job_later(retry):
    node = Node()
    job_id = replica(node, 1, retry=retry)
    node.from_(PEER, m.Enqueue(job_id, 3))
    assert node.show(job_id)["next-requeue-within"] == 3000  # no jitter
    node.wait(2_900)
    assert node.state(job_id) == "active"
    node.wait(200)
    assert node.state(job_id) == "queued"
    # an at-least-once copy announces it will queue the job; nobody announces QUEUED
    assert node.sent() == ([(PEER, m.WillQueue(job_id))] if retry else [])


# ---------------------------------------------------------------- QUEUED / WORKING / SETACK / GOTACK


@pytest.mark.parametrize("retry", [2, 0])
def test_queued_counts_deliveries_and_postpones_only_retrying_jobs(retry):
    node = Node()
    job_id = replica(node, 1, retry=retry)
    node.wait(1_000)
    node.from_(PEER, m.Queued(job_id, incr_nacks=True, incr_deliv=True))
    shown = node.show(job_id)
    assert (shown["nacks"], shown["additional-deliveries"]) == (1, 1)
    job = node.core.jobs.get(job_id)
    if retry:  # a whole retry period from now, announced first
        assert 2000 - 250 <= shown["next-requeue-within"] < 2000 + 250 and job.flags & BCAST_WILLQUEUE
    else:  # an at-most-once copy is never requeued
        assert shown["next-requeue-within"] is None and not job.flags & BCAST_WILLQUEUE


def shared_job(node: Node) -> bytes:
    """A job of `node` replicated to PEER, queued here."""
    producer = Session(node.core)
    assert producer("ADDJOB", "q", "x", 0, "REPLICATE", 2) is BLOCKED
    ((_, repl),) = node.sent()
    job_id = repl.job["id"]
    node.from_(PEER, m.GotJob(job_id))
    assert producer.pending() == [Status(job_id)] and node.state(job_id) == "queued"
    return job_id


@pytest.mark.parametrize(
    "mayhave, holders, expected",
    [
        (2, (), ["gotack"]),  # the sender knows as many holders: it runs the GC
        (2, (PEER, NODE_ID), ["gotack"]),  # ... the same ones
        (1, (), ["setack"]),  # we know more: we run the GC
        (2, (PEER, PEER2), ["setack+"]),  # as many, not the same: we run the GC over them all
        (2, (PEER, PEER3), ["gotack"]),  # a holder we do not know is nobody we could reach
        (0, (), ["gotack", "setack"]),  # the sender has a dummy ACK: tell it we have the job, and GC
    ],
)
def test_setack_hands_the_gc_to_the_widest_view(mayhave, holders, expected):
    node = Node((PEER, PEER2), unlinked=(PEER2,))  # the job goes to PEER; PEER2 is known all the same
    job_id = shared_job(node)
    node.from_(PEER, m.SetAck(job_id, mayhave, holders))
    assert node.state(job_id) == "acked"
    answers = {
        "gotack": [(PEER, m.GotAck(job_id, True))],
        "setack": [(PEER, m.SetAck(job_id, 2, (NODE_ID, PEER)))],
        "setack+": [(PEER, m.SetAck(job_id, 3, (NODE_ID, PEER, PEER2)))],  # PEER2's link is down: next attempt
    }
    assert node.sent() == [sent for name in expected for sent in answers[name]]


@pytest.mark.parametrize("known", [True, False])
def test_gotack_for_a_dummy_ack(known):
    """A peer that has the job takes the GC over at once; otherwise the dummy
    lives until every known node said it does not know the job."""
    node = Node(peers=(PEER, PEER2))
    assert node.s("ACKJOB", ODD_ID) == 0
    assert sorted(node.sent()) == [(PEER, m.SetAck(ODD_ID, 0)), (PEER2, m.SetAck(ODD_ID, 0))]
    node.from_(PEER, m.GotAck(ODD_ID, known))
    if known:
        assert node.show(ODD_ID) is None
    else:
        assert node.show(ODD_ID)["nodes-confirmed"] == sorted([NODE_ID, PEER])
        node.from_(PEER2, m.GotAck(ODD_ID, False))
        assert node.show(ODD_ID) is None
    assert node.sent() == []  # a dummy is dropped silently


# ---------------------------------------------------------------- replication


def test_async_addjob_queues_locally_and_replicates_without_answers():
    node = Node()
    job_id = node.add("REPLICATE", 2, "ASYNC")
    assert node.state(job_id) == "queued" and node.show(job_id)["nodes-delivered"] == [NODE_ID, PEER]
    ((to, repl),) = node.sent()
    assert to == PEER and isinstance(repl, m.ReplJob) and repl.noreply and repl.job["id"] == job_id


@pytest.mark.parametrize("linked", [True, False])
def test_async_addjob_of_a_leaving_node_leaves_nothing_here(linked):
    """External replication: the replica that gets ENQUEUE queues the job."""
    node = Node(unlinked=() if linked else (PEER,))
    assert node.s("CLUSTER", "LEAVING", "yes") == OK
    job_id = node.add("REPLICATE", 1, "ASYNC", "DELAY", 5)
    assert node.show(job_id) is None and len(node.core.jobs) == 0
    sent = node.sent()
    if linked:
        assert [type(msg) for _, msg in sent] == [m.ReplJob, m.Enqueue] and {to for to, _ in sent} == {PEER}
        assert sent[0][1].noreply and sent[1][1] == m.Enqueue(job_id, 5)
    else:  # reachable but not connected: no replica got it
        assert sent == []


@pytest.mark.parametrize("answer", ["gotjob", "setack"])
def test_sync_addjob_of_a_leaving_node(answer):
    node = Node()
    assert node.s("CLUSTER", "LEAVING", "yes") == OK
    producer = Session(node.core)
    assert producer("ADDJOB", "q", "x", 0, "REPLICATE", 1) is BLOCKED
    ((_, repl),) = node.sent()
    job_id = repl.job["id"]
    assert not repl.noreply and node.state(job_id) == "wait-repl"
    assert repl.job["nodes_delivered"] == (PEER,)  # not a holder itself
    if answer == "gotjob":
        node.from_(PEER, m.GotJob(job_id))
        assert node.sent() == [(PEER, m.Enqueue(job_id, 0))]  # the confirmed replica queues it
    else:  # the job was acked on the replica before its GOTJOB came back
        node.from_(PEER, m.SetAck(job_id, 1))
        assert node.sent() == [(PEER, m.GotAck(job_id, False))]  # nobody confirmed: no ENQUEUE
    assert producer.pending() == [Status(job_id)] and not producer.client.repl_jobs
    assert node.show(job_id) is None
    check_core(node.core)


def test_a_leaving_node_waits_for_its_external_replicas_past_the_cron():
    """ADDJOB on a node already leaving replicates to other nodes only; the
    cron that ends a replication under way when a node turns LEAVING must
    let this one wait for its replicas."""
    node = Node()
    assert node.s("CLUSTER", "LEAVING", "yes") == OK
    producer = Session(node.core)
    assert producer("ADDJOB", "q", "x", 0, "REPLICATE", 1) is BLOCKED
    ((_, repl),) = node.sent()
    job_id = repl.job["id"]
    node.wait(300)
    assert producer.pending() == [] and node.state(job_id) == "wait-repl"
    node.sent()
    node.from_(PEER, m.GotJob(job_id))
    assert producer.pending() == [Status(job_id)]
    assert node.sent() == [(PEER, m.Enqueue(job_id, 0))]
    check_core(node.core)


def test_turning_leaving_aborts_synchronous_replication():
    node = Node()
    producer = Session(node.core)
    assert producer("ADDJOB", "q", "x", 0, "REPLICATE", 2) is BLOCKED
    job_id = node.sent()[0][1].job["id"]
    node.wait(200)
    assert [msg for _, msg in node.sent() if isinstance(msg, m.ReplJob)]  # still trying
    assert node.s("CLUSTER", "LEAVING", "yes") == OK
    node.wait(100)
    assert producer.pending() == [errors.leaving()]
    assert node.sent() == [(PEER, m.DelJob(job_id, acked=False))] and node.show(job_id) is None
    check_core(node.core)


def test_enqueue_of_a_job_waiting_for_replication_ends_the_replication():
    node = Node()
    producer = Session(node.core)
    assert producer("ADDJOB", "q", "x", 1000, "REPLICATE", 2) is BLOCKED
    job_id = node.sent()[0][1].job["id"]
    node.from_(PEER, m.Enqueue(job_id, 0))
    assert node.state(job_id) == "queued" and node.s("QLEN", "q") == 1
    node.wait(2_000)  # no more REPLJOB, and the ADDJOB timeout does not abort it
    assert node.sent() == [] and node.state(job_id) == "queued"
    assert job_id not in node.core.replication.pending


# ---------------------------------------------------------------- federation


@pytest.mark.parametrize("queued, count, batches", [(4, 2, [2]), (6, 3, [2, 1])])
def test_yourjobs_batches_are_split_by_size(queued, count, batches):
    node = Node()
    body = b"x" * (YOURJOBS_MAX_BYTES // 2)  # two jobs fill a batch
    ids = [node.add("REPLICATE", 1, "RETRY", 60, body=body) for _ in range(queued)]
    node.from_(PEER, m.NeedJobs(b"q", count))
    sent = node.sent()
    assert {to for to, _ in sent} == {PEER} and [len(msg.jobs) for _, msg in sent] == batches
    handed = [wire["id"] for _, msg in sent for wire in msg.jobs]
    assert handed == ids[:count]  # the oldest first
    assert node.s("QLEN", "q") == queued - count
    assert all(node.show(i)["nodes-delivered"] == [NODE_ID, PEER] for i in handed)


def test_needjobs_from_a_node_we_have_no_link_to_hands_nothing_over():
    """The at-most-once job must stay: YOURJOBS could not reach the asker."""
    node = Node()
    job_id = node.add("REPLICATE", 1, "RETRY", 0)
    node.core.link_closed(node.key(PEER), connect_failed=False)
    node.from_(PEER, m.NeedJobs(b"q", 10))
    assert node.sent() == [] and node.state(job_id) == "queued"
    node.core.link_connected(node.key(PEER))
    node.from_(PEER, m.NeedJobs(b"q", 10))
    ((to, moved),) = node.sent()
    assert to == PEER and [wire["id"] for wire in moved.jobs] == [job_id]
    assert node.show(job_id) is None  # moved for good


@pytest.mark.parametrize("held", ["acked", "queued"])
def test_yourjobs_for_a_job_held_here_is_not_an_import(held):
    node = Node()
    job_id = replica(node, 1)
    if held == "acked":
        node.s("ACKJOB", job_id)
    else:
        node.from_(PEER, m.Enqueue(job_id, 0))
    node.sent()
    node.from_(PEER, m.YourJobs((job_to_wire(origin_job(node, 1), node.clock.ms),)))
    assert node.state(job_id) == held and node.s("QLEN", "q") == (1 if held == "queued" else 0)
    if held == "queued":  # PEER is not recorded as a source of jobs for the queue
        queue = node.core.queues.get(b"q")
        assert node.core.federation.import_from(queue) == [] and node.core.federation.import_rate(queue) == 0


# ---------------------------------------------------------------- membership: messages


def test_a_handshake_id_is_never_a_sender():
    node = Node()
    job_id = node.add("REPLICATE", 1)
    assert node.s("CLUSTER", "MEET", "10.0.0.9", 7719) == OK
    (temp,) = node.handshakes()
    node.core.handle_bus(m.Header(temp.id, 7719, 0), m.DelJob(job_id))
    assert node.state(job_id) == "queued"
    node.from_(PEER, m.DelJob(job_id))
    assert node.show(job_id) is None


def test_ping_without_a_connection_is_read_but_not_answered():
    node = Node()
    node.core.handle_bus(m.Header(PEER, 7712, LEAVING), m.Ping())
    assert node.take(Answer) == [] and node.peer(PEER).flags & LEAVING
    assert node.membership.reachable() == []
    node.core.handle_bus(m.Header(PEER, 7712, 0), m.Ping(), conn=5)
    (answer,) = node.take(Answer)
    assert answer.conn == 5 and isinstance(answer.msg, m.Pong)
    assert not node.peer(PEER).flags & LEAVING and len(node.membership.reachable()) == 1


@pytest.mark.parametrize("before", ["linked", "unlinked", "noaddr"])
def test_ping_from_a_known_node_at_a_new_address(before):
    node = Node(peers={PEER: "noaddr" if before == "noaddr" else "noflags"}, unlinked=(PEER,) * (before != "linked"))
    key = node.key(PEER)
    assert node.core.bus_links() == ({} if before == "noaddr" else {key: ("127.0.0.1", 17712)})
    node.membership.dirty = False
    node.core.handle_bus(m.Header(PEER, 7800, 0), m.Ping(), conn=3, peer_ip="10.0.0.5")
    peer = node.peer(PEER)
    assert (peer.ip, peer.port, peer.flags, peer.link) == ("10.0.0.5", 7800, 0, False)
    assert node.drops() == ([key] if before == "linked" else [])
    assert node.core.bus_links() == {key: ("10.0.0.5", 17800)} and node.membership.dirty


def test_pong_counts_only_on_the_link_it_answers():
    node = Node()
    peer = node.peer(PEER)
    pinged = peer.ping_sent
    assert pinged
    node.clock.advance(10)
    node.core.handle_bus(m.Header(PEER, 7712, 0), m.Pong())  # on no link of ours
    node.core.handle_bus(m.Header(PEER, 7712, 0), m.Pong(), key=999)
    assert (peer.ping_sent, peer.pong_received) == (pinged, 0)
    node.from_(PEER, m.Pong())
    assert (peer.ping_sent, peer.pong_received) == (0, node.clock.ms)


@pytest.mark.parametrize("case", ["moved, linked", "moved, unlinked", "same address"])
def test_handshake_answered_by_a_node_we_know(case):
    """A MEET reached a node we already know: the handshake entry goes, and
    the known node takes the address we reached it at."""
    node = Node(unlinked=(PEER,) if case == "moved, unlinked" else ())
    addr = ("127.0.0.1", 7712) if case == "same address" else ("10.0.0.7", 7720)
    assert node.s("CLUSTER", "MEET", *addr) == OK
    (hs,) = node.handshakes()
    node.core.link_connected(hs.key)
    assert [type(e.msg) for e in node.take(Send)] == [m.Meet]
    node.core.handle_bus(m.Header(PEER, addr[1], 0), m.Pong(), key=hs.key)
    peer = node.peer(PEER)
    assert list(node.membership.nodes) == [NODE_ID, PEER] and hs.key not in node.membership.by_key
    assert (peer.ip, peer.port) == addr
    if case == "moved, linked":
        assert node.drops() == [peer.key, hs.key] and not peer.link
    else:
        assert node.drops() == [hs.key] and peer.link == (case == "same address")


def test_another_node_answering_on_a_link_makes_its_address_unknown():
    node = Node(peers=(PEER, PEER2))
    key = node.key(PEER)
    node.core.handle_bus(m.Header(PEER2, 7712, 0), m.Pong(), key=key)
    peer, other = node.peer(PEER), node.peer(PEER2)
    assert peer.flags & NOADDR and (peer.ip, peer.port, peer.link) == ("", 0, False)
    assert node.drops() == [key] and key not in node.core.bus_links()
    assert other.ping_sent and other.pong_received == 0  # not taken for PEER2's answer
    assert f"{PEER} :0 noaddr" in node.s("CLUSTER", "NODES").decode()


# ---------------------------------------------------------------- membership: gossip and failures


def test_gossip_in_a_meet_from_a_stranger_is_not_trusted():
    node = Node(peers=(PEER,))
    gossip = (GossipEntry(PEER, "127.0.0.1", 7712, FAIL), GossipEntry(PEER3, "10.0.0.9", 7714, 0))
    node.core.handle_bus(m.Header(STRANGER, 7730, 0), m.Meet(gossip), conn=4, peer_ip="10.0.0.30")
    assert [(n.ip, n.port) for n in node.handshakes()] == [("10.0.0.30", 7730)]  # the stranger only
    assert node.peer(PEER).reports == {} and not node.peer(PEER).flags & (PFAIL | FAIL)
    assert [type(a.msg) for a in node.take(Answer)] == [m.Pong]


@pytest.mark.parametrize("moved", [True, False])
def test_gossip_about_a_failing_node_at_a_new_address_starts_a_handshake(moved):
    node = Node(peers={PEER: "fail", PEER2: "noflags"}, unlinked=(PEER,))
    addr = ("10.0.0.8", 7712) if moved else ("127.0.0.1", 7712)
    node.from_(PEER2, m.Ping((GossipEntry(PEER, *addr, 0),)))
    assert [(n.ip, n.port, n.flags) for n in node.handshakes()] == ([(*addr, HANDSHAKE)] if moved else [])
    assert node.peer(PEER).flags & FAIL  # until it answers itself


@pytest.mark.parametrize("gap_ms, fails", [(1_000, True), (31_000, False)])
def test_failure_reports_expire_after_twice_the_node_timeout(gap_ms, fails):
    """Five nodes: FAIL needs our PFAIL plus two reports not older than 30 s."""
    node = Node(peers={PEER: "noflags", PEER2: "noflags", PEER3: "noflags", PEER4: "fail?"}, unlinked=(PEER4,))
    entry = GossipEntry(PEER4, "127.0.0.1", 7715, PFAIL)
    node.from_(PEER, m.Ping((entry,)))
    target = node.peer(PEER4)
    assert target.flags & PFAIL and not target.flags & FAIL and list(target.reports) == [PEER]
    node.clock.advance(gap_ms)
    node.from_(PEER2, m.Ping((entry,)))
    sent = node.sent()
    if fails:
        assert target.flags & FAIL and sorted(sent) == [(p, m.Fail(PEER4)) for p in (PEER, PEER2, PEER3)]
    else:
        assert target.flags == PFAIL and list(target.reports) == [PEER2] and sent == []


def test_a_forgotten_node_is_rediscovered_by_gossip_after_its_blacklist_expires():
    node = Node(peers=(PEER, PEER2))
    key2 = node.key(PEER2)
    assert node.s("CLUSTER", "FORGET", PEER2) == OK
    assert node.drops() == [key2] and PEER2 not in node.membership.nodes
    gossip = m.Ping((GossipEntry(PEER2, "127.0.0.1", 7713, 0),))
    node.from_(PEER, gossip)
    assert node.handshakes() == []

    def keep_alive() -> None:  # PEER stays healthy
        node.from_(PEER, m.Pong())

    node.wait(59_000, on_tick=keep_alive)
    node.from_(PEER, gossip)
    assert node.handshakes() == [] and PEER2 in node.membership.blacklist
    node.wait(1_100, on_tick=keep_alive)
    assert node.membership.blacklist == {}  # the cron forgets expired entries
    node.from_(PEER, gossip)
    assert [(n.ip, n.port) for n in node.handshakes()] == [("127.0.0.1", 7713)]


# ---------------------------------------------------------------- membership: table edits


@pytest.mark.parametrize("connected", [True, False])
def test_an_unanswered_meet_expires_after_the_node_timeout(connected):
    node = Node(peers=(), cluster_node_timeout=2_000)
    assert node.s("CLUSTER", "MEET", "10.0.0.9", 7719) == OK
    (hs,) = node.handshakes()
    if connected:
        node.core.link_connected(hs.key)
        assert [type(e.msg) for e in node.take(Send)] == [m.Meet]
    node.wait(1_900)
    assert node.handshakes() == [hs]
    node.wait(300)
    assert node.handshakes() == [] and hs.key not in node.core.bus_links()
    assert node.drops() == ([hs.key] if connected else [])


def test_link_up_to_a_node_forgotten_meanwhile_is_dropped():
    node = Node(unlinked=(PEER,))
    key = node.key(PEER)
    assert node.s("CLUSTER", "FORGET", PEER) == OK
    assert node.drops() == []  # it had no link
    node.core.link_connected(key)  # the connect the shell had started completes
    assert node.core.out.effects == [DropLink(key)]


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_cluster_reset_forgets_every_other_node(mode):
    node = Node(peers=(PEER, PEER2, PEER3), unlinked=(PEER2, PEER3))
    job_id = node.add("REPLICATE", 1)
    key = node.key(PEER)
    assert node.s("CLUSTER", "FORGET", PEER3) == OK and node.membership.blacklist
    assert node.s("CLUSTER", "LEAVING", "yes") == OK
    node.from_(PEER, m.DelJob(ODD_ID))  # remembered as collected
    assert ODD_ID in node.core.collected
    assert node.s("CLUSTER", "RESET", mode) == OK
    assert node.drops() == [key]  # PEER2 had no link to close
    my_id = node.s("CLUSTER", "MYID").decode()
    assert (my_id == NODE_ID) == (mode == "soft") and len(my_id) == 40
    assert list(node.membership.nodes) == [my_id] and node.core.bus_links() == {}
    assert node.show(job_id) is None and ("save_cluster_config", True) in node.host.calls
    assert "cluster_size:1\r\n" in node.s("CLUSTER", "INFO").decode()
    # Neither mode keeps the blacklist or the collected IDs; HARD is a new
    # node (no learned IP, not leaving), SOFT keeps both with its ID.
    assert node.membership.blacklist == {} and not node.core.collected
    soft = mode == "soft"
    assert node.s("CLUSTER", "NODES").decode() == (
        f"{my_id} 127.0.0.1:7711 myself,leaving 0 0 connected\n" if soft else f"{my_id} :7711 myself 0 0 connected\n"
    )
    # New jobs are owned by the node's current ID, whatever it became.
    assert node.s("CLUSTER", "LEAVING", "no") == OK
    new_id = node.add("REPLICATE", 1)
    assert new_id[2:10] == my_id[:8].encode() and node.show(new_id)["nodes-delivered"] == [my_id]
    assert node.core.jobs.get(new_id).nodes_delivered is node.membership.solo == (my_id,)


def test_meet_refuses_an_invalid_address():
    node = Node(peers=())
    reply = node.s("CLUSTER", "MEET", "not-an-ip", 7711)
    assert isinstance(reply, errors.DisqueError) and "Invalid node address" in str(reply)
    assert node.handshakes() == []
    assert node.s("CLUSTER", "MEET", "::1", 7711) == OK and node.handshakes()[0].ip == "::1"


# ---------------------------------------------------------------- nodes.conf


def test_nodes_conf_skips_blank_and_vars_lines():
    text = (
        "\n"
        "vars currentEpoch 0 lastVoteEpoch 0\n"
        f"{NODE_ID} 10.0.0.1:7711 myself,leaving 0 0 connected\n"
        f"{PEER} 10.0.0.2:7712 fail 1 0 disconnected\n"
    )
    members = Membership.from_conf(text, 7711, rng=random.Random(1), now=1234)
    assert list(members.nodes) == [NODE_ID, PEER] and members.leaving and members.myself.ip == "10.0.0.1"
    peer = members.nodes[PEER]
    assert (peer.flags, peer.fail_time, peer.ping_sent, peer.pong_received) == (FAIL, 1234, 1234, 0)


MYSELF_LINE = f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (MYSELF_LINE + f"{PEER} 127.0.0.1:7712 noflags 0 0\n", "corrupted"),
        (MYSELF_LINE + f"{PEER[:39]} 127.0.0.1:7712 noflags 0 0 connected\n", "corrupted"),
        (MYSELF_LINE + f"{PEER} 127.0.0.1 noflags 0 0 connected\n", "corrupted"),
        (MYSELF_LINE + f"{PEER} 127.0.0.1:7712 noflags,master 0 0 connected\n", "Unknown flag in cluster config file: master"),
        (MYSELF_LINE + f"{PEER} 127.0.0.1:77x2 noflags 0 0 connected\n", "corrupted"),
        (f"{PEER} 127.0.0.1:7712 noflags 0 0 connected\n", "corrupted"),  # nobody is myself
        (MYSELF_LINE + f"{PEER} 127.0.0.1:7712 myself 0 0 connected\n", "corrupted"),  # two are
    ],
)
def test_corrupted_nodes_conf_is_refused(text, message):
    with pytest.raises(ConfError) as e:
        Membership.from_conf(text, 7711, rng=random.Random(1), now=0)
    assert message in str(e.value)


# ---------------------------------------------------------------- bus handshake


def test_initiator_refuses_a_challenge_for_a_secret_it_did_not_offer():
    initiator = AuthLink(Keyring("current secret"), initiator=True, random=os.urandom)
    assert initiator.data_to_send()  # the hello, offering one key ID
    body = b"DQA1C" + b"\x07" * 32 + Keyring("another secret").key_ids()[0]
    initiator.receive_data(len(body).to_bytes(PREFIX, "big") + body)
    with pytest.raises(AuthError) as e:
        initiator.next_body()
    assert e.value.kind == "handshake" and "did not offer" in e.value.reason
    assert not initiator.established and initiator.secret is None and initiator.data_to_send() == b""


# ---------------------------------------------------------------- end to end


def holders(cluster: SimCluster, job_id: bytes) -> dict[int, str]:
    return {
        node.index: job.state.name.lower()
        for node in cluster.nodes
        if node.alive and (job := node.core.jobs.get(job_id)) is not None
    }


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_leaving_node_hands_its_new_jobs_to_replicas(autojump_clock, mode):
    async with SimCluster(3, seed=11, node_timeout=1000) as cluster:
        await cluster.form()
        assert await cluster.call(0, "CLUSTER", "LEAVING", "yes") == b"OK"
        extra = ("ASYNC",) if mode == "async" else ()
        reply = await cluster.call(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, *extra)
        assert isinstance(reply, Status), reply
        job_id = bytes(reply)
        await cluster.wait_for(lambda: sorted(holders(cluster, job_id).values()) == ["active", "queued"], timeout=5)
        copies = holders(cluster, job_id)
        assert set(copies) == {1, 2}  # none on the leaving node
        (queued_on,) = [i for i, state in copies.items() if state == "queued"]
        assert await cluster.call(queued_on, "GETJOB", "NOHANG", "FROM", "q") == [[b"q", job_id, b"b"]]
