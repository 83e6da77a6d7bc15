"""Bus codec: round trips, framing under arbitrary splits, job forms, fuzzing."""

from __future__ import annotations

import ipaddress
import random
import tracemalloc
from typing import Any, get_args

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque.cluster import codec
from disque.store import records
from disque.cluster.codec import (
    INCR_DELIV, INCR_NACKS, MAX_FRAME, NOREPLY, FrameDecoder, FrameError, decode_body, encode_body, encode_frame,
    framed, LinkCodec, POSITIONAL,
)  # fmt: skip
from disque.store.records import (
    STORAGE_VERSION, DecodeError, decode_storage, encode_storage, job_from_storage, job_from_wire, job_to_storage,
    job_to_wire,
)  # fmt: skip
from disque.cluster.messages import (
    DelJob, Enqueue, Fail, GossipEntry, GotAck, GotJob, GotJobs, Header, Meet, Message,
    NeedJobs, Pause, Ping, Pong, Queued, ReplJob, ReplJobs, SetAck, WillQueue, Working, Fanout, GroupSet, Claim, Claimed,
    GroupAck, GroupFlush, NeedEvent, YourEvent, NewEvent,
    WaitEntry, Waiting, YourJobs, SchedSet, Ticked, KeyClaim, KeyClaimed, KeySet, KeyDone, QSet, LimitAsk, LimitGrant, Depend,
    Settled, BatchSet,
)  # fmt: skip
from disque.store import keyed, schedule
from disque.store.ids import new_job_id
from disque.store.job import BCAST_QUEUED, BCAST_WILLQUEUE, DELIVERED, IN_LIST, NACKED, WIRE_FLAGS, Job, State

NOW = 1_700_000_000
NOW_MS = NOW * 1000
U64 = 2**64 - 1
fuzz = settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
relaxed = settings(deadline=None)

# --- strategies ---------------------------------------------------------------

node_ids = st.binary(min_size=20, max_size=20).map(bytes.hex)
job_ids = st.builds(
    new_job_id, node_ids, st.randoms(use_true_random=False), st.integers(1, 2**40), st.integers(0, 1000)
)
uints = st.integers(0, U64)
ports = st.integers(0, 65535)
blobs = st.binary(max_size=48)
headers = st.builds(Header, node_ids, ports, st.integers(0, 2**32 - 1))
gossip = st.lists(
    st.builds(GossipEntry, node_ids, st.ip_addresses().map(str), ports, st.integers(0, 255)), max_size=4
).map(tuple)


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    dummy = draw(st.booleans())
    return Job(
        draw(job_ids),
        None if dummy else draw(blobs),
        None if dummy else draw(blobs),
        state=draw(st.sampled_from(State)),
        flags=draw(st.integers(0, 15)),
        repl=draw(st.integers(1, 65535)),
        etime=draw(st.integers(0, 2**40)),
        ctime=draw(uints),
        delay=draw(uints),
        retry=draw(uints),
        nacks=draw(uints),
        deliv=draw(uints),
        nodes_delivered=tuple(draw(st.lists(node_ids, unique=True, max_size=4))),
        priority=draw(st.integers(0, 9)),
        parents=tuple(draw(st.lists(job_ids, unique=True, max_size=3))),
        on_parent_fail=draw(st.integers(0, 2)),
        batch=draw(st.sampled_from((b"", b"BT" + b"0" * 40))),
        after=tuple(draw(st.lists(job_ids, unique=True, max_size=3))),  # a released child's: parents gone, after kept
    )


wire_jobs = jobs().map(lambda job: job_to_wire(job, NOW_MS))

