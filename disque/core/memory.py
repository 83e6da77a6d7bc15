"""The node's memory: the account, its levels, eviction and queue GC.

Theory of operation (spec/cluster.md §11): what the node's data takes is
counted as Redis and Disque count their allocator's bytes, not the process
RSS (the idle interpreter is a fixed cost the shell reports apart, INFO
used_memory_startup).  Whoever makes or frees data calls `account`: the job
lifecycle per job and queue, read-behind per slot, consumer groups, the
shell for clients' input.  `level()` is upstream's getMemoryWarningLevel:
0 ok, 1 warning (over 75 % of maxmemory: new jobs keep no copy here), 2 oom
(over 95 %: `evict`, and commands that add data are refused when nothing
can be evicted).  Eviction deletes acknowledged jobs and delivered
at-most-once ones, from a random bucket on; with no job left it collects
every idle empty queue.  Queue GC (`collect_idle_queues`) runs a slice of
the queue table per cron tick, sooner the fuller the node.

It sees the jobs and queues through `Holdings` (the job lifecycle
implements it), so eviction deletes through the one way out of a job.

The per-object figures are what objects really cost in CPython, measured
with tracemalloc (tests/inprocess/test_memory_accounting.py keeps them honest),
so that `maxmemory` bounds the data and RSS stays within it plus the fixed
cost.

`retained` is in `used` too: the memory of jobs read-behind moved to disk
that the process keeps.  CPython's small-object allocator returns an arena
(1 MB) to the system only once every object in it is freed, and the few
long-lived objects made while a backlog forms (a job index table rebuilt
smaller, a timer key) are scattered through the arenas its jobs used, so
the memory a job moved to disk frees stays in the RSS, and jobs made later
reuse it.  So a move to disk keeps the job's small objects counted
(`to_disk`: a body past the allocator's 512 bytes is its own block, which
the shell's heap trim returns), and a job coming into memory takes its
place in them first (`add_job`).  The read-behind budget compares the data
without them (`data`): moving jobs to disk frees none of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

from disque.core.settings import Settings
from disque.store.job import DELIVERED, Job, State
from disque.store.scan import NBUCKETS, BucketedDict

if TYPE_CHECKING:
    import random

    from disque.store.queue import Queue

BASE_MEMORY: Final = 100_000  # the empty node's own tables (the job index's 1,024, the queue table, ...)
MEM_LEVELS: Final = ("ok", "warning", "oom")  # level(): as upstream's getMemoryWarningLevel
JOB_OVERHEAD: Final = 396  # per job (record, index slot, timers, copies of its strings) on top of id + queue + body bytes;
# between the compiled build (about 300 in a large store, 320-340 in one of 5,000 jobs, where the index's
# 1,024 tables are small) and the pure one (350-430: its record keeps ints as objects)
QUEUE_OVERHEAD: Final = 1210  # per queue object (and its one Level) and its index entries, on top of its name
QUEUE_IDLE_MS = (300_000, 10_000, 2_000)  # an empty queue is collected after this long idle, by level 0, 1, >= 2
S_ACKED: Final = State.ACKED
SMALL_REQUEST: Final = 512  # CPython's small-object allocator serves requests up to this many bytes


class Jobs(Protocol):
    def __len__(self) -> int: ...
    def values_from(self, start: int) -> Iterator[Job]: ...


class Holdings(Protocol):
    """What eviction and queue GC need of the job lifecycle."""

    now: int
    queues: BucketedDict[bytes, Queue]

    @property
    def jobs(self) -> Jobs: ...  # read-only, so that a JobStore satisfies it (attributes are invariant)
    def delete_job(self, job: Job, log: bool = True) -> None: ...
    def destroy_queue(self, queue: Queue) -> None: ...


class Memory:
    holdings: Holdings  # the job lifecycle, set once it exists (`hold`)

    def __init__(self, config: Any, rng: random.Random) -> None:
        self.config = config
        self.settings: Settings = config.settings
        self.rng = rng
        self.base = BASE_MEMORY
        self.used = BASE_MEMORY
        self.peak = BASE_MEMORY
        self.retained = 0  # in `used`: what jobs moved to disk freed, kept by the allocator (see above)
        self._gc_cursor = 0

    def hold(self, holdings: Holdings) -> None:
        self.holdings = holdings

    def level(self) -> int:
        """0 (`ok`); 1 (`warning`, over 75 % of maxmemory: new jobs keep no
        copy here); 2 (`oom`, over 95 %: `evict`, and commands flagged `m`
        are refused when nothing can be evicted)."""
        limit = self.settings.maxmemory
        used = self.used
        if used > limit // 100 * 95:
            return 2
        return 1 if used > limit // 100 * 75 else 0

    def account(self, delta: int) -> None:
        self.used += delta
        if self.used > self.peak:
            self.peak = self.used

    def data(self) -> int:
        """`used` without `retained`."""
        return self.used - self.retained

    def add_job(self, job: Job) -> None:
        """A job comes into memory, first into what jobs moved to disk left."""
        size = self.job_size(job)
        reuse = min(self.retained, self.small_size(job, size))
        self.retained -= reuse
        self.account(size - reuse)

    def to_disk(self, job: Job) -> None:
        """A job's record left memory for the disk (its slot is counted apart)."""
        size = self.job_size(job)
        small = self.small_size(job, size)
        self.retained += small
        self.used -= size - small

    @staticmethod
    def small_size(job: Job, size: int) -> int:
        """The part of a job's `size` in the small-object allocator."""
        body = len(job.body or b"")
        return size - body if body > SMALL_REQUEST else size

    @staticmethod
    def job_size(job: Job) -> int:
        return JOB_OVERHEAD + len(job.id) + len(job.body or b"") + len(job.queue or b"") + job.extra_size()

    @staticmethod
    def queue_size(name: bytes) -> int:
        return QUEUE_OVERHEAD + len(name)

    def evict(self) -> bool:
        """Free memory at level >= 2 (spec/cluster.md §11).  True when back under
        the 95 % threshold (or nothing needed)."""
        if self.level() < 2:
            return True
        if self.config.maxmemory == 0:
            return True  # upstream quirk kept: maxmemory 0 never answers OOM
        if self.config.maxmemory_policy == "noeviction":
            return False
        holdings = self.holdings
        if len(holdings.jobs) == 0:
            self.collect_idle_queues(everything=True)
        else:
            fruitless = 0
            # A walk from a random bucket: no O(jobs) copy on every command.
            for job in holdings.jobs.values_from(self.rng.randrange(NBUCKETS)):
                if fruitless >= 10 or self.level() < 2:
                    break
                if job.state == S_ACKED or (job.retry == 0 and job.flags & DELIVERED):
                    holdings.delete_job(job)
                    fruitless = 0
                else:
                    fruitless += 1
        return self.level() < 2

    def collect_idle_queues(self, everything: bool = False) -> None:
        """Destroy empty idle queues: a slice of the table per cron tick (a
        rolling scan cursor), or the whole table when evicting."""
        holdings = self.holdings
        idle = QUEUE_IDLE_MS[min(self.level(), 2)]
        if everything:
            candidates = list(holdings.queues.values())
        else:
            self._gc_cursor, candidates = holdings.queues.scan(self._gc_cursor, 100, 16)
        now = holdings.now
        for queue in candidates:
            if not len(queue) and not queue.waiters and not queue.pause and now - queue.atime >= idle:
                holdings.destroy_queue(queue)
