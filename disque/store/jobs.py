"""The job registry and the one timer structure of the job lifecycle.

Theory of operation: `JobStore` owns every job record of the node, keyed by
ID in a scannable `JobIndex`.  Each job has one `awake` time, "when must
the scheduler look at this job next" (spec/cluster.md §8.3): expiry, the WILLQUEUE
lead, the requeue time or the next ACK garbage-collection attempt, whichever
comes first.  Jobs wait in millisecond buckets (`awake` -> `_Bucket`) whose
keys sit in a min-heap, and many jobs share a bucket (expiry times are whole
seconds).  A bucket is a list, so the per-job cost is one list slot (a dict
slot costs 30-40 bytes more per job, and most jobs sit in the timer for their
whole life).  A job in the timer carries the IN_TIMER flag, its bucket is
the one at `awake` and its entry the one at `tpos`; leaving puts None in its
place at once, so the timer never keeps alive a job that left memory (one
read-behind moved to disk, or deleted: a stale entry holding it would keep
its body, uncounted, until the bucket's time).  `live` counts a bucket's
jobs, so it is dropped when the last leaves, and it is packed when the
holes outnumber the jobs, which keeps leaving amortized O(1).  A heap key
whose bucket emptied is skipped when popped, and the heap is rebuilt from
the buckets when such keys are most of it (jobs that leave long before
their time, as read-behind's do, would otherwise leave one key each).
Iteration orders are deterministic, so a simulated cluster replays
identically from a seed.

The store decides nothing: `NodeCore` computes awake times and processes the
jobs that `due()` returns.

With read-behind some jobs are on disk (core/read_behind.py): `spilled`
answers for them, so a lookup by ID loads a spilled job back and returns it
like any other, `in` and `len` count them, and a JSCAN cursor's bucket
holds the spilled jobs of that bucket too.  `resident` tells a
job object still registered in memory from one that left it.  `spilled`
is always there: without read-behind it is `NO_SPILL`, which keeps nothing
and does nothing, so the rest of the core calls the same `Spill` methods
(the end of a step, the tick, a queue that grew, a copy that arrived, a
replay's jobs) and never asks whether read-behind is on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from disque.store.job import IN_TIMER, Job
from disque.store.scan import NBUCKETS, JobIndex

if TYPE_CHECKING:
    from disque.store.queue import Queue

MAX_JOBS_PER_PASS: Final = 10_000


class Spill(Protocol):
    """Where jobs that left memory are kept (core/read_behind.py), as the
    rest of the core sees it."""

    # lookups (JobStore)
    def __len__(self) -> int: ...
    def load_id(self, job_id: bytes) -> Job | None: ...
    def holds(self, job_id: bytes) -> bool: ...
    def peek_id(self, job_id: bytes) -> Job | None: ...
    def in_bucket(self, bucket: int) -> list[Job]: ...

    # the job lifecycle's notes, acted on at the end of the step
    def grew(self, queue: bytes) -> None: ...
    def note_arrival(self, job: Job) -> None: ...
    def ready(self, queue: Queue) -> None: ...
    def forget_queue(self, queue: Queue) -> None: ...
    def every_job(self) -> Iterator[Job]: ...

    # time, the end of a step, and how the disk is
    def next_awake(self) -> int | None: ...
    def tick(self) -> None: ...
    def cron(self) -> None: ...
    def settle(self) -> None: ...
    def error(self) -> str | None: ...

    # an AOF replay
    def replayed(self, job: Job, was_queued: bool) -> bool: ...
    def needs_room(self) -> bool: ...
    def make_room(self, queued: list[Job]) -> None: ...
    def replay_queued(self, trusted: bool) -> Sequence[int]: ...
    def load_live(self, slot: int) -> Job | None: ...
    def slot_ctime(self, slot: int) -> int: ...


class NoSpill:
    """The `Spill` of a node without read-behind: every job stays in memory."""

    def __len__(self) -> int:
        return 0

    def load_id(self, job_id: bytes) -> Job | None:
        return None

    def holds(self, job_id: bytes) -> bool:
        return False

    def peek_id(self, job_id: bytes) -> Job | None:
        return None

    def in_bucket(self, bucket: int) -> list[Job]:
        return []  # pragma: no cover - `scan` asks only a Spill that holds jobs

    def grew(self, queue: bytes) -> None:
        pass

    def note_arrival(self, job: Job) -> None:
        pass

    def ready(self, queue: Queue) -> None:
        pass  # pragma: no cover - asked only for a queue with a tail on disk

    def forget_queue(self, queue: Queue) -> None:
        pass

    def every_job(self) -> Iterator[Job]:
        return iter(())

    def next_awake(self) -> int | None:
        return None

    def tick(self) -> None:
        pass

    def cron(self) -> None:
        pass

    def settle(self) -> None:
        pass

    def error(self) -> str | None:
        return None

    def replayed(self, job: Job, was_queued: bool) -> bool:
        return False

    def needs_room(self) -> bool:
        return False  # pragma: no cover - asked only after `replayed` kept a job on disk

    def make_room(self, queued: list[Job]) -> None:
        pass  # pragma: no cover - as `needs_room`

    def replay_queued(self, trusted: bool) -> Sequence[int]:
        return ()

    def load_live(self, slot: int) -> Job | None:
        return None  # pragma: no cover - no slot is ever given out

    def slot_ctime(self, slot: int) -> int:
        return 0  # pragma: no cover - no slot is ever given out


NO_SPILL: Final = NoSpill()


class _Bucket:
    __slots__ = ("jobs", "live")

    def __init__(self) -> None:
        self.jobs: list[Job | None] = []  # None where a job left
        self.live = 0


class JobStore:
    __slots__ = ("_jobs", "_buckets", "_heap", "spilled")

    def __init__(self) -> None:
        self._jobs = JobIndex()
        self._buckets: dict[int, _Bucket] = {}
        self._heap: list[int] = []
        self.spilled: Spill = NO_SPILL

    def spill_to(self, spill: Spill) -> None:
        """Read-behind is on: jobs may leave memory for `spill`."""
        self.spilled = spill

    def __len__(self) -> int:
        return len(self._jobs) + len(self.spilled)

    def __contains__(self, job_id: bytes) -> bool:
        return job_id in self._jobs or self.spilled.holds(job_id)

    def get(self, job_id: bytes) -> Job | None:
        job = self._jobs.get(job_id)
        if job is None:
            return self.spilled.load_id(job_id)
        return job

    def peek(self, job_id: bytes) -> Job | None:
        """`get` for a read that changes nothing: a job on disk is read, not
        loaded (the copy returned must not be changed)."""
        job = self._jobs.get(job_id)
        if job is None:
            return self.spilled.peek_id(job_id)
        return job

    def resident(self, job: Job) -> bool:
        return self._jobs.get(job.id) is job

    def add(self, job: Job) -> None:
        self._jobs.add(job)

    def remove(self, job: Job) -> None:
        self._jobs.pop(job.id)
        self.unschedule(job)

    def values_from(self, start: int) -> Iterator[Job]:
        return self._jobs.values_from(start)

    def values(self) -> Iterator[Job]:
        """The jobs in memory."""
        return self._jobs.values()

    def scan(self, cursor: int, want: int, max_buckets: int | None) -> tuple[int, list[Job]]:
        """JSCAN: the buckets from `cursor`, each with its jobs on disk (read
        where they are) next to those in memory, so that a job moving
        between the two keeps its bucket and is not missed."""
        spilled = self.spilled
        if not len(spilled):
            return self._jobs.scan(cursor, want, max_buckets)
        jobs: list[Job] = []
        examined = 0
        while cursor < NBUCKETS and len(jobs) < want and (max_buckets is None or examined < max_buckets):
            jobs += self._jobs.bucket(cursor)
            jobs += spilled.in_bucket(cursor)
            cursor += 1
            examined += 1
        return (cursor if cursor < NBUCKETS else 0), jobs

    # -- the timer ---------------------------------------------------------

    def schedule(self, job: Job, at: int) -> None:
        if job.flags & IN_TIMER:
            if job.awake == at:
                return
            self._leave(job)
        else:
            job.flags |= IN_TIMER
        job.awake = at
        bucket = self._buckets.get(at)
        if bucket is None:
            bucket = self._buckets[at] = _Bucket()
            heap = self._heap
            if len(heap) > 2 * len(self._buckets) + 1024:  # mostly keys of emptied buckets: rebuild
                heap[:] = self._buckets
                heapq.heapify(heap)
            else:
                heapq.heappush(heap, at)
        entries = bucket.jobs
        job.tpos = len(entries)
        entries.append(job)
        bucket.live += 1

    def unschedule(self, job: Job) -> None:
        if job.flags & IN_TIMER:
            job.flags &= ~IN_TIMER
            self._leave(job)

    def _leave(self, job: Job) -> None:
        """`job` leaves its bucket (the one at its `awake`)."""
        at = job.awake
        bucket = self._buckets[at]
        bucket.jobs[job.tpos] = None
        bucket.live -= 1
        if not bucket.live:
            del self._buckets[at]
        elif len(bucket.jobs) > 2 * bucket.live + 16:
            self._pack(bucket, 0)

    @staticmethod
    def _pack(bucket: _Bucket, start: int) -> None:
        """Keep the bucket's jobs listed from `start` on, without the holes."""
        listed = bucket.jobs
        entries: list[Job | None] = []
        for i in range(start, len(listed)):
            job = listed[i]
            if job is not None:
                job.tpos = len(entries)
                entries.append(job)
        bucket.jobs = entries

    def next_awake(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._buckets:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def due(self, now_ms: int, limit: int = MAX_JOBS_PER_PASS) -> list[Job]:
        """Take up to `limit` jobs whose awake time has come, earliest first.
        They leave the timer; processing them reschedules them."""
        out: list[Job] = []
        heap, buckets = self._heap, self._buckets
        while heap and heap[0] <= now_ms and len(out) < limit:
            at = heap[0]
            bucket = buckets.get(at)
            if bucket is None:
                heapq.heappop(heap)
                continue
            room = limit - len(out)
            if bucket.live <= room:
                del buckets[at]
                heapq.heappop(heap)
                room = bucket.live
            taken = 0
            for i, job in enumerate(bucket.jobs):  # pragma: no branch - `room` jobs are listed
                if job is not None:
                    job.flags &= ~IN_TIMER
                    out.append(job)
                    taken += 1
                    if taken == room:
                        break
            bucket.live -= taken
            if bucket.live:  # split: the rest stays
                self._pack(bucket, i + 1)
        return out
