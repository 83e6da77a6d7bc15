"""Tests for the RESP front end's parser and encoder."""

from __future__ import annotations

import re

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.connection import Encoder, HiredisRespSerializer, PythonRespSerializer

from disque.core.config import split_args_bytes
from disque.core.errors import DisqueError, err
from disque.core.types import NIL_ARRAY, Map, Status
from disque.protocols.resp.parser import INLINE_MAX, MAX_BULK, MAX_MULTIBULK, QUERY_BUFFER_LIMIT, ProtocolError, RequestParser
from disque.protocols.resp.encoder import encode, encode_error


def pack(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def run(chunks: list[bytes]) -> tuple[list[list[bytes]], str | None]:
    """Feed chunks as a server would; the requests and the error, if any."""
    parser = RequestParser()
    commands: list[list[bytes]] = []
    for chunk in chunks:
        parser.feed(chunk)
        while True:
            try:
                argv = parser.next_command()
            except ProtocolError as exc:
                return commands, exc.message
            if argv is None:
                break
            commands.append(argv)
    return commands, None


def hiredis_reads(data: bytes) -> object:
    reader = hiredis.Reader()
    reader.feed(data)
    return reader.gets()


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def run_all_ways(data: bytes) -> tuple[list[list[bytes]], str | None]:
    """`run` on the whole input and byte by byte, which must agree."""
    result = run([data])
    assert run(bytewise(data)) == result
    return result


PING = pack(b"PING")
LONG_PIPELINE = b"".join(pack(b"SET", b"key%d" % i, b"v" * 40) for i in range(60))  # > 1 KiB


# ---------------------------------------------------------------------------
# An executable model: upstream's request reader over complete input, with
# the deviations the module docstring lists (CRLF line ends, eager
# "expected '$'", a bare LF ends an inline line).


def _model_int(text: bytes) -> int | None:
    if len(text) > 20 or not re.fullmatch(rb"-?[1-9][0-9]*|0", text):
        return None
    value = int(text)
    return value if -(2**63) <= value <= 2**63 - 1 else None


def upstream(data: bytes) -> tuple[list[list[bytes]], str | None]:
    """The requests upstream reads from `data`, then its error (None if it waits)."""
    commands: list[list[bytes]] = []
    pos, end = 0, len(data)
    while pos < end:
        if data[pos] != ord("*"):
            eol = data.find(b"\n", pos)
            if eol < 0:
                return commands, "Protocol error: too big inline request" if end - pos > INLINE_MAX else None
            line, pos = data[pos:eol].removesuffix(b"\r"), eol + 1
            try:
                argv = [a for a in split_args_bytes(line) if a]
            except ValueError:
                return commands, "Protocol error: unbalanced quotes in request"
            if argv:
                commands.append(argv)
            continue
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return commands, "Protocol error: too big mbulk count string" if end - pos > INLINE_MAX else None
        count = _model_int(data[pos + 1 : eol])
        if count is None or count > MAX_MULTIBULK:
            return commands, "Protocol error: invalid multibulk length"
        pos = eol + 2
        argv = []
        for _ in range(count):
            if pos == end:
                return commands, None
            if data[pos] != ord("$"):
                got = data[pos : pos + 1].decode("utf-8", "surrogateescape")
                return commands, f"Protocol error: expected '$', got '{got}'"
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                return commands, "Protocol error: too big bulk count string" if end - pos > INLINE_MAX else None
            size = _model_int(data[pos + 1 : eol])
            if size is None or not 0 <= size <= MAX_BULK:
                return commands, "Protocol error: invalid bulk length"
            if eol + 2 + size + 2 > end:
                return commands, None
            argv.append(data[eol + 2 : eol + 2 + size])
            pos = eol + 2 + size + 2
        if argv:
            commands.append(argv)
    return commands, None


# ---------------------------------------------------------------------------
# Requests


def test_multibulk_whole_and_bytewise() -> None:
    data = pack(b"ADDJOB", b"queue", b"body", b"0")
    assert run_all_ways(data) == ([[b"ADDJOB", b"queue", b"body", b"0"]], None)


def test_pipelined_batch() -> None:
    batch = [[b"GETJOB", b"NOHANG", b"FROM", b"q%d" % i] for i in range(16)]
    data = b"".join(pack(*argv) for argv in batch)
    assert run_all_ways(data) == (batch, None)
    assert run([data[:37], data[37:300], data[300:]]) == (batch, None)


def test_long_pipeline_in_uneven_chunks_keeps_the_copy_small() -> None:
    data = LONG_PIPELINE * 40
    expected = upstream(data)
    parser = RequestParser()
    got = []
    for i in range(0, len(data), 777):
        parser.feed(data[i : i + 777])
        while (argv := parser.next_command()) is not None:
            got.append(argv)
        assert parser.buffered() < 2048
        assert len(parser._buf) < 4096  # what is kept for re-reading stays small
    assert (got, None) == expected


def test_binary_safe_arguments() -> None:
    args = [b"a\r\nb", b"\r\n", b"", b"\x00\xff*$", b"$3\r\nabc\r\n"]
    assert run_all_ways(pack(*args)) == ([args], None)


def test_partial_request_waits() -> None:
    parser = RequestParser()
    data = pack(b"SET", b"k", b"v")
    for i in range(len(data) - 1):
        parser.feed(data[i : i + 1])
        assert parser.next_command() is None
    parser.feed(data[-1:])
    assert parser.next_command() == [b"SET", b"k", b"v"]
    assert parser.next_command() is None


def test_inline_requests() -> None:
    data = b"PING\r\nSET k  v\nGET\tk\r\n"
    assert run_all_ways(data) == ([[b"PING"], [b"SET", b"k", b"v"], [b"GET", b"k"]], None)


def test_inline_quotes() -> None:
    data = b'SET "a b" \'c d\' "\\x41\\n" \'it\\\'s\' x"y z"\r\n'
    assert run_all_ways(data) == ([[b"SET", b"a b", b"c d", b"A\n", b"it's", b"xy z"]], None)


def test_empty_inline_lines_and_arguments_are_skipped() -> None:
    data = b'\r\n\n   \r\n"" \'\'\r\nPING "" x\r\n'
    assert run_all_ways(data) == ([[b"PING", b"x"]], None)


def test_inline_line_stops_at_nul() -> None:
    assert run([b"PING\x00junk\r\n"]) == ([[b"PING"]], None)


def test_inline_then_multibulk_in_separate_feeds() -> None:
    assert run([b"PING\r\n", pack(b"GET", b"k")]) == ([[b"PING"], [b"GET", b"k"]], None)


def test_multibulk_then_inline_in_separate_feeds() -> None:
    assert run([pack(b"GET", b"k"), b"PING\r\n"]) == ([[b"GET", b"k"], [b"PING"]], None)


@pytest.mark.parametrize("inline", [b"PING\r\n", b"$5 x\r\n", b":1\r\n", b"-x\r\n", b"_\r\n", b"~0\r\n"])
def test_inline_after_multibulk_in_one_chunk(inline: bytes) -> None:
    data = PING + inline + PING
    expected = ([[b"PING"], inline.split(), [b"PING"]], None)
    assert run_all_ways(data) == expected
    assert run([PING + inline[:2], inline[2:] + PING]) == expected  # hiredis waits in the line
    assert run([LONG_PIPELINE + data]) == upstream(LONG_PIPELINE + data)


def test_alternating_inline_and_multibulk() -> None:
    data = (PING + b"ECHO x\r\n") * 500
    assert run([data]) == ([[b"PING"], [b"ECHO", b"x"]] * 500, None)


@pytest.mark.parametrize("header", [b"*0\r\n", b"*-1\r\n", b"*-5\r\n", b"*-9223372036854775808\r\n"])
def test_count_not_positive_is_ignored(header: bytes) -> None:
    assert run_all_ways(header + PING) == ([[b"PING"]], None)
    assert run_all_ways(PING + header + PING) == ([[b"PING"], [b"PING"]], None)
    assert run([LONG_PIPELINE + header + PING]) == upstream(LONG_PIPELINE + header + PING)


def test_maximum_sizes_are_accepted() -> None:
    assert run([b"*%d\r\n" % MAX_MULTIBULK]) == ([], None)
    assert run([b"*1\r\n$%d\r\n" % MAX_BULK]) == ([], None)
    assert run([b"x" * INLINE_MAX]) == ([], None)
    assert run([b"*" + b"1" * (INLINE_MAX - 1)]) == ([], None)


PROTOCOL_ERRORS = [
    (b"x" * (INLINE_MAX + 1), "Protocol error: too big inline request"),
    (b'SET "a\r\n', "Protocol error: unbalanced quotes in request"),
    (b"SET 'a'b\r\n", "Protocol error: unbalanced quotes in request"),
    (b"*" + b"1" * INLINE_MAX, "Protocol error: too big mbulk count string"),
    (b"*abc\r\n", "Protocol error: invalid multibulk length"),
    (b"*\r\n", "Protocol error: invalid multibulk length"),
    (b"*01\r\n", "Protocol error: invalid multibulk length"),
    (b"*+1\r\n", "Protocol error: invalid multibulk length"),
    (b"* 1\r\n", "Protocol error: invalid multibulk length"),
    (b"*-0\r\n", "Protocol error: invalid multibulk length"),
    (b"*%d\r\n" % (MAX_MULTIBULK + 1), "Protocol error: invalid multibulk length"),
    (b"*4294967295\r\n", "Protocol error: invalid multibulk length"),
    (b"*9223372036854775808\r\n", "Protocol error: invalid multibulk length"),
    (b"*-9223372036854775809\r\n", "Protocol error: invalid multibulk length"),
    (b"*1\r\n$" + b"1" * INLINE_MAX, "Protocol error: too big bulk count string"),
    (b"*3\r\n:1\r\n", "Protocol error: expected '$', got ':'"),
    (b"*2\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n", "Protocol error: expected '$', got '*'"),
    (b"*1\r\n*4294967295\r\n", "Protocol error: expected '$', got '*'"),
    (b"*1\r\n%1\r\n*1\r\n$1\r\na\r\n$1\r\nb\r\n", "Protocol error: expected '$', got '%'"),
    (b"*1\r\n|1\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n", "Protocol error: expected '$', got '|'"),
    (b"*1\r\n-err\r\n", "Protocol error: expected '$', got '-'"),
    (b"*1\r\n_\r\n", "Protocol error: expected '$', got '_'"),
    (b"*1\r\n?\r\n", "Protocol error: expected '$', got '?'"),
    (b"*1\r\n\r\n", "Protocol error: expected '$', got '\r'"),
    (b"*1\r\n\xff\r\n", "Protocol error: expected '$', got '\udcff'"),
    (b"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$-5\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$-0\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$abc\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$03\r\nabc\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$1\ra\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$%d\r\n" % (MAX_BULK + 1), "Protocol error: invalid bulk length"),
    (b"*1\r\n$9223372036854775808\r\n", "Protocol error: invalid bulk length"),
]


@pytest.mark.parametrize(("data", "message"), PROTOCOL_ERRORS)
def test_protocol_errors(data: bytes, message: str) -> None:
    assert run([data]) == ([], message)
    assert run(bytewise(data[:300]) + [data[300:]]) == ([], message)
    assert run([PING + data]) == ([[b"PING"]], message)
    assert run([LONG_PIPELINE + data]) == upstream(LONG_PIPELINE + data)
    assert upstream(data) == ([], message)


def test_protocol_error_reply() -> None:
    exc = ProtocolError("Protocol error: invalid bulk length")
    assert isinstance(exc, DisqueError)
    assert exc.message == "Protocol error: invalid bulk length"
    assert encode(exc) == b"-ERR Protocol error: invalid bulk length\r\n"
    assert encode(ProtocolError("Protocol error: expected '$', got '\r'")) == (
        b"-ERR Protocol error: expected '$', got ' '\r\n"
    )
    assert encode(ProtocolError("Protocol error: expected '$', got '\udcff'")) == (
        b"-ERR Protocol error: expected '$', got '\xff'\r\n"
    )


def test_parser_stays_dead_after_an_error() -> None:
    parser = RequestParser()
    parser.feed(b"*abc\r\n")
    with pytest.raises(ProtocolError) as first:
        parser.next_command()
    parser.feed(PING)
    with pytest.raises(ProtocolError) as again:
        parser.next_command()
    assert again.value == first.value and again.value is not first.value  # a new error each time
    assert parser.buffered() == 0


def test_buffered_counts_unparsed_input() -> None:
    assert QUERY_BUFFER_LIMIT == 1 << 30
    parser = RequestParser()
    parser.feed(b"PIN")
    assert parser.buffered() == 3
    assert parser.next_command() is None
    parser.feed(b"G\r\n" + PING[:5])
    assert parser.next_command() == [b"PING"]
    assert parser.next_command() is None
    assert parser.buffered() == 5
    parser.feed(PING[5:] + b"*1\r\n$100\r\n" + b"x" * 50)
    assert parser.next_command() == [b"PING"]
    assert parser.next_command() is None
    assert 60 <= parser.buffered() < 60 + 1024  # hiredis keeps up to 1 KiB it has read


def test_big_argument_is_not_kept_twice() -> None:
    parser = RequestParser()
    parser.feed(b"*2\r\n$3\r\nSET\r\n$100000\r\n")
    body = bytes(range(256)) * 400
    for i in range(0, 100000, 1000):
        parser.feed(body[i : i + 1000])
        assert parser.next_command() is None
        assert len(parser._buf) < 1000
    parser.feed(b"\r\n")
    assert parser.next_command() == [b"SET", body[:100000]]


def test_documented_deviation_simple_string_elements() -> None:
    data = b"*2\r\n$3\r\nGET\r\n+key\r\n"
    # hiredis reads `+key` as a string when the request arrives whole ...
    assert run([data]) == ([[b"GET", b"key"]], None)
    # ... and the re-reading done when it is cut gives upstream's error.
    assert run([data[:-3], data[-3:]]) == ([], "Protocol error: expected '$', got '+'")


# ---------------------------------------------------------------------------
# Inline splitting


@pytest.mark.parametrize(
    ("line", "args"),
    [
        (b"", []),
        (b" \t\v\f ", []),
        (b"a b", [b"a", b"b"]),
        (b"a\vb", [b"a\vb"]),
        (b'"a\\tb\\r\\n\\b\\a\\q\\"\\\\"', [b"a\tb\r\n\b\a" + b'q"\\']),
        (b'"\\x4a\\x4" "\\xzz"', [b"Jx4", b"xzz"]),
        (b"'a\\'b\\c'", [b"a'b\\c"]),
        (b'"a"\t"b"', [b"a", b"b"]),
        (b'""', [b""]),
        (b'a"b c"d', None),
        (b'"a"b', None),
        (b"'a", None),
        (b'"a\\', None),
        (b"a\x00 b", [b"a"]),
    ],
)
def test_split_inline(line: bytes, args: list[bytes] | None) -> None:
    if args is None:
        with pytest.raises(ValueError):
            split_args_bytes(line)
    else:
        assert split_args_bytes(line) == args


# ---------------------------------------------------------------------------
# Properties

arguments = st.lists(st.binary(max_size=20), min_size=1, max_size=10)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


@settings(max_examples=300)
@given(st.lists(arguments, max_size=8), st.data())
def test_canonical_requests_round_trip(argvs: list[list[bytes]], data: st.DataObject) -> None:
    stream = b"".join(pack(*argv) for argv in argvs)
    assert run(data.draw(chunked(stream))) == (argvs, None)


FRAGMENTS = [
    b"*0\r\n", b"*-1\r\n", b"*-5\r\n", b"\r\n", b"\n", b"*abc\r\n", b"*01\r\n", b"*1048577\r\n",
    b"*1\r\n:1\r\n", b"*2\r\n$1\r\na\r\n$-1\r\n", b"*1\r\n$abc\r\n", b"*1\r\n*1\r\n$1\r\na\r\n",
    b"*1\r\n%1\r\n$1\r\na\r\n$1\r\nb\r\n", b"*1\r\n$536870913\r\n", b"*1\r\n?\r\n", b"*1\r\n-err\r\n",
    b"*1\r\n_\r\n", b"*1\r\n~1\r\n$1\r\na\r\n", b"*1\r\n,1.5\r\n", b"*1\r\n#t\r\n",
    b"*1\r\n>1\r\n$1\r\na\r\n", b"*1\r\n|1\r\n$1\r\na\r\n$1\r\nb\r\n", b"*1\r\n*4294967295\r\n",
    b"*1\r\n%1\r\n*1\r\n$1\r\na\r\n$1\r\nb\r\n", b"$3\r\nabc\r\n", b":5\r\n", b"_\r\n", b"-x\r\n",
    b"~0\r\n", b"*1\r\n$3\r\nabcXY", b"*9223372036854775808\r\n", b"*-9223372036854775808\r\n",
    b"*1\r\n$-0\r\n", b"*2\r\n$1\r\na\r\n", b"*1\r", b"$", b"*",
]  # fmt: skip
TOKENS = [b"PING", b"a", b'"x y"', b"'q'", b'""', b"", b"\t", b'"\\x41"', b"\x00", b'"open', b"*", b"$3", b"\r"]
inline_lines = st.builds(
    lambda tokens, end: b" ".join(tokens) + end,
    st.lists(st.sampled_from(TOKENS), max_size=4),
    st.sampled_from([b"\r\n", b"\n"]),
)
streams = st.lists(
    st.one_of(
        arguments.map(lambda argv: pack(*argv)),
        inline_lines,
        st.sampled_from(FRAGMENTS),
        st.just(LONG_PIPELINE),
    ),
    max_size=10,
).map(b"".join)


@settings(max_examples=1000)
@given(streams, st.data())
def test_matches_upstream_model(stream: bytes, data: st.DataObject) -> None:
    expected = upstream(stream)
    assert run([stream]) == expected
    assert run(data.draw(chunked(stream))) == expected


garbage = st.one_of(
    st.binary(max_size=200),
    st.lists(
        st.sampled_from(
            [b"*", b"$", b"\r\n", b"\r", b"\n", b"1", b"2", b"-1", b"0", b"3", b":", b"+", b"(", b"=",
             b"%", b"~", b">", b"|", b"_", b"#", b",", b"abc", b'"', b"'", b" ", b"\\x41", b"\x00"]
        ),
        max_size=60,
    ).map(b"".join),
)  # fmt: skip


@settings(max_examples=1000)
@given(garbage, st.data())
def test_garbage_yields_argvs_or_protocol_errors(stream: bytes, data: st.DataObject) -> None:
    parser = RequestParser()
    for chunk in data.draw(chunked(stream)):
        parser.feed(chunk)
        for _ in range(len(stream) + 1):
            try:
                argv = parser.next_command()
            except ProtocolError as exc:
                assert exc.message.startswith("Protocol error: ")
                return
            if argv is None:
                break
            assert type(argv) is list and argv
            assert all(type(arg) is bytes for arg in argv)
        else:
            pytest.fail("more requests than input bytes")


redis_args = st.lists(
    st.one_of(
        st.binary(max_size=30),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=10),
        st.integers(),
        st.floats(allow_nan=False),
    ),
    max_size=6,
)
redis_encoder = Encoder("utf-8", "strict", False)


