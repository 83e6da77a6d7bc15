"""The wire protocol of a real node, byte for byte (spec/commands.md §1.1, §1.3)."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable

import pytest

from disque.testing.devcluster import NodeProcess
from integration.rawsock import Raw, blocked_on, pack, q, raw, reply_end, rss, shared_node  # noqa: F401
from support import wait_for

RawFactory = Callable[..., Raw]
KIB64 = 64 * 1024

# Malformed requests and the error each gets (spec/commands.md §1.3).
MALFORMED = [
    (b"a" * (KIB64 + 1), "too big inline request"),
    (b'ECHO "abc\r\n', "unbalanced quotes in request"),
    (b"ECHO 'abc\r\n", "unbalanced quotes in request"),
    (b'ECHO "a"b\r\n', "unbalanced quotes in request"),
    (b"*" + b"1" * (KIB64 + 1), "too big mbulk count string"),
    (b"*abc\r\n", "invalid multibulk length"),
    (b"*1048577\r\n", "invalid multibulk length"),
    (b"*1\r\n$" + b"1" * (KIB64 + 1), "too big bulk count string"),
    (b"*1\r\nPING\r\n", "expected '$', got 'P'"),
    (b"*2\r\n$4\r\nECHO\r\n:1\r\n", "expected '$', got ':'"),
    (b"*1\r\n$-1\r\n", "invalid bulk length"),
    (b"*1\r\n$abc\r\n", "invalid bulk length"),
    (b"*1\r\n$536870913\r\n", "invalid bulk length"),
    (b"*2\r\n$4\r\nECHO\r\n$x\r\n", "invalid bulk length"),
]


# ---------------------------------------------------------------- reply encodings


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (("PING",), b"+PONG\r\n"),  # status
        (("PING", "hi"), b"$2\r\nhi\r\n"),  # bulk
        (("NOSUCH",), b"-ERR unknown command 'NOSUCH'\r\n"),  # error
        (("QLEN", "nosuch-queue"), b":0\r\n"),  # integer
        (("SHOW", "DI" + "0" * 44 + "SQ"), b"$-1\r\n"),  # nil bulk
        (("QPEEK", "nosuch-queue", 5), b"*0\r\n"),  # empty array
        (("QSTAT", "nosuch-queue"), b"*-1\r\n"),  # nil array
        (("ECHO", b"\x00\xff\r\n"), b"$4\r\n\x00\xff\r\n\r\n"),  # binary safe
    ],
)
def test_reply_encodings(raw: RawFactory, request_: tuple, expected: bytes) -> None:
    assert raw().call_raw(*request_) == expected


def test_error_text_from_user_input_has_no_line_breaks(raw: RawFactory) -> None:
    assert raw().call_raw("NO\r\nSUCH") == b"-ERR unknown command 'NO  SUCH'\r\n"


def test_resp3_switch_changes_nil_and_map_encodings(raw: RawFactory) -> None:
    conn = raw()
    unknown = "DI" + "0" * 44 + "SQ"
    assert conn.call_raw("HELLO", 3).startswith(b"%")
    assert conn.call_raw("SHOW", unknown) == b"_\r\n"
    assert conn.call_raw("QSTAT", "nosuch-queue") == b"_\r\n"
    assert conn.call_raw("CONFIG", "GET", "hz") == b"%1\r\n$2\r\nhz\r\n$2\r\n10\r\n"
    assert conn.call_raw("HELLO").startswith(b"*3\r\n:1\r\n")  # bare HELLO keeps Disque's reply
    assert conn.call_raw("HELLO", 2).startswith(b"*16\r\n")
    assert conn.call_raw("SHOW", unknown) == b"$-1\r\n"
    assert conn.call_raw("CONFIG", "GET", "hz") == b"*2\r\n$2\r\nhz\r\n$2\r\n10\r\n"


# ---------------------------------------------------------------- pipelining


def test_pipelined_batch_gets_every_reply_in_order(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    conn.send(
        b"PING\r\n"
        + pack("ECHO", "a")
        + pack("ADDJOB", q, "body", 0)
        + b"QLEN " + q + b"\r\n"
        + pack("GETJOB", "NOHANG", "FROM", q)
        + pack("GETJOB", "NOHANG", "FROM", q)
        + pack("nope")
        + pack("QLEN")
        + b"PING last\r\n"
    )  # fmt: skip
    replies = [conn.read_raw() for _ in range(9)]
    job_id = replies[2][1:-2]
    assert replies[:2] == [b"+PONG\r\n", b"$1\r\na\r\n"]
    assert len(job_id) == 48 and replies[3] == b":1\r\n"
    assert replies[4] == b"*1\r\n*3\r\n$%d\r\n%s\r\n$48\r\n%s\r\n$4\r\nbody\r\n" % (len(q), q, job_id)
    assert replies[5:] == [
        b"*-1\r\n",
        b"-ERR unknown command 'nope'\r\n",
        b"-ERR wrong number of arguments for 'qlen' command\r\n",
        b"$4\r\nlast\r\n",
    ]


def test_large_pipeline(raw: RawFactory) -> None:
    conn = raw()
    n = 20_000
    conn.send((pack("PING") + b"PING\r\n") * (n // 2))
    received = b""
    while len(received) < 7 * n:
        received += conn._recv()
    assert received == b"+PONG\r\n" * n


def test_pipeline_resumes_after_a_blocked_getjob(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    conn.send(pack("GETJOB", "TIMEOUT", 50, "FROM", q) + b"PING\r\n")
    assert conn.read_raw() == b"*-1\r\n"
    assert conn.read_raw() == b"+PONG\r\n"


def test_pipeline_resumes_after_being_served(raw: RawFactory, q: bytes) -> None:
    conn, producer = raw(), raw()
    conn.send(pack("GETJOB", "FROM", q) + b"ECHO after\r\n")
    wait_for(lambda: blocked_on(producer, q) == 1, what="client blocked")
    job_id = producer.call("ADDJOB", q, "x", 0)
    assert conn.read() == [[q, job_id.encode(), b"x"]]
    assert conn.read_raw() == b"$5\r\nafter\r\n"


def test_binary_safe_bodies_and_names(raw: RawFactory) -> None:
    conn = raw()
    queue, body = b"q\x00\r\n\xff", bytes(range(256)) * 4096  # 1 MiB
    job_id = conn.call("ADDJOB", queue, body, 0)
    assert conn.call("GETJOB", "FROM", queue) == [[queue, job_id.encode(), body]]


def test_request_split_into_single_bytes(raw: RawFactory) -> None:
    conn = raw()
    for byte in pack("ECHO", "split") + b"ECHO inline\r\n":
        conn.send(bytes([byte]))
    assert conn.read_raw() == b"$5\r\nsplit\r\n"
    assert conn.read_raw() == b"$6\r\ninline\r\n"


@pytest.mark.parametrize("seed", range(12))
def test_random_pipelines_in_random_chunks(raw: RawFactory, seed: int) -> None:
    """Inline and multibulk requests of many sizes, ignored empty requests,
    then maybe a malformed one, cut at random points."""
    rng = random.Random(seed)
    requests, replies = [], []
    for _ in range(rng.randrange(1, 40)):
        kind = rng.random()
        if kind < 0.3:
            word = bytes(rng.choices(b"abcdefgh", k=rng.randrange(1, 30)))
            requests.append(b"ECHO " + word + rng.choice([b"\r\n", b"\n"]))
        elif kind < 0.4:
            requests.append(rng.choice([b"*0\r\n", b"*-1\r\n", b"\r\n"]))
            continue
        else:
            word = rng.randbytes(rng.choice([0, 1, 10, 1000, 1500, 5000, 70_000]))
            requests.append(pack("ECHO", word))
        replies.append(b"$%d\r\n%s\r\n" % (len(word), word))
    error = None
    if seed % 2:
        payload, error = rng.choice(MALFORMED)
        requests.append(payload)
    data = b"".join(requests)
    conn = raw()
    pos = 0
    while pos < len(data):
        step = rng.choice([1, 3, 7, 100, 1024, 4096, 65536, len(data)])
        conn.send(data[pos : pos + step])
        pos += step
    assert [conn.read_raw() for _ in replies] == replies
    if error:
        assert conn.read_until_closed() == b"-ERR Protocol error: %s\r\n" % error.encode()
    else:
        assert conn.call_raw("PING") == b"+PONG\r\n"


# ---------------------------------------------------------------- inline commands


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"PING\r\n", b"+PONG\r\n"),
        (b"ping\n", b"+PONG\r\n"),  # LF alone ends a line
        (b"  \t PING  \r\n", b"+PONG\r\n"),
        (b'ECHO "a b"\r\n', b"$3\r\na b\r\n"),
        (b"ECHO 'a b'\r\n", b"$3\r\na b\r\n"),
        (b'ECHO "\\x41\\n\\t\\"\\\\"\r\n', b'$5\r\nA\n\t"\\\r\n'),
        (b"ECHO 'it\\'s'\r\n", b"$4\r\nit's\r\n"),
        (b'ECHO ""\r\n', b"-ERR wrong number of arguments for 'echo' command\r\n"),  # empty args dropped
        (b"ECHO a b\r\n", b"-ERR wrong number of arguments for 'echo' command\r\n"),
        (b"\r\n\n  \r\nPING\r\n", b"+PONG\r\n"),  # empty lines are skipped
    ],
)
def test_inline_commands(raw: RawFactory, line: bytes, expected: bytes) -> None:
    conn = raw()
    conn.send(line)
    assert conn.read_raw() == expected
    assert conn.call_raw("PING") == b"+PONG\r\n"  # nothing else was pending


def test_inline_addjob_and_getjob(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    conn.send(b'ADDJOB %s "hello world" 0\r\n' % q)
    job_id = conn.read_raw()[1:-2]
    conn.send(b"GETJOB FROM %s\r\n" % q)
    assert conn.read() == [[q, job_id, b"hello world"]]


# ---------------------------------------------------------------- protocol errors


@pytest.mark.parametrize(("payload", "error"), MALFORMED)
def test_protocol_error_replies_then_closes(raw: RawFactory, payload: bytes, error: str) -> None:
    conn = raw()
    conn.send(b"PING\r\n" + payload)
    expected = b"+PONG\r\n-ERR Protocol error: %s\r\n" % error.encode()
    assert conn.read_until_closed() == expected
    assert raw().call_raw("PING") == b"+PONG\r\n"


@pytest.mark.parametrize("payload", [b"*1048576\r\n", b"*1\r\n$536870912\r\n"], ids=["max-count", "max-bulk"])
def test_largest_legal_headers_are_accepted(raw: RawFactory, payload: bytes) -> None:
    conn = raw()
    conn.send(payload)
    assert conn.silent_for(0.2)  # waiting for the rest: no error, no close


@pytest.mark.parametrize("header", [b"*0\r\n", b"*-1\r\n", b"*-42\r\n"])
def test_multibulk_count_not_positive_is_ignored(raw: RawFactory, header: bytes) -> None:
    conn = raw()
    conn.send(header + header + b"PING\r\n")
    assert conn.read_raw() == b"+PONG\r\n"
    assert conn.silent_for(0.05)


@pytest.mark.parametrize("seed", range(16))
def test_binary_garbage_never_kills_the_server(raw: RawFactory, seed: int) -> None:
    rng = random.Random(seed)
    garbage = rng.randbytes(rng.randrange(1, 8192))
    if seed % 2:
        garbage = b"*%d\r\n" % rng.randrange(1, 5) + garbage  # garbage inside a multibulk
    conn = raw()
    conn.send(garbage + b"\r\n")
    received = b""
    conn.sock.settimeout(0.05)
    try:
        while chunk := conn.sock.recv(1 << 16):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    pos = 0
    while pos < len(received):  # whatever came back is well-formed RESP
        end = reply_end(received, pos)
        assert end is not None, received
        pos = end
    conn.close()
    assert raw().call_raw("PING") == b"+PONG\r\n"


# ---------------------------------------------------------------- refused requests


def test_refused_requests_leave_memory_flat(spawn: Callable[..., NodeProcess], raw: RawFactory) -> None:
    """1,000 refused 1 MB requests leave the node's memory where it was: an
    error must not keep the request it refused alive."""
    node = spawn()
    conn = raw(node)
    request = pack("ADDJOB", "q", b"x" * (1 << 20), 0, "BOGUSOPTION")
    refused = b"-ERR syntax error\r\n"
    for _ in range(20):  # the allocator settles on its working set
        conn.send(request)
        assert conn.read_raw() == refused
    before = rss(node.pid)
    for i in range(1, 1001):
        conn.send(request)
        assert conn.read_raw() == refused
        if i % 50 == 0:  # fail early rather than grow by a gigabyte
            grown = rss(node.pid) - before
            assert grown < 30 << 20, f"RSS grew by {grown >> 20} MB after {i} refused requests"
    assert conn.call("QLEN", "q") == 0


# ---------------------------------------------------------------- QUIT, disconnects


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"QUIT\r\n", b"+OK\r\n"),
        (pack("quit", "extra", "args"), b"+OK\r\n"),
        (b"QUIT\r\nPING\r\n" + pack("ADDJOB", "after-quit", "x", 0), b"+OK\r\n"),  # nothing after QUIT runs
        (pack("GETJOB", "TIMEOUT", 50, "FROM", "after-quit") + b"QUIT\r\nPING\r\n", b"*-1\r\n+OK\r\n"),
    ],
    ids=["inline", "with-args", "pipelined", "after-blocking"],
)
def test_quit_replies_ok_and_closes(raw: RawFactory, payload: bytes, expected: bytes) -> None:
    conn = raw()
    conn.send(payload)
    assert conn.read_until_closed() == expected
    assert raw().call("QLEN", "after-quit") == 0


@pytest.mark.parametrize("cut", [1, 12, -1, -100_000], ids=["header", "mid-length", "last-byte", "mid-bulk"])
def test_disconnect_mid_command(raw: RawFactory, q: bytes, cut: int) -> None:
    request = pack("ADDJOB", q, b"x" * 200_000, 0)
    partial = raw()
    partial.send(request[:cut])
    other = raw()
    assert other.call_raw("PING") == b"+PONG\r\n"  # a half request holds up nobody
    partial.close()
    assert other.call_raw("PING") == b"+PONG\r\n"
    assert other.call("QLEN", q) == 0


def test_disconnect_while_blocked_in_getjob(raw: RawFactory, q: bytes) -> None:
    first, second, other = raw(), raw(), raw()
    first.send(pack("GETJOB", "FROM", q))
    wait_for(lambda: blocked_on(other, q) == 1, what="first client blocked")
    second.send(pack("GETJOB", "FROM", q))
    wait_for(lambda: blocked_on(other, q) == 2, what="second client blocked")
    first.close()
    wait_for(lambda: blocked_on(other, q) == 1, what="first client gone")
    job_id = other.call("ADDJOB", q, "job1", 0)
    assert second.read() == [[q, job_id.encode(), b"job1"]]
    second.close()
    wait_for(lambda: blocked_on(other, q) == 0, what="second client gone")
    job_id = other.call("ADDJOB", q, "job2", 0)
    assert other.call("QLEN", q) == 1  # not handed to a dead client
    assert other.call("GETJOB", "NOHANG", "FROM", q) == [[q, job_id.encode(), b"job2"]]


def test_peer_reset_while_blocked(raw: RawFactory, q: bytes) -> None:
    conn, other = raw(), raw()
    conn.send(pack("GETJOB", "FROM", q))
    wait_for(lambda: blocked_on(other, q) == 1, what="client blocked")
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()  # RST instead of FIN
    wait_for(lambda: blocked_on(other, q) == 0, what="client gone")
    other.call("ADDJOB", q, "x", 0)
    assert other.call("QLEN", q) == 1


def test_many_blocked_clients_each_get_one_job(raw: RawFactory, q: bytes) -> None:
    consumers, producer = [raw() for _ in range(20)], raw()
    for conn in consumers:
        conn.send(pack("GETJOB", "COUNT", 3, "FROM", q))
    wait_for(lambda: blocked_on(producer, q) == 20, what="20 blocked clients")
    producer.send(b"".join(pack("ADDJOB", q, f"job{i}", 0) for i in range(25)))
    ids = {producer.read_raw()[1:-2] for _ in range(25)}
    got = [conn.read() for conn in consumers]
    assert all(len(reply) == 1 for reply in got)
    served = {reply[0][1] for reply in got}
    assert len(served) == 20 and served <= ids
    assert producer.call("QLEN", q) == 5


def test_a_client_that_does_not_read_holds_up_nobody(raw: RawFactory, q: bytes) -> None:
    hog, other = raw(), raw()
    other.call("ADDJOB", q, b"x" * 10_000, 0)
    hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.sock.setblocking(False)
    request = pack("QPEEK", q, 1)
    sent = 0
    try:
        for _ in range(2000):  # ~20 MB of replies that are never read
            sent += hog.sock.send(request)
    except BlockingIOError:
        pass
    assert sent > 0
    for _ in range(3):
        assert other.call_raw("PING") == b"+PONG\r\n"
    hog.close()
    assert other.call("QLEN", q) == 1


def test_client_kill_of_a_blocked_client_loses_no_job(raw: RawFactory, q: bytes) -> None:
    blocked, other = raw(), raw()
    blocked_id = blocked.call("CLIENT", "ID")
    blocked.send(pack("GETJOB", "FROM", q))
    wait_for(lambda: blocked_on(other, q) == 1, what="client blocked")
    assert other.call("CLIENT", "KILL", "ID", blocked_id) == 1
    assert blocked.read_until_closed() == b""
    assert blocked_on(other, q) == 0
    other.call("ADDJOB", q, "x", 0)
    assert other.call("QLEN", q) == 1


def test_idle_clients_are_closed_after_timeout(spawn: Callable[..., NodeProcess], raw: RawFactory, q: bytes) -> None:
    node = spawn("--timeout", "1")
    idle, blocked = raw(node), raw(node)
    assert idle.call("PING") == "PONG"
    blocked.send(pack("GETJOB", "FROM", q))
    assert idle.read_until_closed(timeout=2.5) == b""
    assert raw(node).call("QLEN", q) == 0 and blocked.silent_for(0.01)  # blocked clients are exempt


# ---------------------------------------------------------------- maxclients


def test_maxclients(spawn: Callable[..., NodeProcess], raw: RawFactory) -> None:
    node = spawn("--maxclients", "2")
    first = raw(node)
    wait_for(lambda: b"connected_clients:1\r\n" in first.call("INFO", "clients"), what="start-up client gone")
    second = raw(node)
    assert second.call_raw("PING") == b"+PONG\r\n"
    third = raw(node)
    assert third.read_until_closed() == b"-ERR max number of clients reached\r\n"
    assert b"rejected_connections:1\r\n" in first.call("INFO", "stats")
    second.close()
    wait_for(lambda: b"connected_clients:1\r\n" in first.call("INFO", "clients"), what="second client gone")
    fourth = raw(node)
    assert fourth.call_raw("PING") == b"+PONG\r\n"
    assert first.call_raw("CONFIG", "SET", "maxclients", 3) == b"+OK\r\n"
    assert raw(node).call_raw("PING") == b"+PONG\r\n"
    assert raw(node).read_until_closed() == b"-ERR max number of clients reached\r\n"


# ---------------------------------------------------------------- output the kernel does not take at once


def test_large_replies_to_a_slow_reader_arrive_whole_and_in_order(raw: RawFactory, q: bytes) -> None:
    other = raw()
    bodies = [b"%02d" % i * 50_000 for i in range(20)]  # 2 MB per QPEEK reply
    other.send(b"".join(pack("ADDJOB", q, body, 0) for body in bodies))
    ids = [other.read() for _ in bodies]
    reader = raw()
    reader.send(pack("QPEEK", q, 20) * 5 + pack("PING", "after"))
    # 10 MB is more than the socket buffers hold while the reader does not
    # read: the node sends what the kernel takes and serves the others meanwhile.
    assert other.call_raw("PING") == b"+PONG\r\n"
    assert other.call("QLEN", q) == 20
    wait_for(lambda: b"client_longest_output_list:1\r\n" in other.call("INFO", "clients"), what="output pending")
    for _ in range(5):
        assert reader.read() == [[q, job_id.encode(), body] for job_id, body in zip(ids, bodies)]
    assert reader.read() == b"after"
    assert reader.call_raw("PING") == b"+PONG\r\n"  # back to reading requests


def test_client_that_closes_with_unsent_output_is_forgotten(raw: RawFactory, q: bytes) -> None:
    other = raw()
    other.call("ADDJOB", q, b"x" * 500_000, 0)
    clients = lambda: int(other.call("INFO", "clients").split(b"connected_clients:")[1].split(b"\r\n")[0])  # noqa: E731
    baseline = clients()
    for reset in (False, True):
        hog = raw()
        hog.send(pack("QPEEK", q, 1) * 40)  # 20 MB of replies that are never read
        wait_for(lambda: clients() == baseline + 1, what="the hog to connect")
        if reset:
            hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        hog.close()
        wait_for(lambda: clients() == baseline, what="the hog to be forgotten")
    assert other.call("QLEN", q) == 1


def test_many_clients_at_once(raw: RawFactory, q: bytes) -> None:
    conns = [raw() for _ in range(300)]
    for i, conn in enumerate(conns):
        conn.send(pack("ADDJOB", q, b"job%d" % i, 0) + pack("PING", b"c%d" % i))
    ids = set()
    for i, conn in enumerate(conns):
        ids.add(conn.read())
        assert conn.read() == b"c%d" % i
    assert len(ids) == 300
    for conn in conns:
        conn.send(pack("GETJOB", "NOHANG", "FROM", q))
    bodies = {conn.read()[0][2] for conn in conns}
    assert bodies == {b"job%d" % i for i in range(300)}


def test_client_pause_holds_other_clients_commands(raw: RawFactory, q: bytes) -> None:
    admin, other = raw(), raw()
    assert admin.call_raw("CLIENT", "PAUSE", 300) == b"+OK\r\n"
    started = time.monotonic()
    other.send(pack("ADDJOB", q, "paused", 0) + pack("QLEN", q))
    assert other.read_raw().startswith(b"+DI")
    assert other.read() == 1
    assert time.monotonic() - started >= 0.25
