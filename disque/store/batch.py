"""A batch of jobs and its one serialized form (docs/workflows.md).

Theory of operation: a `Batch` is what BATCH NEW made (its ID and the
ON-SUCCESS / ON-COMPLETE callbacks, a queue and a body each) plus what the
cluster learned since: the jobs added to it, those acknowledged (`done`),
those gone without that (`failed`), whether it was closed, and which
callbacks were fired.  Every field only grows (sets gain members, flags go
from false to true), so two records of one batch merge by union (`merge`)
and nodes that hear the changes in any order, twice, or after a partition
agree.  The same bytes (`encode`) travel on the bus (BATCHSET) and in the
AOF (`BATCH <record>`); `decode` checks each field and raises DecodeError
on anything else, and a record that breaks a rule (`broken_rule`: a
well-formed batch ID, queue names of at most MAX_QUEUE bytes and bodies of
at most MAX_BODY, job IDs) is dropped alone by the bus and the AOF loader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

import msgpack

from disque.store.ids import valid_id
from disque.store.records import DecodeError

MAX_QUEUE: Final = 1024  # bytes of a callback's queue name
MAX_BODY: Final = 64 << 10  # bytes of a callback's body
SUCCESS, COMPLETE = 1, 2  # `fired` bits, and the callbacks defined (`callbacks`)
valid_batch_id = re.compile(rb"BT[0-9a-f]{40}").fullmatch


@dataclass(slots=True)
class Batch:
    id: bytes
    success: tuple[bytes, bytes] | None = None  # ON-SUCCESS (queue, body)
    complete: tuple[bytes, bytes] | None = None  # ON-COMPLETE (queue, body)
    closed: bool = False
    jobs: set[bytes] = field(default_factory=set)
    done: set[bytes] = field(default_factory=set)
    failed: set[bytes] = field(default_factory=set)
    fired: int = 0  # SUCCESS | COMPLETE

    @property
    def pending(self) -> set[bytes]:
        return self.jobs - self.done - self.failed

    def due(self) -> int:
        """The callbacks whose time has come and that were not fired (bits)."""
        if not self.closed or self.pending:
            return 0
        due = 0
        if self.complete is not None:
            due |= COMPLETE
        if self.success is not None and not self.failed & self.jobs:
            due |= SUCCESS
        return due & ~self.fired

    def merge(self, other: Batch) -> bool:
        """Take what `other` knows; whether anything changed."""
        before = (self.closed, len(self.jobs), len(self.done), len(self.failed), self.fired)
        self.closed |= other.closed
        self.jobs |= other.jobs
        self.done |= other.done
        self.failed |= other.failed
        self.fired |= other.fired
        self.success = self.success or other.success
        self.complete = self.complete or other.complete
        return before != (self.closed, len(self.jobs), len(self.done), len(self.failed), self.fired)


def encode(b: Batch) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        [b.id, list(b.success or ()), list(b.complete or ()), b.closed, sorted(b.jobs), sorted(b.done), sorted(b.failed), b.fired]
    )


def _callback(v: object) -> tuple[bytes, bytes] | None:
    if type(v) is not list or len(v) not in (0, 2) or not all(type(x) is bytes for x in v):
        raise DecodeError("bad batch callback")
    return (v[0], v[1]) if v else None


def _ids(v: object) -> set[bytes]:
    if type(v) is not list or not all(type(x) is bytes and valid_id(x) for x in v):
        raise DecodeError("bad batch job list")
    return set(v)


def decode(data: bytes) -> Batch:
    """The record `encode` made; DecodeError for anything else."""
    try:
        row = msgpack.unpackb(data)
    except Exception:  # msgpack's errors for truncated, extra or malformed data
        raise DecodeError("bad batch record") from None
    if type(row) is not list or len(row) != 8 or type(row[0]) is not bytes or type(row[3]) is not bool or type(row[7]) is not int:
        raise DecodeError("bad batch record")
    b = Batch(row[0], _callback(row[1]), _callback(row[2]), row[3], _ids(row[4]), _ids(row[5]), _ids(row[6]), row[7] & 3)
    rule = broken_rule(b.id, b.success, b.complete)
    if rule:
        raise DecodeError(rule)
    return b


def broken_rule(batch_id: bytes, *callbacks: tuple[bytes, bytes] | None) -> str:
    """The rule a batch breaks ("" for none): BATCH NEW, the bus and the AOF apply it."""
    if not valid_batch_id(batch_id):
        return "invalid batch ID"
    for callback in callbacks:
        if callback is not None and (len(callback[0]) > MAX_QUEUE or not callback[0] or len(callback[1]) > MAX_BODY):
            return f"a callback's queue is 1 to {MAX_QUEUE} bytes and its body at most {MAX_BODY}"
    return ""
