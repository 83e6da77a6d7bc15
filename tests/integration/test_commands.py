"""Every client command of spec/commands.md on one real node, with exact RESP2
replies where the spec fixes them, and the error catalogue (§10) entries
that apply to a single node."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from disque.testing.devcluster import NodeProcess, free_port
from integration.rawsock import NIL, Error, Raw, Status, as_dict, blocked_on, q, raw, shared_node  # noqa: F401
from support import wait_for

RawFactory = Callable[..., Raw]
Spawn = Callable[..., NodeProcess]

UNKNOWN_ID = "DI" + "0" * 40 + "05a1" + "SQ"  # well formed, never created
BAD_IDS = ["DI" + "0" * 45 + "SQ", "DI" + "0" * 43 + "SQ", "DX" + "0" * 44 + "SQ", "DI" + "0" * 44 + "SX", "x"]
BADID = Error("BADID Invalid Job ID format.")
SYNTAX = Error("ERR syntax error")
NOT_INT = Error("ERR value is not an integer or out of range")
BAD_CURSOR = Error("ERR invalid cursor or option name")


def arity_error(name: str) -> Error:
    return Error(f"ERR wrong number of arguments for '{name}' command")


def add(conn: Raw, queue: bytes, body: str = "body", *opts: Any) -> bytes:
    reply = conn.call("ADDJOB", queue, body, 0, *opts)
    assert isinstance(reply, Status), reply
    return reply.encode()


def show(conn: Raw, job_id: bytes) -> dict[bytes, Any]:
    return as_dict(conn.call("SHOW", job_id))


def my_id(conn: Raw) -> bytes:
    return conn.call("CLUSTER", "MYID")


def run_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "disque", *args], capture_output=True, timeout=10, check=False)


@pytest.fixture(scope="module")
def scratch_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node whose settings tests may change (CONFIG SET)."""
    port = free_port()
    node = NodeProcess(port, tmp_path_factory.mktemp("scratch") / f"node-{port}").start()
    yield node
    node.stop()


# ---------------------------------------------------------------- command table (§3, §9.11)

SPEC_TABLE = [
    ("auth", 2, "readonly loading fast"),
    ("ping", -1, "readonly fast"),
    ("info", -1, "readonly loading"),
    ("shutdown", -1, "readonly admin loading"),
    ("monitor", 1, "readonly admin"),
    ("debug", -2, "admin"),
    ("config", -2, "readonly admin"),
    ("cluster", -2, "readonly admin"),
    ("client", -2, "readonly admin"),
    ("slowlog", -2, "readonly"),
    ("time", 1, "readonly fast"),
    ("command", 0, "readonly loading"),
    ("latency", -2, "readonly admin loading"),
    # HELLO also takes the Redis handshake form `HELLO <protover> ...`, which
    # must work while loading too, hence -1 and `loading` (spec: 1, r F).
    ("hello", -1, "readonly loading fast"),
    ("addjob", -4, "write denyoom fast"),
    ("getjob", -2, "write fast"),
    ("ackjob", -1, "write fast"),
    ("fastack", -1, "write fast"),
    ("deljob", -1, "write fast"),
    ("show", 2, "readonly fast"),
    ("loadjob", 2, "write"),
    ("bgrewriteaof", 1, "readonly admin"),
    ("qlen", 2, "readonly fast"),
    ("qpeek", 3, "readonly"),
    ("qstat", 2, "readonly fast"),
    ("qscan", -1, "readonly"),
    ("jscan", -1, "readonly"),
    ("enqueue", -1, "write denyoom fast"),
    ("nack", -1, "write denyoom fast"),
    ("dequeue", -1, "write fast"),
    ("working", 2, "write fast"),
    ("pause", -3, "readonly fast"),
]


@pytest.mark.parametrize(("name", "arity", "flags"), SPEC_TABLE, ids=[row[0] for row in SPEC_TABLE])
def test_command_info_matches_the_spec_table(raw: RawFactory, name: str, arity: int, flags: str) -> None:
    entry = [name.encode(), arity, [Status(f) for f in flags.split()], 0, 0, 0]
    assert raw().call("COMMAND", "INFO", name.upper()) == [entry]


def test_command_replies(raw: RawFactory) -> None:
    conn = raw()
    assert conn.call_raw("COMMAND", "INFO", "addjob") == (
        b"*1\r\n*6\r\n$6\r\naddjob\r\n:-4\r\n*3\r\n+write\r\n+denyoom\r\n+fast\r\n:0\r\n:0\r\n:0\r\n"
    )
    table = conn.call("COMMAND")
    names = {entry[0] for entry in table}
    assert {row[0].encode() for row in SPEC_TABLE} <= names
    assert conn.call("COMMAND", "COUNT") == len(table)
    assert conn.call("COMMAND", "INFO", "nosuch", "ping")[0] is None
    assert conn.call("COMMAND", "BOGUS") == Error("ERR Unknown subcommand or wrong number of arguments.")


# ---------------------------------------------------------------- dispatch (§1.3)


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (("NoSuch", "x"), Error("ERR unknown command 'NoSuch'")),
        (("SHOW",), arity_error("show")),
        (("SHOW", UNKNOWN_ID, "x"), arity_error("show")),
        (("QLEN",), arity_error("qlen")),
        (("QPEEK", "q"), arity_error("qpeek")),
        (("QSTAT", "a", "b"), arity_error("qstat")),
        (("WORKING",), arity_error("working")),
        (("TIME", "x"), arity_error("time")),
        (("MONITOR", "x"), arity_error("monitor")),
        (("LOADJOB",), arity_error("loadjob")),
        (("BGREWRITEAOF", "x"), arity_error("bgrewriteaof")),
        (("AUTH",), arity_error("auth")),
        (("auth", "a", "b"), arity_error("auth")),
        (("ADDJOB", "q", "body"), arity_error("addjob")),
        (("GETJOB",), arity_error("getjob")),
        (("PAUSE", "q"), arity_error("pause")),
        (("DEBUG",), arity_error("debug")),
        (("CONFIG",), arity_error("config")),
        (("CLUSTER",), arity_error("cluster")),
        (("CLIENT",), arity_error("client")),
        (("SLOWLOG",), arity_error("slowlog")),
        (("LATENCY",), arity_error("latency")),
        (("PING", "a", "b"), arity_error("ping")),
        (("INFO", "a", "b"), SYNTAX),
        (("ECHO",), arity_error("echo")),
    ],
)
def test_lookup_and_arity_errors(raw: RawFactory, request_: tuple, expected: Error) -> None:
    assert raw().call(*request_) == expected


HUGE, PADDED = "9" * 5000, "0" * 5000 + "7"  # Python's int() refuses strings of more than 4300 digits


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (("QPEEK", "q-huge", HUGE), NOT_INT),
        (("QPEEK", "q-huge", PADDED), []),
        (("JSCAN", HUGE), BAD_CURSOR),
        (("QSCAN", PADDED, "COUNT", PADDED), [b"0", []]),
        (("QSCAN", "MINLEN", HUGE), NOT_INT),
        (("GETJOB", "COUNT", HUGE, "FROM", "q-huge"), Error("ERR COUNT must be a number greater than zero")),
        (("ADDJOB", "q-huge", "x", HUGE), Error("ERR timeout is not an integer or out of range")),
        (("ADDJOB", "q-huge", "x", 0, "TTL", HUGE), Error("ERR TTL must be a number > 0")),
        (("CLIENT", "KILL", "ID", HUGE), SYNTAX),
        (("CLIENT", "PAUSE", HUGE), Error("ERR timeout is not an integer or out of range")),
        (("CONFIG", "SET", "hz", HUGE), Error(f"ERR Invalid argument '{HUGE}' for CONFIG SET 'hz'")),
        (("HELLO", HUGE), Error("ERR Protocol version is not an integer or out of range")),
        (("SLOWLOG", "GET", HUGE), NOT_INT),
        (("DEBUG", "RESTART", HUGE), NOT_INT),
    ],
)
def test_huge_numbers(raw: RawFactory, request_: tuple, expected: Any) -> None:
    assert raw().call(*request_) == expected


@pytest.mark.parametrize("command", ["ACKJOB", "FASTACK", "DELJOB", "ENQUEUE", "NACK", "DEQUEUE"])
def test_id_commands_without_ids_reply_zero(raw: RawFactory, command: str) -> None:
    assert raw().call_raw(command) == b":0\r\n"


