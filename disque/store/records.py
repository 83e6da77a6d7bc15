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
from dataclasses import dataclass, field
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

    check.fast = f"v if type(v) is int and {lo} <= v <= {hi} else "  # type: ignore[attr-defined]  # see _loader
    return check


def _of_type(t: type) -> _Check:
    def check(v: Any) -> Any:
        if type(v) is not t:
            raise DecodeError(f"expected {t.__name__}, got {type(v).__name__}")
        return v

    check.fast = f"v if type(v) is {t.__name__} else "  # type: ignore[attr-defined]
    return check


_bytes = _of_type(bytes)
_bool = _of_type(bool)
_str = _of_type(str)


def _opt_bytes(v: Any) -> bytes | None:
    return None if v is None else _bytes(v)


_opt_bytes.fast = "v if v is None or type(v) is bytes else "  # type: ignore[attr-defined]


def _job_id(v: Any) -> bytes:
    if type(v) is not bytes or not valid_id(v):
        raise DecodeError("invalid job ID" if type(v) is bytes else f"expected bytes, got {type(v).__name__}")
    return v


def _opt_job_id(v: Any) -> bytes:
    return v if v == b"" else _job_id(v)


_job_id.fast = "v if type(v) is bytes and valid_id(v) else "  # type: ignore[attr-defined]
_opt_job_id.fast = 'v if v == b"" or type(v) is bytes and valid_id(v) else '  # type: ignore[attr-defined]


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


_job_state.fast = "_STATES[v] if type(v) is int and v in _STATES else "  # type: ignore[attr-defined]


def _job_flags(v: Any) -> int:
    return _FLAG_BYTE(v) & WIRE_FLAGS


_job_flags.fast = f"v & {WIRE_FLAGS} if type(v) is int and 0 <= v <= 255 else "  # type: ignore[attr-defined]


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
    """A required key is absent (raised and caught inside one loader)."""


def _compile(name: str, lines: list[str], names: dict[str, Any]) -> Callable[..., Any]:
    scope: dict[str, Any] = {}
    exec("\n".join(lines), names, scope)  # noqa: S102 - source built from the field tables only
    return scope[name]  # type: ignore[no-any-return]


def _load_function(fields: _Fields, kind: type, reads: Callable[[int, _Field], list[str]], missing: str,
                   names: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:  # fmt: skip
    """The generated check both forms share: `o` must be a `kind`, `reads`
    gives the lines that set x<i> (and `k`, the field's name for errors)
    from it, and `missing` is what a field left out raises."""
    names |= {"DecodeError": DecodeError, "_STATES": _STATES, "valid_id": valid_id}
    word = "a map" if kind is dict else "an array"
    lines = [
        "def load(o):",
        f"    if type(o) is not {kind.__name__}:",
        f"        raise DecodeError(f'expected {word}, got {{type(o).__name__}}')",
        "    try:",
    ]
    for i, f in enumerate(fields):
        lines += reads(i, f)
    lines += [
        f"    except {missing}:",
        "        raise DecodeError(f'missing field {k!r}') from None",
        "    except DecodeError as e:",
        "        raise DecodeError(f'field {k!r}: {e}') from None",
        "    return {" + ", ".join(f"{f.name!r}: x{i}" for i, f in enumerate(fields)) + "}",
    ]
    return _compile("load", lines, names)


def _loader(fields: _Fields, *, named: bool = False) -> Callable[[Any], dict[str, Any]]:
    """The check of map `o` (short keys, or our names when `named`) ->
    {name: value}, generated from the table as dataclasses generate their
    methods: one function, no loop, and the common case of each check (a
    plain int in range, a value of the exact type) inline, the check itself
    called only for anything else (which it normalises or refuses)."""
    names: dict[str, Any] = {"_MISSING": _MISSING, "_Missing": _Missing}

    def reads(i: int, f: _Field) -> list[str]:
        names[f"c{i}"], names[f"d{i}"] = f.check, f.default
        check = f"{getattr(f.check, 'fast', '')}c{i}(v)"
        lines = [f"        k = {(f.name if named else f.key)!r}", "        v = o.get(k, _MISSING)"]
        if f.default is None:
            return [*lines, "        if v is _MISSING:", "            raise _Missing", f"        x{i} = {check}"]
        return [*lines, f"        x{i} = d{i} if v is _MISSING else {check}"]

    return _load_function(fields, dict, reads, "_Missing", names)


def _packer(fields: _Fields, *, items: bool = False) -> Callable[[Any], dict[str, Any]]:
    """Our object (attributes, or a dict with our names when `items`) -> the
    map of short keys; a field equal to its default is left out."""
    names: dict[str, Any] = {}
    lines = ["def pack(o):", "    out = {}"]
    for i, f in enumerate(fields):
        names[f"u{i}"], names[f"d{i}"] = f.dump, f.default
        get = f"o[{f.name!r}]" if items else f"o.{f.name}"
        value = get if f.dump is None else f"u{i}({get})"
        if f.default is None:
            lines.append(f"    out[{f.key!r}] = {value}")
        else:
            lines += [f"    if {get} != d{i}:", f"        out[{f.key!r}] = {value}"]
    lines.append("    return out")
    return _compile("pack", lines, names)


def _pos_loader(fields: _Fields, offset: int = 0) -> Callable[[Any], dict[str, Any]]:
    """`_loader` for the positional form: the check of array `o`, whose
    items from `offset` on are the fields in table order (more items are
    ignored, as unknown keys are; a field with a default missing at the end
    takes it: an older sender's table ended before it)."""
    names: dict[str, Any] = {}

    def reads(i: int, f: _Field) -> list[str]:
        check = names[f"c{i}"] = f.check if f.pos is None else f.pos[0]
        names[f"d{i}"] = f.default
        value = f"{getattr(check, 'fast', '')}c{i}(v)"
        lines = [f"        k = {f.name!r}"]
        if f.default is None:
            return [*lines, f"        v = o[{offset + i}]", f"        x{i} = {value}"]
        return [*lines, f"        if len(o) <= {offset + i}:", f"            x{i} = d{i}", "        else:",
                f"            v = o[{offset + i}]", f"            x{i} = {value}"]  # fmt: skip

    return _load_function(fields, list, reads, "IndexError", names)


def _pos_packer(fields: _Fields, *, items: bool = False) -> Callable[..., list[Any]]:
    """`_packer` for the positional form: `pack(o, head)` -> [*head, field, ...],
    every field present."""
    names: dict[str, Any] = {}
    values = []
    for i, f in enumerate(fields):
        dump = f.dump if f.pos is None else f.pos[1]
        names[f"u{i}"] = dump
        get = f"o[{f.name!r}]" if items else f"o.{f.name}"
        values.append(get if dump is None else f"u{i}({get})")
    return _compile("pack", ["def pack(o, head=()):", f"    return [*head, {', '.join(values)}]"], names)


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
