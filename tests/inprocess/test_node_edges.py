"""Edge cases of NodeCore that the model, the fuzzer and the cluster
simulation reach rarely or never: the bounded memory of collected job IDs,
ACKJOB on a job still being replicated elsewhere, a duplicated YOURJOBS for a
job already queued, blocked consumers and a queue paused between the loader
and the next command, and a failing bus handler."""

from __future__ import annotations

import logging
import random

from disque.cluster import messages as m
from disque.store.records import job_to_wire
from disque.store.ids import mixed, new_job_id
from disque.core.types import BLOCKED, Status
from disque.core.node import NodeCore
from disque.store import collected as collected_module
from disque.core.replay import Replay
from disque.store.aof import RecordReader, encode_clean_marker, encode_loadjob
from disque.store.job import BCAST_QUEUED, DELIVERED, Job, State
from invariants import advance, check_core
from support import NODE_ID, START_MS, FakeClock, Session, bus_sent, linked_core, make_core

PEER = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"


def duo(**overrides) -> tuple[NodeCore, FakeClock]:
    """A node that knows one linked peer (PEER); what it sends is in effects."""
    conf = f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n{PEER} 127.0.0.1:7712 noflags 0 0 connected\n"
    core, clock, _ = linked_core(conf, (PEER,), **overrides)
    return core, clock


def from_peer(core: NodeCore, msg) -> None:
    core.handle_bus(m.Header(PEER, 7712, 0), msg, key=core.membership.nodes[PEER].key)


# ---------------------------------------------------------------- collected IDs


def test_collected_ids_are_bounded_oldest_forgotten_first(monkeypatch):
    """Collected IDs block a stale REPLJOB; past the cap the oldest is
    forgotten, and a late copy of that job is accepted again."""
    monkeypatch.setattr(collected_module, "COLLECTED_MEMORY_MAX", 2)
    core, _ = duo()
    s = Session(core)
    ids = [bytes(s("ADDJOB", "q", f"j{i}", 0, "REPLICATE", 1)) for i in range(3)]
    wires = [job_to_wire(core.jobs.get(job_id), core.now) for job_id in ids]
    for job_id in ids:
        assert s("ACKJOB", job_id) == 1
        assert s.show(job_id) is None  # single copy: collected at once
    assert list(core.collected) == ids[1:]
    bus_sent(core)

    from_peer(core, m.ReplJob(wires[2]))
    assert s.show(ids[2]) is None and bus_sent(core) == []  # remembered: ignored, no GOTJOB
    from_peer(core, m.ReplJob(wires[0]))
    assert s.show(ids[0])["state"] == "active"  # forgotten: a new copy
    assert bus_sent(core) == [m.GotJob(ids[0])]
    check_core(core)


# ---------------------------------------------------------------- ACKJOB


def test_ackjob_of_an_externally_replicated_job_answers_the_producer():
    """Above 75 % of maxmemory ADDJOB replicates externally: the job waits
    here in wait-repl without a local copy.  An ACKJOB for it counts, gives
    the producer its ID (as SETACK would) and forgets the record."""
    core, _ = duo(maxmemory=120_000)
    assert core.memory.level() == 1
    producer, consumer = Session(core), Session(core)
    assert producer("ADDJOB", "q", "x", 0, "REPLICATE", 1) is BLOCKED
    [job_id] = list(core.out.repl_waiters)
    assert consumer.show(job_id)["state"] == "wait-repl"
    [repl] = bus_sent(core)
    assert isinstance(repl, m.ReplJob) and repl.job["id"] == job_id and not repl.noreply

    assert consumer("ACKJOB", job_id) == 1
    assert producer.pending() == [Status(job_id)]
    assert consumer.show(job_id) is None and not core.out.repl_waiters and not producer.client.repl_jobs
    assert bus_sent(core) == []  # nobody confirmed: no ENQUEUE to send
    assert consumer("ACKJOB", job_id) == 0  # gone; an even TTL field (RETRY > 0) makes no dummy ACK
    check_core(core)


# ---------------------------------------------------------------- federation