MESSAGES: dict[type, st.SearchStrategy[Any]] = {
    Ping: st.builds(Ping, gossip, st.integers(0, 2**32 - 1)),
    Pong: st.builds(Pong, gossip, st.integers(0, 2**32 - 1)),
    Meet: st.builds(Meet, gossip, st.integers(0, 2**32 - 1)),
    Fail: st.builds(Fail, node_ids),
    ReplJob: st.builds(ReplJob, wire_jobs, st.booleans()),
    GotJob: st.builds(GotJob, job_ids),
    GotJobs: st.builds(GotJobs, st.lists(job_ids, min_size=1, max_size=5).map(tuple)),
    ReplJobs: st.builds(ReplJobs, st.lists(wire_jobs, min_size=1, max_size=3).map(tuple), st.booleans()),
    Enqueue: st.builds(Enqueue, job_ids, uints),
    Queued: st.builds(Queued, job_ids, st.booleans(), st.booleans()),
    Working: st.builds(Working, job_ids),
    WillQueue: st.builds(WillQueue, job_ids),
    SetAck: st.builds(SetAck, job_ids, uints, st.lists(node_ids, unique=True, max_size=4).map(tuple), st.binary(max_size=64)),
    GotAck: st.builds(GotAck, job_ids, st.booleans()),
    DelJob: st.builds(DelJob, job_ids),
    NeedJobs: st.builds(NeedJobs, blobs, uints),
    YourJobs: st.builds(YourJobs, st.lists(wire_jobs, min_size=1, max_size=3).map(tuple)),
    Pause: st.builds(Pause, blobs, st.integers(0, 3)),
    Fanout: st.builds(Fanout, st.builds(lambda p, c: p + b"+" + c, blobs.filter(lambda b: b and b"+" not in b), blobs.filter(bool)), st.booleans()),
    GroupSet: st.builds(GroupSet, job_ids, blobs, uints),
    Claim: st.builds(Claim, job_ids, blobs, uints, uints),
    GroupAck: st.builds(GroupAck, job_ids, blobs, uints),
    Claimed: st.builds(Claimed, uints, st.booleans(), st.booleans(), st.one_of(st.just(b""), job_ids)),
    GroupFlush: st.builds(GroupFlush, blobs),
    NewEvent: st.builds(NewEvent, blobs),
    NeedEvent: st.builds(NeedEvent, blobs, blobs, uints, uints),
    YourEvent: st.builds(YourEvent, uints, job_ids, blobs),
    Waiting: st.builds(Waiting, st.lists(st.builds(WaitEntry, blobs, uints), min_size=1, max_size=3).map(tuple)),
    SchedSet: st.builds(lambda name, body: SchedSet(schedule.encode(schedule.Schedule(b"n" + name, 1, "a", b"q", body, 1000))), blobs, blobs),
    Ticked: st.builds(Ticked, blobs, uints, node_ids),
    KeyClaim: st.builds(KeyClaim, uints, blobs, blobs, job_ids, uints, st.booleans(), st.booleans()),
    KeyClaimed: st.builds(KeyClaimed, uints, blobs, blobs, job_ids),
    KeySet: st.builds(lambda key, job: KeySet(keyed.encode(keyed.KeyHold(b"q", b"k" + key, 1, "a", job, 2))), blobs, job_ids),
    KeyDone: st.builds(KeyDone, blobs, blobs, job_ids, st.booleans()),
    QSet: st.builds(QSet, blobs),
    LimitAsk: st.builds(LimitAsk, blobs, uints, uints, uints, uints, uints),
    LimitGrant: st.builds(LimitGrant, blobs, uints, uints, uints, uints),
    Depend: st.builds(Depend, st.lists(job_ids, min_size=1, max_size=5).map(tuple)),
    Settled: st.builds(Settled, job_ids, st.booleans(), st.binary(max_size=64)),
    BatchSet: st.builds(BatchSet, blobs),
}
frames = st.tuples(headers, st.one_of(*MESSAGES.values()))
one_of_each = st.tuples(*(st.tuples(headers, s) for s in MESSAGES.values())).map(list)

# Any value msgpack can carry.
msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), U64) | st.floats() | st.binary(max_size=16)
    | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


