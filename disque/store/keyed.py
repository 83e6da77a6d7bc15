"""A key's hold at its home (docs/keys.md) and its one serialized form.

Theory of operation: ADDJOB ... KEY k DEDUP makes (queue, k) held by one
job for a while; the home of (queue, k) (core/keys.py) keeps that as a
`KeyHold`: the job holding the key, until when (ms of the home's clock),
and whether an acknowledgement of the job ends it early (DEDUP ACTIVE)
or a later claim supersedes the job (DEBOUNCE: `until` is when it is due).
Every change is a new whole record stamped with its `version` (ms) and
`origin` (node ID); of two records of one (queue, key) the later version
wins (ties: the higher origin), so the home's standbys, a node that links
up and an AOF replayed agree however the records reach them.  A release
is a record too (no job), so an older hold cannot come back.

The same bytes (`encode`: a msgpack array of the fields in order, the last,
`debounce`, left out when False, as older nodes wrote it) travel on the bus (KEYSET) and in the AOF (`KEYHOLD <storage form>`); `decode`
checks each field (the key by store/job.py's key rule, the job ID as IDs
are, DEBOUNCE by store/job_options.py's rule) and raises `DecodeError`: the bus and the AOF loader drop that record
alone, never the link or the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from disque.store.ids import valid_id
from disque.store.job import key_problem
from disque.store.job_options import debounce_problem
from disque.store.records import DecodeError


@dataclass(slots=True, init=False)
class KeyHold:
    """Never changed once made (a change is a new record).  Its own
    constructor: compiled, a dataclass's generated one (frozen even more)
    costs about as much as the rest of a DEDUP claim."""

    queue: bytes
    key: bytes
    version: int  # ms of the change (last writer wins)
    origin: str  # node ID that made the change (breaks ties)
    job: bytes  # the job holding the key (b"": released)
    until: int  # ms the hold ends (the DEDUP window; DEDUP ACTIVE: the job's expiry)
    active: bool  # DEDUP ACTIVE: the job's acknowledgement ends it
    debounce: bool  # DEBOUNCE: the job is the key's pending one, superseded by a later claim until due

    def __init__(
        self, queue: bytes, key: bytes, version: int, origin: str, job: bytes = b"", until: int = 0, active: bool = False,
        debounce: bool = False,
    ) -> None:  # fmt: skip
        self.queue = queue
        self.key = key
        self.version = version
        self.origin = origin
        self.job = job
        self.until = until
        self.active = active
        self.debounce = debounce

    def newer(self, other: KeyHold | None) -> bool:
        """Whether this record replaces `other` (None: nothing known)."""
        return other is None or (self.version, self.origin) > (other.version, other.origin)

    def holds(self, now: int) -> bool:
        """Whether a job holds the key at `now` (ms)."""
        return bool(self.job) and now < self.until

    @property
    def name(self) -> bytes:
        """What homes are chosen by (core/homes.py): the queue and the key."""
        return self.queue + b"\0" + self.key


_FIELDS: tuple[tuple[str, type], ...] = (
    ("queue", bytes), ("key", bytes), ("version", int), ("origin", str), ("job", bytes), ("until", int), ("active", bool),
    ("debounce", bool),
)  # fmt: skip


def encode(h: KeyHold) -> bytes:
    fields = _FIELDS if h.debounce else _FIELDS[:-1]
    return msgpack.packb([getattr(h, name) for name, _ in fields])  # type: ignore[no-any-return]


def decode(data: bytes) -> KeyHold:
    """The record `encode` made; DecodeError for anything else."""
    try:
        row = msgpack.unpackb(data)
    except Exception:  # msgpack's errors for truncated, extra or malformed data
        raise DecodeError("bad key record") from None
    if type(row) is not list or not len(_FIELDS) - 1 <= len(row) <= len(_FIELDS):
        raise DecodeError("bad key record")
    for (name, kind), value in zip(_FIELDS, row):
        if type(value) is not kind:  # (a bool is not an int here, nor an int a bool)
            raise DecodeError(f"bad key field {name}")
    h = KeyHold(*row)
    problem = key_problem(h.key) if h.key else "a key record needs a key"
    if problem is None and h.job and not valid_id(h.job):
        problem = "bad job ID"
    if problem is None and (h.version < 0 or h.until < 0):
        problem = "negative time"
    if problem is None and h.debounce:
        problem = debounce_problem(True, h.active, False)
    if problem is not None:
        raise DecodeError(problem)
    return h
