"""Job results: what a consumer hands back with its acknowledgement.

Theory of operation: `ACKJOB <id> RESULT <bytes>` (docs/workflows.md) keeps
the bytes here under the job's ID until `until` (ms of the core clock): the
acknowledging node sets it to now plus `result-ttl`, and so does every node
that learns the result later, from the SETACK that carries it (the ACK's
garbage collection waits for every holder's GOTACK, so each copy's node
hears of it, a node that was down included) or from its own AOF (a
`RESULT` record, written when it learned it and again by each rewrite).
The first result known for an ID is kept: a second ACK's result, or the
same one carried again, changes nothing.  One size rule, `problem`, serves
the command, the bus and the AOF loader alike.

Entries are kept oldest first; `expire` drops the expired ones from the
front and `get` checks the deadline, so an entry learned out of order (an
AOF record of a longer TTL) is never served late.  At most
`RESULTS_MAX_BYTES` of results are kept, the oldest forgotten first.
Owned by the lifecycle (`life.results`); written by core/acks.py and the
AOF replay, read by RESULT, WAITJOB ... WITHRESULTS and the snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Final

MAX_RESULT_BYTES: Final = 16 * 1024  # a result's largest size
RESULTS_MAX_BYTES: Final = 64 << 20  # the results a node keeps, at most


def problem(result: bytes) -> str | None:
    """What is wrong with a result, or None when it may be kept."""
    if len(result) > MAX_RESULT_BYTES:
        return f"RESULT is longer than {MAX_RESULT_BYTES} bytes"
    return None


class Results:
    __slots__ = ("_kept", "size")

    def __init__(self) -> None:
        self._kept: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()  # job ID -> (until ms, result)
        self.size = 0  # bytes of the results kept

    def keep(self, job_id: bytes, result: bytes, until: int) -> bool:
        """Keep a result (within the size rule) unless one is known for the
        ID; True when it is new here."""
        kept = self._kept
        if job_id in kept:
            return False
        kept[job_id] = (until, result)
        self.size += len(result)
        while self.size > RESULTS_MAX_BYTES:
            self.size -= len(kept.popitem(last=False)[1][1])
        return True

    def get(self, job_id: bytes, now: int) -> bytes | None:
        entry = self._kept.get(job_id)
        return entry[1] if entry is not None and entry[0] > now else None

    def expire(self, now: int) -> None:
        kept = self._kept
        while kept and next(iter(kept.values()))[0] <= now:
            self.size -= len(kept.popitem(last=False)[1][1])

    def clear(self) -> None:
        self._kept.clear()
        self.size = 0

    def items(self) -> Iterator[tuple[bytes, int, bytes]]:
        """(job ID, until, result) of each result kept, oldest first."""
        return ((job_id, until, result) for job_id, (until, result) in self._kept.items())

    def __len__(self) -> int:
        return len(self._kept)
