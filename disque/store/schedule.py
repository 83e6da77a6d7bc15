"""A recurring job's definition and its one serialized form (docs/schedules.md).

Theory of operation: a `Schedule` is the whole definition SCHEDULE ADD gave
(queue, body, EVERY ms or a CRON expression with its TZ, the ADDJOB options)
plus whether it is paused or deleted, stamped with the `version` (ms) and
`origin` (node ID) of the change that made it.  Every change is a new whole
record, and of two records of one name the later version wins (ties: the
higher origin), so nodes that hear the changes in any order, twice, or
after a partition agree (`newer`).  A deletion is a record too (a
tombstone), so a node that comes back with the old definition cannot bring
it back.  The same bytes (`encode`: netstring fields) travel on the bus
(SCHEDSET) and in the AOF (`SCHEDULE <storage form>`); `decode` checks them
and raises `DecodeError` on anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from disque.store.records import DecodeError


@dataclass(frozen=True, slots=True)
class Schedule:
    name: bytes
    version: int  # ms of the change (last writer wins)
    origin: str  # node ID that made the change (breaks ties)
    queue: bytes = b""
    body: bytes = b""
    every: int = 0  # ms between ticks (EVERY), or 0 for CRON
    cron: bytes = b""  # a 5-field expression (CRON)
    tz: bytes = b""  # the CRON expression's zone (b"": UTC)
    paused: bool = False
    deleted: bool = False
    since: int = 0  # ms the schedule was added: only the ticks after it fire
    # ADDJOB's options (0 / b"": not given, ADDJOB's default)
    repl: int = 0
    ttl: int = 0
    retry: int = -1  # -1: not given (0 is at-most-once)
    delay: int = 0
    maxlen: int = 0
    max_attempts: int = 0
    dead_letter: bytes = b""

    def newer(self, other: Schedule | None) -> bool:
        """Whether this record replaces `other` (None: nothing known)."""
        return other is None or (self.version, self.origin) > (other.version, other.origin)

    def options(self) -> list[bytes]:
        """The ADDJOB options given, as words (SCHEDULE SHOW)."""
        words: list[bytes] = []
        for word, value, unset in (
            (b"REPLICATE", self.repl, 0), (b"TTL", self.ttl, 0), (b"RETRY", self.retry, -1),
            (b"DELAY", self.delay, 0), (b"MAXLEN", self.maxlen, 0), (b"MAXATTEMPTS", self.max_attempts, 0),
        ):  # fmt: skip
            if value != unset:
                words += [word, b"%d" % value]
        return words + [b"DEADLETTER", self.dead_letter] if self.dead_letter else words


_INTS = ("version", "every", "since", "repl", "ttl", "retry", "delay", "maxlen", "max_attempts")
_BYTES = ("name", "queue", "body", "cron", "tz", "dead_letter")
_FIELDS = ("name", "version", "origin", "queue", "body", "every", "cron", "tz", "paused", "deleted", "since",
           "repl", "ttl", "retry", "delay", "maxlen", "max_attempts", "dead_letter")  # fmt: skip


def encode(s: Schedule) -> bytes:
    out = []
    for name in _FIELDS:
        value = getattr(s, name)
        raw = value if isinstance(value, bytes) else value.encode() if isinstance(value, str) else b"%d" % value
        out.append(b"%d:%s," % (len(raw), raw))
    return b"".join(out)


def decode(data: bytes) -> Schedule:
    """The record `encode` made; DecodeError for anything else."""
    if not isinstance(data, bytes):
        raise DecodeError("a schedule record is bytes")
    values: dict[str, object] = {}
    pos = 0
    for name in _FIELDS:
        colon = data.find(b":", pos, pos + 12)
        size = data[pos:colon]
        if colon < 0 or not size.isdigit():
            raise DecodeError(f"bad schedule field {name}")
        end = colon + 1 + int(size)
        if data[end : end + 1] != b",":
            raise DecodeError(f"bad schedule field {name}")
        raw = data[colon + 1 : end]
        pos = end + 1
        if name in _BYTES:
            values[name] = raw
        elif name == "origin":
            values[name] = raw.decode("ascii", "replace")
        elif name in _INTS:
            if not (raw.isdigit() or (raw[:1] == b"-" and raw[1:].isdigit())) or len(raw) > 19:
                raise DecodeError(f"bad schedule field {name}")
            values[name] = int(raw)
        elif raw in (b"0", b"1"):
            values[name] = raw == b"1"
        else:
            raise DecodeError(f"bad schedule field {name}")
    if pos != len(data) or not values["name"]:
        raise DecodeError("bad schedule record")
    return Schedule(**values)  # type: ignore[arg-type]