def frame_of(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def drain(decoder: FrameDecoder) -> list[tuple[Header, Message]]:
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    return out


def decode_stream(stream: bytes) -> list[tuple[Header, Message]]:
    """Decode until the data runs out or a FrameError; check what came out."""
    decoder = FrameDecoder()
    decoder.feed(stream)
    out: list[tuple[Header, Message]] = []
    try:
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    except FrameError:
        pass
    for header, msg in out:  # a decoded message is valid iff it survives a round trip
        assert decode_body(encode_body(header, msg)) == (header, msg)
    return out


def job_fields(job: Job) -> dict[str, Any]:
    """The serialized fields of a job (everything but the local timers)."""
    return {name: getattr(job, name) for name in job_to_storage(job) if name != "not_before"}


# --- message round trips --------------------------------------------------------


def test_strategies_cover_every_message_type() -> None:
    assert set(MESSAGES) == set(get_args(Message))


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@relaxed
@given(data=st.data())
def test_round_trip(cls: type, data: st.DataObject) -> None:
    header, msg = data.draw(headers), data.draw(MESSAGES[cls])
    decoder = FrameDecoder()
    decoder.feed(encode_frame(header, msg))
    assert drain(decoder) == [(header, msg)]


def test_envelope_shape() -> None:
    header = Header("ab" * 20, 7711, 4 | 128)
    jid = new_job_id(header.sender, random.Random(0), 60, 1)
    body = msgpack.unpackb(encode_body(header, Queued(jid, incr_nacks=True, incr_deliv=True)), raw=False)
    assert body == {"v": 1, "t": "QUEUED", "s": header.sender, "p": 7711, "f": 132, "m": INCR_NACKS | INCR_DELIV, "i": jid}
    body = msgpack.unpackb(encode_body(header, Pause(b"q\xff\x00", 2)), raw=False)
    assert body["q"] == b"q\xff\x00" and body["m"] == 0  # bytes travel as msgpack bin


@relaxed
@given(headers, wire_jobs, st.booleans())
def test_noreply_travels_in_mflags(header: Header, job: dict[str, Any], noreply: bool) -> None:
    body = msgpack.unpackb(encode_body(header, ReplJob(job, noreply)), raw=False)
    assert body["m"] == (NOREPLY if noreply else 0)


@relaxed
@given(st.lists(frames, max_size=6), st.data())
def test_random_chunk_splits(pairs: list[tuple[Header, Message]], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(h, m) for h, m in pairs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder, out = FrameDecoder(), []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        decoder.feed(stream[start:end])
        out += drain(decoder)
    assert out == pairs


@settings(deadline=None, max_examples=20)
@given(one_of_each)
def test_one_byte_at_a_time(pairs: list[tuple[Header, Message]]) -> None:
    stream = b"".join(encode_frame(h, m) for h, m in pairs)
    decoder, out = FrameDecoder(), []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        out += drain(decoder)
    assert out == pairs


def test_unknown_extra_keys_are_ignored() -> None:
    header = Header("0" * 40, 1, 0)
    body = msgpack.unpackb(encode_body(header, Ping()), raw=False) | {"zz": [1, 2]}
    assert decode_body(msgpack.packb(body, use_bin_type=True)) == (header, Ping())


# --- versions, limits and malformed frames -----------------------------------------------

HEADER = Header("0123456789abcdef0123456789abcdef01234567", 7711, 0)
GOOD_ID = new_job_id(HEADER.sender, random.Random(1), 3600, 1)
GOOD_JOB = job_to_wire(Job(GOOD_ID, b"q", b"b", nodes_delivered=(HEADER.sender,), etime=NOW + 60), NOW_MS)


def test_unknown_version_is_skipped() -> None:
    decoder = FrameDecoder()
    decoder.feed(frame_of(msgpack.packb({"v": 2, "t": "FROM-THE-FUTURE", "x": b"\x00"})))
    assert decoder.next_frame() is None
    decoder.feed(frame_of(msgpack.packb({"v": -1})) + encode_frame(HEADER, Ping()))
    assert drain(decoder) == [(HEADER, Ping())]


def test_oversized_length_prefix_fails_without_allocating() -> None:
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        decoder.feed((MAX_FRAME + 1).to_bytes(4, "big") + b"x" * 100)
        with pytest.raises(FrameError, match="exceeds"):
            decoder.next_frame()
        with pytest.raises(FrameError):  # the stream stays unusable
            decoder.next_frame()
        # A large but allowed length just waits for its data.
        pending = FrameDecoder()
        pending.feed(MAX_FRAME.to_bytes(4, "big") + b"x" * 100)
        assert pending.next_frame() is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_max_frame_is_inclusive() -> None:
    frame = encode_frame(HEADER, Ping())
    exact = FrameDecoder(max_frame=len(frame) - 4)
    exact.feed(frame)
    assert drain(exact) == [(HEADER, Ping())]
    short = FrameDecoder(max_frame=len(frame) - 5)
    short.feed(frame)
    with pytest.raises(FrameError):
        short.next_frame()


def edit(d: dict[str, Any], /, **changes: Any) -> dict[str, Any]:
    """A copy of `d` with some keys replaced; a None value removes the key."""
    return {k: v for k, v in (d | changes).items() if v is not None}


def _body(msg: Message, **changes: Any) -> bytes:
    """A valid body for `msg`, edited."""
    return msgpack.packb(edit(msgpack.unpackb(encode_body(HEADER, msg), raw=False), **changes), use_bin_type=True)


def _job_map(**changes: Any) -> dict[str, Any]:
    """The wire map of GOOD_JOB, edited."""
    return edit(msgpack.unpackb(encode_body(HEADER, ReplJob(GOOD_JOB)), raw=False)["j"], **changes)


BAD_BODIES = {
    "empty": b"",
    "reserved byte": b"\xc1",
    "truncated": _body(Ping())[:-1],
    "trailing data": _body(Ping()) + b"\x00",
    "not a map": msgpack.packb([1, 2, 3]),
    "non-string map key": b"\x81\x01\x01",
    "invalid utf-8": b"\x81\xa1v\xa1\xff",
    "no version": _body(Ping(), v=None),
    "string version": _body(Ping(), v="1"),
    "no type": _body(Ping(), t=None),
    "unknown type": _body(Ping(), t="PINGG"),
    "bytes type": _body(Ping(), t=b"PING"),
    "no sender": _body(Ping(), s=None),
    "uppercase sender": _body(Ping(), s="A" * 40),
    "short sender": _body(Ping(), s="a" * 39),
    "bytes sender": _body(Ping(), s=b"a" * 40),
    "port too large": _body(Ping(), p=65536),
    "negative port": _body(Ping(), p=-1),
    "boolean port": _body(Ping(), p=True),
    "float port": _body(Ping(), p=1.0),
    "no flags": _body(Ping(), f=None),
    "no mflags": _body(Ping(), m=None),
    "string mflags": _body(Ping(), m="1"),
    "gossip not a list": _body(Ping(), g={}),
    "gossip entry not a map": _body(Ping(), g=[[HEADER.sender, "1.2.3.4", 1, 0]]),
    "gossip bad ip": _body(Ping(), g=[{"n": HEADER.sender, "i": "1.2.3.400", "p": 1, "f": 0}]),
    "gossip empty ip": _body(Ping(), g=[{"n": HEADER.sender, "i": "", "p": 1, "f": 0}]),
    "gossip missing port": _body(Ping(), g=[{"n": HEADER.sender, "i": "::1", "f": 0}]),
    "fail bad node": _body(Fail(HEADER.sender), n="x" * 40),
    "short job id": _body(GotJob(GOOD_ID), i=GOOD_ID[:-1]),
    "string job id": _body(GotJob(GOOD_ID), i=GOOD_ID.decode()),
    "bad id suffix": _body(GotJob(GOOD_ID), i=GOOD_ID[:-2] + b"XX"),
    "missing id": _body(DelJob(GOOD_ID), i=None),
    "no gotjobs ids": _body(GotJobs((GOOD_ID,)), i=[]),
    "bad id among gotjobs ids": _body(GotJobs((GOOD_ID,)), i=[GOOD_ID, GOOD_ID[:-1]]),
    "gotjobs ids not a list": _body(GotJobs((GOOD_ID,)), i=GOOD_ID),
    "negative delay": _body(Enqueue(GOOD_ID, 1), d=-1),
    "integer known": _body(GotAck(GOOD_ID, True), k=1),
    "string queue": _body(NeedJobs(b"q", 1), q="q"),
    "pause flags": _body(Pause(b"q", 1), pf=4),
    "fanout without a child": _body(Fanout(b"q+c"), c=b"q+"),
    "fanout of a plain queue": _body(Fanout(b"q+c"), c=b"q"),
    "group not bytes": _body(GroupSet(GOOD_ID, b"g", 1), g="g"),
    "negative deadline": _body(Claim(GOOD_ID, b"g", 1, 1), d=-1),
    "ticket not a number": _body(Claimed(1), k=b"1"),
    "no jobs": _body(YourJobs((GOOD_JOB,)), j=[]),
    "no repljobs jobs": _body(ReplJobs((GOOD_JOB,)), j=[]),
    "bad second repljobs job": _body(ReplJobs((GOOD_JOB,)), j=[_job_map(), _job_map(na=-1)]),
    "job not a map": _body(ReplJob(GOOD_JOB), j=[1]),
    "job missing ttl": _body(ReplJob(GOOD_JOB), j=_job_map(tl=None)),
    "job zero ttl": _body(ReplJob(GOOD_JOB), j=_job_map(tl=0)),
    "job zero repl": _body(ReplJob(GOOD_JOB), j=_job_map(r=0)),
    "job bad state": _body(ReplJob(GOOD_JOB), j=_job_map(s=4)),
    "job string body": _body(ReplJob(GOOD_JOB), j=_job_map(b="body")),
    "job bad delivered node": _body(ReplJob(GOOD_JOB), j=_job_map(nd=["z" * 40])),
    "job delivered node not a string": _body(ReplJob(GOOD_JOB), j=_job_map(nd=["a" * 40, 7])),
    "bad second job": _body(YourJobs((GOOD_JOB,)), j=[_job_map(), _job_map(na=-1)]),
    "no waiting entries": _body(Waiting((WaitEntry(b"q", 1),)), e=[]),
    "negative waiting count": _body(Waiting((WaitEntry(b"q", 1),)), e=[{"q": b"q", "c": -1}]),
    "waiting queue not bytes": _body(Waiting((WaitEntry(b"q", 1),)), e=[{"q": "q", "c": 1}]),
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES)
def test_malformed_frame_raises_frame_error(body: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(frame_of(body))
    with pytest.raises(FrameError) as info:
        decoder.next_frame()
    assert isinstance(info.value, ValueError) and info.value.reason


# --- fuzzing: only valid messages or FrameError, never anything else -------------------


@fuzz
@given(st.binary(max_size=512))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    decode_stream(data)


@fuzz
@given(st.lists(st.binary(max_size=64) | msgpack_values.map(lambda v: msgpack.packb(v, use_bin_type=True))))
def test_fuzz_framed_garbage(bodies: list[bytes]) -> None:
    decode_stream(b"".join(frame_of(body) for body in bodies))


def _containers(obj: Any) -> list[tuple[Any, Any]]:
    """Every (container, key/index) slot inside a decoded msgpack value."""
    slots: list[tuple[Any, Any]] = []
    keys = obj.keys() if isinstance(obj, dict) else range(len(obj)) if isinstance(obj, list) else ()
    for key in keys:
        slots.append((obj, key))
        slots += _containers(obj[key])
    return slots


@fuzz
@given(frames, st.data())
def test_fuzz_mutated_fields(frame: tuple[Header, Message], data: st.DataObject) -> None:
    """Replace or delete one value anywhere inside a valid body."""
    body = msgpack.unpackb(encode_body(*frame), raw=False)
    container, key = data.draw(st.sampled_from(_containers(body)))
    if isinstance(container, dict) and data.draw(st.booleans()):
        del container[key]
    else:
        container[key] = data.draw(msgpack_values)
    decode_stream(frame_of(msgpack.packb(body, use_bin_type=True)))


mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0)),
    st.tuples(st.just("insert"), st.integers(0), st.binary(min_size=1, max_size=8)),
)


