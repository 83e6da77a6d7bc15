"""The one msgpack codec: bus frames and the two serialized forms of a job.

Theory of operation: a frame is a 4-byte big-endian body length followed by
the body, a msgpack map (spec/cluster.md §2.1):

    {"v": 1, "t": "<TYPE>", "s": sender, "p": client port, "f": node flags,
     "m": mflags, ...short keys of the message's fields...}

Framing and body encoding are separate layers: `encode_body`/`decode_body`
turn a (Header, message) pair into a body and back, and `encode_frame` /
`FrameDecoder` only add and strip the length prefix, so a per-link MAC and
sequence number can later wrap each body without touching either side.

Everything is table-driven: a `_Field` names an attribute, its short key, a
check that validates and normalises a decoded value, and a dump that makes the
value msgpack-ready.  `_KINDS` holds one row per message type; gossip entries
and jobs are described by the same kind of field tuples, and one generic pack
and one generic load serve them all.

Incoming frames are validated strictly: the core never sees an ill-typed or
out-of-range field.  Bytes stay bytes (msgpack bin) and text stays str, so
queue names and bodies are binary-safe.  A frame of an unknown version is
skipped; anything else that is wrong raises `FrameError` and the caller drops
the link (house rule 5).  Malformed serialized jobs raise
`DecodeError` (a ValueError).

Jobs have two forms with the same fields (spec/cluster.md §8.1, spec/persistence.md §4):
the bus form (`job_to_wire`, a relative `ttl`, DELIVERED cleared) carried by
REPLJOB and YOURJOBS, and the storage form (`job_to_storage`, absolute
`etime`, state and flags kept) written to the AOF as `encode_storage` bytes.
Neither carries `gc_retry` nor the local IN_LIST flag.

Callers: the trio bus (`encode_frame`, `FrameDecoder`), the core when it sends
or receives jobs (`job_to_wire`, `job_from_wire`), and the AOF
(`encode_storage`, `decode_storage`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from disque.cluster.messages import (
    Claim, Claimed, DelJob, Enqueue, Fail, Fanout, GossipEntry, GotAck, GotJob, GotJobs, GroupAck, GroupFlush, GroupSet,
    Header, Meet, Message, NeedEvent, NeedJobs, NewEvent, Pause, Ping, Pong, Queued, ReplJob, ReplJobs, SetAck, WaitEntry,
    Waiting, WillQueue, WireJob, Working, YourEvent, YourJobs,
)  # fmt: skip
from disque.core.ids import valid_id
from disque.store.job import DELIVERED, NACKED, WIRE_FLAGS, Job, State

VERSION = 1  # frame body version ("v")
STORAGE_VERSION = 1  # storage form version ("v")

# Largest accepted frame body: a 64 MiB job body plus 1 MiB for the envelope
# and the other job fields.  A YOURJOBS batch must stay under it as well.
MAX_FRAME = (64 << 20) + (1 << 20)

# mflags bits.
NOREPLY = 1
INCR_NACKS = 2
INCR_DELIV = 4
JOINED = 8
GRANTED = 16
UNKNOWN = 32

_PREFIX = 4  # length prefix size
_U64 = 2**64 - 1  # msgpack's largest integer


class DecodeError(ValueError):
    """A frame body or a serialized job is malformed."""


class FrameError(DecodeError):
    """The peer sent something unusable: the link must be dropped."""

    @property
    def reason(self) -> str:
        return self.args[0]


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


def _fanout_child(v: Any) -> bytes:
    parent, plus, child = _bytes(v).partition(b"+")
    if not (parent and plus and child):
        raise DecodeError("not a fanout child name (parent+child)")
    return v


def _ip(v: Any) -> str:
    try:
        ipaddress.ip_address(_str(v))
    except ValueError:
        raise DecodeError("invalid IP address") from None
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
    ignored, as unknown keys are)."""
    names: dict[str, Any] = {}

    def reads(i: int, f: _Field) -> list[str]:
        check = names[f"c{i}"] = f.check if f.pos is None else f.pos[0]
        return [f"        k = {f.name!r}", f"        v = o[{offset + i}]", f"        x{i} = {getattr(check, 'fast', '')}c{i}(v)"]

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
_WIRE_JOB: _Fields = _JOB_COMMON + (_Field("ttl", "tl", _int_in(1, _U64)), _Field("etime", "et", _UINT))
# `not_before`: the core-clock ms before which a NACK ... DELAY job is not queued again (0: none).
_STORED_JOB: _Fields = _JOB_COMMON + (_Field("etime", "et", _UINT), _Field("not_before", "nb", _UINT, default=0))
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
               f["origin"])  # fmt: skip


