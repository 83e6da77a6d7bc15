"""Replaying the AOF into a node (spec/persistence.md §7).

Theory of operation: the shell reads the file (shell/aof_loader.py), the
parser checks each record (store/aof.py), and `Replay.apply` gives it to
the job lifecycle: a `LOADJOB` job is adopted by the rule every job this
node did not just create follows (`Lifecycle.adopt`, as a copy from a peer
is): it comes back `active` with timers of its own, keeping the flags it
was stored with; `DELJOB` deletes it; `GROUPSET` restores a consumer
group's progress; `SCHEDULE` and `SCHEDTICK` restore the schedules and
the latest tick each is known to have fired; `KEYHOLD` a key's hold
(core/keys.py); `QLIMITS` a queue's limits (core/limits.py); `RESULT` a
job's result (store/results.py: the first one known wins); `BATCH` a
batch's record (core/batches.py: merged).  The first record of a job wins, except that a later one
carrying `not_before` (written by NACK ... DELAY) brings its counters and
that requeue time, and a later one without the parents the first waited
for (core/dependencies.py: released since) replaces it.  Jobs stored `queued` are re-queued once, at the end
(`finish`/`requeue`), only when the file is trusted: `trust_queued`
(aof-enqueue-jobs-once) or a CLEANSHUTDOWN marker as the very last record.

With read-behind (`jobs.spilled`) the job store may keep a replayed job on
disk at once, and the jobs kept in memory make room as the replay grows
past the budget; the jobs stored queued on disk are merged, by creation
time, with those in memory at the end.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from disque.store.aof import (
    BATCH, CLEANSHUTDOWN, DELJOB, GROUPSET, KEYHOLD, LOADJOB, QLIMITS, RESULT, SCHEDTICK, SCHEDULE, check_record,
)
from disque.store.job import NACKED, Job, State

if TYPE_CHECKING:
    from disque.core.batches import Batches
    from disque.core.groups import Groups
    from disque.core.keys import Keys
    from disque.core.lifecycle import Lifecycle
    from disque.core.limits import Limits
    from disque.core.schedules import Schedules

KEEP_FLAGS = ~0  # a replayed record keeps the flags it was stored with


class Replay:
    def __init__(
        self, life: Lifecycle, groups: Groups, settle: Callable[[], None], read_clock: Callable[[], int], *,
        trust_queued: bool = False, schedules: Schedules | None = None, keys: Keys | None = None,
        limits: Limits | None = None, batches: Batches | None = None,
    ) -> None:  # fmt: skip
        self.life = life
        self.groups = groups
        # (tests that replay jobs only leave them out)
        self.schedules, self.keys, self.limits, self.batches = schedules, keys, limits, batches
        self.settle = settle  # the end of a step (read-behind moves jobs to disk)
        self.read_clock = read_clock
        self.trust_queued = trust_queued
        self.queued: list[Job] = []
        self.clean_marker: int | None = None
        self.loaded = self.deleted = self.expired = self.duplicates = self.requeued = 0
        self.now_ms = life.now

    def refresh_time(self) -> None:
        self.now_ms = self.read_clock()

    def apply(self, offset: int, args: list[bytes]) -> None:
        name = args[0].upper()
        self.clean_marker = None
        if name == LOADJOB:
            job = check_record(offset, args)
            assert job is not None
            self._loadjob(job)
        elif name == DELJOB:
            check_record(offset, args)
            job = self.life.jobs.get(args[1])
            if job is not None:
                self.life.delete_job(job, log=False)
                self.deleted += 1
        elif name == GROUPSET:
            check_record(offset, args)
            self.groups.replay(args[1], args[2], int(args[3]))
        elif name == RESULT:
            check_record(offset, args)
            self.life.results.keep(args[1], args[3], int(args[2]))  # (an expired one is never served, and soon dropped)
        elif name == BATCH:
            check_record(offset, args)
            assert self.batches is not None
            self.batches.replay(args[1])
        elif name in (SCHEDULE, SCHEDTICK):
            check_record(offset, args)
            assert self.schedules is not None
            self.schedules.replay(args)
        elif name == KEYHOLD:
            check_record(offset, args)
            assert self.keys is not None
            self.keys.replay(args[1])
        elif name == QLIMITS:
            check_record(offset, args)
            assert self.limits is not None
            self.limits.replay(args[1])
        else:
            check_record(offset, args)
            if name == CLEANSHUTDOWN:  # (else the AOFFORMAT marker, which the reader took)
                self.clean_marker = offset

    def _loadjob(self, job: Job) -> None:
        life = self.life
        if job.etime * 1000 <= self.now_ms:
            self.expired += 1
            return
        not_before = job.qtime if job.flags & NACKED else 0
        known = life.jobs.get(job.id)
        if known is not None and known.parents and not job.parents:  # released since (core/dependencies.py): the later record wins
            life.delete_job(known, log=False)
            known = None
        if known is not None:
            self.duplicates += 1  # the first record wins, but for what a NACK ... DELAY or ERROR logged
            if job.failure or not_before:
                known.nacks, known.deliv = job.nacks, job.deliv
            if job.failure:
                life.set_failure(known, job.failure)
            if not_before:
                known.flags |= NACKED
                known.qtime = max(known.qtime, not_before)
                life.reschedule(known)
            return
        was_queued = job.state == State.QUEUED
        life.adopt(job, not_before, KEEP_FLAGS)
        self.loaded += 1
        spill = life.jobs.spilled
        if not spill.replayed(job, was_queued):
            if was_queued:
                self.queued.append(job)
        elif spill.needs_room():  # the slots grow too: the jobs kept in memory so far make room, newest first
            spill.make_room(self.queued)

    def _in_queue_order(self, spilled: Sequence[int]) -> Iterator[Job | int]:
        """The jobs stored queued, in memory and (slots) on disk, merged by
        ctime.  Each job leaves `queued` as it is given: read-behind may move
        it to disk, and the list must not keep it in memory."""
        queued = self.queued
        queued.sort(key=Job.sort_key, reverse=True)  # queue order, popped from the end
        in_memory = (queued.pop() for _ in range(len(queued)))
        if not spilled:
            return in_memory
        ctime = self.life.jobs.spilled.slot_ctime
        return heapq.merge(in_memory, spilled, key=lambda e: e.ctime if isinstance(e, Job) else ctime(e))

    @property
    def trusted(self) -> bool:
        return self.trust_queued or self.clean_marker is not None

    def finish(self) -> int:
        """Re-queue the jobs stored queued if the file is trusted; returns
        how many were queued."""
        for _ in self.requeue():
            pass
        return self.requeued

    def requeue(self) -> Iterator[None]:
        """`finish` in steps of 1,024 jobs (the shell's event loop runs
        between them: a backlog on disk takes a while); `requeued` counts."""
        life = self.life
        spill = life.jobs.spilled
        spilled = spill.replay_queued(self.trusted)
        if not self.trusted:
            self.queued.clear()
            return
        self.refresh_time()
        for n, entry in enumerate(self._in_queue_order(spilled)):
            job = entry if isinstance(entry, Job) else spill.load_live(entry)
            if job is not None and life.jobs.get(job.id) is job and job.state == State.ACTIVE:
                if not job.retry:
                    job.qtime = life.now  # its one queueing: enqueue refuses qtime 0 (upstream defect §9, fixed)
                if life.enqueue(job):
                    self.requeued += 1
            if n % 1024 == 1023:  # (no job held across the pause: the loop may move it to disk)
                self.settle()  # read-behind: a long queue goes back to disk as it forms
                yield
                self.refresh_time()