def test_duplicated_yourjobs_for_a_queued_retry0_job_queues_it_once():
    """A second YOURJOBS for an at-most-once job already queued here sets its
    qtime (so the one allowed enqueue can happen) but the enqueue is refused;
    scheduler visits then leave the queued job alone, and once it is
    delivered it is never queued again."""
    core, clock = duo()
    s = Session(core)
    rng = random.Random(3)
    while True:  # an ID for which this node wins the QUEUED tie-break: the job stays queued
        job_id = new_job_id(PEER, rng, 3600, 0)
        if mixed(PEER, job_id) <= mixed(NODE_ID, job_id):
            break
    job = Job(job_id, b"q", b"once", etime=START_MS // 1000 + 3600, ctime=START_MS * 1_000_000,
              nodes_delivered=(PEER, NODE_ID))  # fmt: skip
    wire = job_to_wire(job, core.now)

    from_peer(core, m.YourJobs((wire,)))
    assert s.show(job_id)["state"] == "queued" and s.show(job_id)["next-requeue-within"] is None
    bus_sent(core)
    from_peer(core, m.YourJobs((wire,)))  # the same batch again
    assert s("QLEN", "q") == 1 and dict(s("QSTAT", "q"))[b"jobs-in"] == 1
    assert bus_sent(core) == []  # refused: no QUEUED broadcast
    from_peer(core, m.Queued(job_id))  # the peer announces it: we keep it queued, it is rescheduled
    assert s.show(job_id)["state"] == "queued"
    assert s.show(job_id)["next-requeue-within"] is None  # the refused enqueue left no requeue time

    for _ in range(3):
        clock.advance(1)
        core.tick()
        assert s("QLEN", "q") == 1 and s.show(job_id)["additional-deliveries"] == 0
        assert core.next_deadline() > clock.ms  # not due at every tick
    assert s("GETJOB", "NOHANG", "FROM", "q") == [[b"q", job_id, b"once"]]
    clock.advance(1)
    core.tick()
    assert s.show(job_id)["state"] == "active" and s("QLEN", "q") == 0
    assert dict(s("QSTAT", "q"))[b"jobs-in"] == 1