def job_to_storage(job: Job) -> dict[str, Any]:
    """Storage form: absolute etime, state and flags kept (IN_LIST masked),
    and the pending requeue time of a NACK ... DELAY as `not_before`."""
    d = job.fields(WIRE_FLAGS)
    d["etime"] = job.etime
    d["not_before"] = job.qtime if job.flags & NACKED else 0
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


# --- messages -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Kind:
    code: int  # its number in the positional form (its row in _KINDS, from 1)
    name: str  # wire type name
    cls: type
    fields: _Fields = ()
    mflags: tuple[tuple[str, int], ...] = ()  # boolean attribute -> mflags bit
    pack: Callable[[Any], dict[str, Any]] = field(init=False)
    load: Callable[[Any], dict[str, Any]] = field(init=False)  # with the mflags
    pack_pos: Callable[..., list[Any]] = field(init=False)  # (message, head) -> [*head, field, ...]
    load_pos: Callable[[Any], dict[str, Any]] = field(init=False)  # [code, mflags, field, ...] -> with the mflags

    def __post_init__(self) -> None:
        object.__setattr__(self, "pack", _packer(self.fields))
        object.__setattr__(self, "load", _loader(self.fields + (_MFLAGS,)))
        object.__setattr__(self, "pack_pos", _pos_packer(self.fields))
        object.__setattr__(self, "load_pos", _pos_loader((_MFLAGS, *self.fields), offset=1))

    def mflags_of(self, msg: Message) -> int:
        return sum(bit for attr, bit in self.mflags if getattr(msg, attr))


_ENVELOPE: _Fields = (
    _Field("sender", "s", _node_id),
    _Field("port", "p", _PORT),
    _Field("flags", "f", _BITS),
)
_MFLAGS = _Field("mflags", "m", _BITS)
_pack_envelope, _load_envelope = _packer(_ENVELOPE), _loader(_ENVELOPE)
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack

_GOSSIP_ENTRY: _Fields = (
    _Field("node_id", "n", _node_id),
    _Field("ip", "i", _ip),
    _Field("port", "p", _PORT),
    _Field("flags", "f", _BITS),
)
_GOSSIP = _Field(
    "gossip", "g", _list_of(_record(_GOSSIP_ENTRY, GossipEntry)), _each(_packer(_GOSSIP_ENTRY)),
    pos=(_list_of(_pos_record(_GOSSIP_ENTRY, GossipEntry)), _each(_pos_packer(_GOSSIP_ENTRY))),
)
_ID = _Field("id", "i", _job_id)
_JOBS = _Field("jobs", "j", _list_of(_wire_job, 1), _each(_dump_wire_job),
               pos=(_list_of(_wire_job_pos, 1), _each(_dump_wire_job_pos)))  # fmt: skip
_OPT_ID = _Field("id", "i", _opt_job_id, default=b"")
_QUEUE = _Field("queue", "q", _bytes)
_GROUP = _Field("group", "g", _bytes)
_TICKET = _Field("ticket", "k", _UINT)
_WAIT_ENTRY: _Fields = (_QUEUE, _Field("count", "c", _UINT))
_WAIT_ENTRIES = _Field(
    "entries", "e", _list_of(_record(_WAIT_ENTRY, WaitEntry), 1), _each(_packer(_WAIT_ENTRY)),
    pos=(_list_of(_pos_record(_WAIT_ENTRY, WaitEntry), 1), _each(_pos_packer(_WAIT_ENTRY))),
)