# ---------------------------------------------------------------- ADDJOB (§4.1, §2)


def test_addjob_replies_a_status_with_a_48_char_id(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    reply = conn.call_raw("ADDJOB", q, "body", 0)
    prefix = my_id(conn)[:8]
    assert re.fullmatch(rb"\+DI" + prefix + rb"[0-9a-f]{32}05a1SQ\r\n", reply), reply


@pytest.mark.parametrize(
    ("opts", "ttl_field"),
    [
        ((), "05a1"),
        (("RETRY", 0), "05a0"),
        (("TTL", 59), "0001"),
        (("TTL", 59, "RETRY", 0), "0000"),
        (("TTL", 180, "RETRY", 0), "0002"),
        (("TTL", 120, "RETRY", 0), "0002"),
        (("TTL", 300_000_000), "ffff"),
        (("TTL", 300_000_000, "RETRY", 0), "fffe"),
    ],
)
def test_addjob_ttl_field_parity(raw: RawFactory, q: bytes, opts: tuple, ttl_field: str) -> None:
    assert add(raw(), q, "b", *opts)[42:46] == ttl_field.encode()


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        ((), {b"repl": 1, b"ttl": 86400, b"retry": 300, b"delay": 0, b"state": b"queued"}),
        (("TTL", 50), {b"ttl": 50, b"retry": 5}),
        (("TTL", 5), {b"retry": 1}),
        (("ttl", 100, "Ttl", 200, "retry", 7), {b"ttl": 200, b"retry": 7}),  # case-insensitive, last wins
        (("DELAY", 10), {b"delay": 10, b"state": b"active"}),
        (("DELAY", ""), {b"delay": 0, b"state": b"queued"}),  # the empty string parses as 0
        (("REPLICATE", 1, "ASYNC", "MAXLEN", 5), {b"repl": 1, b"state": b"queued"}),
    ],
)
def test_addjob_options(raw: RawFactory, q: bytes, opts: tuple, expected: dict) -> None:
    conn = raw()
    job = show(conn, add(conn, q, "b", *opts))
    assert {k: job[k] for k in expected} == expected
    assert job[b"nodes-delivered"] == [my_id(conn)]
    assert conn.call("QLEN", q) == (1 if expected.get(b"state", b"queued") == b"queued" else 0)


def test_addjob_delay_schedules_the_job(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    job = show(conn, add(conn, q, "b", "DELAY", 1))
    assert 0 < job[b"next-requeue-within"] <= 1000
    wait_for(lambda: conn.call("QLEN", q) == 1, what="delayed job queued")
    assert show(conn, job[b"id"])[b"state"] == b"queued"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("REPLICATE", 0), "ERR REPLICATE must be between 1 and 65535"),
        (("REPLICATE", 65536), "ERR REPLICATE must be between 1 and 65535"),
        (("REPLICATE", "x"), "ERR REPLICATE must be between 1 and 65535"),
        (("TTL", 0), "ERR TTL must be a number > 0"),
        (("TTL", " 5"), "ERR TTL must be a number > 0"),
        (("TTL", "5s"), "ERR TTL must be a number > 0"),
        (("RETRY", -1), "ERR RETRY time must be a non negative number"),
        (("DELAY", -1), "ERR DELAY time must be a non negative number"),
        (("MAXLEN", 0), "ERR MAXLEN must be a positive number"),
        (("MAXLEN", 99999999999999999999), "ERR MAXLEN must be a positive number"),
        (("BOGUS",), "ERR syntax error"),
        (("TTL",), "ERR syntax error"),  # a value option with no value
        (("TTL", 0, "BOGUS"), "ERR TTL must be a number > 0"),  # the first failing option decides
        (("BOGUS", "TTL", 0), "ERR syntax error"),
        (("REPLICATE", 2, "RETRY", 0), "ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)"),
        (("REPLICATE", 2), "NOREPL Not enough reachable nodes for the requested replication level"),
        (("DELAY", 10, "TTL", 10), "ERR The specified DELAY is greater than TTL. Job refused since would never be delivered"),
    ],
)
def test_addjob_option_errors(raw: RawFactory, q: bytes, args: tuple, error: str) -> None:
    conn = raw()
    assert conn.call("ADDJOB", q, "body", 0, *args) == Error(error)
    assert conn.call("QSTAT", q) is NIL  # nothing created


@pytest.mark.parametrize(
    ("timeout", "opts", "error"),
    [
        ("abc", (), "ERR timeout is not an integer or out of range"),
        ("-1", (), "ERR timeout is negative"),
        ("abc", ("TTL", 0), "ERR TTL must be a number > 0"),  # options are parsed first
    ],
)
def test_addjob_timeout_errors(raw: RawFactory, q: bytes, timeout: str, opts: tuple, error: str) -> None:
    assert raw().call("ADDJOB", q, "body", timeout, *opts) == Error(error)


