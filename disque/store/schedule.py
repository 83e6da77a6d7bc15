"""A recurring job's definition and its one serialized form (docs/schedules.md).

Theory of operation: a `Schedule` is the whole definition SCHEDULE ADD gave
(queue, body, EVERY ms or a CRON expression with its TZ, the ADDJOB options)
plus whether it is paused or deleted, stamped with the `version` (ms) and
`origin` (node ID) of the change that made it.  Every change is a new whole
record, and of two records of one name the later version wins (ties: the
higher origin), so nodes that hear the changes in any order, twice, or
after a partition agree (`newer`).  A deletion is a record too (a
tombstone), so a node that comes back with the old definition cannot bring
it back.  The same bytes (`encode`: a msgpack array of the fields in
`_FIELDS` order) travel on the bus (SCHEDSET) and in the AOF (`SCHEDULE
<storage form>`); `decode` checks each field's type and raises
`DecodeError` on anything else.  Fields added later go at the end, and a
record without them (from an older node) takes their defaults.

The rules a record keeps (`broken_rule`: a name of 1 to MAX_NAME bytes
without control characters, an expression and a zone of at most MAX_EXPR
bytes, queue names of at most MAX_QUEUE, a body of at most MAX_BODY so the
record fits one bus frame) are stated here once: SCHEDULE ADD refuses a
definition that breaks one, naming it; `decode` raises `RuleError` for a
record that does (an older node, a bug), and the bus and the AOF loader
drop that record alone, logged and counted, never the link or the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from disque.store.records import RuleError, decode_row, encode_row

MAX_NAME = 256  # bytes of a schedule's name
MAX_EXPR = 1024  # bytes of a CRON expression, and of its zone
MAX_QUEUE = 64 << 10  # bytes of the queue's name, and of the dead-letter queue's
MAX_BODY = 64 << 20  # bytes of the body: with the rest, the record fits one bus frame (64 MiB + 1 MiB)
_CONTROL = bytes(range(32)) + b"\x7f"


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
    zones: int = 0
    priority: int = -1  # -1: the queue's

    def newer(self, other: Schedule | None) -> bool:
        """Whether this record replaces `other` (None: nothing known)."""
        return other is None or (self.version, self.origin) > (other.version, other.origin)

    def options(self) -> list[bytes]:
        """The ADDJOB options given, as words (SCHEDULE SHOW)."""
        words: list[bytes] = []
        for word, value, unset in (
            (b"REPLICATE", self.repl, 0), (b"TTL", self.ttl, 0), (b"RETRY", self.retry, -1),
            (b"DELAY", self.delay, 0), (b"MAXLEN", self.maxlen, 0), (b"MAXATTEMPTS", self.max_attempts, 0),
            (b"ZONES", self.zones, 0), (b"PRIORITY", self.priority, -1),
        ):  # fmt: skip
            if value != unset:
                words += [word, b"%d" % value]
        return words + [b"DEADLETTER", self.dead_letter] if self.dead_letter else words


_FIELDS: tuple[tuple[str, type], ...] = (
    ("name", bytes), ("version", int), ("origin", str), ("queue", bytes), ("body", bytes), ("every", int),
    ("cron", bytes), ("tz", bytes), ("paused", bool), ("deleted", bool), ("since", int), ("repl", int), ("ttl", int),
    ("retry", int), ("delay", int), ("maxlen", int), ("max_attempts", int), ("dead_letter", bytes),
    ("zones", int), ("priority", int),
)  # fmt: skip
_REQUIRED = 18  # the fields after these came later: a record without them takes their defaults


def encode(s: Schedule) -> bytes:
    return encode_row(s, _FIELDS)


def decode(data: bytes) -> Schedule:
    """The record `encode` made; DecodeError for anything else."""
    s = Schedule(**decode_row(data, _FIELDS, _REQUIRED, "schedule"))
    rule = broken_rule(s)
    if rule:
        raise RuleError(rule)
    return s


def broken_rule(s: Schedule) -> str:
    """The rule `s` breaks, as an error text ("": none)."""
    if not 0 < len(s.name) <= MAX_NAME or s.name != s.name.translate(None, _CONTROL):
        return f"the schedule name must be 1 to {MAX_NAME} bytes without control characters"
    if len(s.cron) > MAX_EXPR or len(s.tz) > MAX_EXPR:
        return f"the CRON expression and TZ must be at most {MAX_EXPR} bytes"
    if len(s.queue) > MAX_QUEUE or len(s.dead_letter) > MAX_QUEUE:
        return f"queue names must be at most {MAX_QUEUE} bytes"
    if len(s.body) > MAX_BODY:
        return f"the body must be at most {MAX_BODY} bytes"
    return ""
