"""The serialized forms of a job, and the checked field tables they are built from.

Theory of operation: a job has two msgpack forms with the same fields
(spec/cluster.md §8.1, spec/persistence.md §4): the bus form (`job_to_wire`,
a relative `ttl`, DELIVERED cleared) carried by REPLJOB and YOURJOBS, and
the storage form (`job_to_storage`, absolute `etime`, state and flags kept)
written to the AOF and to read-behind's segments as `encode_storage` bytes.
Neither carries `gc_retry` nor the local IN_LIST flag.  Malformed input
raises `DecodeError` (a ValueError): the core never sees an ill-typed or
out-of-range field.

Everything is table-driven: a `_Field` names an attribute, its short key, a
check that validates and normalises a decoded value, and a dump that makes
the value msgpack-ready; one generic pack and one generic load (`_MapLoader`,
`_MapPacker` and their positional twins) serve every table.  Checks, loads
and dumps are objects of small classes with one method, so that the
compiled loops call them natively.  The bus codec
(cluster/codec.py) builds its messages from the same pieces, which is why
it imports them from here: the job forms belong to the store, the frames
to the cluster layer above it.

Callers: the AOF (`encode_storage`, `decode_storage`), read-behind, the bus
codec, and the core when it sends or receives jobs (`job_to_wire`,
`job_from_wire`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgpack

from disque.store import failure as failures
from disque.store.ids import valid_id
from disque.store.job import DEFAULT_PRIORITY, DELIVERED, MAX_PRIORITY, NACKED, WIRE_FLAGS, Job, State, key_problem

STORAGE_VERSION = 1  # storage form version ("v")
WireJob = dict[str, Any]  # a job's bus form, as REPLJOB and YOURJOBS carry it (read-only)

_U64 = 2**64 - 1  # msgpack's largest integer
T = TypeVar("T")


class DecodeError(ValueError):
    """A frame body or a serialized job is malformed."""


class RuleError(DecodeError):
    """A well-formed whole record (a schedule, a queue's limits) that breaks one of its kind's rules."""



# --- checks: validate a decoded value and return it normalised ---------------


class Check:
    """Validates one decoded value and returns it normalised (`check`).
    Subclasses return Any, as this does: with a narrower return type mypyc
    calls them through a glue function."""

    def check(self, v: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - every check is a subclass's


class _IntIn(Check):
    def __init__(self, lo: int, hi: int) -> None:
        self.lo = lo
        self.hi = hi

    def check(self, v: Any) -> Any:
        # msgpack yields plain ints and bools; IntEnums such as State come from
        # dicts made by this module.  A bool is never a valid integer field.
        if type(v) is not int and (not isinstance(v, int) or isinstance(v, bool)):
            raise DecodeError(f"expected an integer, got {type(v).__name__}")
        n: int = v  # compared as a native int
        if not self.lo <= n <= self.hi:
            raise DecodeError(f"{v} is not in [{self.lo}, {self.hi}]")
        return v


class _OfType(Check):
    def __init__(self, t: type) -> None:
        self.t = t

    def check(self, v: Any) -> Any:
        if type(v) is not self.t:
            raise DecodeError(f"expected {self.t.__name__}, got {type(v).__name__}")
        return v


_bytes: Final = _OfType(bytes)
_bool: Final = _OfType(bool)
_str: Final = _OfType(str)


class _OptBytes(Check):
    def check(self, v: Any) -> Any:
        return None if v is None else _bytes.check(v)


class _Id(Check):
    """A job or a node ID: a value of type `t` that `valid` accepts."""

    def __init__(self, t: type, valid: Callable[[Any], object], what: str) -> None:
        self.t = t
        self.valid = valid
        self.what = what

    def check(self, v: Any) -> Any:
        if type(v) is not self.t or not self.valid(v):
            raise DecodeError(f"invalid {self.what}" if type(v) is self.t else f"expected {self.t.__name__}, got {type(v).__name__}")
        return v


_job_id: Final = _Id(bytes, valid_id, "job ID")
_node_id: Final = _Id(str, re.compile("[0-9a-f]{40}").fullmatch, "node ID")


class _OptJobId(Check):
    def check(self, v: Any) -> Any:
        return v if v == b"" else _job_id.check(v)


_opt_job_id: Final = _OptJobId()


class _ListOf(Check):
    """A msgpack array (or a tuple, in a dict made by this module) -> tuple."""

    def __init__(self, item: Check, min_len: int = 0) -> None:
        self.item = item
        self.min_len = min_len

    def check(self, v: Any) -> Any:
        if type(v) is not list and type(v) is not tuple:
            raise DecodeError(f"expected an array, got {type(v).__name__}")
        if len(v) < self.min_len:
            raise DecodeError(f"expected at least {self.min_len} item(s)")
        item = self.item
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item.check(x))
            except DecodeError as e:
                raise DecodeError(f"item {i}: {e}") from None
        return tuple(out)


_PORT = _IntIn(0, 65535)
_BITS = _IntIn(0, 2**32 - 1)  # node flags and mflags: unknown bits are harmless
_UINT = _IntIn(0, _U64)
_FLAG_BYTE: Final = _IntIn(0, 255)
_STATE_CODE: Final = _IntIn(min(State), max(State))
_node_ids: Final = _ListOf(_node_id)


_STATES: Final = {s.value: s for s in State}


class _JobState(Check):
    def check(self, v: Any) -> Any:
        return _STATES[_STATE_CODE.check(v)]


class _JobFlags(Check):
    def check(self, v: Any) -> Any:
        return _FLAG_BYTE.check(v) & WIRE_FLAGS


_are_node_ids: Final = re.compile("[0-9a-f]{40}(?:,[0-9a-f]{40})*").fullmatch


# Checked lists of delivery nodes, by their items: the jobs of a cluster come
# with few distinct lists, so most are checked once, and the jobs that came
# with the same list share one tuple (memory).  Emptied when full, so that
# a peer sending ever new lists cannot grow it.
_delivered: Final[dict[tuple[Any, ...], tuple[str, ...]]] = {}
_DELIVERED_MAX: Final = 4096


class _NodesDelivered(Check):
    def check(self, v: Any) -> Any:
        if type(v) is list or type(v) is tuple:
            try:
                return _delivered[tuple(v)]
            except (KeyError, TypeError):  # new, or an item is not hashable
                pass
        try:
            common = type(v) is list and _are_node_ids(",".join(v))  # the common case, in one match
        except TypeError:  # not all strings
            common = None
        checked = tuple(dict.fromkeys(v if common else _node_ids.check(v)))  # a set: drop duplicates, keep order
        if len(_delivered) >= _DELIVERED_MAX:
            _delivered.clear()
        _delivered[tuple(v)] = checked
        return checked


_nodes_delivered: Final = _NodesDelivered()


class _Failure(Check):
    """A job's last failure (store/failure.py): an array of its six fields,
    within its size rule, or an empty one for none."""

    def check(self, v: Any) -> Any:
        if type(v) is not list and not isinstance(v, tuple):  # (a Failure itself, in a dict made by this module)
            raise DecodeError(f"expected an array, got {type(v).__name__}")
        if not v:
            return failures.NO_FAILURE
        if len(v) != len(failures.Failure._fields):
            raise DecodeError(f"expected {len(failures.Failure._fields)} items")
        for x in v[:4]:
            _bytes.check(x)
        f = failures.Failure(v[0], v[1], v[2], v[3], _UINT.check(v[4]), _UINT.check(v[5]))
        if (problem := failures.problem(f)) is not None:
            raise DecodeError(problem)
        return f



class _Key(Check):
    """ADDJOB KEY: bytes within the key rule (store/job.py)."""

    def check(self, v: Any) -> Any:
        if (problem := key_problem(_bytes.check(v))) is not None:
            raise DecodeError(problem)
        return v


# --- records: field tables, one pack and one load -----------------------------


class Dump:
    """Makes one value of ours msgpack-ready (`dump`)."""

    def dump(self, v: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - every dump is a subclass's


@dataclass(frozen=True, slots=True)
class _Field:
    name: str  # attribute / dict key on our side
    key: str  # short key in the msgpack map
    check: Check  # decoded value -> validated value
    dump: Dump | None = None  # our value -> msgpack-ready value (None: as it is)
    default: Any = None  # not None: the field may be left out, and is when it has this value
    pos: tuple[Check, Dump | None] | None = None  # (check, dump) of the positional form, when it differs


_Fields = tuple[_Field, ...]

_MISSING: Final = object()


class _Missing(DecodeError):
    """A required key is absent (its message is the whole error)."""


class _Slot:
    """One field of a compiled table: what a load or a pack needs of it."""

    def __init__(self, name: str, key: str, check: Check, dump: Dump | None, default: Any) -> None:
        self.name = name
        self.key = key
        self.check = check
        self.dump = dump
        self.default = default


class _MapLoader(Check):
    """The check of map `o` (short keys, or our names when `named`) ->
    {name: value}; a field with a default may be left out."""

    def __init__(self, fields: _Fields, named: bool = False) -> None:
        self.slots = tuple([_Slot(f.name, f.name if named else f.key, f.check, None, f.default) for f in fields])

    def check(self, o: Any) -> Any:
        if type(o) is not dict:
            raise DecodeError(f"expected a map, got {type(o).__name__}")
        out: dict[str, Any] = {}
        key = ""
        try:
            for s in self.slots:
                key = s.key
                v = o.get(key, _MISSING)
                if v is not _MISSING:
                    out[s.name] = s.check.check(v)
                elif s.default is not None:
                    out[s.name] = s.default
                else:
                    raise _Missing(f"missing field {key!r}")
        except _Missing:
            raise
        except DecodeError as e:
            raise DecodeError(f"field {key!r}: {e}") from None
        return out


class _ArrayLoader(Check):
    """`_MapLoader` for the positional form: the check of array `o`, whose
    items from `offset` on are the fields in table order (more items are
    ignored, as unknown keys are; the optional fields that end the table
    may be missing, and take their defaults, as missing keys do: a node
    of an older version sends a row without the fields added to it since)."""

    def __init__(self, fields: _Fields, offset: int = 0) -> None:
        self.slots = tuple([_Slot(f.name, f.key, f.check if f.pos is None else f.pos[0], None, f.default) for f in fields])
        self.offset = offset
        required = len(fields)  # the optional fields that end the table follow these
        while required and fields[required - 1].default is not None:
            required -= 1
        self.required = required

    def check(self, o: Any) -> Any:
        if type(o) is not list:
            raise DecodeError(f"expected an array, got {type(o).__name__}")
        offset = self.offset
        end = len(o)
        if end < offset + self.required:
            raise DecodeError(f"missing field {self.slots[max(end - offset, 0)].name!r}")
        out: dict[str, Any] = {}
        name = ""
        try:
            for s in self.slots:
                name = s.name
                out[name] = s.check.check(o[offset]) if offset < end else s.default
                offset += 1
        except DecodeError as e:
            raise DecodeError(f"field {name!r}: {e}") from None
        return out


class _MapPacker(Dump):
    """Our object (attributes, or a dict with our names when `items`) -> the
    map of short keys; a field equal to its default is left out."""

    def __init__(self, fields: _Fields, items: bool = False) -> None:
        self.slots = tuple([_Slot(f.name, f.key, f.check, f.dump, f.default) for f in fields])
        self.items = items

    def dump(self, o: Any) -> Any:
        out: dict[str, Any] = {}
        items = self.items
        for s in self.slots:
            v = o[s.name] if items else getattr(o, s.name)
            if s.default is None or v != s.default:
                out[s.key] = v if s.dump is None else s.dump.dump(v)
        return out


class _ArrayPacker(Dump):
    """`_MapPacker` for the positional form: `pack(o, head)` -> [*head,
    field, ...], every field present."""

    def __init__(self, fields: _Fields, items: bool = False) -> None:
        self.slots = tuple([_Slot(f.name, f.key, f.check, f.dump if f.pos is None else f.pos[1], f.default) for f in fields])
        self.items = items

    def pack(self, o: Any, head: tuple[Any, ...]) -> list[Any]:
        out = list(head)
        items = self.items
        for s in self.slots:
            v = o[s.name] if items else getattr(o, s.name)
            out.append(v if s.dump is None else s.dump.dump(v))
        return out

    def dump(self, o: Any) -> Any:
        return self.pack(o, ())


class _Record(Check):
    """A record checked by `loader`, built by `build` from its fields."""

    def __init__(self, loader: Check, build: Callable[..., Any]) -> None:
        self.loader = loader
        self.build = build

    def check(self, v: Any) -> Any:
        return self.build(**self.loader.check(v))


class _Each(Dump):
    def __init__(self, item: Dump) -> None:
        self.item = item

    def dump(self, items: Any) -> Any:
        item = self.item
        return [item.dump(x) for x in items]


def _unpack(data: bytes) -> Any:
    try:
        # The default limits of unpackb are derived from len(data), so a
        # claimed array or string length cannot allocate more than that.
        return msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise DecodeError(f"undecodable msgpack: {e}") from None


def _unpack_map(data: bytes) -> dict[Any, Any]:
    m = _unpack(data)
    if type(m) is not dict:
        raise DecodeError(f"expected a map, got {type(m).__name__}")
    return m


def encode_row(record: Any, fields: tuple[tuple[str, type], ...]) -> bytes:
    """A whole-record kind's storage form (schedules, queue limits): a
    msgpack array of its `fields`' values, in order."""
    return msgpack.packb([getattr(record, name) for name, _ in fields])  # type: ignore[no-any-return]


def decode_alone(decode: Callable[[bytes], T], record: bytes, what: str, source: str) -> T | None:
    """A whole record from the bus or the AOF, decoded; None for a bad one,
    logged: its caller drops it alone and counts it, and the link it came on
    and the file it is in stay in use (house rule 5)."""
    try:
        return decode(record)
    except DecodeError as e:
        logging.getLogger("disque").warning("%s record %s dropped: %s", what, source, e)
        return None


def decode_row(data: Any, fields: tuple[tuple[str, type], ...], required: int, what: str) -> dict[str, Any]:
    """`encode_row`'s array back as values by name: the first `required`
    fields always there, the later ones (added since) left to their
    defaults when missing; DecodeError for anything else, a bool is not an
    int here, nor an int a bool."""
    if not isinstance(data, bytes):
        raise DecodeError(f"a {what} record is bytes")
    try:
        row = msgpack.unpackb(data)
    except Exception:  # msgpack's errors for truncated, extra or malformed data
        raise DecodeError(f"bad {what} record") from None
    if type(row) is not list or not required <= len(row) <= len(fields):
        raise DecodeError(f"bad {what} record")
    values: dict[str, Any] = {}
    for (name, kind), value in zip(fields, row):
        if type(value) is not kind:
            raise DecodeError(f"bad {what} field {name}")
        values[name] = value
    return values


_VERSION = (_Field("v", "v", _IntIn(-(2**63), _U64)),)  # any msgpack integer


_load_version: Final = _MapLoader(_VERSION)


def _version(m: dict[Any, Any]) -> int:
    return _load_version.check(m)["v"]


# --- jobs ---------------------------------------------------------------------

# The fields both forms share; the names are those of Job's constructor, the
# keys of `Job.fields`.
_JOB_COMMON: _Fields = (
    _Field("id", "i", _job_id),
    _Field("state", "s", _JobState()),
    _Field("flags", "f", _JobFlags()),
    _Field("repl", "r", _IntIn(1, 65535)),
    _Field("ctime", "c", _UINT),
    _Field("delay", "d", _UINT),
    _Field("retry", "rt", _UINT),
    _Field("nacks", "na", _UINT),
    _Field("deliv", "dv", _UINT),
    _Field("queue", "q", _OptBytes()),
    _Field("body", "b", _OptBytes()),
    _Field("nodes_delivered", "nd", _nodes_delivered),
    # MAXATTEMPTS / DEADLETTER and dead-lettered copies: left out when unset.
    _Field("max_attempts", "ma", _IntIn(0, 65535), default=0),
    _Field("dead_letter", "dl", _bytes, default=b""),
    _Field("origin", "o", _opt_job_id, default=b""),
)
# PRIORITY, left out at its default; after the other fields, so that the
# positional form of an older node (which has none) still decodes (`_ArrayLoader`).
_PRIORITY = _Field("priority", "pr", _IntIn(0, MAX_PRIORITY), default=DEFAULT_PRIORITY)
# The last failure (store/failure.py), left out when there is none; after PRIORITY, for the same reason.
_FAILURE = _Field("failure", "er", _Failure(), default=failures.NO_FAILURE)
# ADDJOB KEY (docs/keys.md), left out when there is none; after the failure, for the same reason.
_KEY = _Field("key", "k", _Key(), default=b"")
# ADDJOB ... AFTER: the parents a job still waits for, and what a failed one does (core/dependencies.py);
# left out for a job that waits for none, after the fields above for the same reason.
_DEPENDS: _Fields = (
    _Field("parents", "pa", _ListOf(_job_id), default=()),
    _Field("on_parent_fail", "pf", _IntIn(0, 2), default=0),
    _Field("batch", "bt", _bytes, default=b""),  # ADDJOB ... BATCH (core/batches.py)
    _Field("after", "af", _ListOf(_job_id), default=()),  # every parent AFTER named, kept after the release
)
_WIRE_JOB: _Fields = _JOB_COMMON + (
    _Field("ttl", "tl", _IntIn(1, _U64)), _Field("etime", "et", _UINT), _PRIORITY, _FAILURE, _KEY, *_DEPENDS
)
# `not_before`: the core-clock ms before which a NACK ... DELAY job is not queued again (0: none).
_STORED_JOB: _Fields = _JOB_COMMON + (
    _Field("etime", "et", _UINT), _Field("not_before", "nb", _UINT, default=0), _PRIORITY, _FAILURE, _KEY, *_DEPENDS
)
_wire_job: Final = _MapLoader(_WIRE_JOB)  # checks the job of REPLJOB / YOURJOBS (a dict with our names)
_dump_wire_job: Final = _MapPacker(_WIRE_JOB, items=True)
_wire_job_pos: Final = _ArrayLoader(_WIRE_JOB)
_dump_wire_job_pos: Final = _ArrayPacker(_WIRE_JOB, items=True)
_load_stored_job: Final = _MapLoader(_STORED_JOB, named=True)
_load_stored_map: Final = _MapLoader(_STORED_JOB)
_pack_stored_job: Final = _MapPacker(_STORED_JOB, items=True)


def job_to_wire(job: Job, now_ms: int) -> WireJob:
    """Bus form: DELIVERED (and local flags) cleared, the expiry both as the
    remaining TTL in milliseconds and as the sender's absolute `etime`.

    The receiver keeps the earlier of the two: the relative form protects a
    receiver whose clock is behind, the absolute one caps the TTL of a frame
    that waited in a stalled TCP connection during a partition (with only a
    relative TTL such a job outlives its TTL by the time it waited).  The
    milliseconds keep a job moved between nodes many times from gaining a
    rounding second at every hop."""
    d = job.fields(WIRE_FLAGS & ~DELIVERED)
    d["ttl"] = max(1, job.etime * 1000 - now_ms)
    d["etime"] = job.etime
    d["priority"] = job.priority
    d["failure"] = job.failure
    d["key"] = job.key
    return d


def job_from_wire(d: WireJob, now_ms: int) -> Job:
    """A received job expiring at the earlier of `(now_ms + ttl) // 1000` and
    the sender's `etime`, every other field as sent.

    The caller applies the receive rules (state active, qtime, known nodes).
    `d` is a job of a decoded REPLJOB or YOURJOBS: `decode_body` checked it.
    """
    return _new_job(d, min((now_ms + d["ttl"]) // 1000, d["etime"]))


def _new_job(f: Any, etime: int) -> Job:
    """The job of checked fields `f`, expiring at `etime`.  Positional: a
    compiled Job parses keywords at twice the cost of the whole call."""
    return Job(f["id"], f["queue"], f["body"], f["state"], f["flags"], f["repl"], etime, f["ctime"], f["delay"],
               f["retry"], f["nacks"], f["deliv"], f["nodes_delivered"], f["max_attempts"], f["dead_letter"],
               f["origin"], f["priority"], f["failure"], f["key"], f["parents"], f["on_parent_fail"], f["batch"],
               f["after"])  # fmt: skip


def job_to_storage(job: Job) -> dict[str, Any]:
    """Storage form: absolute etime, state and flags kept (IN_LIST masked),
    and the pending requeue time of a NACK ... DELAY as `not_before`."""
    d = job.fields(WIRE_FLAGS)
    d["etime"] = job.etime
    d["not_before"] = job.qtime if job.flags & NACKED else 0
    d["priority"] = job.priority
    d["failure"] = job.failure
    d["key"] = job.key
    return d


def _stored_job(fields: dict[str, Any]) -> Job:
    not_before = fields["not_before"]
    job = _new_job(fields, fields["etime"])
    if not_before:
        job.qtime = not_before
        job.flags |= NACKED
    return job


def job_from_storage(d: dict[str, Any]) -> Job:
    """Inverse of job_to_storage; raises DecodeError if `d` is malformed."""
    return _stored_job(_load_stored_job.check(d))


def encode_storage(job: Job) -> bytes:
    """The AOF LOADJOB payload: the storage form as a versioned msgpack map."""
    m = _pack_stored_job.dump(job_to_storage(job))
    m["v"] = STORAGE_VERSION
    return msgpack.packb(m, use_bin_type=True)


def decode_storage(data: bytes) -> Job:
    """Inverse of encode_storage; raises DecodeError on anything malformed."""
    m = _unpack_map(data)
    if _version(m) != STORAGE_VERSION:
        raise DecodeError(f"unknown storage version {m['v']}")
    return _stored_job(_load_stored_map.check(m))
