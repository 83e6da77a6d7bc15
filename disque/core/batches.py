"""Batches: jobs counted together, with a callback job once they are done.

Theory of operation: BATCH NEW makes a batch record (store/batch.py) with
its ON-SUCCESS and ON-COMPLETE callbacks; `ADDJOB ... BATCH <id>` adds a job
to it (the job carries the batch's ID, `Job.batch`); BATCH CLOSE says no
more jobs will come but from the batch's own running jobs, which may still
add to it while any of its jobs is pending.  Every node keeps every batch
whole: each change made here (new, a job added, a job acknowledged or gone,
closed, a callback fired) goes to the AOF (`BATCH <record>`) and, as the
whole record, to every peer (BATCHSET); a record received is merged by
union (the fields only grow) and logged when it taught something; a peer
that links up gets every record.  A job's end is learned where its copies
are (the ACK paths, expiry, dead-lettering: `finished`), and the node that
learns it tells the others.

The callbacks: once the batch is closed and none of its jobs is pending,
ON-COMPLETE is due, and ON-SUCCESS too if none failed.  Only the batch's
home (core/homes.py, among the nodes it sees up) fires a due callback: it
adds the callback job with an ID made from the batch's ID (as a schedule's
tick is: `tick_job_id`), marks it fired and tells everyone.  So a callback
fires once while the cluster is connected; under a partition each side's
home may fire it, with the same ID: at least once.  A home that dies
before firing is replaced by the next node in line at the next cron.

A job that adds to its own batch does so before it is acknowledged: through
the node it is acknowledged on, that node's record, sent whole with the
ACK's news, holds the new job; through another, the new job's BATCHSET has
the FIRE_GRACE_MS a due callback waits to reach the home.  Owned by NodeCore; called by
the BATCH command, ADDJOB (`add`), the lifecycle's job endings
(`finished`), the bus (BATCHSET), the AOF replay and the cron.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from disque.cluster import messages as m
from disque.core import errors
from disque.core.homes import home
from disque.core.types import Connection
from disque.store import batch as records
from disque.store.aof import BATCH, encode_record
from disque.store.batch import COMPLETE, SUCCESS, Batch
from disque.store.ids import tick_job_id
from disque.store.job import Job
from disque.store.job_options import JobOptions
from disque.store.records import DecodeError

if TYPE_CHECKING:
    import random

    from disque.core.lifecycle import Lifecycle

log = logging.getLogger("disque")
CALLBACK_TTL: Final = 86400  # s, a callback job's TTL
CRON_EVERY_MS: Final = 1000  # every batch is looked at this often (a home that changed)
FIRE_GRACE_MS: Final = 500  # a callback due this long still, and only then, is fired


class Batches:
    def __init__(self, life: Lifecycle, rng: random.Random) -> None:
        self.life = life
        self.rng = rng
        self.batches: dict[bytes, Batch] = {}
        self.client = Connection(0, addr="batch")  # adds the callbacks' jobs (ASYNC: never waits)
        self.fired = self.dropped = 0  # INFO workflows
        self._last_cron = 0
        self.due_since: dict[bytes, int] = {}  # batch -> when its home first saw a callback due
        self.finished_at: dict[bytes, int] = {}  # batch -> when this node first saw it finished, its callbacks fired

    # ------------------------------------------------------------ commands

    def new(self, success: tuple[bytes, bytes] | None, complete: tuple[bytes, bytes] | None) -> bytes:
        batch_id = b"BT" + self.life.membership.my_id[:8].encode() + b"%032x" % self.rng.getrandbits(128)
        rule = records.broken_rule(batch_id, success, complete)
        if rule:
            raise errors.err(rule)
        self._changed(Batch(batch_id, success, complete))
        return batch_id

    def get(self, batch_id: bytes) -> Batch:
        b = self.batches.get(batch_id)
        if b is None:
            raise errors.err("Unknown batch")
        return b

    def add(self, batch_id: bytes, job_id: bytes) -> None:
        """ADDJOB ... BATCH: before the job exists anywhere, so that no node
        sees it end before it is counted."""
        b = self.get(batch_id)
        if b.closed and not b.pending:
            raise errors.err("The batch is finished: no job can join it")
        b.jobs.add(job_id)
        self._changed(b)

    def close(self, batch_id: bytes) -> None:
        b = self.get(batch_id)
        if not b.closed:
            b.closed = True
            self._changed(b)

    def finished(self, job: Job, acked: bool) -> None:
        """A job of a batch was acknowledged, or went without that."""
        b = self.batches.get(job.batch)
        if b is None or job.id not in b.jobs or job.id in b.done or job.id in b.failed:
            return
        (b.done if acked else b.failed).add(job.id)
        self._changed(b)

    # ------------------------------------------------------------ the cluster

    def _changed(self, b: Batch) -> None:
        """Keep `b` (logged), tell every peer, fire what is due."""
        self.batches[b.id] = b
        out = self.life.out
        record = records.encode(b)
        if out.aof.state != "off":
            out.aof_record(None, encode_record(BATCH, record))
        out.broadcast(self.life.membership.linked_ids(features=m.FEATURE_BATCHES), m.BatchSet(record))
        self._fire(b)

    def on_batch_set(self, sender: str, msg: m.BatchSet) -> None:
        b = self._checked(msg.record, f"from {sender}")
        if b is not None:
            self._merge(b, replayed=False)

    def _merge(self, b: Batch, replayed: bool) -> None:
        """Take a record; a replayed one fires nothing yet (the cron does,
        once the peers had a chance to say what was fired)."""
        known = self.batches.get(b.id)
        if known is None:
            self.batches[b.id] = known = b
        elif not known.merge(b):
            return
        if replayed:
            return
        if self.life.out.aof.state != "off":
            self.life.out.aof_record(None, encode_record(BATCH, records.encode(known)))
        self._fire(known)

    def _checked(self, record: bytes, source: str) -> Batch | None:
        """The record decoded; None for a bad one, dropped alone (logged, counted)."""
        try:
            return records.decode(record)
        except DecodeError as e:
            self.dropped += 1
            log.warning("Batch record %s dropped: %s", source, e)
            return None

    def replay(self, record: bytes) -> None:
        b = self._checked(record, "in the AOF")
        if b is not None:
            self._merge(b, replayed=True)

    def sync_messages(self) -> list[Any]:
        """Every batch, for a node that just linked up."""
        return [m.BatchSet(records.encode(b)) for b in self.batches.values()]

    def snapshot_records(self) -> list[bytes]:
        return [encode_record(BATCH, records.encode(b)) for b in self.batches.values()]

    def cron(self) -> None:
        """The due callbacks whose grace is over fire; every CRON_EVERY_MS,
        every batch is looked at (this node may have become a home), and a
        batch finished `result-ttl` ago, its callbacks fired, is forgotten."""
        now = self.life.now
        if now - self._last_cron < CRON_EVERY_MS:
            for batch_id in list(self.due_since):
                self._fire(self.batches[batch_id])
            return
        self._last_cron = now
        keep_ms = int(self.life.config.result_ttl) * 1000
        for b in list(self.batches.values()):
            self._fire(b)
            if b.closed and not b.pending and not b.due():
                if now - self.finished_at.setdefault(b.id, now) >= keep_ms:
                    del self.batches[b.id], self.finished_at[b.id]

    # ------------------------------------------------------------ callbacks

    def _fire(self, b: Batch) -> None:
        """Fire what is due at the batch's home, once it stayed due for
        FIRE_GRACE_MS: a job a running job added through another node (its
        BATCHSET under way) has that long to reach the home."""
        due = b.due()
        life = self.life
        if not due or home(b.id, life.membership.up_ids()) != life.membership.my_id:
            self.due_since.pop(b.id, None)
            return
        since = self.due_since.setdefault(b.id, life.now)
        if life.now - since < FIRE_GRACE_MS:
            return
        del self.due_since[b.id]
        for bit, callback, kind in ((SUCCESS, b.success, b"success"), (COMPLETE, b.complete, b"complete")):
            if due & bit and callback is not None:
                job_id = tick_job_id(b.id + b"/" + kind, 0, CALLBACK_TTL, -1)
                if job_id in life.jobs or job_id in life.collected:  # fired here before this record said so
                    b.fired |= bit
                    continue
                try:
                    life.add_job(self.client, callback[0], callback[1], JobOptions(
                        0, min(3, life.membership.size()), CALLBACK_TTL, is_async=True, minrepl=1, job_id=job_id,
                    ))  # fmt: skip
                except errors.DisqueError as e:  # (a full or paused queue, memory): tried again at the next cron
                    log.warning("Batch %r: %s callback not added: %s", b.id, kind.decode(), e)
                    continue
                self.fired += 1
                b.fired |= bit
        if b.fired & due:
            self._changed(b)

    def info_fields(self) -> list[tuple[str, int]]:
        """INFO workflows (docs/workflows.md), after the dependencies' fields."""
        return [("batches", len(self.batches)), ("batch_callbacks_fired", self.fired), ("batch_records_dropped", self.dropped)]

    def clear(self) -> None:
        self.batches.clear()
        self.due_since.clear()
        self.finished_at.clear()

    def show(self, batch_id: bytes) -> list[tuple[bytes, Any]]:
        b = self.get(batch_id)
        return [
            (b"id", b.id), (b"closed", int(b.closed)), (b"jobs", len(b.jobs)), (b"pending", len(b.pending)),
            (b"done", len(b.done & b.jobs)), (b"failed", len(b.failed & b.jobs)),
            (b"on-success", list(b.success or ())), (b"on-complete", list(b.complete or ())),
            (b"success-fired", int(bool(b.fired & SUCCESS))), (b"complete-fired", int(bool(b.fired & COMPLETE))),
            (b"callback-ids", [tick_job_id(b.id + b"/" + k, 0, CALLBACK_TTL, -1) for k in (b"success", b"complete")]),
        ]  # fmt: skip