def test_replayed_delivered_retry0_job_is_never_due_again():
    """An at-most-once job logged as queued but already delivered comes back
    active; WORKING then reschedules it, and it must not be due at every
    tick (which would keep the node's deadline in the past)."""
    core, clock, _ = make_core()
    job_id = new_job_id(NODE_ID, core.rng, 3600, 0)
    job = Job(job_id, b"q", b"once", state=State.QUEUED, flags=BCAST_QUEUED | DELIVERED,
              etime=core.now // 1000 + 3600, ctime=core.lifecycle.new_ctime(), nodes_delivered=(NODE_ID,))  # fmt: skip
    replay = Replay(core.lifecycle, core.groups, core.settle, core.read_clock)
    reader = RecordReader()
    reader.feed(encode_loadjob(job) + encode_clean_marker(START_MS))
    for offset, args in reader:
        replay.apply(offset, args)
    assert replay.finish() == 0
    s = Session(core)
    assert s.show(job_id)["state"] == "active" and s.show(job_id)["next-requeue-within"] is None
    assert s("WORKING", job_id) == 0  # RETRY 0: nothing to postpone
    for _ in range(3):
        clock.advance(1)
        core.tick()
        assert core.next_deadline() > clock.ms
    assert s("QLEN", "q") == 0 and s.show(job_id)["state"] == "active"


# ---------------------------------------------------------------- blocking


def test_queue_paused_before_the_next_event_keeps_loaded_jobs_from_consumers():
    """A job the AOF loader queues is handed to blocked consumers by the next
    event.  If that event pauses the queue for output, nobody is served until
    the pause is lifted."""
    core, _, _ = make_core()
    consumer, admin = Session(core), Session(core)
    assert consumer("GETJOB", "FROM", "q") is BLOCKED
    job_id = new_job_id(NODE_ID, core.rng, 3600, 5)
    job = Job(job_id, b"q", b"loaded", state=State.QUEUED, flags=BCAST_QUEUED, etime=core.now // 1000 + 3600,
              retry=5, ctime=core.lifecycle.new_ctime(), nodes_delivered=(NODE_ID,))  # fmt: skip
    replay = Replay(core.lifecycle, core.groups, core.settle, core.read_clock)
    reader = RecordReader()
    reader.feed(encode_loadjob(job) + encode_clean_marker(START_MS))
    for offset, args in reader:
        replay.apply(offset, args)
    assert replay.finish() == 1 and core.blocking.ready  # queued outside any command: served by the next event

    assert admin("PAUSE", "q", "out") == Status(b"out")
    assert consumer.pending() == [] and admin("QLEN", "q") == 1
    assert admin.show(job_id)["state"] == "queued"
    assert admin("PAUSE", "q", "none") == Status(b"none")
    assert consumer.pending() == [[[b"q", job_id, b"loaded"]]]
    assert admin.show(job_id)["state"] == "active" and consumer.client.waiter is None
    check_core(core)


# ---------------------------------------------------------------- bus


def test_a_failing_bus_handler_costs_one_message_not_the_node(monkeypatch, caplog):
    """An exception in a job-message handler is logged; the node keeps its
    jobs and handles the following messages."""
    core, clock = duo()
    s = Session(core)
    job_id = bytes(s("ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 10))
    assert s("GETJOB", "FROM", "q")[0][1] == job_id

    def broken(sender, msg):
        raise RuntimeError("handler bug")

    monkeypatch.setitem(core.on_bus, m.WillQueue, broken)
    received = core.stats.bus_received
    with caplog.at_level(logging.ERROR, logger="disque"):
        from_peer(core, m.WillQueue(job_id))
    [record] = [r for r in caplog.records if r.getMessage() == f"Error handling WillQueue from {PEER}"]
    assert record.exc_info is not None and str(record.exc_info[1]) == "handler bug"
    assert core.stats.bus_received == received + 1
    assert s.show(job_id)["nodes-delivered"] == [NODE_ID]  # the message had no effect

    from_peer(core, m.Queued(job_id, incr_deliv=True))  # the next message is handled as usual
    assert s.show(job_id)["additional-deliveries"] == 1
    advance(core, clock, 11_000)
    assert s.show(job_id)["state"] == "queued"
    check_core(core)


# ---------------------------------------------------------------- shell entry points


def test_shell_entry_points() -> None:
    core, clock, _ = make_core()
    s = Session(core)
    assert core.pause_left(clock.ms) == 0
    assert s("CLIENT", "PAUSE", "500") == Status(b"OK")
    assert core.pause_left(clock.ms) == 500 and core.pause_left(clock.ms + 499) == 1
    assert core.pause_left(clock.ms + 500) == 0 and core.pause_left(clock.ms + 10_000) == 0
    core.set_aof_error("No space left on device")
    assert s("ADDJOB", "q", "b", "0").code == "MISCONF"
    core.set_aof_error(None)
    assert s("ADDJOB", "q", "b", "0").startswith(b"DI")
    waiting = Session(core)
    assert waiting("GETJOB", "FROM", "q2") is BLOCKED
    s("ADDJOB", "q2", "b", "0")
    taken = core.take_effects()
    assert [type(e).__name__ for e in taken] == ["Reply"] and taken[0].client_id == waiting.client.id
    assert core.take_effects() == []
    core.membership.dirty = True
    assert core.conf_dirty()
    assert core.cluster_conf() == core.membership.to_conf() and not core.conf_dirty()


# ---------------------------------------------------------------- WORKING


def test_working_on_a_delayed_retry_0_job_due_for_willqueue_is_not_left_overdue() -> None:
    """WORKING sets the WILLQUEUE flag, due 500 ms before qtime: on a delayed
    RETRY 0 job (qtime = the end of its delay, kept) that is already in the
    past, so WILLQUEUE goes out at once and the job waits for its delay."""
    core, clock = duo()
    s = Session(core)
    job_id = s("ADDJOB", "q", "b", 0, "REPLICATE", 1, "RETRY", 0, "DELAY", 1)
    job = core.jobs.get(job_id)
    job.nodes_delivered = (NODE_ID, PEER)  # as if a copy were on the peer
    advance(core, clock, 600)
    core.take_effects()
    assert s("WORKING", job_id) == 0
    check_core(core)  # nothing overdue
    assert [type(e.msg) for e in core.take_effects()] == [m.Working, m.WillQueue]
    assert job.awake == START_MS + 1000 and job.state == State.ACTIVE
    advance(core, clock, 400)
    assert job.state == State.QUEUED and s("QLEN", "q") == 1


def test_willqueue_from_a_node_the_job_did_not_list_adds_it_and_says_queued():
    core, clock = duo()
    s = Session(core)
    job_id = bytes(s("ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 10))  # queued here, listing only this node
    bus_sent(core)
    from_peer(core, m.WillQueue(job_id))
    assert s.show(job_id)["nodes-delivered"] == [NODE_ID, PEER] and bus_sent(core) == [m.Queued(job_id)]
