"""The bus codec: frames of msgpack messages (spec/cluster.md §2.1).

Theory of operation: a frame is a 4-byte big-endian body length followed by
the body, a msgpack map:

    {"v": 1, "t": "<TYPE>", "s": sender, "p": client port, "f": node flags,
     "m": mflags, ...short keys of the message's fields...}

Framing and body encoding are separate layers: `encode_body`/`decode_body`
turn a (Header, message) pair into a body and back, and `encode_frame` /
`FrameDecoder` only add and strip the length prefix, so a per-link MAC and
sequence number can later wrap each body without touching either side.

Everything is table-driven, with the field tables of store/records.py (a
`_Field` names an attribute, its short key, a check and a dump): `_KINDS`
holds one row per message type; gossip entries and the jobs of REPLJOB and
YOURJOBS (their bus form, store/records.py) are described by the same kind
of field tuples, and one generic pack and one generic load serve them all.

Incoming frames are validated strictly: the core never sees an ill-typed or
out-of-range field.  Bytes stay bytes (msgpack bin) and text stays str, so
queue names and bodies are binary-safe.  A frame of an unknown version is
skipped; anything else that is wrong raises `FrameError` and the caller drops
the link (house rule 5).  A record a message carries whole (SCHEDSET's
schedule) is bytes here: the core checks it and drops a bad one alone, so a
record sent again on every new link never cuts a node off.

Callers: the trio bus (`encode_frame`, `FrameDecoder`, `LinkCodec`).
"""
from __future__ import annotations

import ipaddress
import struct
from typing import Any, Final

import msgpack

from disque.cluster.messages import (
    Claim, Claimed, DelJob, Enqueue, Fail, Fanout, GossipEntry, GotAck, GotJob, GotJobs, GroupAck, GroupFlush, GroupSet,
    Header, Meet, Message, NeedEvent, NeedJobs, NewEvent, Pause, Ping, Pong, Queued, ReplJob, ReplJobs, SetAck, WaitEntry,
    Waiting, WillQueue, Working, YourEvent, YourJobs, SchedSet, Ticked, KeyClaim, KeyClaimed, KeySet, KeyDone, QSet, LimitAsk,
    LimitGrant, Depend, Settled, BatchSet, valid_zone,
)  # fmt: skip
from disque.store.records import (  # the pieces of the field tables
    _BITS, _FAILURE, _PORT, _UINT, Check, DecodeError, _ArrayLoader, _ArrayPacker, _bool, _bytes, _dump_wire_job, _Each, _Field,
    _Fields, _IntIn, _job_id, _Key, _ListOf, _MapLoader, _MapPacker, _node_id, _node_ids, _opt_job_id, _Record, _str, _unpack,
    _unpack_map, _version, _wire_job, _wire_job_pos, _dump_wire_job_pos,
)  # fmt: skip
from disque.store.results import problem as result_problem

VERSION: Final = 1  # frame body version ("v")

# Largest accepted frame body: a 64 MiB job body plus 1 MiB for the envelope
# and the other job fields.  A YOURJOBS batch must stay under it as well.
FRAME_SLACK: Final = 1 << 20  # a job's frame beside its body: its other fields, the header
MAX_FRAME: Final = (64 << 20) + FRAME_SLACK


def frame_limit(max_job_size: int) -> int:
    """The largest frame a link takes: one carrying a job of `max-job-size`
    (never below the default's, so a smaller setting refuses no peer's frame)."""
    return max(MAX_FRAME, max_job_size + FRAME_SLACK)


# mflags bits.
NOREPLY: Final = 1
INCR_NACKS: Final = 2
INCR_DELIV: Final = 4
JOINED: Final = 8
GRANTED: Final = 16
UNKNOWN: Final = 32
PUSHED: Final = 64

_PREFIX: Final = 4  # length prefix size
_LENGTH: Final = struct.Struct(">I")  # the length prefix


class FrameError(DecodeError):
    """The peer sent something unusable: the link must be dropped."""

    @property
    def reason(self) -> str:
        return self.args[0]