@fuzz
@given(st.lists(frames, min_size=1, max_size=4), st.lists(mutations, min_size=1, max_size=3))
def test_fuzz_mutated_stream(pairs: list[tuple[Header, Message]], ops: list[tuple[Any, ...]]) -> None:
    """Bit flips, truncations and insertions anywhere, length prefixes included."""
    encoded = [encode_frame(h, m) for h, m in pairs]
    stream = bytearray(b"".join(encoded))
    first = len(stream)  # frames wholly before the first damage must survive
    for op, pos, *arg in ops:
        pos %= len(stream) + 1
        first = min(first, pos)
        if op == "flip" and pos < len(stream):
            stream[pos] ^= 1 << arg[0]
        elif op == "truncate":
            del stream[pos:]
        elif op == "insert":
            stream[pos:pos] = arg[0]
    intact, end = 0, 0
    for frame in encoded:
        end += len(frame)
        intact += end <= first
    assert decode_stream(bytes(stream))[:intact] == pairs[:intact]


# --- the positional form of a link ------------------------------------------------


def positional_pair() -> tuple[LinkCodec, LinkCodec]:
    """A sender that knows its peer reads the positional form, and that peer."""
    sender, receiver = LinkCodec(), LinkCodec()
    sender.positional = True
    return sender, receiver


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@relaxed
@given(data=st.data())
def test_positional_round_trip(cls: type, data: st.DataObject) -> None:
    header, first, second = data.draw(headers), data.draw(MESSAGES[cls]), data.draw(MESSAGES[cls])
    sender, receiver = positional_pair()
    bodies = [sender.encode(header, first), sender.encode(header, second)]
    arrays = [msgpack.unpackb(b, raw=False) for b in bodies]
    assert arrays[0][:4] == [0, header.sender, header.port, header.flags]  # the header, once
    assert type(arrays[1][0]) is int and arrays[1][0] > 0
    decoded = [receiver.decode(b) for b in bodies]
    assert decoded == [(header, first), (header, second)]
    assert decoded[0][0] is decoded[1][0]  # the link's header, kept


