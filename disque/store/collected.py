"""The IDs of jobs collected lately, so that a late copy cannot return.

Theory of operation: once a job is garbage-collected after its ACK (or
deleted by a peer's DELJOB), a REPLJOB for it may still be in flight in a
stalled link.  Its ID is remembered here for `COLLECTED_MEMORY_MS` (and at
most `COLLECTED_MEMORY_MAX` IDs, the oldest forgotten first), and a
replica refuses a copy whose ID is remembered.  Owned by the node; written by
ACK/GC (core/acks.py) and job deletion, read by the REPLJOB handler.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

COLLECTED_MEMORY_MS = 300_000  # how long a collected job's ID is remembered
COLLECTED_MEMORY_MAX = 100_000  # ... and how many of them, at most


class Collected:
    __slots__ = ("_until",)

    def __init__(self) -> None:
        # job ID -> (forget at (ms), acknowledged), oldest first
        self._until: OrderedDict[bytes, tuple[int, bool]] = OrderedDict()

    def remember(self, job_id: bytes, now: int, acked: bool = True) -> None:
        """`acked` False: removed without an acknowledgement (WAITJOB does
        not count it)."""
        until = self._until
        until[job_id] = (now + COLLECTED_MEMORY_MS, acked)
        until.move_to_end(job_id)
        if len(until) > COLLECTED_MEMORY_MAX:
            until.popitem(last=False)

    def acked(self, job_id: bytes) -> bool:
        return self._until[job_id][1]

    def expire(self, now: int) -> None:
        until = self._until
        while until and next(iter(until.values()))[0] <= now:
            until.popitem(last=False)

    def clear(self) -> None:
        self._until.clear()

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._until

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._until)

    def __len__(self) -> int:
        return len(self._until)