class _FanoutChild(Check):
    def check(self, v: Any) -> Any:
        parent, plus, child = _bytes.check(v).partition(b"+")
        if not (parent and plus and child):
            raise DecodeError("not a fanout child name (parent+child)")
        return v


class _Ip(Check):
    def check(self, v: Any) -> Any:
        try:
            ipaddress.ip_address(_str.check(v))
        except ValueError:
            raise DecodeError("invalid IP address") from None
        return v


# Checked gossip entries remembered by `_KnownEntries`: at most this many.
ENTRIES_KEPT: Final = 4096


class _KnownEntries(Check):
    """A gossip entry in the positional form, checked by `record`, or the
    entry already built from the same four values.  Every PING and PONG
    carries a tenth of the sender's table, and checking and building each
    entry (the ID's pattern, ipaddress.ip_address, the dataclass) was most
    of an idle node's decoding: in a cluster that does not change, the
    entries repeat.  Only a list of exactly (str, str, int, int) is looked
    up, so a value of another type (True for 1) never matches a checked one;
    the entries are frozen, so sharing them is safe.  All are forgotten at
    once when ENTRIES_KEPT are kept."""

    def __init__(self, record: Check) -> None:
        self.record = record
        self.known: dict[tuple[str, str, int, int], GossipEntry] = {}

    def check(self, v: Any) -> Any:
        if not (type(v) is list and len(v) == 4 and type(v[0]) is str and type(v[1]) is str and type(v[2]) is int and type(v[3]) is int):
            return self.record.check(v)
        key = (v[0], v[1], v[2], v[3])
        entry = self.known.get(key)
        if entry is None:
            entry = self.record.check(v)
            if len(self.known) >= ENTRIES_KEPT:
                self.known.clear()
            self.known[key] = entry
        return entry


class _Zone(Check):
    def check(self, v: Any) -> Any:
        if not valid_zone(_str.check(v)):
            raise DecodeError("invalid zone name")
        return v


class _Result(Check):
    """A job's result (store/results.py): bytes within its size rule."""

    def check(self, v: Any) -> Any:
        if (trouble := result_problem(_bytes.check(v))) is not None:
            raise DecodeError(trouble)
        return v


# --- messages -----------------------------------------------------------------


class _Kind:
    """One message type: its wire name and number, class, fields and mflags,
    and the pack and load of both forms made from them."""

    __slots__ = ("code", "name", "cls", "fields", "mflags", "pack", "load", "pack_pos", "load_pos")

    def __init__(self, code: int, name: str, cls: type, fields: _Fields = (), mflags: tuple[tuple[str, int], ...] = ()) -> None:
        self.code = code  # its number in the positional form (its row in _KINDS, from 1)
        self.name = name  # wire type name
        self.cls = cls
        self.fields = fields
        self.mflags = mflags  # boolean attribute -> mflags bit
        self.pack = _MapPacker(fields)
        self.load = _MapLoader(fields + (_MFLAGS,))  # with the mflags
        self.pack_pos = _ArrayPacker(fields)  # (message, head) -> [*head, field, ...]
        self.load_pos = _ArrayLoader((_MFLAGS, *fields), offset=1)  # [code, mflags, field, ...] -> with the mflags

    def mflags_of(self, msg: Message) -> int:
        return sum(bit for attr, bit in self.mflags if getattr(msg, attr))


_ENVELOPE: _Fields = (
    _Field("sender", "s", _node_id),
    _Field("port", "p", _PORT),
    _Field("flags", "f", _BITS),
)
_MFLAGS = _Field("mflags", "m", _BITS)
_pack_envelope: Final = _MapPacker(_ENVELOPE)
_load_envelope: Final = _MapLoader(_ENVELOPE)
_packb: Final = msgpack.Packer(use_bin_type=True, autoreset=True).pack

