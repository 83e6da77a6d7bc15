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
the value msgpack-ready; one generic pack and one generic load (`_loader`,
`_packer` and their positional twins) serve every table.  The bus codec
(cluster/codec.py) builds its messages from the same pieces, which is why
it imports them from here: the job forms belong to the store, the frames
to the cluster layer above it.

Callers: the AOF (`encode_storage`, `decode_storage`), read-behind, the bus
codec, and the core when it sends or receives jobs (`job_to_wire`,
`job_from_wire`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgpack

from disque.store.ids import valid_id
from disque.store.job import DEFAULT_PRIORITY, DELIVERED, MAX_PRIORITY, NACKED, WIRE_FLAGS, Job, State

STORAGE_VERSION = 1  # storage form version ("v")
WireJob = dict[str, Any]  # a job's bus form, as REPLJOB and YOURJOBS carry it (read-only)

_U64 = 2**64 - 1  # msgpack's largest integer


class DecodeError(ValueError):
    """A frame body or a serialized job is malformed."""



# --- checks: validate a decoded value and return it normalised ---------------

_Check = Callable[[Any], Any]


def _int_in(lo: int, hi: int) -> _Check:
    def check(v: Any) -> int:
        # msgpack yields plain ints and bools; IntEnums such as State come from
        # dicts made by this module.  A bool is never a valid integer field.
        if not isinstance(v, int) or isinstance(v, bool):
            raise DecodeError(f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise DecodeError(f"{v} is not in [{lo}, {hi}]")
        return v

    return check


def _of_type(t: type) -> _Check:
    def check(v: Any) -> Any:
        if type(v) is not t:
            raise DecodeError(f"expected {t.__name__}, got {type(v).__name__}")
        return v

    return check


_bytes = _of_type(bytes)
_bool = _of_type(bool)
_str = _of_type(str)


def _opt_bytes(v: Any) -> bytes | None:
    return None if v is None else _bytes(v)



def _job_id(v: Any) -> bytes:
    if type(v) is not bytes or not valid_id(v):
        raise DecodeError("invalid job ID" if type(v) is bytes else f"expected bytes, got {type(v).__name__}")
    return v


def _opt_job_id(v: Any) -> bytes:
    return v if v == b"" else _job_id(v)



_is_node_id = re.compile("[0-9a-f]{40}").fullmatch


def _node_id(v: Any) -> str:
    if type(v) is not str or not _is_node_id(v):
        raise DecodeError("invalid node ID" if type(v) is str else f"expected str, got {type(v).__name__}")
    return v



def _list_of(check: _Check, min_len: int = 0) -> _Check:
    """A msgpack array (or a tuple, in a dict made by this module) -> tuple."""

    def load(v: Any) -> tuple[Any, ...]:
        if type(v) not in (list, tuple):
            raise DecodeError(f"expected an array, got {type(v).__name__}")
        if len(v) < min_len:
            raise DecodeError(f"expected at least {min_len} item(s)")
        out = []
        for i, item in enumerate(v):
            try:
                out.append(check(item))
            except DecodeError as e:
                raise DecodeError(f"item {i}: {e}") from None
        return tuple(out)

    return load


_PORT = _int_in(0, 65535)
_BITS = _int_in(0, 2**32 - 1)  # node flags and mflags: unknown bits are harmless
_UINT = _int_in(0, _U64)
_FLAG_BYTE = _int_in(0, 255)
_STATE_CODE = _int_in(min(State), max(State))
_node_ids = _list_of(_node_id)


_STATES = {s.value: s for s in State}


def _job_state(v: Any) -> State:
    return _STATES[_STATE_CODE(v)]



def _job_flags(v: Any) -> int:
    return _FLAG_BYTE(v) & WIRE_FLAGS



_are_node_ids = re.compile("[0-9a-f]{40}(?:,[0-9a-f]{40})*").fullmatch


# Checked lists of delivery nodes, by their items: the jobs of a cluster come
# with few distinct lists, so most are checked once, and the jobs that came
# with the same list share one tuple (memory).  Emptied when full, so that
# a peer sending ever new lists cannot grow it.
_delivered: dict[tuple[Any, ...], tuple[str, ...]] = {}
_DELIVERED_MAX = 4096


def _nodes_delivered(v: Any) -> tuple[str, ...]:
    if type(v) in (list, tuple):
        try:
            return _delivered[tuple(v)]
        except (KeyError, TypeError):  # new, or an item is not hashable
            pass
    try:
        common = type(v) is list and _are_node_ids(",".join(v))  # the common case, in one match
    except TypeError:  # not all strings
        common = None
    checked = tuple(dict.fromkeys(v if common else _node_ids(v)))  # a set: drop duplicates, keep order
    if len(_delivered) >= _DELIVERED_MAX:
        _delivered.clear()
    _delivered[tuple(v)] = checked
    return checked


# --- records: field tables, one pack and one load -----------------------------


@dataclass(frozen=True, slots=True)
class _Field:
    name: str  # attribute / dict key on our side
    key: str  # short key in the msgpack map
    check: _Check  # decoded value -> validated value
    dump: Callable[[Any], Any] | None = None  # our value -> msgpack-ready value (None: as it is)
    default: Any = None  # not None: the field may be left out, and is when it has this value
    pos: tuple[_Check, Callable[[Any], Any]] | None = None  # (check, dump) of the positional form, when it differs


_Fields = tuple[_Field, ...]
_MISSING = object()


class _Missing(DecodeError):
    """A required key is absent (its message is the whole error)."""


def _load_map(fields: tuple[tuple[str, str, _Check, Any], ...], o: Any) -> dict[str, Any]:
    """The check of map `o`: `fields` are (name, key, check, default)."""
    if type(o) is not dict:
        raise DecodeError(f"expected a map, got {type(o).__name__}")
    out: dict[str, Any] = {}
    key = ""
    try:
        for name, key, check, default in fields:
            v = o.get(key, _MISSING)
            if v is not _MISSING:
                out[name] = check(v)
            elif default is not None:
                out[name] = default
            else:
                raise _Missing(f"missing field {key!r}")
    except _Missing:
        raise
    except DecodeError as e:
        raise DecodeError(f"field {key!r}: {e}") from None
    return out


def _loader(fields: _Fields, *, named: bool = False) -> Callable[[Any], dict[str, Any]]:
    """The check of map `o` (short keys, or our names when `named`) ->
    {name: value}; a field with a default may be left out."""
    table = tuple((f.name, f.name if named else f.key, f.check, f.default) for f in fields)
    return partial(_load_map, table)


def _load_array(fields: tuple[tuple[str, _Check, Any], ...], required: int, offset: int, o: Any) -> dict[str, Any]:
    """The check of array `o`: its items from `offset` on are `fields`,
    (name, check, default); the fields after the first `required` may be
    missing and take their defaults."""
    if type(o) is not list:
        raise DecodeError(f"expected an array, got {type(o).__name__}")
    end = len(o)
    if end < offset + required:
        raise DecodeError(f"missing field {fields[max(end - offset, 0)][0]!r}")
    out: dict[str, Any] = {}
    name = ""
    try:
        for name, check, default in fields:
            out[name] = check(o[offset]) if offset < end else default
            offset += 1
    except DecodeError as e:
        raise DecodeError(f"field {name!r}: {e}") from None
    return out


def _pos_loader(fields: _Fields, offset: int = 0) -> Callable[[Any], dict[str, Any]]:
    """`_loader` for the positional form: the check of array `o`, whose
    items from `offset` on are the fields in table order (more items are
    ignored, as unknown keys are; the optional fields that end the table
    may be missing, and take their defaults, as missing keys do: a node
    of an older version sends a row without the fields added to it since)."""
    required = len(fields)  # the optional fields that end the table follow these
    while required and fields[required - 1].default is not None:
        required -= 1
    table = tuple((f.name, f.check if f.pos is None else f.pos[0], f.default) for f in fields)
    return partial(_load_array, table, required, offset)


def _pack_map(fields: tuple[tuple[str, str, Any, Any], ...], items: bool, o: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key, dump, default in fields:
        v = o[name] if items else getattr(o, name)
        if default is None or v != default:
            out[key] = v if dump is None else dump(v)
    return out


def _packer(fields: _Fields, *, items: bool = False) -> Callable[[Any], dict[str, Any]]:
    """Our object (attributes, or a dict with our names when `items`) -> the
    map of short keys; a field equal to its default is left out."""
    return partial(_pack_map, tuple((f.name, f.key, f.dump, f.default) for f in fields), items)


def _pack_array(fields: tuple[tuple[str, Any], ...], items: bool, o: Any, head: tuple[Any, ...] = ()) -> list[Any]:
    out = list(head)
    for name, dump in fields:
        v = o[name] if items else getattr(o, name)
        out.append(v if dump is None else dump(v))
    return out


def _pos_packer(fields: _Fields, *, items: bool = False) -> Callable[..., list[Any]]:
    """`_packer` for the positional form: `pack(o, head)` -> [*head, field, ...],
    every field present."""
    return partial(_pack_array, tuple((f.name, f.dump if f.pos is None else f.pos[1]) for f in fields), items)


def _record(fields: _Fields, build: Callable[..., Any]) -> _Check:
    load = _loader(fields)
    return lambda m: build(**load(m))


def _pos_record(fields: _Fields, build: Callable[..., Any]) -> _Check:
    load = _pos_loader(fields)
    return lambda a: build(**load(a))


def _each(dump: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    return lambda items: [dump(item) for item in items]


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


_VERSION = (_Field("v", "v", _int_in(-(2**63), _U64)),)  # any msgpack integer


_load_version = _loader(_VERSION)


def _version(m: dict[Any, Any]) -> int:
    return _load_version(m)["v"]


# --- jobs ---------------------------------------------------------------------

# The fields both forms share; the names are those of Job's constructor, the
# keys of `Job.fields`.
_JOB_COMMON: _Fields = (
    _Field("id", "i", _job_id),
    _Field("state", "s", _job_state),
    _Field("flags", "f", _job_flags),
    _Field("repl", "r", _int_in(1, 65535)),
    _Field("ctime", "c", _UINT),
    _Field("delay", "d", _UINT),
    _Field("retry", "rt", _UINT),
    _Field("nacks", "na", _UINT),
    _Field("deliv", "dv", _UINT),
    _Field("queue", "q", _opt_bytes),
    _Field("body", "b", _opt_bytes),
    _Field("nodes_delivered", "nd", _nodes_delivered),
    # MAXATTEMPTS / DEADLETTER and dead-lettered copies: left out when unset.
    _Field("max_attempts", "ma", _int_in(0, 65535), default=0),
    _Field("dead_letter", "dl", _bytes, default=b""),
    _Field("origin", "o", _opt_job_id, default=b""),
)
# PRIORITY, left out at its default; after the other fields, so that the
# positional form of an older node (which has none) still decodes (`_pos_loader`).
_PRIORITY = _Field("priority", "pr", _int_in(0, MAX_PRIORITY), default=DEFAULT_PRIORITY)
_WIRE_JOB: _Fields = _JOB_COMMON + (_Field("ttl", "tl", _int_in(1, _U64)), _Field("etime", "et", _UINT), _PRIORITY)
# `not_before`: the core-clock ms before which a NACK ... DELAY job is not queued again (0: none).
_STORED_JOB: _Fields = _JOB_COMMON + (
    _Field("etime", "et", _UINT), _Field("not_before", "nb", _UINT, default=0), _PRIORITY
)
_wire_job = _loader(_WIRE_JOB)  # checks the job of REPLJOB / YOURJOBS (a dict with our names)
_dump_wire_job = _packer(_WIRE_JOB, items=True)
_wire_job_pos, _dump_wire_job_pos = _pos_loader(_WIRE_JOB), _pos_packer(_WIRE_JOB, items=True)
_load_stored_job, _load_stored_map = _loader(_STORED_JOB, named=True), _loader(_STORED_JOB)
_pack_stored_job = _packer(_STORED_JOB, items=True)


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
               f["origin"], f["priority"])  # fmt: skip


def job_to_storage(job: Job) -> dict[str, Any]:
    """Storage form: absolute etime, state and flags kept (IN_LIST masked),
    and the pending requeue time of a NACK ... DELAY as `not_before`."""
    d = job.fields(WIRE_FLAGS)
    d["etime"] = job.etime
    d["not_before"] = job.qtime if job.flags & NACKED else 0
    d["priority"] = job.priority
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
    return _stored_job(_load_stored_job(d))


def encode_storage(job: Job) -> bytes:
    """The AOF LOADJOB payload: the storage form as a versioned msgpack map."""
    m = _pack_stored_job(job_to_storage(job))
    m["v"] = STORAGE_VERSION
    return msgpack.packb(m, use_bin_type=True)


def decode_storage(data: bytes) -> Job:
    """Inverse of encode_storage; raises DecodeError on anything malformed."""
    m = _unpack_map(data)
    if _version(m) != STORAGE_VERSION:
        raise DecodeError(f"unknown storage version {m['v']}")
    return _stored_job(_load_stored_map(m))