def test_addjob_maxlen_and_paused(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    add(conn, q, "a", "MAXLEN", 1)
    assert conn.call("ADDJOB", q, "b", 0, "MAXLEN", 1) == Error("MAXLEN Queue is already longer than the specified MAXLEN count")
    add(conn, q, "b", "MAXLEN", 2)
    assert conn.call("PAUSE", q, "in") == "in"
    assert conn.call("ADDJOB", q, "c", 0) == Error("PAUSED Queue paused in input, try later")
    assert conn.call("QLEN", q) == 2


# ---------------------------------------------------------------- GETJOB (§4.2)


def test_getjob_entry_shapes(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    first, second = add(conn, q, "body1"), add(conn, q, "body2")
    assert conn.call_raw("GETJOB", "FROM", q) == b"*1\r\n*3\r\n$%d\r\n%s\r\n$48\r\n%s\r\n$5\r\nbody1\r\n" % (len(q), q, first)
    assert conn.call_raw("GETJOB", "WITHCOUNTERS", "FROM", q) == (
        b"*1\r\n*7\r\n$%d\r\n%s\r\n$48\r\n%s\r\n$5\r\nbody2\r\n$5\r\nnacks\r\n:0\r\n"
        b"$21\r\nadditional-deliveries\r\n:0\r\n" % (len(q), q, second)
    )
    assert show(conn, first)[b"state"] == b"active"
    assert conn.call("NACK", second) == 1
    assert conn.call("GETJOB", "withcounters", "FROM", q)[0][3:] == [b"nacks", 1, b"additional-deliveries", 0]


def test_getjob_rounds_over_queues(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    a, b = q + b"a", q + b"b"
    ids = {(name, i): add(conn, name, f"{name.decode()}{i}") for name in (a, b) for i in range(3)}
    got = conn.call("GETJOB", "COUNT", 4, "FROM", a, q + b"missing", b)
    assert [(e[0], e[1]) for e in got] == [(a, ids[a, 0]), (b, ids[b, 0]), (a, ids[a, 1]), (b, ids[b, 1])]
    twice = conn.call("GETJOB", "COUNT", 10, "FROM", a, a, b)  # a queue listed twice is visited twice
    assert [e[1] for e in twice] == [ids[a, 2], ids[b, 2]]
    assert conn.call("QSTAT", q + b"missing") is not NIL  # GETJOB created it


def test_getjob_nohang_and_timeout(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    assert conn.call_raw("GETJOB", "NOHANG", "TIMEOUT", 10_000, "FROM", q) == b"*-1\r\n"
    started = time.monotonic()
    assert conn.call_raw("GETJOB", "TIMEOUT", 100, "FROM", q) == b"*-1\r\n"
    assert time.monotonic() - started >= 0.09


def test_blocked_getjob_gets_exactly_one_job_fifo(raw: RawFactory, q: bytes) -> None:
    first, second, producer = raw(), raw(), raw()
    first.send(b"GETJOB COUNT 5 FROM %s other\r\n" % q)
    wait_for(lambda: blocked_on(producer, q) == 1)
    second.send(b"GETJOB FROM %s\r\n" % q)
    wait_for(lambda: blocked_on(producer, q) == 2)
    job1 = add(producer, q, "j1")
    assert first.read_raw() == b"*1\r\n*3\r\n$%d\r\n%s\r\n$48\r\n%s\r\n$2\r\nj1\r\n" % (len(q), q, job1)
    job2 = add(producer, q, "j2")
    assert second.read() == [[q, job2, b"j2"]]
    add(producer, q, "j3")
    assert producer.call("QLEN", q) == 1


def test_everything_after_from_is_a_queue(raw: RawFactory, q: bytes) -> None:
    waiter, producer = raw(), raw()
    waiter.send(b"GETJOB FROM %s NOHANG\r\n" % q)  # blocks on "q" and "NOHANG"
    wait_for(lambda: blocked_on(producer, q) == 1)
    job = add(producer, b"NOHANG", "x")
    assert waiter.read() == [[b"NOHANG", job, b"x"]]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("NOHANG",), "ERR syntax error"),
        (("FROM",), "ERR syntax error"),
        (("BOGUS", "FROM", "q"), "ERR syntax error"),
        (("COUNT", 0, "FROM", "q"), "ERR COUNT must be a number greater than zero"),
        (("COUNT", -1, "FROM", "q"), "ERR COUNT must be a number greater than zero"),
        (("COUNT", "x", "FROM", "q"), "ERR COUNT must be a number greater than zero"),
        (("TIMEOUT", "x", "FROM", "q"), "ERR timeout is not an integer or out of range"),
        (("TIMEOUT", -5, "FROM", "q"), "ERR timeout is negative"),
        (("TIMEOUT",), "ERR syntax error"),
    ],
)
def test_getjob_errors(raw: RawFactory, args: tuple, error: str) -> None:
    assert raw().call("GETJOB", *args) == Error(error)


# ---------------------------------------------------------------- job commands (§5)


def test_ackjob(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    job = add(conn, q)
    assert conn.call_raw("ACKJOB", job, UNKNOWN_ID) == b":1\r\n"
    assert conn.call_raw("SHOW", job) == b"$-1\r\n"  # single node: deleted at once
    assert conn.call("ACKJOB", job) == 0
    assert conn.call_raw("SHOW", UNKNOWN_ID) == b"$-1\r\n"  # no dummy ACK on a single node
    assert conn.call("QLEN", q) == 0


@pytest.mark.parametrize(("command", "count"), [("FASTACK", 1), ("DELJOB", 1)])
def test_fastack_and_deljob_delete(raw: RawFactory, q: bytes, command: str, count: int) -> None:
    conn = raw()
    queued, active = add(conn, q), add(conn, q, "b", "DELAY", 100)
    assert conn.call(command, queued, active, UNKNOWN_ID) == 2
    assert conn.call("SHOW", queued) is None and conn.call("SHOW", active) is None
    assert conn.call("QLEN", q) == 0
    assert conn.call(command, queued) == 0


@pytest.mark.parametrize("command", ["ACKJOB", "FASTACK", "DELJOB", "ENQUEUE", "NACK", "DEQUEUE", "WORKING", "SHOW"])
@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_ids_are_refused_before_acting(raw: RawFactory, q: bytes, command: str, bad: str) -> None:
    conn = raw()
    job = add(conn, q)
    ids = [bad] if command in ("WORKING", "SHOW") else [job, bad]
    assert conn.call(command, *ids) == BADID
    assert show(conn, job)[b"state"] == b"queued"


def test_enqueue_nack_dequeue(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    job = add(conn, q)
    assert conn.call("ENQUEUE", job) == 0  # already queued
    assert conn.call("DEQUEUE", job, UNKNOWN_ID) == 1
    assert conn.call("DEQUEUE", job) == 0
    assert (show(conn, job)[b"state"], conn.call("QLEN", q)) == (b"active", 0)
    assert conn.call("ENQUEUE", job) == 1
    assert conn.call("QLEN", q) == 1
    conn.call("GETJOB", "FROM", q)
    assert conn.call("NACK", job) == 1
    conn.call("GETJOB", "FROM", q)
    assert conn.call("ENQUEUE", job) == 1
    counters = show(conn, job)
    assert (counters[b"nacks"], counters[b"additional-deliveries"]) == (1, 2)  # two ENQUEUEs after the first queueing


def test_at_most_once_job_is_never_requeued(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    job = add(conn, q, "b", "RETRY", 0)
    assert conn.call("GETJOB", "FROM", q)[0][1] == job
    assert conn.call("ENQUEUE", job) == 0
    assert conn.call("NACK", job) == 0
    assert show(conn, job)[b"next-requeue-within"] is None


def test_working(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    assert conn.call("WORKING", UNKNOWN_ID) == Error("NOJOB Job not known in the context of this node.")
    job = add(conn, q, "b", "RETRY", 42)
    assert conn.call_raw("WORKING", job) == b":42\r\n"
    assert (show(conn, job)[b"state"], conn.call("QLEN", q)) == (b"active", 0)  # dequeued
    at_most_once = add(conn, q, "b", "RETRY", 0)
    assert conn.call_raw("WORKING", at_most_once) == b":0\r\n"
    assert conn.call("QLEN", q) == 0


def test_working_too_late(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    job = add(conn, q, "b", "TTL", 1)
    toolate = Error("TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone the next delivery.")
    wait_for(lambda: conn.call("WORKING", job) == toolate, timeout=2, what="TOOLATE")


SHOW_KEYS = [
    (b"id", bytes), (b"queue", bytes), (b"state", bytes), (b"repl", int), (b"ttl", int), (b"ctime", int),
    (b"delay", int), (b"retry", int), (b"nacks", int), (b"additional-deliveries", int),
    (b"nodes-delivered", list), (b"nodes-confirmed", list), (b"next-requeue-within", int),
    (b"next-awake-within", int), (b"body", bytes),
]  # fmt: skip


def test_show(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    before = time.time_ns()
    job = add(conn, q, "the body", "TTL", 3600, "RETRY", 60)
    flat = conn.call("SHOW", job)
    assert len(flat) == 30
    assert [(k, type(v)) for k, v in zip(flat[::2], flat[1::2])] == SHOW_KEYS
    info = as_dict(flat)
    assert (info[b"id"], info[b"queue"], info[b"body"], info[b"ttl"]) == (job, q, b"the body", 3600)
    assert before // 10**6 - 1000 <= info[b"ctime"] // 10**6 <= time.time_ns() // 10**6
    assert 59_000 <= info[b"next-requeue-within"] <= 60_250
    assert info[b"next-awake-within"] == info[b"next-requeue-within"] - 500
    assert info[b"nodes-confirmed"] == []


# ---------------------------------------------------------------- scanning (§5.9, §6.4)


def jscan_all(conn: Raw, *opts: Any) -> list[Any]:
    cursor, items = b"0", []
    for _ in range(10_000):
        cursor, batch = conn.call("JSCAN", cursor, *opts)
        items += batch
        if cursor == b"0":
            return items
    raise AssertionError("JSCAN never finished")


def test_jscan(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    jobs = {add(conn, q, str(i)) for i in range(150)}
    delayed = add(conn, q, "d", "DELAY", 100)
    reply = conn.call_raw("JSCAN", "QUEUE", q, "BUSYLOOP")
    assert reply.startswith(b"*2\r\n$1\r\n0\r\n*151\r\n+DI")  # IDs are status replies
    cursor, items = conn.call("JSCAN", "QUEUE", q, "BUSYLOOP")
    assert all(isinstance(i, Status) for i in items)
    assert {i.encode() for i in items} == jobs | {delayed}
    assert {i.encode() for i in jscan_all(conn, "COUNT", 7, "QUEUE", q)} == jobs | {delayed}
    assert conn.call("JSCAN", "BUSYLOOP", "QUEUE", q, "STATE", "active")[1] == [Status(delayed.decode())]
    both = conn.call("JSCAN", "BUSYLOOP", "QUEUE", q, "STATE", "ACTIVE", "STATE", "queued")[1]
    assert len(both) == 151
    (full,) = conn.call("JSCAN", "BUSYLOOP", "QUEUE", q, "STATE", "active", "REPLY", "ALL")[1]
    assert len(full) == 30 and full[:6] == [b"id", delayed, b"queue", q, b"state", b"active"]
    assert conn.call("JSCAN", "BUSYLOOP", "QUEUE", q + b"x")[1] == []


def test_scan_contract_under_churn(raw: RawFactory, q: bytes) -> None:
    """Every job (queue) present for the whole iteration is returned, while
    others come and go between the calls."""
    conn = raw()
    stable_jobs = {add(conn, q, str(i)) for i in range(300)}
    stable_queues = {q + b"-s%d" % i for i in range(100)}
    for name in stable_queues:
        conn.call("PAUSE", name, "in")  # a paused queue is never collected
    churn: list[bytes] = []
    seen_jobs: set[bytes] = set()
    seen_queues: set[bytes] = set()
    job_cursor = queue_cursor = b"0"
    for step in range(10_000):
        churn += [add(conn, q + b"-churn", "c") for _ in range(5)]
        conn.call("DELJOB", *churn[:3])
        del churn[:3]
        conn.call("PAUSE", q + b"-c%d" % step, "in")
        if job_cursor is not None:
            job_cursor, items = conn.call("JSCAN", job_cursor, "COUNT", 10)
            seen_jobs |= {i.encode() for i in items}
            job_cursor = None if job_cursor == b"0" else job_cursor
        if queue_cursor is not None:
            queue_cursor, names = conn.call("QSCAN", queue_cursor, "COUNT", 5)
            seen_queues |= set(names)
            queue_cursor = None if queue_cursor == b"0" else queue_cursor
        if job_cursor is None and queue_cursor is None:
            break
    assert stable_jobs <= seen_jobs and stable_queues <= seen_queues
    conn.call("DELJOB", *churn)


@pytest.mark.parametrize("command", ["JSCAN", "QSCAN"])
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("0", "0"), SYNTAX),
        (("abc",), BAD_CURSOR),
        (("COUNT",), BAD_CURSOR),  # an option keyword with no value is read as the cursor
        (("0", "COUNT"), SYNTAX),
        (("COUNT", "x"), NOT_INT),
        (("12x",), BAD_CURSOR),
        ((" 1",), BAD_CURSOR),
        (("0x1",), BAD_CURSOR),
        (("+",), BAD_CURSOR),
        (("-",), BAD_CURSOR),
        (("18446744073709551616",), BAD_CURSOR),  # ERANGE
    ],
)
def test_scan_errors(raw: RawFactory, command: str, args: tuple, error: Error) -> None:
    assert raw().call(command, *args) == error


@pytest.mark.parametrize("command", ["JSCAN", "QSCAN"])
@pytest.mark.parametrize("cursor", ["", "+0", "-1", "18446744073709551615", "007"])
def test_scan_cursors_read_like_strtoul(raw: RawFactory, command: str, cursor: str) -> None:
    reply = raw().call(command, cursor, "COUNT", 1)
    assert isinstance(reply, list) and reply[0].isdigit()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("STATE", "bogus"), Error("ERR Invalid job state name")),
        (("REPLY", "bogus"), Error("ERR Invalid REPLY type, try ID or ALL")),
        (("MINLEN", 1), BAD_CURSOR),
    ],
)
def test_jscan_errors(raw: RawFactory, args: tuple, error: Error) -> None:
    assert raw().call("JSCAN", *args) == error


def test_qscan(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    for i in range(3):
        for _ in range(i):
            add(conn, q + b"%d" % i)
    conn.call("GETJOB", "NOHANG", "FROM", q + b"0")  # creates an empty queue
    reply = conn.call("QSCAN", "BUSYLOOP")
    assert reply[0] == b"0" and all(type(name) is bytes for name in reply[1])
    assert {q + b"0", q + b"1", q + b"2"} <= set(reply[1])
    mine = lambda *opts: {n for n in conn.call("QSCAN", "BUSYLOOP", *opts)[1] if n.startswith(q)}  # noqa: E731
    assert mine("MINLEN", 1) == {q + b"1", q + b"2"}
    assert mine("MAXLEN", 1) == {q + b"0", q + b"1"}
    assert mine("MINLEN", 1, "MAXLEN", 1, "IMPORTRATE", 0) == {q + b"1"}
    assert conn.call("QSCAN", "MINLEN", "x") == NOT_INT


# ---------------------------------------------------------------- queues (§6)


def test_qlen_qpeek(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    jobs = [add(conn, q, f"b{i}") for i in range(4)]
    entry = lambda i: [q, jobs[i], f"b{i}".encode()]  # noqa: E731
    assert conn.call_raw("QLEN", q) == b":4\r\n"
    assert conn.call("QPEEK", q, 2) == [entry(0), entry(1)]
    assert conn.call("QPEEK", q, -3) == [entry(3), entry(2), entry(1)]
    assert conn.call("QPEEK", q, 100) == [entry(i) for i in range(4)]
    assert conn.call_raw("QPEEK", q, 0) == b"*0\r\n"
    assert conn.call("QPEEK", q, "x") == NOT_INT
    assert conn.call("QPEEK", q, "") == []  # the empty string parses as 0
    assert show(conn, jobs[0])[b"state"] == b"queued" and conn.call("QLEN", q) == 4


def test_qstat(raw: RawFactory, q: bytes) -> None:
    conn, waiter = raw(), raw()
    for i in range(3):
        add(conn, q, str(i))
    conn.call("GETJOB", "FROM", q)
    conn.call("PAUSE", q, "out")
    waiter.send(b"GETJOB FROM %s\r\n" % q)
    flat = wait_for(lambda: (r := conn.call("QSTAT", q)) and as_dict(r)[b"blocked"] == 1 and r)
    assert [(k, type(v)) for k, v in zip(flat[::2], flat[1::2])] == [
        (b"name", bytes), (b"len", int), (b"age", int), (b"idle", int), (b"blocked", int),
        (b"import-from", list), (b"import-rate", int), (b"jobs-in", int), (b"jobs-out", int), (b"pause", bytes),
    ]  # fmt: skip
    stat = as_dict(flat)
    assert stat[b"name"] == q and (stat[b"len"], stat[b"jobs-in"], stat[b"jobs-out"]) == (2, 3, 1)
    assert (stat[b"age"], stat[b"idle"], stat[b"import-from"], stat[b"import-rate"]) == (0, 0, [], 0)
    assert stat[b"pause"] == b"out"
    assert conn.call("PAUSE", q, "none") == "none"
    assert waiter.read()[0][2] == b"1"  # clearing the out pause serves the blocked client


@pytest.mark.parametrize(
    ("options", "result"),
    [
        (("in",), "in"), (("out",), "out"), (("all",), "all"), (("in", "out"), "all"),
        (("IN", "none"), "none"), (("none", "in"), "in"), (("out", "state"), "out"), (("in", "bcast"), "in"),
    ],
)  # fmt: skip
def test_pause(raw: RawFactory, q: bytes, options: tuple, result: str) -> None:
    conn = raw()
    assert conn.call_raw("PAUSE", q, *options) == b"+%s\r\n" % result.encode()
    assert conn.call("PAUSE", q, "state") == result
    stat = conn.call("QSTAT", q)
    assert (stat is NIL) if result == "none" else as_dict(stat)[b"pause"] == result.encode()


def test_pause_errors_and_missing_queues(raw: RawFactory, q: bytes) -> None:
    conn = raw()
    assert conn.call("PAUSE", q, "state") == "none"
    assert conn.call("PAUSE", q, "none") == "none"
    assert conn.call("QSTAT", q) is NIL  # "none" does not create the queue
    assert conn.call("PAUSE", q, "in", "bogus") == SYNTAX
    assert conn.call("QSTAT", q) is NIL  # nothing applied
    conn.call("PAUSE", q, "all")
    add_err = conn.call("ADDJOB", q, "b", 0)
    assert add_err == Error("PAUSED Queue paused in input, try later")
    assert conn.call("PAUSE", q, "out") == "out"
    job = add(conn, q)
    assert conn.call("GETJOB", "NOHANG", "FROM", q) is NIL
    assert conn.call("ENQUEUE", job) == 0 and conn.call("QLEN", q) == 1


def test_memory_pressure(scratch_node: NodeProcess, raw: RawFactory, q: bytes) -> None:
    conn = raw(scratch_node)
    job = add(conn, q)
    oom_reason = Error(
        "NOREPL Not enough reachable nodes for the requested replication level, since I'm unable to hold "
        "a copy of the message for the following reason: I'm out of memory"
    )
    info = conn.call("INFO", "memory")
    used = int(re.search(rb"used_memory:(\d+)", info.encode() if isinstance(info, str) else info).group(1))
    assert conn.call("CONFIG", "SET", "maxmemory", str(used * 100 // 85)) == "OK"  # above 75 %: external replication
    assert conn.call("ADDJOB", q, "x", 0) == oom_reason
    assert conn.call("CONFIG", "SET", "maxmemory-policy", "noeviction") == "OK"
    assert conn.call("CONFIG", "SET", "maxmemory", str(used)) == "OK"  # above 95 %, nothing may be evicted
    oom = Error("OOM command not allowed when used memory > 'maxmemory'.")
    assert [conn.call(*c) for c in (("ADDJOB", q, "x", 0), ("ENQUEUE", job), ("NACK", job))] == [oom] * 3
    assert conn.call("DEQUEUE", job) == 1 and conn.call("PING") == "PONG"
    assert conn.call("CONFIG", "SET", "maxmemory", "0") == "OK"  # upstream quirk: never OOM, always external
    assert conn.call("ADDJOB", q, "x", 0) == oom_reason
    for name, value in (("maxmemory", "1gb"), ("maxmemory-policy", "acks")):
        assert conn.call("CONFIG", "SET", name, value) == "OK"
    add(conn, q)


# ---------------------------------------------------------------- HELLO, CLUSTER (§7, §8)


def test_hello_and_cluster_on_a_lone_node(raw: RawFactory, shared_node: NodeProcess) -> None:
    conn = raw()
    me = my_id(conn)
    assert re.fullmatch(rb"[0-9a-f]{40}", me)
    port = str(shared_node.port).encode()
    assert conn.call_raw("HELLO") == (
        b"*3\r\n:1\r\n$40\r\n%s\r\n*4\r\n$40\r\n%s\r\n$0\r\n\r\n$%d\r\n%s\r\n$1\r\n1\r\n" % (me, me, len(port), port)
    )
    assert conn.call("CLUSTER", "INFO") == (
        b"cluster_state:ok\r\ncluster_known_nodes:1\r\ncluster_reachable_nodes:0\r\ncluster_size:1\r\n"
        b"cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n"
    )
    assert conn.call("CLUSTER", "NODES") == b"%s :%s myself 0 0 connected\n" % (me, port)
    assert conn.call_raw("cluster", "leaving") == b"+no\r\n"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("BOGUS",), "ERR Wrong CLUSTER subcommand or number of arguments"),
        (("MYID", "x"), "ERR Wrong CLUSTER subcommand or number of arguments"),
        (("LEAVING", "maybe"), "ERR Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'"),
        (("MEET", "127.0.0.1", "x"), "ERR Invalid TCP port specified: x"),
        (("MEET", "127.0.0.1", "7_711"), "ERR Invalid TCP port specified: 7_711"),
        (("MEET", "127.0.0.1", " 7711"), "ERR Invalid TCP port specified:  7711"),
        (("MEET", "localhost", "7711"), "ERR Invalid node address specified: localhost:7711"),
        (("MEET", "127.0.0.1", "55536"), "ERR Invalid node address specified: 127.0.0.1:55536"),
        (("FORGET", "abc"), "ERR Invalid node identifier"),
        (("FORGET", "f" * 40), "ERR Unknown node " + "f" * 40),
        (("RESET", "BOGUS"), "ERR syntax error"),
    ],
)
def test_cluster_errors(raw: RawFactory, args: tuple, error: str) -> None:
    assert raw().call("CLUSTER", *args) == Error(error)


def test_cluster_forget_myself(raw: RawFactory) -> None:
    conn = raw()
    assert conn.call("CLUSTER", "FORGET", my_id(conn)) == Error("ERR I tried hard but I can't forget myself...")


def test_leaving_node(spawn: Spawn, raw: RawFactory, q: bytes) -> None:
    node = spawn()
    waiter, other = raw(node), raw(node)
    job = add(other, q)
    waiter.send(b"GETJOB FROM %s-empty\r\n" % q)
    wait_for(lambda: b"blocked_clients:1\r\n" in other.call("INFO", "clients"))
    assert other.call_raw("CLUSTER", "LEAVING", "yes") == b"+OK\r\n"
    leaving = Error("LEAVING This node is leaving the cluster, please connect to a different one")
    assert waiter.read() == leaving  # the blocked client is told by the client cron
    assert other.call("CLUSTER", "LEAVING") == "yes"
    assert other.call("GETJOB", "FROM", q) == [[q, job, b"body"]]  # queued jobs are still served
    assert other.call("GETJOB", "FROM", q) == leaving
    assert other.call("GETJOB", "NOHANG", "FROM", q) is NIL
    assert other.call("ADDJOB", q, "x", 0) == Error(
        "NOREPL Not enough reachable nodes for the requested replication level, since I'm unable to hold "
        "a copy of the message for the following reason: I'm leaving the cluster"
    )
    me = my_id(other)
    assert other.call("HELLO")[2] == [me, b"", str(node.port).encode(), b"100"]
    assert b" myself,leaving " in other.call("CLUSTER", "NODES")
    assert other.call("CLUSTER", "LEAVING", "no") == "OK"
    assert other.call("HELLO")[2][3] == b"1"


# ---------------------------------------------------------------- connection commands


def test_ping_echo_select_time(raw: RawFactory) -> None:
    conn = raw()
    assert conn.call_raw("ping") == b"+PONG\r\n"
    assert conn.call_raw("PING", "") == b"$0\r\n\r\n"
    assert conn.call_raw("ECHO", "x y") == b"$3\r\nx y\r\n"
    assert conn.call_raw("SELECT", 0) == b"+OK\r\n"
    assert conn.call("SELECT", 1) == Error("ERR DB index is out of range")
    before = time.time()
    seconds, micros = conn.call("TIME")  # two bulk strings
    assert type(seconds) is bytes and type(micros) is bytes and 0 <= int(micros) < 1_000_000
    assert before - 1 <= int(seconds) + int(micros) / 1e6 <= time.time() + 1


def test_auth_and_requirepass(spawn: Spawn, raw: RawFactory) -> None:
    node = spawn()
    assert raw(node).call("CONFIG", "SET", "requirepass", "s3cret") == "OK"
    conn = raw(node)
    noauth = Error("NOAUTH Authentication required.")
    assert conn.call("PING") == noauth
    assert conn.call("ADDJOB", "q", "x", 0) == noauth
    assert conn.call("HELLO") == noauth
    assert conn.call("HELLO", 3) == noauth
    assert conn.call("NOSUCH") == Error("ERR unknown command 'NOSUCH'")  # lookup and arity come first
    assert conn.call("SHOW") == arity_error("show")
    assert conn.call("AUTH", "wrong") == Error("ERR invalid password")
    assert conn.call_raw("AUTH", "s3cret") == b"+OK\r\n"
    assert conn.call("PING") == "PONG"
    assert conn.call("AUTH", "wrong") == Error("ERR invalid password")
    assert conn.call("PING") == noauth  # a failed AUTH logs the connection out
    assert conn.call("QUIT") == "OK"
    hello = raw(node)
    assert hello.call("HELLO", 2, "AUTH", "default", "wrong")[:9] == "WRONGPASS"
    assert as_dict(hello.call("HELLO", 2, "AUTH", "default", "s3cret", "SETNAME", "me"))[b"proto"] == 2
    assert hello.call("CLIENT", "GETNAME") == b"me"
    assert hello.call("CONFIG", "GET", "requirepass") == [b"requirepass", b"s3cret"]
    assert hello.call("CONFIG", "SET", "requirepass", "") == "OK"
    assert raw(node).call("PING") == "PONG"
    assert raw(node).call("AUTH", "x") == Error("ERR Client sent AUTH, but no password is set")


def test_requirepass_set_at_runtime_applies_to_open_connections(spawn: Spawn, raw: RawFactory) -> None:
    conn = raw(spawn())
    assert conn.call("CONFIG", "SET", "requirepass", "s3cret") == "OK"
    assert conn.call("PING") == Error("NOAUTH Authentication required.")  # it never authenticated


def test_hello_handshake(raw: RawFactory) -> None:
    conn = raw()
    reply = as_dict(conn.call("HELLO", 2, "SETNAME", "worker-1"))
    assert (reply[b"server"], reply[b"proto"]) == (b"disque", 2)
    assert reply[b"id"] == conn.call("CLIENT", "ID")
    assert conn.call("CLIENT", "GETNAME") == b"worker-1"
    assert conn.call("HELLO", 4)[:7] == "NOPROTO"
    for bad in ("x", " 3", "3_0"):
        assert conn.call("HELLO", bad) == Error("ERR Protocol version is not an integer or out of range")


CLIENT_LINE = re.compile(
    rb"id=(\d+) addr=127\.0\.0\.1:(\d+) fd=\d+ name=(\S*) age=\d+ idle=\d+ flags=([Nb]) qbuf=\d+ "
    rb"qbuf-free=\d+ obl=\d+ oll=\d+ omem=\d+ events=r cmd=(\S+)"
)


def test_client_name_id_list(raw: RawFactory, q: bytes) -> None:
    conn, blocked = raw(), raw()
    assert conn.call_raw("CLIENT", "GETNAME") == b"$-1\r\n"
    assert conn.call_raw("CLIENT", "SETNAME", "lister") == b"+OK\r\n"
    assert conn.call_raw("CLIENT", "GETNAME") == b"$6\r\nlister\r\n"
    bad_name = Error("ERR Client names cannot contain spaces, newlines or special characters.")
    assert conn.call("CLIENT", "SETNAME", "a b") == bad_name
    assert conn.call("CLIENT", "SETNAME", "caf\xe9") == bad_name
    my_client_id = conn.call("CLIENT", "ID")
    assert isinstance(my_client_id, int)
    blocked_id = blocked.call("CLIENT", "ID")
    blocked.send(b"GETJOB FROM %s\r\n" % q)
    wait_for(lambda: blocked_on(conn, q) == 1)
    listing = conn.call("CLIENT", "LIST")
    assert listing.endswith(b"\n")
    lines = {int(m[1]): m for m in map(CLIENT_LINE.fullmatch, listing.splitlines())}
    assert None not in lines, listing
    assert (lines[my_client_id][3], lines[my_client_id][4], lines[my_client_id][5]) == (b"lister", b"N", b"client")
    assert (lines[blocked_id][4], lines[blocked_id][5]) == (b"b", b"getjob")
    assert conn.call("CLIENT", "SETNAME", "") == "OK"
    assert conn.call("CLIENT", "GETNAME") is None
    assert conn.call("CLIENT", "SETINFO", "lib-name", "x") == "OK"
    assert conn.call("CLIENT", "SETINFO", "bogus", "x")[:3] == "ERR"


def client_addr(conn: Raw, client_id: int) -> str:
    for line in conn.call("CLIENT", "LIST").splitlines():
        match = CLIENT_LINE.fullmatch(line)
        assert match is not None, line
        if int(match[1]) == client_id:
            return f"127.0.0.1:{match[2].decode()}"
    raise AssertionError(f"client {client_id} not listed")


def test_client_kill(raw: RawFactory) -> None:
    conn, victim, other = raw(), raw(), raw()
    assert conn.call_raw("CLIENT", "KILL", client_addr(conn, victim.call("CLIENT", "ID"))) == b"+OK\r\n"
    assert victim.read_until_closed() == b""
    assert conn.call("CLIENT", "KILL", "127.0.0.1:1") == Error("ERR No such client")
    other_id = other.call("CLIENT", "ID")
    assert conn.call_raw("CLIENT", "KILL", "ID", other_id) == b":1\r\n"
    assert other.read_until_closed() == b""
    assert conn.call("CLIENT", "KILL", "ID", conn.call("CLIENT", "ID")) == 0  # SKIPME yes by default
    assert conn.call("CLIENT", "KILL", "ADDR", "127.0.0.1:1", "TYPE", "normal") == 0
    assert conn.call("CLIENT", "KILL", "TYPE", "master") == Error("ERR Unknown client type 'master'")
    for malformed in (("ID", "x"), ("ID", " 1"), ("ID", "1_0"), ("BOGUS", "1"), ("SKIPME", "maybe")):
        assert conn.call("CLIENT", "KILL", *malformed) == SYNTAX
    conn.send(b"CLIENT KILL ID %d SKIPME no\r\nPING\r\n" % conn.call("CLIENT", "ID"))
    assert conn.read_until_closed() == b":1\r\n"


def test_client_reply_and_pause(raw: RawFactory) -> None:
    conn, other = raw(), raw()
    conn.send(b"CLIENT REPLY OFF\r\nPING\r\nECHO a\r\nCLIENT REPLY ON\r\nECHO b\r\n")
    assert conn.read_raw() == b"+OK\r\n"
    assert conn.read_raw() == b"$1\r\nb\r\n"
    conn.send(b"CLIENT REPLY SKIP\r\nECHO skipped\r\nECHO c\r\n")
    assert conn.read_raw() == b"$1\r\nc\r\n"
    assert conn.call("CLIENT", "PAUSE", "x") == Error("ERR timeout is not an integer or out of range")
    assert conn.call("CLIENT", "PAUSE", -1) == Error("ERR timeout is negative")
    assert conn.call_raw("CLIENT", "PAUSE", 300) == b"+OK\r\n"
    started = time.monotonic()
    assert other.call("PING") == "PONG"
    assert time.monotonic() - started >= 0.1
    syntax = Error("ERR Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME connection-name)")
    for bad in (("BOGUS",), ("LIST", "x"), ("SETNAME",), ("REPLY", "maybe")):
        assert conn.call("CLIENT", *bad) == syntax


def test_monitor(raw: RawFactory) -> None:
    monitor, conn = raw(), raw()
    assert monitor.call_raw("MONITOR") == b"+OK\r\n"
    conn.call("ECHO", 'say "hi"')
    line = monitor.read_raw()
    assert re.fullmatch(rb'\+\d+\.\d{6} \[127\.0\.0\.1:\d+\] "ECHO" "say \\"hi\\""\r\n', line), line


# ---------------------------------------------------------------- server commands (§9)

INFO_SECTIONS = {
    "Server": "disque_version disque_git_sha1 disque_git_dirty disque_build_id os arch_bits multiplexing_api "
    "gcc_version process_id run_id tcp_port zone uptime_in_seconds uptime_in_days hz executable config_file",
    "Clients": "connected_clients client_longest_output_list client_biggest_input_buf blocked_clients",
    "Memory": "used_memory used_memory_human used_memory_rss used_memory_startup used_memory_retained used_memory_peak "
    "used_memory_peak_human mem_fragmentation_ratio mem_allocator maxmemory maxmemory_human maxmemory_policy "
    "mem_level mem_level_name",
    "Jobs": "registered_jobs",
    "Queues": "registered_queues",
    "Persistence": "loading aof_enabled aof_state aof_rewrite_in_progress aof_rewrite_scheduled "
    "aof_last_rewrite_time_sec aof_current_rewrite_time_sec aof_last_bgrewrite_status aof_last_write_status",
    "Stats": "total_connections_received total_commands_processed instantaneous_ops_per_sec total_net_input_bytes "
    "total_net_output_bytes instantaneous_input_kbps instantaneous_output_kbps rejected_connections latest_fork_usec",
    "CPU": "used_cpu_sys used_cpu_user used_cpu_sys_children used_cpu_user_children",
}


def parse_info(text: bytes) -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    assert text.endswith(b"\r\n")
    for block in text.decode().split("\r\n\r\n"):
        title, *lines = block.strip("\r\n").split("\r\n")
        assert title.startswith("# ")
        sections[title[2:]] = dict(line.split(":", 1) for line in lines)
    return sections


def test_info(spawn: Spawn, raw: RawFactory, q: bytes) -> None:
    node = spawn()
    conn = raw(node)
    info = parse_info(conn.call("INFO"))
    assert list(info) == list(INFO_SECTIONS)
    for title, keys in INFO_SECTIONS.items():
        assert list(info[title]) == keys.split(), title
    server = info["Server"]
    assert server["tcp_port"] == str(node.port) and server["process_id"] == str(node.pid)
    assert re.fullmatch(r"[0-9a-f]{40}", server["run_id"])
    assert server["config_file"] == str(node.workdir / "disque.conf")
    assert (info["Jobs"]["registered_jobs"], info["Queues"]["registered_queues"]) == ("0", "0")
    assert info["Persistence"]["aof_state"] == "off" and info["Persistence"]["loading"] == "0"
    add(conn, q)
    add(conn, q + b"2")
    assert parse_info(conn.call("info", "JOBS")) == {"Jobs": {"registered_jobs": "2"}}
    assert parse_info(conn.call("INFO", "queues")) == {"Queues": {"registered_queues": "2"}}
    assert conn.call_raw("INFO", "nosuch") == b"$0\r\n\r\n"
    assert "Commandstats" not in parse_info(conn.call("INFO", "default"))
    stats = parse_info(conn.call("INFO", "all"))["Commandstats"]
    assert re.fullmatch(r"calls=2,usec=\d+,usec_per_call=\d+\.\d\d", stats["cmdstat_addjob"])
    assert "cmdstat_ping" in stats  # the start-up probe
    assert list(parse_info(conn.call("INFO", "commandstats"))) == ["Commandstats"]


def test_config_get(spawn: Spawn, raw: RawFactory) -> None:
    node = spawn()
    conn = raw(node)
    flat = conn.call("CONFIG", "GET", "*")
    assert all(type(item) is bytes for item in flat)
    names = flat[::2]
    spec_order = (
        "requirepass unixsocket logfile pidfile maxmemory maxmemory-samples timeout auto-aof-rewrite-percentage "
        "auto-aof-rewrite-min-size slowlog-log-slower-than latency-monitor-threshold slowlog-max-len port "
        "tcp-backlog databases maxclients watchdog-period hz cluster-node-timeout tcp-keepalive "
        "no-appendfsync-on-rewrite daemonize activerehashing aof-rewrite-incremental-fsync aof-load-truncated "
        "aof-enqueue-jobs-once maxmemory-policy loglevel appendfsync syslog-facility appendonly dir "
        "client-output-buffer-limit unixsocketperm bind"
    ).encode().split()
    assert [n for n in names if n in spec_order] == spec_order
    assert not {b"appendfilename", b"cluster-config-file", b"syslog-enabled", b"rename-command"} & set(names)
    values = as_dict(flat)
    assert values[b"dir"] == str(node.workdir).encode() and values[b"port"] == str(node.port).encode()
    assert (values[b"maxmemory"], values[b"tcp-keepalive"], values[b"bind"]) == (b"1073741824", b"no", b"127.0.0.1")
    assert conn.call_raw("CONFIG", "GET", "MAXMEMORY") == b"*0\r\n"  # patterns are case-sensitive
    assert conn.call_raw("CONFIG", "GET", "h?") == b"*2\r\n$2\r\nhz\r\n$2\r\n10\r\n"
    assert conn.call("CONFIG", "GET", "maxmemory*")[::2] == [b"maxmemory", b"maxmemory-samples", b"maxmemory-policy"]


@pytest.mark.parametrize(
    ("name", "value", "reply", "readback"),
    [
        ("hz", "20", "OK", "20"),
        ("HZ", "30", "OK", "30"),  # names are case-insensitive
        ("maxmemory", "2mb", "OK", "2097152"),
        ("maxmemory", "10xb", "ERR Invalid argument '10xb' for CONFIG SET 'maxmemory'", None),
        ("maxclients", "-1", "ERR Invalid argument '-1' for CONFIG SET 'maxclients'", None),
        ("maxclients", "0", "ERR Invalid argument '0' for CONFIG SET 'maxclients'", None),
        ("timeout", "abc", "ERR Invalid argument 'abc' for CONFIG SET 'timeout'", None),
        ("hz", "-1", "ERR Invalid argument '-1' for CONFIG SET 'hz'", None),
        ("appendfsync", "sometimes", "ERR Invalid argument 'sometimes' for CONFIG SET 'appendfsync'", None),
        ("activerehashing", "maybe", "ERR Invalid argument 'maybe' for CONFIG SET 'activerehashing'", None),
        ("maxmemory-policy", "noeviction", "OK", "noeviction"),
        ("tcp-keepalive", "yes", "OK", "yes"),
        ("loglevel", "warning", "OK", "warning"),
        ("dir", "/nonexistent", "ERR Changing directory: No such file or directory", None),
        ("hz", "0", "OK", "1"),  # clamped to 1..500
        ("hz", "1000", "OK", "500"),
        ("port", "1", "ERR Unsupported CONFIG parameter: port", None),
        ("nosuch", "1", "ERR Unsupported CONFIG parameter: nosuch", None),
    ],
)
def test_config_set(scratch_node: NodeProcess, raw: RawFactory, name: str, value: str, reply: str, readback: str | None) -> None:
    conn = raw(scratch_node)
    before = conn.call("CONFIG", "GET", name.lower())
    got = conn.call("CONFIG", "SET", name, value)
    assert got == (Status(reply) if reply == "OK" else Error(reply))
    after = conn.call("CONFIG", "GET", name.lower())
    assert after == (before if readback is None else [name.lower().encode(), readback.encode()])


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("GET",), "ERR Wrong number of arguments for CONFIG GET"),
        (("set", "hz"), "ERR Wrong number of arguments for CONFIG set"),
        (("ResetStat", "x"), "ERR Wrong number of arguments for CONFIG ResetStat"),
        (("REWRITE", "x"), "ERR Wrong number of arguments for CONFIG REWRITE"),
        (("BOGUS",), "ERR CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE"),
    ],
)
def test_config_errors(raw: RawFactory, args: tuple, error: str) -> None:
    assert raw().call("CONFIG", *args) == Error(error)


