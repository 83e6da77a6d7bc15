"""Acknowledgements and their garbage collection (spec/cluster.md §8.5-§8.7).

Theory of operation: ACKJOB turns a job into an `acked` record (a "dummy"
one, holding only the ID and its TTL, when this node never had the job and
other nodes may), and the record's timer drives GC attempts: SETACK goes to
every owner not yet confirmed, each answers GOTACK, and once every owner has
confirmed, DELJOB goes to all of them and the record is deleted.  The delay
between attempts doubles up to three minutes (lifecycle.py's `reschedule`).
SETACK carries the sender's holders, not only their count as upstream's
does: two nodes may each list three holders yet not the same three, and a
count alone would let the GC end without the copy only one of them knew.
The receiver adds the holders it did not know (among the nodes it knows)
and runs the GC itself when it then knows more than the sender.
A result (`ACKJOB <id> RESULT <bytes>`, store/results.py) is kept by
the acknowledging node and rides on every SETACK the GC sends, so each
node that may hold a copy keeps it too before it confirms; each one writes
it to its AOF (a `RESULT` record) when it first learns it.
FASTACK skips all that: DELJOB to every owner (every linked node for an
unknown job) and the job goes at once.  A peer's DELJOB deletes the local
copy and remembers the ID as collected, so a late REPLJOB cannot bring it
back.  A job still waiting for its replication level is acknowledged only
once the level is reached (`Replication.achieved`); if it was handed to a
replica and forgotten here, the ACK has nothing left to do.

Owned by NodeCore as `life.acks`; called by the ACK commands of the front
ends, the job lifecycle's timer (`try_gc`) and the bus table
(SETACK/GOTACK/DELJOB).  It works on jobs through the lifecycle, emits
through the outbox and tells WAITJOB clients through `Blocking`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disque.cluster import messages as m
from disque.core.types import Status
from disque.store.aof import RESULT, encode_record
from disque.store.ids import ttl_minutes
from disque.store.job import ACK, Job, State

if TYPE_CHECKING:
    from disque.core.blocking import Blocking
    from disque.core.lifecycle import Lifecycle
    from disque.core.outbox import Outbox
    from disque.core.replication import Replication

S_ACTIVE, S_ACKED, S_WAIT_REPL = State.ACTIVE, State.ACKED, State.WAIT_REPL


class Acks:
    def __init__(self, life: Lifecycle, out: Outbox, replication: Replication, waits: Blocking) -> None:
        self.life = life
        self.out = out
        self.replication = replication
        self.waits = waits

    def ack_job(self, job_id: bytes, result: bytes | None = None) -> bool:
        """ACKJOB for one ID (spec/commands.md §5.3), with the consumer's
        `result` if it gave one.  True when it counts."""
        life = self.life
        job = life.jobs.get(job_id)
        if job is None:
            if life.membership.size() == 1 or life.membership.leaving or not ttl_minutes(job_id) & 1:
                return False
            job = Job(job_id, None, None, state=S_ACKED, etime=life.now // 1000 + ttl_minutes(job_id) * 60)
            life.register(job)
        elif job.state == S_WAIT_REPL and not self.replication.achieved(job):
            return True  # handed to a replica and forgotten here (external replication)
        if result is not None:  # kept before the ACK tells the jobs that wait for this one (core/dependencies.py)
            self.keep_result(job_id, job.queue, result)
        counted = job.state != S_ACKED
        if counted:
            self.acknowledge(job)  # a waiting producer got its ID first, as with SETACK
            if job.rare is not None and job.rare.key:  # its key's home may end its hold (core/keys.py)
                life.keys.done(job, False)
        self.try_gc(job)
        return counted

    def keep_result(self, job_id: bytes, queue: bytes | None, result: bytes) -> None:
        """Keep a job's result here for `result-ttl`, in the AOF too when it is new."""
        life = self.life
        until = life.now + int(life.config.result_ttl) * 1000
        if life.results.keep(job_id, result, until) and self.out.aof.state != "off":
            self.out.aof_record(queue, result_record(job_id, until, result))

    def snapshot_records(self) -> list[bytes]:
        """The results kept, for an AOF rewrite."""
        return [result_record(*entry) for entry in self.life.results.items()]

    def fast_ack(self, job_id: bytes) -> bool:
        """FASTACK for one ID.  True when the job was known here."""
        life = self.life
        job = life.jobs.get(job_id)
        if job is None:
            for node_id in life.membership.linked_ids():
                self.out.send(node_id, m.DelJob(job_id))
            return False
        self.out.broadcast(job.nodes_delivered, m.DelJob(job_id))
        self.waits.settle_waits(job_id, True)
        if job.rare is not None and job.rare.key:
            life.keys.done(job, False)
        life.finished(job, True)
        life.delete_job(job)
        life.collected.remember(job_id, life.now)  # acknowledged: a late REPLJOB must not revive it
        return True

    def acknowledge(self, job: Job) -> None:
        if job.state == S_ACKED:
            return
        life = self.life
        life.dequeue(job)
        was_active = job.state == S_ACTIVE
        job.move(ACK)
        self.waits.settle_waits(job.id, True)
        if job.rare is not None or life.deps.held or life.deps.watchers:  # (a plain job: no batch, nobody waits)
            life.finished(job, True)
        job.nodes_confirmed = None
        if was_active:  # pragma: no branch - callers make a wait-repl job active first (achieved)
            self.out.aof_deljob(job)
        life.reschedule(job)

    def try_gc(self, job: Job) -> None:
        """One ACK garbage-collection attempt (spec/cluster.md §8.6): a copy
        may be deleted only once every node that may hold one has the ACK,
        or a late requeue elsewhere would deliver an acknowledged job again."""
        life = self.life
        dummy = job.is_dummy_ack
        job.gc_retry = min(job.gc_retry + 1, 10)
        if job.nodes_confirmed is None:
            job.nodes_confirmed = {life.membership.my_id}
        if (not dummy and len(job.nodes_delivered) == len(job.nodes_confirmed)) or (
            dummy and life.membership.size() == 1
        ):
            life.delete_job(job)
            return
        targets = list(life.membership.nodes) if dummy else job.nodes_delivered
        self.out.broadcast([n for n in targets if n not in job.nodes_confirmed], set_ack(life, job))

    # ------------------------------------------------------------ bus messages

    def on_set_ack(self, sender: str, msg: m.SetAck) -> None:
        life = self.life
        if msg.result:  # kept before the GOTACK that lets the sender's GC end
            self.keep_result(msg.id, None, msg.result)
        job = life.jobs.get(msg.id)
        if job is not None:
            if job.state == S_WAIT_REPL and not self.replication.achieved(job):
                job = None  # handed to a replica and forgotten (external replication)
            else:
                self.acknowledge(job)
                if job.nodes_delivered:  # a dummy ACK stays one: it has no copy to collect
                    known = life.membership.nodes
                    for node_id in msg.holders:
                        if node_id in known:
                            job.add_delivered(node_id)
        if job is None or len(job.nodes_delivered) <= msg.mayhave:
            self.out.send(sender, m.GotAck(msg.id, job is not None))
            return
        if msg.mayhave == 0:
            self.out.send(sender, m.GotAck(msg.id, True))
        self.try_gc(job)  # we know more possible holders: we run the GC

    def on_got_ack(self, sender: str, msg: m.GotAck) -> None:
        life = self.life
        job = life.jobs.get(msg.id)
        if job is None or job.state != S_ACKED:
            return
        dummy = job.is_dummy_ack
        if dummy and msg.known:
            life.delete_job(job)  # somebody who really has it now runs the GC
            return
        if job.nodes_confirmed is None:
            job.nodes_confirmed = {life.membership.my_id}
        if msg.known or sender in job.nodes_delivered:
            job.add_delivered(sender)
            job.nodes_confirmed.add(sender)
        if dummy:
            job.nodes_confirmed.add(sender)
            if len(job.nodes_confirmed) >= len(life.membership.nodes):
                life.delete_job(job)  # nobody knows the job
        elif len(job.nodes_confirmed) >= len(job.nodes_delivered):
            self.out.broadcast(job.nodes_delivered, m.DelJob(job.id))
            life.delete_job(job)

    def on_del_job(self, sender: str, msg: m.DelJob) -> None:
        life = self.life
        job = life.jobs.get(msg.id)
        if job is not None:
            self.waits.settle_waits(msg.id, msg.acked)  # a FASTACK or the end of a GC; or not (dead-lettered, aborted)
            if not msg.acked and job.rare is not None and job.rare.key:  # a DEBOUNCE job superseded (core/keys.py):
                self.out.answer_producer(msg.id, Status(msg.id))  # a producer waiting for its copies was answered
            life.finished(job, msg.acked)
            life.delete_job(job)
        life.collected.remember(msg.id, life.now, msg.acked)


def set_ack(life: Lifecycle, job: Job) -> m.SetAck:
    """The SETACK of an acknowledged job: its holders, and their count for
    an older node that reads only that; its result, if one is kept."""
    return m.SetAck(job.id, len(job.nodes_delivered), job.nodes_delivered, life.results.get(job.id, life.now) or b"")


def result_record(job_id: bytes, until: int, result: bytes) -> bytes:
    """The AOF record of a result (store/aof.py)."""
    return encode_record(RESULT, job_id, b"%d" % until, result)
