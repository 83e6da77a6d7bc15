"""How a node reacts to the job messages that change a job's copy here
(spec/cluster.md §8.2-8.4, §8.8): REPLJOB, ENQUEUE, QUEUED, WORKING, WILLQUEUE,
PAUSE.

Theory of operation: `NodeCore.handle_bus` hands every job message from a
known sender to the handler its bus table lists for the type: the ones
registered here in `HANDLERS`, and those of the concerns that keep state of
their own (GOTJOB: replication.py; SETACK/GOTACK/DELJOB: acks.py;
NEEDJOBS/YOURJOBS/WAITING: federation.py).  Handlers get the job lifecycle
(core/lifecycle.py) and change jobs only through its operations (receive,
enqueue, dequeue, reschedule, ...), so the single-node invariants hold for
cluster traffic too; they answer through its outbox.  Messages about
unknown jobs are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from disque.cluster import messages as m
from disque.core.acks import set_ack
from disque.store.records import job_from_wire
from disque.store.ids import mixed
from disque.store.job import BCAST_QUEUED, BCAST_WILLQUEUE, State
from disque.store.queue import PAUSE_IN, PAUSE_OUT

if TYPE_CHECKING:
    from disque.core.lifecycle import Lifecycle

Handler = Callable[["Lifecycle", str, Any], None]
HANDLERS: dict[type, Handler] = {}


def handles(kind: type) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[kind] = fn
        return fn

    return register


@handles(m.ReplJob)
def repl_job(life: Lifecycle, sender: str, msg: m.ReplJob) -> None:
    _copy(life, sender, msg.job, msg.noreply)


@handles(m.ReplJobs)
def repl_jobs(life: Lifecycle, sender: str, msg: m.ReplJobs) -> None:
    for wire in msg.jobs:
        _copy(life, sender, wire, msg.noreply)


def _copy(life: Lifecycle, sender: str, wire: m.WireJob, noreply: bool) -> None:
    """Keep the copy a peer replicates here, and say so unless `noreply`."""
    if life.memory.level() > 0 or life.membership.leaving:
        return
    received = job_from_wire(wire, life.now)
    if received.id in life.collected:
        return  # acknowledged and collected already: a late, stale copy
    queue = life.queues.get(received.queue)  # type: ignore[arg-type]
    if queue is not None and queue.pause & PAUSE_IN:
        return
    job = life.jobs.get(received.id)
    if job is None:
        job = life.receive(received)
        job.flags |= BCAST_QUEUED  # a replica that re-queues it must announce it
        life.out.aof_loadjob(job)
    else:
        for node_id in received.nodes_delivered:
            if node_id in life.membership.nodes:
                job.add_delivered(node_id)
    if not noreply:
        life.out.send(sender, m.GotJob(job.id))


@handles(m.Enqueue)
def enqueue(life: Lifecycle, sender: str, msg: m.Enqueue) -> None:
    job = life.jobs.get(msg.id)
    if job is None or job.state not in (State.WAIT_REPL, State.ACTIVE):
        return
    queue = life.queues.get(job.queue)  # type: ignore[arg-type]
    if queue is not None and queue.pause & PAUSE_IN:
        return
    job.flags &= ~BCAST_QUEUED  # this node queues it first: no QUEUED
    if job.retry == 0 and not job.qtime:
        job.qtime = life.now  # upstream defect fixed: RETRY 0 jobs get their one enqueue
    if msg.delay == 0:
        life.enqueue(job)
    elif job.qtime:  # pragma: no branch - always set here: RETRY 0 jobs got one just above
        job.qtime = life.now + msg.delay * 1000
        life.reschedule(job)


def _postpone(life: Lifecycle, sender: str, msg: Any, working: bool) -> None:
    """QUEUED and WORKING (spec/cluster.md §8.4): another holder has queued
    the job or a consumer works on it, so this node steps aside (dequeues it,
    pushes its own requeue a retry period on) and one node queues it at a time."""
    job = life.jobs.get(msg.id)
    if job is None:
        return
    if job.state == State.ACKED:
        life.out.send(sender, set_ack(life, job))
        return
    delay = 0 if working else msg.delay  # NACK DELAY: nobody queues it before then
    if job.state == State.QUEUED and (working or delay or mixed(sender, job.id) > mixed(life.membership.my_id, job.id)):
        life.dequeue(job)
    if job.retry:
        job.flags |= BCAST_WILLQUEUE
        if job.qtime:  # pragma: no branch - a job with RETRY > 0 always has a qtime
            job.qtime = life.now + (delay + job.retry) * 1000 + life.jitter()
    if not working:
        if msg.failure:  # NACK ... ERROR: the consumer's failure, kept here too
            life.set_failure(job, msg.failure)
        if msg.incr_nacks:
            job.nacks = min(job.nacks + 1, 0xFFFF)
        if msg.incr_deliv:
            job.deliv = min(job.deliv + 1, 0xFFFF)
    life.reschedule(job)


@handles(m.Queued)
def queued(life: Lifecycle, sender: str, msg: m.Queued) -> None:
    _postpone(life, sender, msg, working=False)


@handles(m.Working)
def working(life: Lifecycle, sender: str, msg: m.Working) -> None:
    _postpone(life, sender, msg, working=True)


@handles(m.WillQueue)
def will_queue(life: Lifecycle, sender: str, msg: m.WillQueue) -> None:
    seen = life.jobs.peek(msg.id)  # read-behind: a queued job on disk stays there
    if seen is not None and seen.state == State.QUEUED and sender in seen.nodes_delivered:
        life.out.broadcast(seen.nodes_delivered, m.Queued(seen.id))
        return
    job = life.jobs.get(msg.id)
    if job is None:
        return
    if job.state == State.ACKED:
        life.out.send(sender, set_ack(life, job))
    elif job.state in (State.ACTIVE, State.QUEUED):
        job.add_delivered(sender)
        if job.state == State.QUEUED:
            life.out.broadcast(job.nodes_delivered, m.Queued(job.id))


@handles(m.Pause)
def pause(life: Lifecycle, sender: str, msg: m.Pause) -> None:
    life.set_pause(msg.queue, msg.flags & (PAUSE_IN | PAUSE_OUT))