def test_config_resetstat(scratch_node: NodeProcess, raw: RawFactory) -> None:
    conn = raw(scratch_node)
    for _ in range(5):
        conn.call("PING")
    assert conn.call_raw("CONFIG", "RESETSTAT") == b"+OK\r\n"
    stats = parse_info(conn.call("INFO", "all"))
    assert int(stats["Stats"]["total_commands_processed"]) <= 1
    assert "cmdstat_ping" not in stats["Commandstats"]


def test_config_rewrite_through_a_real_file(spawn: Spawn, raw: RawFactory) -> None:
    node = spawn("--hz", "42")  # command-line directives override the file
    conf = node.workdir / "disque.conf"
    conn = raw(node)
    assert conn.call("CONFIG", "GET", "hz") == [b"hz", b"42"]
    for name, value in [("hz", "33"), ("maxmemory", "2mb"), ("maxmemory-policy", "noeviction"), ("timeout", "7")]:
        assert conn.call("CONFIG", "SET", name, value) == "OK"
    assert conn.call_raw("CONFIG", "REWRITE") == b"+OK\r\n"
    lines = conf.read_text().splitlines()
    for line in ("hz 33", "maxmemory 2mb", "maxmemory-policy noeviction", "timeout 7", f"port {node.port}"):
        assert line in lines
    assert lines.count("hz 33") == 1 and not any(line.startswith("hz 10") for line in lines)
    conn.close()
    node.extra.clear()  # restart from the rewritten file alone
    assert node.stop() == 0
    node.start()
    restarted = raw(node)
    for name, value in [("hz", b"33"), ("maxmemory", b"2097152"), ("maxmemory-policy", b"noeviction")]:
        assert restarted.call("CONFIG", "GET", name) == [name.encode(), value]


