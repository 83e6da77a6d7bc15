"""How a node reacts to each job message of the bus (cluster.md §8.2-8.8).

Theory of operation: `NodeCore.handle_bus` hands every job message from a
known sender to the handler registered for its type in `HANDLERS`.  Handlers
only read and change the node through `NodeCore` operations (enqueue,
dequeue, acknowledge, try_gc, delete_job, ...), so the single-node invariants
of node.py hold for cluster traffic too.  Messages about unknown jobs are
ignored except where the spec says otherwise (SETACK answers GOTACK(0)).
Replication (REPLJOB/GOTJOB) and federation (NEEDJOBS/YOURJOBS) keep their
state in `replication.py` and `federation.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from disque.cluster import messages as m
from disque.cluster.codec import DecodeError, job_from_wire
from disque.core.ids import mixed
from disque.store.job import BCAST_QUEUED, BCAST_WILLQUEUE, State
from disque.store.queue import PAUSE_IN, PAUSE_OUT

if TYPE_CHECKING:
    from disque.core.node import NodeCore

Handler = Callable[["NodeCore", str, Any], None]
HANDLERS: dict[type, Handler] = {}


def handles(kind: type) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[kind] = fn
        return fn

    return register


@handles(m.ReplJob)
def repl_job(node: NodeCore, sender: str, msg: m.ReplJob) -> None:
    if node.mem_level() > 0 or node.cluster.leaving:
        return
    try:
        received = job_from_wire(msg.job, node.now)
    except DecodeError:
        return
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
    if not msg.noreply:
        node.send(sender, m.GotJob(job.id))


@handles(m.GotJob)
def got_job(node: NodeCore, sender: str, msg: m.GotJob) -> None:
    job = node.jobs.get(msg.id)
    if job is not None:
        node.replication.got_job(sender, job)


@handles(m.Enqueue)
def enqueue(node: NodeCore, sender: str, msg: m.Enqueue) -> None:
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


def _postpone(node: NodeCore, sender: str, msg: Any, working: bool) -> None:
    """QUEUED and WORKING (cluster.md §8.4)."""
    job = node.jobs.get(msg.id)
    if job is None:
        return
    if job.state == State.ACKED:
        node.send(sender, m.SetAck(job.id, len(job.nodes_delivered)))
        return
    if job.state == State.QUEUED and (working or mixed(sender, job.id) > mixed(node.cluster.my_id, job.id)):
        node.dequeue(job)
    if job.retry:
        job.flags |= BCAST_WILLQUEUE
        if job.qtime:  # pragma: no branch - a job with RETRY > 0 always has a qtime
            job.qtime = node.now + job.retry * 1000 + node.jitter()
    if not working:
        if msg.incr_nacks:
            job.nacks = min(job.nacks + 1, 0xFFFF)
        if msg.incr_deliv:
            job.deliv = min(job.deliv + 1, 0xFFFF)
    node.reschedule(job)


@handles(m.Queued)
def queued(node: NodeCore, sender: str, msg: m.Queued) -> None:
    _postpone(node, sender, msg, working=False)


@handles(m.Working)
def working(node: NodeCore, sender: str, msg: m.Working) -> None:
    _postpone(node, sender, msg, working=True)


@handles(m.WillQueue)
def will_queue(node: NodeCore, sender: str, msg: m.WillQueue) -> None:
    job = node.jobs.get(msg.id)
    if job is None:
        return
    if job.state == State.ACKED:
        node.send(sender, m.SetAck(job.id, len(job.nodes_delivered)))
    elif job.state in (State.ACTIVE, State.QUEUED):
        job.add_delivered(sender)
        if job.state == State.QUEUED:
            node.broadcast(job.nodes_delivered, m.Queued(job.id))


@handles(m.SetAck)
def set_ack(node: NodeCore, sender: str, msg: m.SetAck) -> None:
    job = node.jobs.get(msg.id)
    if job is not None:
        if job.state == State.WAIT_REPL and not node.replication.achieved(job):
            job = None  # handed to a replica and forgotten (external replication)
        else:
            node.acknowledge(job)
    if job is None or len(job.nodes_delivered) <= msg.mayhave:
        node.send(sender, m.GotAck(msg.id, job is not None))
        return
    if msg.mayhave == 0:
        node.send(sender, m.GotAck(msg.id, True))
    node.try_gc(job)  # we know more possible holders: we run the GC


@handles(m.GotAck)
def got_ack(node: NodeCore, sender: str, msg: m.GotAck) -> None:
    job = node.jobs.get(msg.id)
    if job is None or job.state != State.ACKED:
        return
    dummy = job.is_dummy_ack
    if dummy and msg.known:
        node.delete_job(job)  # somebody who really has it now runs the GC
        return
    if job.nodes_confirmed is None:
        job.nodes_confirmed = {node.cluster.my_id}
    if msg.known or sender in job.nodes_delivered:
        job.add_delivered(sender)
        job.nodes_confirmed.add(sender)
    if dummy:
        job.nodes_confirmed.add(sender)
        if len(job.nodes_confirmed) >= len(node.cluster.nodes):
            node.delete_job(job)  # nobody knows the job
    elif len(job.nodes_confirmed) >= len(job.nodes_delivered):
        node.broadcast(job.nodes_delivered, m.DelJob(job.id))
        node.delete_job(job)


@handles(m.DelJob)
def del_job(node: NodeCore, sender: str, msg: m.DelJob) -> None:
    job = node.jobs.get(msg.id)
    if job is not None:
        node.delete_job(job)
    node.remember_collected(msg.id)


@handles(m.NeedJobs)
def need_jobs(node: NodeCore, sender: str, msg: m.NeedJobs) -> None:
    node.federation.on_need_jobs(sender, msg)


@handles(m.YourJobs)
def your_jobs(node: NodeCore, sender: str, msg: m.YourJobs) -> None:
    node.federation.on_your_jobs(sender, msg)


@handles(m.Pause)
def pause(node: NodeCore, sender: str, msg: m.Pause) -> None:
    node.set_pause(msg.queue, msg.flags & (PAUSE_IN | PAUSE_OUT))
