"""A queue's cluster-wide limits and their one serialized form (docs/limits.md).

Theory of operation: a `QueueLimits` is every limit QCONFIG gave a queue:
`rate-limit` (jobs handed to consumers per period, cluster-wide),
`concurrency` (jobs out with consumers at once, cluster-wide), and the same
two per key of a keyed job (`rate-limit-per-key`, `concurrency-per-key`),
and `ordered` (one job per key out at a time, each key's oldest first:
concurrency-per-key 1 with the keys' jobs served in creation order),
stamped with the `version` (ms) and `origin` (node ID) of the change that
made it.  It is cluster state as a schedule is (store/schedule.py): every
change is a new whole record, of two records of one queue the later version
wins (ties: the higher origin), and QCONFIG DEL leaves a tombstone so a node
that comes back with the old record cannot bring it back.  The same bytes
(`encode`) travel on the bus (QSET) and in the AOF (`QLIMITS <storage
form>`); `decode` checks each field's type, then the rules.

The rules a record keeps (`broken_rule`, stated once: QCONFIG SET, the bus
and the AOF loader apply the same): a queue name of 1 to MAX_QUEUE bytes;
every count at most MAX_COUNT; a rate's period one of PERIODS, and a period
only with a rate; an ordered queue's concurrency-per-key 1 or none.  QCONFIG SET's words are read by `apply_options`, which
names the option a bad value was given to.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from disque.store.records import RuleError, decode_row, encode_row

MAX_QUEUE = 64 << 10  # bytes of a queue's name
MAX_COUNT = 1_000_000_000  # the largest rate or concurrency
PERIODS = {b"s": 1000, b"m": 60_000, b"h": 3_600_000}  # a rate's unit -> its period in ms
UNITS = {ms: unit for unit, ms in PERIODS.items()}
NONE_WORDS = (b"0", b"none", b"off")  # a limit set to one of these is removed


class OptionError(ValueError):
    """A bad QCONFIG SET option or value; `str()` is the error to reply."""


@dataclass(frozen=True, slots=True)
class QueueLimits:
    queue: bytes
    version: int  # ms of the change (last writer wins)
    origin: str  # node ID that made the change (breaks ties)
    rate: int = 0  # jobs handed out per `period` (0: no rate limit)
    period: int = 0  # ms
    concurrency: int = 0  # jobs out at once (0: no limit)
    key_rate: int = 0  # the same per key of a keyed job
    key_period: int = 0
    key_concurrency: int = 0
    deleted: bool = False
    ordered: bool = False  # one job per key out at a time, oldest first

    def per_key(self) -> int:
        """The jobs of one key that may be out at once (0: no limit)."""
        return self.key_concurrency or int(self.ordered)

    def keyed(self) -> bool:
        """Whether the keys of the queue's jobs have budgets of their own."""
        return not self.deleted and bool(self.key_rate or self.per_key())

    def newer(self, other: QueueLimits | None) -> bool:
        """Whether this record replaces `other` (None: nothing known)."""
        return other is None or (self.version, self.origin) > (other.version, other.origin)

    def any(self) -> bool:
        """Whether the record limits anything."""
        return self.keyed() or not self.deleted and bool(self.rate or self.concurrency)

    def options(self) -> list[tuple[bytes, bytes | int | None]]:
        """QCONFIG GET's pairs (None: not limited)."""
        return [
            (b"rate-limit", rate_text(self.rate, self.period)), (b"concurrency", self.concurrency or None),
            (b"rate-limit-per-key", rate_text(self.key_rate, self.key_period)),
            (b"concurrency-per-key", self.key_concurrency or None), (b"ordered", b"yes" if self.ordered else None),
        ]  # fmt: skip


def rate_text(rate: int, period: int) -> bytes | None:
    """`300/s` (None: no rate)."""
    return b"%d/%s" % (rate, UNITS[period]) if rate else None