_GOSSIP_ENTRY: _Fields = (
    _Field("node_id", "n", _node_id),
    _Field("ip", "i", _Ip()),
    _Field("port", "p", _PORT),
    _Field("flags", "f", _BITS),
)
_GOSSIP = _Field(
    "gossip", "g", _ListOf(_Record(_MapLoader(_GOSSIP_ENTRY), GossipEntry)), _Each(_MapPacker(_GOSSIP_ENTRY)),
    pos=(_ListOf(_KnownEntries(_Record(_ArrayLoader(_GOSSIP_ENTRY), GossipEntry))), _Each(_ArrayPacker(_GOSSIP_ENTRY))),
)
# Added after the first version: an older node sends none (0) and ignores it.
_FEATURES = _Field("features", "ft", _BITS, default=0)
_ZONE = _Field("zone", "z", _Zone(), default="")  # optional: older nodes send none
_CLOCK = _Field("clock", "ck", _UINT, default=0)  # optional: older nodes send none
_ID = _Field("id", "i", _job_id)
_RESULT = _Field("result", "rs", _Result(), default=b"")
_JOBS = _Field("jobs", "j", _ListOf(_wire_job, 1), _Each(_dump_wire_job),
               pos=(_ListOf(_wire_job_pos, 1), _Each(_dump_wire_job_pos)))  # fmt: skip
_OPT_ID = _Field("id", "i", _opt_job_id, default=b"")
_QUEUE = _Field("queue", "q", _bytes)
_LIMIT_KEY = _Field("key", "K", _bytes, default=b"")  # a key's budget (LIMITASK, LIMITGRANT)
_GROUP = _Field("group", "g", _bytes)
_TICKET = _Field("ticket", "k", _UINT)
_KEY_NAME = _Field("key", "y", _Key())  # ADDJOB KEY's rule (store/job.py)
_KEY_JOB = _Field("job", "i", _job_id)
_WAIT_ENTRY: _Fields = (_QUEUE, _Field("count", "c", _UINT))
_WAIT_ENTRIES = _Field(
    "entries", "e", _ListOf(_Record(_MapLoader(_WAIT_ENTRY), WaitEntry), 1), _Each(_MapPacker(_WAIT_ENTRY)),
    pos=(_ListOf(_Record(_ArrayLoader(_WAIT_ENTRY), WaitEntry), 1), _Each(_ArrayPacker(_WAIT_ENTRY))),
)