def start_process(args: list[str], cwd: Path, port: int, stdin: bytes = b"") -> subprocess.Popen[bytes]:
    """`disque-server` started by hand (no config file written for it); waits for PING."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "disque", *args], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(stdin)
    proc.stdin.close()

    def pong() -> bool:
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        try:
            conn = Raw(("127.0.0.1", port))
        except OSError:
            return False
        with closing(conn):
            return conn.call("PING") == "PONG"

    wait_for(pong, timeout=10, what="server start")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(10)
    if proc.stderr:
        proc.stderr.close()
    return code


@pytest.mark.parametrize("stdin_config", [False, True], ids=["no-file", "stdin"])
def test_running_without_a_config_file(tmp_path: Path, raw: RawFactory, stdin_config: bool) -> None:
    port = free_port()
    args = ["-", "--bind", "127.0.0.1"] if stdin_config else ["--port", str(port), "--bind", "127.0.0.1"]
    proc = start_process(args, tmp_path, port, stdin=b"port %d\n" % port if stdin_config else b"")
    try:
        conn = raw(("127.0.0.1", port))
        assert conn.call("CONFIG", "REWRITE") == Error("ERR The server is running without a config file")
        assert b"config_file:\r\n" in conn.call("INFO", "server")
    finally:
        assert stop(proc) == 0


# ---------------------------------------------------------------- misc server commands


def test_slowlog(scratch_node: NodeProcess, raw: RawFactory) -> None:
    conn = raw(scratch_node)
    assert conn.call_raw("SLOWLOG", "RESET") == b"+OK\r\n"
    assert conn.call_raw("SLOWLOG", "GET") == b"*0\r\n"
    assert conn.call("CONFIG", "SET", "slowlog-log-slower-than", 0) == "OK"
    conn.call("ECHO", "slow")
    entries = conn.call("SLOWLOG", "GET")
    assert conn.call("SLOWLOG", "LEN") >= 2
    newest = entries[0]
    assert [type(v) for v in newest] == [int, int, int, list]
    assert newest[3] == [b"ECHO", b"slow"] and abs(newest[1] - time.time()) < 5
    assert len(conn.call("SLOWLOG", "GET", 1)) == 1
    assert conn.call("CONFIG", "SET", "slowlog-log-slower-than", 10**9) == "OK"
    assert conn.call("SLOWLOG", "RESET") == "OK"
    assert conn.call("SLOWLOG", "LEN") == 0
    error = Error("ERR Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")
    assert [conn.call("SLOWLOG", *bad) for bad in (("BOGUS",), ("LEN", "x"), ("GET", 1, 2))] == [error] * 3


def test_latency(raw: RawFactory) -> None:
    conn = raw()
    assert conn.call_raw("LATENCY", "LATEST") == b"*0\r\n"
    assert type(conn.call("LATENCY", "DOCTOR")) is bytes
    assert conn.call_raw("LATENCY", "HISTORY", "command") == b"*0\r\n"
    assert conn.call("LATENCY", "GRAPH", "command") == Error("ERR No samples available for event 'command'")
    assert conn.call("LATENCY", "RESET") == 0
    assert conn.call("LATENCY", "BOGUS") == SYNTAX


def test_loadjob_and_bgrewriteaof(scratch_node: NodeProcess, raw: RawFactory) -> None:
    conn = raw(scratch_node)
    assert conn.call_raw("LOADJOB", "x") == b"-ERR LOADJOB is a special command only processed from AOF\r\n"
    assert conn.call_raw("BGREWRITEAOF") == b"+Background append only file rewriting started\r\n"  # AOF off


def test_debug(spawn: Spawn, raw: RawFactory, q: bytes) -> None:
    node = spawn()
    conn, waiter, other = raw(node), raw(node), raw(node)
    add(conn, q)
    conn.call("PAUSE", q + b"p", "all")
    waiter.send(b"GETJOB FROM %s-empty\r\n" % q)
    wait_for(lambda: b"blocked_clients:1\r\n" in conn.call("INFO", "clients"))
    assert conn.call_raw("DEBUG", "FLUSHALL") == b"+OK\r\n"
    assert waiter.read_raw() == b"*-1\r\n"
    info = parse_info(conn.call("INFO"))
    assert (info["Jobs"]["registered_jobs"], info["Queues"]["registered_queues"]) == ("0", "0")
    assert conn.call_raw("DEBUG", "ERROR", "BOOM it\r\nfailed") == b"-BOOM it  failed\r\n"
    assert type(conn.call("DEBUG", "STRUCTSIZE")) is bytes
    for value in ("nonsense", "-1", "nan", "inf", "-1e400", "0.01x"):  # C strtod; no negative sleeps
        assert conn.call("DEBUG", "SLEEP", value) == "OK"
    conn.send(b"DEBUG SLEEP 0.4\r\n")
    time.sleep(0.1)
    started = time.monotonic()
    assert other.call("PING") == "PONG"
    assert time.monotonic() - started >= 0.15  # the whole server slept
    assert conn.read() == "OK"
    for bad in (("bogus",), ("SLEEP",), ("FLUSHALL", "x"), ("ERROR",)):
        assert conn.call("DEBUG", *bad) == Error(f"ERR Unknown DEBUG subcommand or wrong number of arguments for '{bad[0]}'")
    assert conn.call("DEBUG", "RESTART", "x") == NOT_INT


def test_debug_restart(spawn: Spawn, raw: RawFactory) -> None:
    node = spawn()
    conn = raw(node)
    run_id = parse_info(conn.call("INFO", "server"))["Server"]["run_id"]
    conn.call("CONFIG", "SET", "hz", 17)
    conn.send(b"DEBUG RESTART -5\r\n")  # a negative delay is no delay
    assert conn.read_until_closed() == b""

    def restarted() -> dict[str, str] | None:
        probe = None
        try:
            probe = Raw(node)
            return parse_info(probe.call("INFO", "server"))["Server"]
        except OSError:
            return None
        finally:
            if probe is not None:
                probe.close()

    server = wait_for(restarted, timeout=10, what="restart")
    assert server["process_id"] == str(node.pid) and server["run_id"] != run_id
    assert raw(node).call("CONFIG", "GET", "hz") == [b"hz", b"17"]  # CONFIG REWRITE ran first
    assert node.alive()


# ---------------------------------------------------------------- process lifecycle


@pytest.mark.parametrize("args", [(), ("rewrite-aof",)])
def test_shutdown_exits_0_without_reply(spawn: Spawn, raw: RawFactory, args: tuple) -> None:
    node = spawn()
    conn = raw(node)
    conn.send(b"SHUTDOWN %s\r\n" % " ".join(args).encode())
    assert conn.read_until_closed() == b""
    assert node.proc is not None and node.proc.wait(10) == 0


def test_shutdown_bad_arguments(raw: RawFactory) -> None:
    conn = raw()
    assert conn.call("SHUTDOWN", "NOW") == SYNTAX
    assert conn.call("SHUTDOWN", "REWRITE-AOF", "x") == SYNTAX
    assert conn.call("PING") == "PONG"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_exit_0(spawn: Spawn, raw: RawFactory, q: bytes, signum: int) -> None:
    node = spawn()
    blocked = raw(node)
    blocked.send(b"GETJOB FROM %s\r\n" % q)
    node.signal(signum)
    assert node.proc is not None and node.proc.wait(10) == 0
    assert blocked.read_until_closed() == b""
    assert "Received %s scheduling shutdown" % signal.Signals(signum).name in node.log_path.read_text()


@pytest.mark.parametrize("argv", [["-v"], ["--version"], [str(Path(sys.executable).with_name("disque-server")), "-v"]])
def test_version(argv: list[str]) -> None:
    if argv[0].startswith("-"):
        result = run_cli(*argv)
    else:
        result = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    assert result.returncode == 0
    assert re.fullmatch(rb"Disque server v=\S+ sha=[0-9a-f]+:\d malloc=\S+ bits=(32|64) build=[0-9a-f]+\n", result.stdout)


def test_info_shows_the_revision_of_disque_server_version(raw: RawFactory) -> None:
    """INFO's disque_git_sha1/dirty are the revision `--version` prints."""
    version = run_cli("--version").stdout
    sha, dirty = re.search(rb"sha=([0-9a-f]+):(\d)", version).groups()  # type: ignore[union-attr]
    server = parse_info(raw().call("INFO", "server"))["Server"]
    assert (server["disque_git_sha1"], server["disque_git_dirty"]) == (sha.decode(), dirty.decode())
    assert server["arch_bits"] == "64"


