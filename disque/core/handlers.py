"""How a node reacts to the job messages that change a job's copy here
(spec/cluster.md §8.2-8.4, §8.8): REPLJOB, ENQUEUE, QUEUED, WORKING, WILLQUEUE,
PAUSE.

Theory of operation: `NodeCore.handle_bus` hands every job message from a
known sender to the handler its bus table lists for the type: the ones
registered here in `HANDLERS`, and those of the concerns that keep state of
their own (GOTJOB: replication.py; SETACK/GOTACK/DELJOB: core/acks.py;
NEEDJOBS/YOURJOBS: federation.py).  Handlers only read and change the node
through its lifecycle operations (core/services.py: enqueue, dequeue,
delete_job, ...), so the single-node invariants hold for cluster traffic
too.  Messages about unknown jobs are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from disque.cluster import messages as m
from disque.cluster.codec import job_from_wire
from disque.core.ids import mixed
from disque.store.job import BCAST_QUEUED, BCAST_WILLQUEUE, State
from disque.store.queue import PAUSE_IN, PAUSE_OUT

if TYPE_CHECKING:
    from disque.core.services import Node

Handler = Callable[["Node", str, Any], None]
HANDLERS: dict[type, Handler] = {}


def handles(kind: type) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[kind] = fn
        return fn

    return register


@handles(m.ReplJob)
def repl_job(node: Node, sender: str, msg: m.ReplJob) -> None:
    _copy(node, sender, msg.job, msg.noreply)


@handles(m.ReplJobs)
def repl_jobs(node: Node, sender: str, msg: m.ReplJobs) -> None:
    for wire in msg.jobs:
        _copy(node, sender, wire, msg.noreply)


def _copy(node: Node, sender: str, wire: m.WireJob, noreply: bool) -> None:
    """Keep the copy a peer replicates here, and say so unless `noreply`."""
    if node.mem_level() > 0 or node.cluster.leaving:
        return
    received = job_from_wire(wire, node.now)
    if received.id in node.collected:
        return  # acknowledged and collected already: a late, stale copy
    queue = node.queues.get(received.queue)  # type: ignore[arg-type]
    if queue is not None and queue.pause & PAUSE_IN:
        return
    job = node.jobs.get(received.id)
    if job is None:
        job = node.adopt(received)
        job.flags |= BCAST_QUEUED  # a replica that re-queues it must announce it
        node.aof_loadjob(job)
    else:
        for node_id in received.nodes_delivered:
            if node_id in node.cluster.nodes:
                job.add_delivered(node_id)
    if not noreply:
        node.send(sender, m.GotJob(job.id))


@handles(m.Enqueue)
def enqueue(node: Node, sender: str, msg: m.Enqueue) -> None:
    job = node.jobs.get(msg.id)
    if job is None or job.state not in (State.WAIT_REPL, State.ACTIVE):
        return
    queue = node.queues.get(job.queue)  # type: ignore[arg-type]
    if queue is not None and queue.pause & PAUSE_IN:
        return
    job.flags &= ~BCAST_QUEUED  # this node queues it first: no QUEUED
    if job.retry == 0 and not job.qtime:
        job.qtime = node.now  # upstream defect fixed: RETRY 0 jobs get their one enqueue
    if msg.delay == 0:
        node.enqueue(job)
    elif job.qtime:  # pragma: no branch - always set here: RETRY 0 jobs got one just above
        job.qtime = node.now + msg.delay * 1000
        node.reschedule(job)


def _postpone(node: Node, sender: str, msg: Any, working: bool) -> None:
    """QUEUED and WORKING (spec/cluster.md §8.4): another holder has queued
    the job or a consumer works on it, so this node steps aside (dequeues it,
    pushes its own requeue a retry period on) and one node queues it at a time."""
    job = node.jobs.get(msg.id)
    if job is None:
        return
    if job.state == State.ACKED:
        node.send(sender, m.SetAck(job.id, len(job.nodes_delivered)))
        return
    delay = 0 if working else msg.delay  # NACK DELAY: nobody queues it before then
    if job.state == State.QUEUED and (working or delay or mixed(sender, job.id) > mixed(node.cluster.my_id, job.id)):
        node.dequeue(job)
    if job.retry:
        job.flags |= BCAST_WILLQUEUE
        if job.qtime:  # pragma: no branch - a job with RETRY > 0 always has a qtime
            job.qtime = node.now + (delay + job.retry) * 1000 + node.jitter()
    if not working:
        if msg.incr_nacks:
            job.nacks = min(job.nacks + 1, 0xFFFF)
        if msg.incr_deliv:
            job.deliv = min(job.deliv + 1, 0xFFFF)
    node.reschedule(job)


@handles(m.Queued)
def queued(node: Node, sender: str, msg: m.Queued) -> None:
    _postpone(node, sender, msg, working=False)


@handles(m.Working)
def working(node: Node, sender: str, msg: m.Working) -> None:
    _postpone(node, sender, msg, working=True)


@handles(m.WillQueue)
def will_queue(node: Node, sender: str, msg: m.WillQueue) -> None:
    seen = node.jobs.peek(msg.id)  # read-behind: a queued job on disk stays there
    if seen is not None and seen.state == State.QUEUED and sender in seen.nodes_delivered:
        node.broadcast(seen.nodes_delivered, m.Queued(seen.id))
        return
    job = node.jobs.get(msg.id)
    if job is None:
        return
    if job.state == State.ACKED:
        node.send(sender, m.SetAck(job.id, len(job.nodes_delivered)))
    elif job.state in (State.ACTIVE, State.QUEUED):
        job.add_delivered(sender)
        if job.state == State.QUEUED:
            node.broadcast(job.nodes_delivered, m.Queued(job.id))


@handles(m.Pause)
def pause(node: Node, sender: str, msg: m.Pause) -> None:
    node.set_pause(msg.queue, msg.flags & (PAUSE_IN | PAUSE_OUT))