# One row per message type: (name, class, fields, mflags).  Short keys must
# not reuse the envelope keys v, t, s, p, f, m, pv; the positional code of a
# type is its row number (from 1): new types go at the end, and so do new
# fields of a row, with a default (a body of an older node lacks them).
_ROWS: tuple[tuple[Any, ...], ...] = (
    ("PING", Ping, (_GOSSIP, _FEATURES, _ZONE, _CLOCK)),
    ("PONG", Pong, (_GOSSIP, _FEATURES, _ZONE, _CLOCK)),
    ("MEET", Meet, (_GOSSIP, _FEATURES, _ZONE, _CLOCK)),
    ("FAIL", Fail, (_Field("node", "n", _node_id),)),
    ("REPLJOB", ReplJob, (_Field("job", "j", _wire_job, _dump_wire_job, pos=(_wire_job_pos, _dump_wire_job_pos)),), (("noreply", NOREPLY),)),
    ("GOTJOB", GotJob, (_ID,)),
    ("ENQUEUE", Enqueue, (_ID, _Field("delay", "d", _UINT))),
    ("QUEUED", Queued, (_ID, _Field("delay", "d", _UINT, default=0), _FAILURE), (("incr_nacks", INCR_NACKS), ("incr_deliv", INCR_DELIV))),
    ("WORKING", Working, (_ID,)),
    ("WILLQUEUE", WillQueue, (_ID,)),
    ("SETACK", SetAck, (_ID, _Field("mayhave", "h", _UINT), _Field("holders", "hs", _node_ids, default=()),
                        _RESULT)),
    ("GOTACK", GotAck, (_ID, _Field("known", "k", _bool))),
    ("DELJOB", DelJob, (_ID, _Field("acked", "ak", _bool, default=True))),
    ("NEEDJOBS", NeedJobs, (_QUEUE, _Field("count", "c", _UINT))),
    ("YOURJOBS", YourJobs, (_JOBS,), (("pushed", PUSHED),)),
    ("PAUSE", Pause, (_QUEUE, _Field("flags", "pf", _IntIn(0, 3)))),
    ("FANOUT", Fanout, (_Field("child", "c", _FanoutChild()),), (("joined", JOINED),)),
    ("GROUPSET", GroupSet, (_ID, _GROUP, _Field("deadline", "d", _UINT))),
    ("CLAIM", Claim, (_ID, _GROUP, _Field("deadline", "d", _UINT), _TICKET)),
    ("GROUPACK", GroupAck, (_ID, _GROUP, _TICKET)),
    ("CLAIMED", Claimed, (_TICKET, _OPT_ID), (("granted", GRANTED), ("unknown", UNKNOWN))),
    ("NEEDEVENT", NeedEvent, (_QUEUE, _GROUP, _Field("deadline", "d", _UINT), _TICKET)),
    ("YOUREVENT", YourEvent, (_TICKET, _ID, _Field("body", "b", _bytes))),
    ("NEWEVENT", NewEvent, (_QUEUE,)),
    ("GROUPFLUSH", GroupFlush, (_QUEUE,)),
    ("GOTJOBS", GotJobs, (_Field("ids", "i", _ListOf(_job_id, 1)),)),
    ("REPLJOBS", ReplJobs, (_JOBS,), (("noreply", NOREPLY),)),
    ("WAITING", Waiting, (_WAIT_ENTRIES,)),
    ("SCHEDSET", SchedSet, (_Field("record", "r", _bytes),)),  # the record is checked alone: house rule 5
    ("TICKED", Ticked, (_Field("name", "n", _bytes), _Field("tick", "k", _UINT), _Field("node", "o", _node_id))),
    ("KEYCLAIM", KeyClaim, (_TICKET, _QUEUE, _KEY_NAME, _KEY_JOB, _Field("hold", "h", _UINT), _Field("active", "a", _bool, default=False),
                              _Field("debounce", "d", _bool, default=False))),
    ("KEYCLAIMED", KeyClaimed, (_TICKET, _QUEUE, _KEY_NAME, _KEY_JOB)),
    ("KEYSET", KeySet, (_Field("record", "r", _bytes),)),  # the record is checked alone: house rule 5
    ("KEYDONE", KeyDone, (_QUEUE, _KEY_NAME, _KEY_JOB, _Field("aborted", "a", _bool, default=False))),
    ("QSET", QSet, (_Field("record", "r", _bytes),)),  # checked alone, as SCHEDSET's
    ("LIMITASK", LimitAsk, (_QUEUE, _Field("want", "w", _UINT), _Field("out", "o", _UINT), _Field("held", "h", _UINT),
                            _Field("tokens", "n", _UINT), _Field("at", "a", _UINT), _LIMIT_KEY)),
    ("LIMITGRANT", LimitGrant, (_QUEUE, _Field("slots", "l", _UINT), _Field("tokens", "n", _UINT),
                                _Field("retry", "y", _UINT), _Field("at", "a", _UINT), _LIMIT_KEY)),
    ("DEPEND", Depend, (_Field("ids", "i", _ListOf(_job_id, 1)),)),
    ("SETTLED", Settled, (_ID, _Field("acked", "ak", _bool), _RESULT)),
    ("BATCHSET", BatchSet, (_Field("record", "r", _bytes),)),  # the record is checked alone: house rule 5
)
_KINDS = tuple(_Kind(code, *row) for code, row in enumerate(_ROWS, 1))
_BY_NAME: Final = {k.name: k for k in _KINDS}
_BY_CLASS: Final = {k.cls: k for k in _KINDS}
_BY_CODE: Final = {k.code: k for k in _KINDS}