def test_a_link_goes_positional_once_the_peer_says_it_reads_it() -> None:
    a, b = LinkCodec(), LinkCodec()
    header = Header("a" * 40, 7711, 0)
    first = a.encode(header, Fail("b" * 40))
    assert msgpack.unpackb(first, raw=False)["pv"] == POSITIONAL  # a map that says so
    assert b.decode(first) == (header, Fail("b" * 40)) and b.positional
    answer = b.encode(header, Fail("c" * 40))
    assert type(msgpack.unpackb(answer, raw=False)) is list
    assert a.decode(answer) == (header, Fail("c" * 40)) and a.positional  # a positional body says it too
    # An older node's bodies never say "pv": it gets maps only.
    c = LinkCodec()
    assert c.decode(encode_body(header, Fail("b" * 40))) == (header, Fail("b" * 40))
    assert not c.positional and type(msgpack.unpackb(c.encode(header, Fail("b" * 40)), raw=False)) is dict
    other, d = msgpack.unpackb(first, raw=False) | {"pv": POSITIONAL + 1}, LinkCodec()  # a form it does not read
    assert d.decode(msgpack.packb(other)) == (header, Fail("b" * 40)) and not d.positional


def test_a_new_header_goes_with_the_next_message_only() -> None:
    sender, receiver = positional_pair()
    old, new = Header("a" * 40, 7711, 0), Header("a" * 40, 7711, 128)  # LEAVING set
    job_id = new_job_id("a" * 40, random.Random(1), 60, 30)
    bodies = [sender.encode(h, GotJob(job_id)) for h in (old, old, new, new)]
    assert [len(msgpack.unpackb(b)) for b in bodies] == [7, 3, 7, 3]  # [0, s, p, f,] code, mflags, id
    assert [receiver.decode(b)[0] for b in bodies] == [old, old, new, new]


def test_a_broadcast_is_packed_once() -> None:
    (a, _), (b, _) = positional_pair(), positional_pair()
    header, msg = Header("a" * 40, 7711, 0), Fail("b" * 40)
    a.encode(header, msg), b.encode(header, msg)  # each link's header
    assert a.encode(header, msg) is b.encode(header, msg)


def _positional(header: Header, msg: Message) -> list[bytes]:
    sender, _ = positional_pair()
    return [sender.encode(header, msg), sender.encode(header, msg)]


_HEADER = Header("a" * 40, 7711, 0)
GOOD_GOTJOB = GotJob(GOOD_ID)
BAD_POSITIONAL = {
    "empty array": [msgpack.packb([])],
    "a message before any header": [_positional(_HEADER, GOOD_GOTJOB)[1]],
    "a header alone": [msgpack.packb([0, "a" * 40, 7711, 0])],
    "bad header sender": [msgpack.packb([0, "z" * 40, 7711, 0, 6, 0, GOOD_GOTJOB.id])],
    "short header": [msgpack.packb([0, "a" * 40])],
    "unknown code": [_positional(_HEADER, GOOD_GOTJOB)[0], msgpack.packb([99, 0, GOOD_GOTJOB.id])],
    "ill-typed code": [_positional(_HEADER, GOOD_GOTJOB)[0], msgpack.packb(["GOTJOB", 0, GOOD_GOTJOB.id])],
    "missing field": [_positional(_HEADER, GOOD_GOTJOB)[0], msgpack.packb([6, 0])],
    "bad field": [_positional(_HEADER, GOOD_GOTJOB)[0], msgpack.packb([6, 0, b"x"])],
    "bad job field": [_positional(_HEADER, GOOD_GOTJOB)[0], msgpack.packb([5, 0, [b"x"]])],
    "a scalar body": [msgpack.packb(7)],
}


@pytest.mark.parametrize("bodies", BAD_POSITIONAL.values(), ids=BAD_POSITIONAL)
def test_malformed_positional_body_raises_frame_error(bodies: list[bytes]) -> None:
    decoder = FrameDecoder()
    decoder.feed(b"".join(framed(b) for b in bodies))
    with pytest.raises(FrameError) as info:
        drain(decoder)
    assert info.value.reason