_FIELDS: tuple[tuple[str, type], ...] = (
    ("queue", bytes), ("version", int), ("origin", str), ("rate", int), ("period", int), ("concurrency", int),
    ("key_rate", int), ("key_period", int), ("key_concurrency", int), ("deleted", bool), ("ordered", bool),
)  # fmt: skip


def encode(limits: QueueLimits) -> bytes:
    """The record's bytes; `ordered` only when set, so a node from before it reads the others."""
    return encode_row(limits, _FIELDS if limits.ordered else _FIELDS[:-1])


def decode(data: bytes) -> QueueLimits:
    """The record `encode` made; DecodeError for anything else."""
    limits = QueueLimits(**decode_row(data, _FIELDS, len(_FIELDS) - 1, "limits"))  # (a record from before `ordered`: not)
    rule = broken_rule(limits)
    if rule:
        raise RuleError(rule)
    return limits


def broken_rule(limits: QueueLimits) -> str:
    """The rule `limits` breaks, as an error text ("": none)."""
    if not 0 < len(limits.queue) <= MAX_QUEUE:
        return f"the queue name must be 1 to {MAX_QUEUE} bytes"
    for count in (limits.rate, limits.concurrency, limits.key_rate, limits.key_concurrency):
        if not 0 <= count <= MAX_COUNT:
            return f"a limit must be 0 to {MAX_COUNT}"
    for rate, period in ((limits.rate, limits.period), (limits.key_rate, limits.key_period)):
        if (period in UNITS) != bool(rate):
            return "a rate's period must be 1000, 60000 or 3600000 ms, and given with a rate only"
    if limits.ordered and limits.key_concurrency > 1:
        return "an ordered queue has one job per key out at a time: concurrency-per-key 1 or none"
    return ""


def _count(option: bytes, word: bytes) -> int:
    if word.lower() in NONE_WORDS:
        return 0
    if not word.isdigit() or int(word) > MAX_COUNT:
        raise OptionError(f"{option.decode()} must be a number from 0 to {MAX_COUNT}, or none")
    return int(word)


def _yes(option: bytes, word: bytes) -> bool:
    word = word.lower()
    if word not in (b"yes", b"no"):
        raise OptionError(f"{option.decode()} must be yes or no")
    return word == b"yes"


def _rate(option: bytes, word: bytes) -> tuple[int, int]:
    if word.lower() in NONE_WORDS:
        return 0, 0
    count, slash, unit = word.partition(b"/")
    period = PERIODS.get(unit.lower())
    if not (slash and period and count.isdigit() and 0 < int(count) <= MAX_COUNT):
        raise OptionError(f"{option.decode()} must be <n>/s, <n>/m or <n>/h (n from 1 to {MAX_COUNT}), or none")
    return int(count), period


def apply_options(limits: QueueLimits, words: list[bytes]) -> QueueLimits:
    """QCONFIG SET's `<option> <value>` pairs over `limits` (a tombstone
    starts from nothing); OptionError naming the first bad one."""
    if not words or len(words) % 2:
        raise OptionError("QCONFIG SET takes <option> <value> pairs")
    if limits.deleted:
        limits = QueueLimits(limits.queue, limits.version, limits.origin)
    for option, word in zip(words[::2], words[1::2]):
        name = option.lower()
        if name == b"rate-limit":
            rate, period = _rate(name, word)
            limits = replace(limits, rate=rate, period=period)
        elif name == b"rate-limit-per-key":
            rate, period = _rate(name, word)
            limits = replace(limits, key_rate=rate, key_period=period)
        elif name == b"concurrency":
            limits = replace(limits, concurrency=_count(name, word))
        elif name == b"concurrency-per-key":
            limits = replace(limits, key_concurrency=_count(name, word))
        elif name == b"ordered":
            limits = replace(limits, ordered=_yes(name, word))
        else:
            shown = option[:64].decode("utf-8", "backslashreplace")
            raise OptionError(
                f"unknown option '{shown}': rate-limit, concurrency, rate-limit-per-key, concurrency-per-key or ordered"
            )
    rule = broken_rule(limits)
    if rule:
        raise OptionError(rule)
    return limits
