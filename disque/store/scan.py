"""Tables split into fixed hash buckets, so that they can be scanned with a cursor.

Theory of operation: JSCAN and QSCAN promise that every element present for a
whole iteration is returned at least once, while elements come and go between
calls.  Keys never move between buckets (bucket = hash(key) % NBUCKETS), so a
cursor that is simply "the next bucket to visit" keeps that promise and never
returns an element twice.  Lookups cost one extra index operation.  Empty
buckets are skipped without counting against the per-call budget, so a small
table is scanned in one call; a bitmap of the non-empty buckets (`_used`, bit
i set iff bucket i holds something) lets a scan jump straight to them, which
matters for the idle-queue collector that scans a mostly empty queue table
ten times a second.

`_Bucketed` is that scanning; what a bucket is belongs to the table.  The
queue table's buckets are dicts.  The job index's are open-addressing
tables of job records keyed by their own `id`: a slot is one pointer and a
tag byte, where a dict entry also holds the key and its hash, and the index
of a node holding millions of jobs is the largest structure it has after the
jobs themselves (docs/performance.md, "Where a queued job's bytes go").
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from typing import Final, Generic, TypeVar

from mypy_extensions import i64

from disque.store.job import Job

K = TypeVar("K")
V = TypeVar("V")

BUCKET_BITS: Final = 10
NBUCKETS: Final = 1 << BUCKET_BITS


class _Bucketed(Generic[V]):
    __slots__ = ("_len", "_used")

    def __init__(self) -> None:
        self._len = 0
        self._used = 0

    def __len__(self) -> int:
        return self._len

    @abstractmethod
    def bucket(self, index: int) -> list[V]: ...  # the values of one bucket, as a list the caller may keep

    def _next_used(self, index: int) -> int:
        """The first non-empty bucket from `index` on, or NBUCKETS."""
        used = self._used >> index  # bit 0 is bucket `index`
        return index + (used & -used).bit_length() - 1 if used else NBUCKETS

    def values_from(self, start: int) -> Iterator[V]:
        """Every element once, bucket by bucket from bucket `start` round to
        it again.  Safe against deleting the element just returned."""
        for first, stop in ((start, NBUCKETS), (0, start)):
            index = self._next_used(first)
            while index < stop:
                yield from self.bucket(index)
                index = self._next_used(index + 1)

    def values(self) -> Iterator[V]:
        return self.values_from(0)

    def scan(self, cursor: int, want: int, max_buckets: int | None) -> tuple[int, list[V]]:
        """Visit buckets from `cursor` until `want` values were collected or
        `max_buckets` non-empty buckets were examined (None: no limit).
        Returns the next cursor (0 when the iteration is complete)."""
        out: list[V] = []
        examined = 0
        index = self._next_used(cursor) if cursor < NBUCKETS else NBUCKETS
        while index < NBUCKETS:
            out += self.bucket(index)
            examined += 1
            index = self._next_used(index + 1)
            if len(out) >= want or (max_buckets is not None and examined >= max_buckets):
                break
        return (index if index < NBUCKETS else 0), out


class BucketedDict(_Bucketed[V], Generic[K, V]):
    __slots__ = ("_buckets",)

    def __init__(self) -> None:
        super().__init__()
        self._buckets: list[dict[K, V]] = [{} for _ in range(NBUCKETS)]

    def get(self, key: K) -> V | None:
        return self._buckets[hash(key) % NBUCKETS].get(key)

    def __contains__(self, key: K) -> bool:
        return key in self._buckets[hash(key) % NBUCKETS]

    def add(self, key: K, value: V) -> None:
        index = hash(key) % NBUCKETS
        bucket = self._buckets[index]
        if key not in bucket:
            if not bucket:
                self._used |= 1 << index
            self._len += 1
        bucket[key] = value

    def pop(self, key: K) -> V | None:
        index = hash(key) % NBUCKETS
        bucket = self._buckets[index]
        value = bucket.pop(key, None)
        if value is not None:
            self._len -= 1
            if not bucket:
                self._used &= ~(1 << index)
        return value

    def clear(self) -> None:
        for bucket in self._buckets:
            bucket.clear()
        self._len = 0
        self._used = 0

    def bucket(self, index: int) -> list[V]:
        return list(self._buckets[index].values())


MIN_SLOTS: Final = 8
EMPTY: Final = 0  # slot tags; 2-255 tag a job with bits of its hash
GONE: Final = 1  # a job left: probing goes on past it, an insertion may reuse it


class _Table:
    """One bucket of the job index: open addressing with linear probing.
    `tags` holds a byte per slot, so that a probe reads a job (two cache
    misses: the record, then its ID) only when the byte matches."""

    __slots__ = ("jobs", "tags", "live", "used")

    def __init__(self, size: int) -> None:
        self.jobs: list[Job | None] = [None] * size
        self.tags = bytearray(size)
        self.live = 0  # jobs
        self.used = 0  # jobs and GONE slots: kept under 3/4 of the slots, so probes end


def _tag(h: i64) -> int:
    return 2 + (h >> 48) % 254


class JobIndex(_Bucketed[Job]):
    """The jobs of a node by ID.  A job's home slot in its bucket's table
    comes from the hash bits above those that chose the bucket.  A table is
    rebuilt at 8/3 of its jobs when its used slots pass three quarters (a
    job moves about once as its table grows: each move reads the record and
    its ID), and at half its size when under a sixth holds jobs.  Hashes
    are `i64`, so that the compiled build does this arithmetic unboxed."""

    __slots__ = ("_tables",)

    def __init__(self) -> None:
        super().__init__()
        self._tables: list[_Table | None] = [None] * NBUCKETS

    def _probe(self, table: _Table, h: i64, job_id: bytes) -> i64:
        """The slot holding `job_id`, or -1 - the slot where it would go."""
        jobs, tags = table.jobs, table.tags
        size: i64 = len(tags)
        tag = _tag(h)
        i = (h >> BUCKET_BITS) % size
        free: i64 = -1
        while True:
            t = tags[i]
            if t == EMPTY:
                return -1 - (free if free >= 0 else i)
            if t == tag:
                job = jobs[i]
                if job is not None and job.id == job_id:
                    return i
            elif t == GONE and free < 0:
                free = i
            i += 1
            if i == size:
                i = 0

    def get(self, job_id: bytes) -> Job | None:
        h: i64 = hash(job_id)
        table = self._tables[h & (NBUCKETS - 1)]
        if table is None:
            return None
        i = self._probe(table, h, job_id)
        return table.jobs[i] if i >= 0 else None

    def __contains__(self, job_id: bytes) -> bool:
        return self.get(job_id) is not None

    def add(self, job: Job) -> None:
        """Register `job`, in place of a record with the same ID."""
        h: i64 = hash(job.id)
        index: int = h & (NBUCKETS - 1)  # an int: the bitmap of used buckets is 1,024 bits wide
        table = self._tables[index]
        if table is None:
            table = self._tables[index] = _Table(MIN_SLOTS)
            self._used |= 1 << index
        i = self._probe(table, h, job.id)
        if i < 0:
            i = -1 - i
            if table.tags[i] == EMPTY:
                table.used += 1
            table.tags[i] = _tag(h)
            table.live += 1
            self._len += 1
        table.jobs[i] = job
        if 4 * table.used > 3 * len(table.tags):
            self._rebuild(index, table, max(MIN_SLOTS, 8 * table.live // 3))

    def pop(self, job_id: bytes) -> Job | None:
        h: i64 = hash(job_id)
        index: int = h & (NBUCKETS - 1)  # an int: the bitmap of used buckets is 1,024 bits wide
        table = self._tables[index]
        if table is None:
            return None
        i = self._probe(table, h, job_id)
        if i < 0:
            return None
        jobs, tags = table.jobs, table.tags
        job = jobs[i]
        jobs[i] = None
        tags[i] = GONE
        size: i64 = len(tags)
        while tags[i] == GONE and tags[(i + 1) % size] == EMPTY:  # a run's tail needs no GONE marks
            tags[i] = EMPTY
            table.used -= 1
            i = (i - 1) % size
        table.live -= 1
        self._len -= 1
        if not table.live:
            self._tables[index] = None
            self._used &= ~(1 << index)
        elif size > MIN_SLOTS and 6 * table.live < size:
            self._rebuild(index, table, max(MIN_SLOTS, size // 2))
        return job

    def _rebuild(self, index: int, old: _Table, size: i64) -> None:
        table = self._tables[index] = _Table(size)
        jobs, tags = table.jobs, table.tags
        for job in old.jobs:
            if job is not None:
                h: i64 = hash(job.id)
                i = (h >> BUCKET_BITS) % size
                while tags[i] != EMPTY:
                    i = i + 1 if i + 1 < size else 0
                jobs[i] = job
                tags[i] = _tag(h)
        table.live = table.used = old.live

    def bucket(self, index: int) -> list[Job]:
        table = self._tables[index]
        return [job for job in table.jobs if job is not None] if table is not None else []