def _map_of(header: Header, msg: Message) -> dict[str, Any]:
    kind = _BY_CLASS[type(msg)]
    m = {"v": VERSION, "t": kind.name, "m": kind.mflags_of(msg)}
    m |= _pack_envelope.dump(header)
    m |= kind.pack.dump(msg)
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
    return Header(**_load_envelope.check(m)), _message(kind, kind.load.check(m))


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
POSITIONAL: Final = 2
_load_pos_header: Final = _ArrayLoader(_ENVELOPE, offset=1)
_last: Final[list[Any]] = [None, b""]  # the last message encoded without a header and its body: a broadcast packs once


class LinkCodec:
    """The frame bodies of one link, both directions.

    A link starts in the map form, each body carrying "pv": the positional
    form this node reads.  Once the peer is known to read it too (its map
    bodies carry the same "pv", or it sent a positional body), bodies are
    msgpack arrays, fields in table order (jobs and gossip entries arrays
    too, optional fields always present, except that a body of an older node
    lacks the optional fields added at the end of a row since):

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
            body = _packb(kind.pack_pos.pack(msg, (kind.code, kind.mflags_of(msg))))
            _last[:] = msg, body
            return body
        self._sent = header
        return _packb(kind.pack_pos.pack(msg, (0, header.sender, header.port, header.flags, kind.code, kind.mflags_of(msg))))

    def encode_parts(self, header: Header, msg: Message) -> list[bytes]:
        """`encode` as buffers to write one after another: a REPLJOB's body
        of `SPLICE_MIN` bytes or more is not copied into the frame's body
        but goes as it is, after its msgpack header (the same bytes on the
        wire; a 50 MB copy holds the event loop for tens of ms)."""
        if not isinstance(msg, ReplJob) or len(msg.job["body"]) < SPLICE_MIN:
            return [self.encode(header, msg)]
        body: bytes = msg.job["body"]
        packed = self.encode(header, ReplJob({**msg.job, "body": _MARK}, msg.noreply))
        if packed.count(_PACKED_MARK) != 1:  # a name holding the mark too: no splice
            return [self.encode(header, msg)]
        at = packed.index(_PACKED_MARK)
        return [packed[:at], _bin_header(len(body)), body, packed[at + len(_PACKED_MARK) :]]

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
                self._header = Header(**_load_pos_header.check(o))
                o = o[4:]
                code = o[0] if o else None
            if self._header is None:
                raise DecodeError("a positional body before any header")
            kind = _BY_CODE.get(code) if type(code) is int else None
            if kind is None:
                raise DecodeError(f"unknown message code {code!r:.40}")
            self.positional = True
            return self._header, _message(kind, kind.load_pos.check(o))
        except DecodeError as e:
            raise FrameError(str(e)) from None


# --- framing ------------------------------------------------------------------

SPLICE_MIN: Final = 1 << 20  # a job body this big is written beside its frame, not copied into it
_MARK: Final = b"\x00\xffdisque:the-body-goes-here\xff\x00"  # packed in the body's place, then replaced
_PACKED_MARK: Final = msgpack.packb(_MARK, use_bin_type=True)


def _bin_header(size: int) -> bytes:
    """msgpack's header of a bin of `size` bytes, 64 KB or more (bin 32)."""
    return b"\xc6" + _LENGTH.pack(size)



def length_prefix(size: int) -> bytes:
    """The prefix of a frame whose body is `size` bytes (written before it,
    apart, when the body is big enough that copying it costs)."""
    return _LENGTH.pack(size)


def framed(body: bytes) -> bytes:
    return length_prefix(len(body)) + body


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
        size: int = _LENGTH.unpack_from(buf)[0]
        if size > self.max_frame:
            raise FrameError(f"frame of {size} bytes exceeds the {self.max_frame} byte limit")
        end = _PREFIX + size
        if len(buf) < end:
            return None
        body = bytes(buf[_PREFIX:end])
        del buf[:end]  # O(1) for a bytearray: it only moves its start
        return body