def test_extra_trailing_items_are_ignored() -> None:
    header, msg = _HEADER, GOOD_GOTJOB
    first, _ = _positional(header, msg)
    array = msgpack.unpackb(first, raw=False) + ["from a later version"]
    assert LinkCodec().decode(msgpack.packb(array)) == (header, msg)


@fuzz
@given(frames, frames, st.data())
def test_fuzz_mutated_positional_fields(one: tuple[Header, Message], two: tuple[Header, Message], data: st.DataObject) -> None:
    """Replace or drop one value anywhere inside positional bodies: only
    valid messages or FrameError come out."""
    sender, _ = positional_pair()
    arrays = [msgpack.unpackb(sender.encode(*f), raw=False) for f in (one, two)]
    container, key = data.draw(st.sampled_from(_containers(arrays)))
    if isinstance(container, list) and data.draw(st.booleans()):
        del container[key]
    else:
        container[key] = data.draw(msgpack_values)
    decoder = FrameDecoder()
    decoder.feed(b"".join(framed(msgpack.packb(a, use_bin_type=True)) for a in arrays))
    try:
        for header, msg in drain(decoder):
            assert decode_body(encode_body(header, msg)) == (header, msg)
    except FrameError:
        pass


# --- jobs: bus form and storage form ------------------------------------------------


