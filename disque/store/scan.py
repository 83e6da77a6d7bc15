"""A dict split into fixed hash buckets, so that it can be scanned with a cursor.

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
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

NBUCKETS = 1024


class BucketedDict(Generic[K, V]):
    __slots__ = ("_buckets", "_len", "_used")

    def __init__(self) -> None:
        self._buckets: list[dict[K, V]] = [{} for _ in range(NBUCKETS)]
        self._len = 0
        self._used = 0

    def __len__(self) -> int:
        return self._len

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

    def values_from(self, start: int) -> Iterator[V]:
        """Every element once, bucket by bucket from bucket `start` round to
        it again.  Safe against deleting the element just returned."""
        buckets = self._buckets
        for index in chain(range(start, NBUCKETS), range(start)):
            if buckets[index]:
                yield from list(buckets[index].values())

    def values(self) -> Iterator[V]:
        for bucket in self._buckets:
            yield from bucket.values()

    def clear(self) -> None:
        for bucket in self._buckets:
            bucket.clear()
        self._len = 0
        self._used = 0

    def bucket(self, index: int) -> list[V]:
        """The values of one bucket (a scan that walks every bucket itself)."""
        return list(self._buckets[index].values())

    def scan(self, cursor: int, want: int, max_buckets: int | None) -> tuple[int, list[V]]:
        """Visit buckets from `cursor` until `want` values were collected or
        `max_buckets` non-empty buckets were examined (None: no limit).
        Returns the next cursor (0 when the iteration is complete)."""
        out: list[V] = []
        if cursor >= NBUCKETS:
            return 0, out
        used = self._used >> cursor  # bit 0 is bucket `index`
        index = cursor
        examined = 0
        while used:
            skip = (used & -used).bit_length()  # 1 + distance to the next non-empty bucket
            index += skip
            used >>= skip
            out.extend(self._buckets[index - 1].values())
            examined += 1
            if len(out) >= want or (max_buckets is not None and examined >= max_buckets):
                break
        return (index if used else 0), out