# One row per message type: (name, class, fields, mflags).  Short keys must
# not reuse the envelope keys v, t, s, p, f, m, pv; the positional code of a
# type is its row number (from 1): new types go at the end.
_ROWS: tuple[tuple[Any, ...], ...] = (
    ("PING", Ping, (_GOSSIP,)),
    ("PONG", Pong, (_GOSSIP,)),
    ("MEET", Meet, (_GOSSIP,)),
    ("FAIL", Fail, (_Field("node", "n", _node_id),)),
    ("REPLJOB", ReplJob, (_Field("job", "j", _wire_job, _dump_wire_job, pos=(_wire_job_pos, _dump_wire_job_pos)),), (("noreply", NOREPLY),)),
    ("GOTJOB", GotJob, (_ID,)),
    ("ENQUEUE", Enqueue, (_ID, _Field("delay", "d", _UINT))),
    ("QUEUED", Queued, (_ID, _Field("delay", "d", _UINT, default=0)), (("incr_nacks", INCR_NACKS), ("incr_deliv", INCR_DELIV))),
    ("WORKING", Working, (_ID,)),
    ("WILLQUEUE", WillQueue, (_ID,)),
    ("SETACK", SetAck, (_ID, _Field("mayhave", "h", _UINT))),
    ("GOTACK", GotAck, (_ID, _Field("known", "k", _bool))),
    ("DELJOB", DelJob, (_ID, _Field("acked", "ak", _bool, default=True))),
    ("NEEDJOBS", NeedJobs, (_QUEUE, _Field("count", "c", _UINT))),
    ("YOURJOBS", YourJobs, (_JOBS,)),
    ("PAUSE", Pause, (_QUEUE, _Field("flags", "pf", _int_in(0, 3)))),
    ("FANOUT", Fanout, (_Field("child", "c", _fanout_child),), (("joined", JOINED),)),
    ("GROUPSET", GroupSet, (_ID, _GROUP, _Field("deadline", "d", _UINT))),
    ("CLAIM", Claim, (_ID, _GROUP, _Field("deadline", "d", _UINT), _TICKET)),
    ("GROUPACK", GroupAck, (_ID, _GROUP, _TICKET)),
    ("CLAIMED", Claimed, (_TICKET, _OPT_ID), (("granted", GRANTED), ("unknown", UNKNOWN))),
    ("NEEDEVENT", NeedEvent, (_QUEUE, _GROUP, _Field("deadline", "d", _UINT), _TICKET)),
    ("YOUREVENT", YourEvent, (_TICKET, _ID, _Field("body", "b", _bytes))),
    ("NEWEVENT", NewEvent, (_QUEUE,)),
    ("GROUPFLUSH", GroupFlush, (_QUEUE,)),
    ("GOTJOBS", GotJobs, (_Field("ids", "i", _list_of(_job_id, 1)),)),
    ("REPLJOBS", ReplJobs, (_JOBS,), (("noreply", NOREPLY),)),
    ("WAITING", Waiting, (_WAIT_ENTRIES,)),
)
_KINDS = tuple(_Kind(code, *row) for code, row in enumerate(_ROWS, 1))
_BY_NAME = {k.name: k for k in _KINDS}
_BY_CLASS = {k.cls: k for k in _KINDS}
_BY_CODE = {k.code: k for k in _KINDS}


def _map_of(header: Header, msg: Message) -> dict[str, Any]:
    kind = _BY_CLASS[type(msg)]
    m = {"v": VERSION, "t": kind.name, "m": kind.mflags_of(msg)}
    m |= _pack_envelope(header)
    m |= kind.pack(msg)
    return m


def encode_body(header: Header, msg: Message) -> bytes:
    """The map form of a frame body (the form every link starts with)."""
    return _packb(_map_of(header, msg))


def _message(kind: _Kind, fields: dict[str, Any]) -> Message:
    mflags = fields.pop("mflags")
    for attr, bit in kind.mflags:
        fields[attr] = bool(mflags & bit)
    return kind.cls(**fields)  # type: ignore[no-any-return]


def _from_map(m: dict[Any, Any]) -> tuple[Header, Message] | None:
    if _version(m) != VERSION:
        return None
    name = m.get("t")
    kind = _BY_NAME.get(name) if type(name) is str else None
    if kind is None:
        raise DecodeError(f"unknown message type {name[:40]!r}" if type(name) is str else "ill-typed type 't'")
    return Header(**_load_envelope(m)), _message(kind, kind.load(m))


def decode_body(body: bytes) -> tuple[Header, Message] | None:
    """Decode one map-form frame body; None for a frame of an unknown version.

    Raises FrameError for anything else that is wrong, including a malformed
    field of a known message type: the link is dropped rather than the frame
    ignored, since a peer that sends one bad frame cannot be trusted with the
    next.  Unknown extra keys are ignored.
    """
    try:
        return _from_map(_unpack_map(body))
    except DecodeError as e:
        raise FrameError(str(e)) from None


# --- the positional form of one link ---------------------------------------------