@relaxed
@given(jobs(), st.integers(0, 2**50), st.integers(0, 2**50))
def test_job_bus_form(job: Job, sent_at: int, received_at: int) -> None:
    job.gc_retry = 3
    d = job_to_wire(job, sent_at)
    assert d["ttl"] == max(1, job.etime * 1000 - sent_at)
    assert d["flags"] == job.flags & (BCAST_QUEUED | BCAST_WILLQUEUE)  # DELIVERED, IN_LIST cleared
    assert d["etime"] == job.etime and "gc_retry" not in d
    [(_, msg)] = decode_stream(encode_frame(HEADER, ReplJob(d)))
    copy = job_from_wire(msg.job, received_at)
    assert copy.etime == min((received_at + d["ttl"]) // 1000, job.etime)
    assert job_fields(copy) == job_fields(job) | {"flags": d["flags"], "etime": copy.etime}
    assert (copy.gc_retry, copy.qtime, copy.awake, copy.nodes_confirmed) == (0, 0, 0, None)


@relaxed
@given(jobs())
def test_job_storage_form(job: Job) -> None:
    job.gc_retry = 5
    d = job_to_storage(job)
    assert d["etime"] == job.etime and d["state"] == job.state
    assert d["flags"] == job.flags & WIRE_FLAGS  # DELIVERED kept, IN_LIST masked
    expected = job_fields(job) | {"flags": job.flags & ~IN_LIST}
    assert job_fields(job_from_storage(d)) == expected
    copy = decode_storage(encode_storage(job))
    assert job_fields(copy) == expected and copy.gc_retry == 0
    assert msgpack.unpackb(encode_storage(job))["v"] == STORAGE_VERSION
    assert "nb" not in msgpack.unpackb(encode_storage(job))  # no NACK ... DELAY pending


@relaxed
@given(jobs(), st.integers(1, 2**50))
def test_a_pending_nack_delay_is_stored_as_not_before(job: Job, qtime: int) -> None:
    job.flags |= NACKED
    job.qtime = qtime
    copy = decode_storage(encode_storage(job))
    assert copy.qtime == qtime and copy.flags & NACKED and job_fields(copy) == job_fields(job_from_storage(job_to_storage(job)))
    job.flags &= ~NACKED
    assert decode_storage(encode_storage(job)).qtime == 0


def test_delivered_nodes_are_a_set() -> None:
    _, msg = decode_body(_body(ReplJob(GOOD_JOB), j=_job_map(nd=["a" * 40, "b" * 40, "a" * 40])))
    assert job_from_wire(msg.job, NOW_MS).nodes_delivered == ("a" * 40, "b" * 40)


def test_jobs_that_came_with_the_same_delivery_list_share_its_checked_tuple() -> None:
    nodes = ["a" * 40, "b" * 40, "c" * 40]
    first, second = (decode_body(_body(ReplJob(GOOD_JOB), j=_job_map(nd=list(nodes))))[1].job for _ in range(2))
    assert first["nodes_delivered"] == tuple(nodes) and first["nodes_delivered"] is second["nodes_delivered"]
    for bad in ({"a" * 40: 1}, ["A" * 40], [["a" * 40]]):  # checked as ever, though the list above is known
        with pytest.raises(DecodeError):
            records._nodes_delivered.check(bad)
    for i in range(records._DELIVERED_MAX + 1):  # lists a peer makes up do not grow it without bound
        records._nodes_delivered.check(["%040x" % i])
    assert len(records._delivered) <= records._DELIVERED_MAX


def test_a_jobs_fields_are_what_the_job_forms_carry() -> None:
    job = Job(GOOD_ID, b"q", b"b", flags=DELIVERED | BCAST_QUEUED | IN_LIST, max_attempts=3, dead_letter=b"d")
    fields = job.fields(WIRE_FLAGS & ~DELIVERED)
    assert list(fields) == [f.name for f in records._JOB_COMMON + records._DEPENDS]
    assert fields["flags"] == BCAST_QUEUED and (fields["max_attempts"], fields["dead_letter"]) == (3, b"d")


def test_job_from_wire_accepts_its_own_output() -> None:
    job = job_from_wire(GOOD_JOB, NOW_MS)
    assert job.etime == NOW + 60 == (NOW_MS + GOOD_JOB["ttl"]) // 1000 and job.flags & DELIVERED == 0


GOOD_STORED = job_to_storage(job_from_wire(GOOD_JOB, NOW_MS))
BAD_JOB_FIELDS = [
    ("id", None),
    ("id", b"x" * 48),
    ("origin", b"x" * 48),  # an optional ID: empty, or a valid one
    ("state", 4),
    ("state", "queued"),
    ("flags", 256),
    ("repl", 65536),
    ("ctime", -1),
    ("delay", True),
    ("queue", "q"),
    ("nodes_delivered", "a" * 40),
    ("nodes_delivered", ("A" * 40,)),
    ("parents", (b"x" * 48,)),
    ("on_parent_fail", 3),
    ("after", (b"x" * 48,)),
]


@pytest.mark.parametrize(("field", "value"), [*BAD_JOB_FIELDS, ("ttl", 0), ("ttl", None)])
@pytest.mark.parametrize("kind", [ReplJob, YourJobs])
def test_malformed_wire_job_raises_frame_error(kind: type, field: str, value: Any) -> None:
    """The codec checks a received job once, as it decodes the frame;
    job_from_wire then trusts it."""
    key = {f.name: f.key for f in records._WIRE_JOB}[field]
    msg = kind(GOOD_JOB) if kind is ReplJob else kind((GOOD_JOB,))
    body = _body(msg, j=_job_map(**{key: value}) if kind is ReplJob else [_job_map(), _job_map(**{key: value})])
    with pytest.raises(FrameError):
        decode_body(body)


@pytest.mark.parametrize(("field", "value"), [*BAD_JOB_FIELDS, ("etime", -1), ("etime", None)])
def test_malformed_stored_job_raises_decode_error(field: str, value: Any) -> None:
    with pytest.raises(DecodeError):
        job_from_storage(edit(GOOD_STORED, **{field: value}))


def test_decode_storage_rejects_other_versions_and_shapes() -> None:
    m = msgpack.unpackb(encode_storage(job_from_wire(GOOD_JOB, NOW_MS)), raw=False)
    for bad in ({**m, "v": STORAGE_VERSION + 1}, {k: v for k, v in m.items() if k != "v"}, [m]):
        with pytest.raises(DecodeError):
            decode_storage(msgpack.packb(bad, use_bin_type=True))


@fuzz
@given(jobs(), st.binary(max_size=64), st.integers(0), st.integers(0, 7))
def test_fuzz_decode_storage(job: Job, junk: bytes, pos: int, bit: int) -> None:
    """Garbage and damaged records decode to a Job or raise DecodeError."""
    data = bytearray(encode_storage(job))
    data[pos % len(data)] ^= 1 << bit
    for candidate in (junk, bytes(data), bytes(data[: pos % len(data)])):
        try:
            copy = decode_storage(candidate)
        except DecodeError:
            continue
        assert job_fields(decode_storage(encode_storage(copy))) == job_fields(copy)


def test_a_job_moved_between_nodes_many_times_keeps_its_expiry() -> None:
    # Regression (jepsen-lite): federation can move a job back and forth many
    # times during partitions; rounding the TTL up at every hop made it outlive
    # its TTL by seconds.
    job = Job(GOOD_ID, b"q", b"b", nodes_delivered=(HEADER.sender,), etime=NOW + 20)
    now = NOW_MS + 123
    for _ in range(100):
        now += 7  # transit and processing time of one hop
        job = job_from_wire(job_to_wire(job, now), now)
    assert job.etime == NOW + 20


def test_a_job_that_waited_in_a_stalled_link_keeps_its_expiry() -> None:
    # Regression (jepsen-lite): a REPLJOB held 8 s in a TCP connection stalled
    # by a partition arrived with its whole remaining TTL.
    job = Job(GOOD_ID, b"q", b"b", nodes_delivered=(HEADER.sender,), etime=NOW + 20)
    copy = job_from_wire(job_to_wire(job, NOW_MS), NOW_MS + 8_000)
    assert copy.etime == NOW + 20


announced = st.builds(lambda size, body: size.to_bytes(4, "big") + body, st.integers(0, 80_000), st.binary(max_size=2_000))


@fuzz
@given(st.lists(st.one_of(announced, st.binary(min_size=1, max_size=70_000)), min_size=1, max_size=12))
def test_fuzz_an_unidentified_connection_cannot_make_the_decoder_hold_more_than_a_first_frame(reads: list[bytes]) -> None:
    """The bus reads a connection that has sent no valid frame yet with a
    64 KB frame limit: whatever it sends, the decoder holds at most one such
    frame and one read before it yields a frame or refuses the stream."""
    decoder = FrameDecoder(64 * 1024)
    for data in reads:
        decoder.feed(data)
        try:
            while decoder.next_frame() is not None:
                pass
        except (FrameError, DecodeError):
            return
        assert len(decoder._buf) <= 4 + 64 * 1024 + len(data)


def test_deljob_says_when_the_job_went_unacknowledged() -> None:
    header = Header("a" * 40, 7711, 0)
    job_id = new_job_id("a" * 40, random.Random(1), 60, 30)
    assert decode_body(encode_body(header, DelJob(job_id, acked=False)))[1] == DelJob(job_id, acked=False)
    assert decode_body(encode_body(header, DelJob(job_id)))[1].acked is True


def test_queued_carries_a_nack_delay_and_reads_frames_without_one() -> None:
    header = Header("a" * 40, 7711, 0)
    job_id = new_job_id("a" * 40, random.Random(1), 60, 30)
    assert decode_body(encode_body(header, Queued(job_id, incr_nacks=True, delay=30)))[1] == Queued(job_id, incr_nacks=True, delay=30)
    plain = encode_body(header, Queued(job_id))
    assert b"\xa1d" not in plain  # left out when 0, so older nodes read it unchanged
    assert decode_body(plain)[1].delay == 0


def test_setack_carries_its_holders_and_reads_frames_without_them() -> None:
    header = Header("a" * 40, 7711, 0)
    job_id = new_job_id("a" * 40, random.Random(1), 60, 30)
    holders = ("a" * 40, "b" * 40)
    assert decode_body(encode_body(header, SetAck(job_id, 2, holders)))[1] == SetAck(job_id, 2, holders)
    plain = encode_body(header, SetAck(job_id, 0))
    assert b"\xa2hs" not in plain  # a dummy ACK's SETACK is what an older node sends
    assert decode_body(plain)[1] == SetAck(job_id, 0, ())


# --- checked gossip entries are remembered ---------------------------------------

entry_values = st.one_of(st.text(max_size=3), st.integers(-1, 2**33), st.booleans(), st.floats(allow_nan=False), st.none())


@fuzz
@given(st.lists(st.one_of(
    st.builds(lambda e: [e.node_id, e.ip, e.port, e.flags], st.builds(GossipEntry, node_ids, st.ip_addresses().map(str), ports, st.integers(0, 255))),
    st.lists(entry_values, min_size=3, max_size=5),
    st.tuples(node_ids, st.sampled_from(["1.2.3.400", "::1", "", "10.0.0.1"]), st.one_of(ports, st.just(True), st.just(1.0), st.just(-1)),
              st.one_of(st.integers(0, 2**33), st.just(False))).map(list),
), max_size=20))  # fmt: skip
def test_a_remembered_entry_is_what_checking_it_again_gives(items: list[list[Any]]) -> None:
    """Decoding through the memory of checked entries accepts and builds
    exactly what the plain check does, the second time as the first."""
    plain = records._Record(records._ArrayLoader(codec._GOSSIP_ENTRY), GossipEntry)
    known = codec._KnownEntries(plain)
    for item in items * 2:
        try:
            want: Any = plain.check(item)
        except DecodeError:
            with pytest.raises(DecodeError):
                known.check(item)
        else:
            got = known.check(item)
            assert got == want and type(got) is GossipEntry and type(got.port) is int and type(got.flags) is int


def test_remembered_entries_are_bounded_and_shared() -> None:
    plain = records._Record(records._ArrayLoader(codec._GOSSIP_ENTRY), GossipEntry)
    known = codec._KnownEntries(plain)
    first = known.check(["a" * 40, "10.0.0.1", 7711, 0])
    assert known.check(["a" * 40, "10.0.0.1", 7711, 0]) is first
    assert known.check(["a" * 40, "10.0.0.1", 7711, 4]) is not first  # another flag: another entry
    for i in range(codec.ENTRIES_KEPT + 10):
        known.check(["a" * 40, str(ipaddress.IPv4Address(i + 1)), 1, 0])
    assert len(known.known) == 12  # all forgotten once ENTRIES_KEPT were kept: 12 added since


@pytest.mark.parametrize("positional", [True, False])
def test_a_big_job_body_is_written_beside_its_frame_not_copied_into_it(positional: bool) -> None:
    """encode_parts: the same bytes as encode, a big REPLJOB body left as
    the very object it is; a small one, or a name that holds the mark, in one piece."""
    header = Header("a" * 40, 7711, 0)
    body = b"x" * codec.SPLICE_MIN
    big = ReplJob(job_to_wire(Job(GOOD_ID, b"q", body, nodes_delivered=(HEADER.sender,), etime=NOW + 60), NOW_MS))
    parts_codec, whole_codec = LinkCodec(), LinkCodec()
    parts_codec.positional = whole_codec.positional = positional
    parts = parts_codec.encode_parts(header, big)
    assert len(parts) == 4 and parts[2] is body
    assert b"".join(parts) == whole_codec.encode(header, big)
    assert LinkCodec().decode(b"".join(parts)) == (header, big)
    assert parts_codec.encode_parts(header, GotJob(GOOD_ID)) == [whole_codec.encode(header, GotJob(GOOD_ID))]
    odd = ReplJob(big.job | {"queue": codec._MARK})
    assert parts_codec.encode_parts(header, odd) == [whole_codec.encode(header, odd)]
