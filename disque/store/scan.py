"""A dict split into fixed hash buckets, so that it can be scanned with a cursor.

Theory of operation: JSCAN and QSCAN promise that every element present for a
whole iteration is returned at least once, while elements come and go between
calls.  Keys never move between buckets (bucket = hash(key) % NBUCKETS), so a
cursor that is simply "the next bucket to visit" keeps that promise and never
returns an element twice.  Lookups cost one extra index operation.  Empty
buckets are skipped without counting against the per-call budget, so a small
table is scanned in one call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

NBUCKETS = 1024


class BucketedDict(Generic[K, V]):
    __slots__ = ("_buckets", "_len")

    def __init__(self) -> None:
        self._buckets: list[dict[K, V]] = [{} for _ in range(NBUCKETS)]
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def get(self, key: K) -> V | None:
        return self._buckets[hash(key) % NBUCKETS].get(key)

    def __contains__(self, key: K) -> bool:
        return key in self._buckets[hash(key) % NBUCKETS]

    def add(self, key: K, value: V) -> None:
        bucket = self._buckets[hash(key) % NBUCKETS]
        if key not in bucket:
            self._len += 1
        bucket[key] = value

    def pop(self, key: K) -> V | None:
        value = self._buckets[hash(key) % NBUCKETS].pop(key, None)
        if value is not None:
            self._len -= 1
        return value

    def values(self) -> Iterator[V]:
        for bucket in self._buckets:
            yield from bucket.values()

    def clear(self) -> None:
        for bucket in self._buckets:
            bucket.clear()
        self._len = 0

    def scan(self, cursor: int, want: int, max_buckets: int | None) -> tuple[int, list[V]]:
        """Visit buckets from `cursor` until `want` values were collected or
        `max_buckets` non-empty buckets were examined (None: no limit).
        Returns the next cursor (0 when the iteration is complete)."""
        out: list[V] = []
        examined = 0
        index = cursor % NBUCKETS if cursor < NBUCKETS else NBUCKETS
        while index < NBUCKETS:
            bucket = self._buckets[index]
            index += 1
            if bucket:
                out.extend(bucket.values())
                examined += 1
                if len(out) >= want or (max_buckets is not None and examined >= max_buckets):
                    break
        return (index if index < NBUCKETS else 0), out
