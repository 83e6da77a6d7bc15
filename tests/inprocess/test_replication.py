"""Synchronous replication with a peer: REPLJOB and GOTJOB(S), a producer
waiting for its copies, a replica received, a late REPLJOB."""

from __future__ import annotations

import pytest

from disque.core import errors
from disque.store import ids
from disque.cluster import messages as m
from disque.core.types import BLOCKED, Status
from disque.store.job import Job

from jobenv import ODD_ID, PEER, duo, from_peer
from support import NODE_ID, Session


def test_job_shared_with_peer(duo):
    """A job replicated to the peer: commands tell the peer what they did."""
    producer = Session(duo.core)
    assert producer("ADDJOB", "q", "x", 0) is BLOCKED  # default REPLICATE 2
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    assert isinstance(repl, m.ReplJob) and duo.state(job_id) == "wait-repl" and duo.s("QLEN", "q") == 0
    from_peer(duo, m.GotJob(job_id))
    assert producer.pending() == [Status(job_id)] and duo.s("QLEN", "q") == 1
    assert duo.s("WORKING", job_id) > 0 and duo.sent() == [m.Working(job_id)]
    assert duo.s("NACK", job_id) == 1 and duo.sent() == [m.Queued(job_id, incr_nacks=True, incr_deliv=False)]
    duo.s("GETJOB", "FROM", "q")
    assert duo.s("ACKJOB", job_id) == 1 and duo.sent() == [m.SetAck(job_id, 2, (NODE_ID, PEER))]
    assert duo.state(job_id) == "acked"
    from_peer(duo, m.GotAck(job_id, True))
    assert duo.sent() == [m.DelJob(job_id)] and duo.show(job_id) is None


def test_one_gotjobs_body_replicates_every_job_it_names(duo):
    """GOTJOBS (the GOTJOBs of one step, in one body) counts for each job it
    names, and skips an ID this node does not know."""
    producers = [Session(duo.core) for _ in range(3)]
    assert all(p("ADDJOB", "q", "x", 0) is BLOCKED for p in producers)
    ids = [repl.job["id"] for repl in duo.sent()]
    assert len(ids) == 3 and duo.s("QLEN", "q") == 0
    from_peer(duo, m.GotJobs((ids[0], ODD_ID, ids[2])))
    assert [p.pending() for p in producers] == [[Status(ids[0])], [], [Status(ids[2])]]
    assert duo.s("QLEN", "q") == 2 and duo.state(ids[1]) == "wait-repl"


@pytest.mark.parametrize(
    "how",
    [
        "disconnect",
        "deljob",
        "flushall",
        "timeout",
        "ackjob",
    ],
)
def test_producer_waiting_for_replication(duo, how):
    producer = Session(duo.core)
    assert producer("ADDJOB", "q", "x", 1000) is BLOCKED
    job_id = duo.sent()[0].job["id"]
    if how == "disconnect":
        duo.core.disconnect(producer.client.id)
        assert duo.sent() == [m.DelJob(job_id, acked=False)] and duo.show(job_id) is None
        assert duo.core.out.effects == []  # no reply for a connection that is gone
    elif how == "ackjob":
        assert duo.s("ACKJOB", job_id) == 1 and duo.state(job_id) == "acked"
        duo.wait(2_000)
        assert producer.pending() == [Status(job_id)] and not producer.client.repl_jobs
    else:
        if how == "timeout":
            duo.wait(1_100)
            expected = errors.norepl_timeout()
        else:
            duo.s(*{"deljob": ("DELJOB", job_id), "flushall": ("DEBUG", "FLUSHALL")}[how])
            expected = errors.norepl_removed()
        assert producer.pending() == [expected] and m.DelJob(job_id, acked=False) in duo.sent()
        assert duo.show(job_id) is None
    duo.check()


@pytest.mark.parametrize("retry", [2, 0])
def test_replica_received_from_peer(duo, retry):
    """REPLJOB: the copy is active and unqueued.  An at-least-once copy is
    queued after delay + retry unless the owner announces it, and that
    re-queueing is announced; an at-most-once copy is never queued here."""
    from disque.store.records import job_to_wire

    origin = Job(b"DI" + PEER[:8].encode() + b"1" * 32 + b"05a1SQ", b"q", b"x", etime=duo.clock.ms // 1000 + 60,
                 ctime=duo.clock.ms * 1_000_000, retry=retry, nodes_delivered=(PEER, NODE_ID, "c" * 40))  # fmt: skip
    from_peer(duo, m.ReplJob(job_to_wire(origin, duo.clock.ms)))
    assert duo.sent() == [m.GotJob(origin.id)]
    shown = duo.show(origin.id)
    assert shown["state"] == "active" and shown["nodes-delivered"] == [PEER, NODE_ID]
    if retry:
        assert 2000 - 250 <= shown["next-requeue-within"] <= 2000 + 249
    else:
        assert shown["next-requeue-within"] is None
    duo.wait(2_250)
    assert duo.state(origin.id) == ("queued" if retry else "active")
    expected = [m.WillQueue(origin.id), m.Queued(origin.id, incr_nacks=False, incr_deliv=True)] if retry else []
    assert [x for x in duo.sent() if not isinstance(x, m.Ping)] == expected


def test_late_repljob_does_not_revive_a_collected_job(duo):
    """Regression (jepsen-lite): a REPLJOB delayed in a stalled link arrived
    after the job was acknowledged and collected, and re-created it here."""
    from disque.store.records import job_to_wire

    origin = Job(b"DI" + PEER[:8].encode() + b"2" * 32 + b"05a1SQ", b"q", b"x", etime=duo.clock.ms // 1000 + 60,
                 ctime=duo.clock.ms * 1_000_000, retry=2, nodes_delivered=(PEER, NODE_ID))  # fmt: skip
    late = m.ReplJob(job_to_wire(origin, duo.clock.ms))
    from_peer(duo, late)
    from_peer(duo, m.DelJob(origin.id))  # the owner collected it after an ACK
    assert duo.show(origin.id) is None
    duo.sent()
    from_peer(duo, late)
    assert duo.show(origin.id) is None and duo.sent() == []
    duo.wait(301_000)  # remembered for five minutes, then forgotten
    assert origin.id not in duo.core.collected