@settings(max_examples=300)
@given(st.binary(max_size=10).filter(lambda name: b" " not in name), redis_args, st.data())
def test_redis_py_packers_round_trip(name: bytes, args: list[object], data: st.DataObject) -> None:
    expected = [name, *map(redis_encoder.encode, args)]
    for serializer in (PythonRespSerializer(100, redis_encoder.encode), HiredisRespSerializer()):
        pieces = [bytes(piece) for piece in serializer.pack(name, *args)]
        assert run(pieces) == ([expected], None)
        assert run(data.draw(chunked(b"".join(pieces)))) == ([expected], None)


def test_hiredis_behaviour_relied_upon() -> None:
    """hiredis drops consumed input once it has read 1 KiB; resp.py uses the
    drop to learn where a request ended (and still works without it)."""
    reader = hiredis.Reader()
    reader.feed(LONG_PIPELINE)
    consumed = 0
    while reader.len() == len(LONG_PIPELINE):
        argv = reader.gets()
        consumed += len(pack(*argv))
    assert consumed >= 1024
    assert reader.len() == len(LONG_PIPELINE) - consumed


# ---------------------------------------------------------------------------
# Replies


@pytest.mark.parametrize(
    ("value", "resp2", "resp3"),
    [
        (Status(b"OK"), b"+OK\r\n", b"+OK\r\n"),
        (0, b":0\r\n", b":0\r\n"),
        (-42, b":-42\r\n", b":-42\r\n"),
        (2**63 - 1, b":9223372036854775807\r\n", b":9223372036854775807\r\n"),
        (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
        (b"a\r\nb", b"$4\r\na\r\nb\r\n", b"$4\r\na\r\nb\r\n"),
        ("é", b"$2\r\n\xc3\xa9\r\n", b"$2\r\n\xc3\xa9\r\n"),
        ("\udcff", b"$1\r\n\xff\r\n", b"$1\r\n\xff\r\n"),
        (None, b"$-1\r\n", b"_\r\n"),
        (NIL_ARRAY, b"*-1\r\n", b"_\r\n"),
        ([], b"*0\r\n", b"*0\r\n"),
        ((b"a", 1), b"*2\r\n$1\r\na\r\n:1\r\n", b"*2\r\n$1\r\na\r\n:1\r\n"),
        (Map(), b"*0\r\n", b"%0\r\n"),
        (Map([(b"k", 1), ("v", None)]), b"*4\r\n$1\r\nk\r\n:1\r\n$1\r\nv\r\n$-1\r\n", b"%2\r\n$1\r\nk\r\n:1\r\n$1\r\nv\r\n_\r\n"),
        (err("syntax error"), b"-ERR syntax error\r\n", b"-ERR syntax error\r\n"),
        (DisqueError("NOJOB", "a\r\nb"), b"-NOJOB a  b\r\n", b"-NOJOB a  b\r\n"),
    ],
)  # fmt: skip
def test_encode(value: object, resp2: bytes, resp3: bytes) -> None:
    assert encode(value) == resp2
    assert encode(value, 2) == resp2
    assert encode(value, 3) == resp3
    assert encode([value, [value]], 3) == b"*2\r\n" + resp3 + b"*1\r\n" + resp3


def test_encode_getjob_reply() -> None:
    jobs = [[b"q", b"D" * 48, b"body\r\n"], [b"q2", b"E" * 48, b""]]
    assert encode(jobs) == (
        b"*2\r\n*3\r\n$1\r\nq\r\n$48\r\n" + b"D" * 48 + b"\r\n$6\r\nbody\r\n\r\n"
        b"*3\r\n$2\r\nq2\r\n$48\r\n" + b"E" * 48 + b"\r\n$0\r\n\r\n"
    )
    assert hiredis_reads(encode(jobs)) == jobs


def test_encode_lengths_past_the_cached_length_lines() -> None:
    big = b"x" * 5000
    assert encode([big, [big]]) == b"*2\r\n$5000\r\n" + big + b"\r\n*1\r\n$5000\r\n" + big + b"\r\n"
    many = [b"a"] * 3000
    assert encode([many]) == b"*1\r\n*3000\r\n" + b"$1\r\na\r\n" * 3000
    assert hiredis_reads(encode([many, big])) == [many, big]
    assert encode(Map([(big, 1)])) == b"*2\r\n$5000\r\n" + big + b"\r\n:1\r\n"


def test_encode_nested() -> None:
    value = [Map([(b"jobs", [[b"a", 1, None], NIL_ARRAY]), (Status(b"s"), err("x"))]), "t", ()]
    top = hiredis_reads(encode(value))
    assert top[0][:3] == [b"jobs", [[b"a", 1, None], None], b"s"]
    assert isinstance(top[0][3], hiredis.ReplyError)
    assert top[1:] == [b"t", []]
    assert encode(value, 3) == (
        b"*3\r\n%2\r\n$4\r\njobs\r\n*2\r\n*3\r\n$1\r\na\r\n:1\r\n_\r\n_\r\n+s\r\n-ERR x\r\n"
        b"$1\r\nt\r\n*0\r\n"
    )


def test_encode_int_subclass() -> None:
    class Code(int):
        pass

    assert encode(Code(7)) == b":7\r\n"
    assert encode([Code(7)], 3) == b"*1\r\n:7\r\n"


@pytest.mark.parametrize("value", [True, False, 1.5, {b"a": 1}, {1}, bytearray(b"x"), object()])
def test_encode_rejects_other_types(value: object) -> None:
    with pytest.raises(TypeError):
        encode(value)
    with pytest.raises(TypeError):
        encode([value], 3)


def test_encode_error() -> None:
    assert encode_error("max number of clients reached") == b"-ERR max number of clients reached\r\n"
    assert encode_error("a\r\nb") == b"-ERR a  b\r\n"


def test_nil_array_repr() -> None:
    assert repr(NIL_ARRAY) == "NIL_ARRAY"