# The positional form this node reads, told in the "pv" key of its map bodies
# (2: with GOTJOBS and REPLJOBS; a node that says another number gets maps).
POSITIONAL = 2
_load_pos_header = _pos_loader(_ENVELOPE, offset=1)
_last: list[Any] = [None, b""]  # the last message encoded without a header and its body: a broadcast packs once


class LinkCodec:
    """The frame bodies of one link, both directions.

    A link starts in the map form, each body carrying "pv": the positional
    form this node reads.  Once the peer is known to read it too (its map
    bodies carry the same "pv", or it sent a positional body), bodies are
    msgpack arrays, fields in table order (jobs and gossip entries arrays
    too, optional fields always present):

        [code, mflags, field, ...]                    a message (code: its row in _KINDS)
        [0, sender, port, flags, code, mflags, ...]   the same, after a new header

    The header goes only when it differs from the last one sent on the link;
    the receiver keeps the last one it got.  A peer that never says "pv" (an
    older node) gets map bodies only."""

    __slots__ = ("positional", "_sent", "_header")

    def __init__(self) -> None:
        self.positional = False  # the peer reads the positional form
        self._sent: Header | None = None
        self._header: Header | None = None

    def encode(self, header: Header, msg: Message) -> bytes:
        if not self.positional:
            m = _map_of(header, msg)
            m["pv"] = POSITIONAL
            return _packb(m)
        kind = _BY_CLASS[type(msg)]
        if header is self._sent or header == self._sent:
            if msg is _last[0]:
                return _last[1]  # the same message, sent on another link: the same body
            body = _packb(kind.pack_pos(msg, (kind.code, kind.mflags_of(msg))))
            _last[:] = msg, body
            return body
        self._sent = header
        return _packb(kind.pack_pos(msg, (0, header.sender, header.port, header.flags, kind.code, kind.mflags_of(msg))))

    def decode(self, body: bytes) -> tuple[Header, Message] | None:
        """decode_body for either form; None for a map of an unknown version."""
        try:
            o = _unpack(body)
            if type(o) is dict:
                decoded = _from_map(o)
                if decoded is not None and o.get("pv") == POSITIONAL:
                    self.positional = True
                return decoded
            if type(o) is not list or not o:
                raise DecodeError(f"expected a map or an array, got {type(o).__name__ if o != [] else 'an empty array'}")
            code = o[0]
            if code == 0 and type(code) is int:
                self._header = Header(**_load_pos_header(o))
                o = o[4:]
                code = o[0] if o else None
            if self._header is None:
                raise DecodeError("a positional body before any header")
            kind = _BY_CODE.get(code) if type(code) is int else None
            if kind is None:
                raise DecodeError(f"unknown message code {code!r:.40}")
            self.positional = True
            return self._header, _message(kind, kind.load_pos(o))
        except DecodeError as e:
            raise FrameError(str(e)) from None


# --- framing ------------------------------------------------------------------


def framed(body: bytes) -> bytes:
    return len(body).to_bytes(_PREFIX, "big") + body


def encode_frame(header: Header, msg: Message) -> bytes:
    return framed(encode_body(header, msg))


class FrameDecoder:
    """Turns the byte stream of one link into (Header, message) pairs.

    `feed()` whatever arrives, then call `next_frame()` until it returns None
    (more data needed).  A length prefix over `max_frame` raises FrameError as
    soon as the prefix is seen, before any of the body is buffered.  After a
    FrameError the stream cannot be resynchronised: drop the link.
    """

    __slots__ = ("max_frame", "codec", "_buf")

    def __init__(self, max_frame: int = MAX_FRAME, codec: LinkCodec | None = None) -> None:
        self.max_frame = max_frame
        self.codec = LinkCodec() if codec is None else codec
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_frame(self) -> tuple[Header, Message] | None:
        while (body := self._next_body()) is not None:
            decoded = self.codec.decode(body)
            if decoded is not None:  # None: unknown version, skipped
                return decoded
        return None

    def _next_body(self) -> bytes | None:
        buf = self._buf
        if len(buf) < _PREFIX:
            return None
        size = int.from_bytes(buf[:_PREFIX], "big")
        if size > self.max_frame:
            raise FrameError(f"frame of {size} bytes exceeds the {self.max_frame} byte limit")
        end = _PREFIX + size
        if len(buf) < end:
            return None
        body = bytes(buf[_PREFIX:end])
        del buf[:end]  # O(1) for a bytearray: it only moves its start
        return body