def test_help_exits_1() -> None:
    result = run_cli("--help")
    assert result.returncode == 1 and b"Usage: disque-server" in result.stderr


@pytest.mark.parametrize(
    ("content", "extra", "line_no", "line", "message"),
    [
        ("port 7711\nfoo bar\n", (), 2, "foo bar", "Bad directive or wrong number of arguments"),
        ("# comment\n\n  loglevel loud  \n", (), 3, "loglevel loud", "Invalid log level. Must be one of debug, verbose, notice, warning"),
        ("maxclients 0\n", (), 1, "maxclients 0", "Invalid max clients limit"),
        ('requirepass "abc\n', (), 1, 'requirepass "abc', "Unbalanced quotes in configuration line"),
    ],
)  # fmt: skip
def test_bad_config_file_exits_1_with_the_fatal_block(
    tmp_path: Path, content: str, extra: tuple, line_no: int, line: str, message: str
) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text(content)
    result = run_cli(str(conf), *extra)
    assert result.returncode == 1
    expected = f"\n*** FATAL CONFIG FILE ERROR ***\nReading the configuration file, at line {line_no}\n>>> '{line}'\n{message}\n"
    assert result.stderr.decode() == expected


def test_a_bad_command_line_option_is_named_as_an_option(tmp_path: Path) -> None:
    conf = tmp_path / "good.conf"
    conf.write_text("port 7711\n")
    result = run_cli(str(conf), "--daemonize", "maybe")
    assert result.returncode == 1
    assert result.stderr.decode() == "disque-server: --daemonize \"maybe\": argument must be 'yes' or 'no'; disque-server --help shows the usage\n"


def test_missing_config_file_exits_1(tmp_path: Path) -> None:
    result = run_cli(str(tmp_path / "nope.conf"))
    assert result.returncode == 1
    assert f"can't open config file '{tmp_path / 'nope.conf'}'".encode() in result.stderr


def test_port_in_use_exits_1(shared_node: NodeProcess, tmp_path: Path) -> None:
    result = run_cli("--port", str(shared_node.port), "--bind", "127.0.0.1", "--dir", str(tmp_path))
    assert result.returncode == 1
