"""The command layer: the errors' wire form, every command's replies to bad
and edge arguments, the COMMAND table, QUIT, the gate's checks (NOAUTH,
OOM, MISCONF, LOADING), a failing handler, SHUTDOWN and RESETSTAT."""

from __future__ import annotations

import pytest

from disque.core import errors
from disque.protocols.resp.table import COMMANDS
from disque.core.errors import DisqueError
from disque.core.types import NIL_ARRAY, SILENT, Status

from jobenv import ODD_ID, OK, env, level2_limit
from support import NODE_ID, START_MS, Session


@pytest.mark.parametrize(
    "error, text",
    [
        (DisqueError("ERR", "a\r\nb"), b"ERR a  b"),
        (DisqueError("CODE"), b"CODE"),
        (errors.wrong_arity("ping"), b"ERR wrong number of arguments for 'ping' command"),
        (errors.unknown_command("Nope"), b"ERR unknown command 'Nope'"),
        (errors.misconf("No space left on device"), b"MISCONF Errors writing to the AOF file: No space left on device"),
        (errors.noreply_reason("x"), b"NOREPL Not enough reachable nodes for the requested replication level, "
         b"since I'm unable to hold a copy of the message for the following reason: x"),
    ],
)  # fmt: skip
def test_error_wire_form(error, text):
    assert error.wire() == text and str(error) == text.decode().replace("a  b", "a\r\nb")


ERR = errors.err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (("NOPE", "x"), ERR("unknown command 'NOPE'")),
        (("qlen",), ERR("wrong number of arguments for 'qlen' command")),
        (("PING", "a", "b"), ERR("wrong number of arguments for 'ping' command")),
        (("PING", "hi"), b"hi"),
        (("ECHO", "hi"), b"hi"),
        (("SELECT", "0"), OK),
        (("SELECT", "1"), ERR("DB index is out of range")),
        (("TIME",), [b"%d" % (START_MS // 1000), b"0"]),
        (("LOADJOB", "x"), ERR("LOADJOB is a special command only processed from AOF")),
        (("AUTH", "x"), ERR("Client sent AUTH, but no password is set")),
        (("INFO", "a", "b"), errors.syntax()),
        (("INFO", "nope"), b""),
        (("INFO", "JOBS"), b"# Jobs\r\nregistered_jobs:0\r\n"),
        (("COMMAND", "INFO", "addjob", "nope"),
         [["addjob", -4, [Status(b"write"), Status(b"denyoom"), Status(b"fast")], 0, 0, 0], None]),
        (("COMMAND", "x"), ERR("Unknown subcommand or wrong number of arguments.")),
        (("SLOWLOG", "LEN"), 0),
        (("SLOWLOG", "RESET"), OK),
        (("SLOWLOG", "GET"), []),
        (("SLOWLOG", "GET", "x"), errors.not_integer()),
        (("SLOWLOG", "nope"), ERR("Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")),
        (("LATENCY", "LATEST"), []),
        (("LATENCY", "DOCTOR"), b"No latency spikes were observed (latency monitoring is not sampling events)."),
        (("LATENCY", "HISTORY", "e"), []),
        (("LATENCY", "GRAPH", "e"), ERR("No samples available for event 'e'")),
        (("LATENCY", "RESET", "e"), 0),
        (("LATENCY", "nope"), errors.syntax()),
        (("SHUTDOWN", "nosave"), errors.syntax()),
        (("SHUTDOWN", "a", "b"), errors.syntax()),
        (("SHUTDOWN", "REWRITE-AOF"), SILENT),
        (("BGREWRITEAOF",), Status(b"Background append only file rewriting started")),
        (("CLUSTER", "MYID"), NODE_ID.encode()),
        (("HELLO",), [1, NODE_ID, [NODE_ID, "", b"7711", b"1"]]),
        (("CLUSTER", "LEAVING"), Status(b"no")),
        (("CLUSTER", "LEAVING", "maybe"), ERR("Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")),
        (("ADDJOB", "q", "b", "0", "TTL", "0"), ERR("TTL must be a number > 0")),
        (("ADDJOB", "q", "b", "x", "TTL", "0"), ERR("TTL must be a number > 0")),
        (("ADDJOB", "q", "b", "x"), errors.timeout_not_int()),
        (("ADDJOB", "q", "b", "-1"), errors.timeout_negative()),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "0"), ERR("REPLICATE must be between 1 and 65535")),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "65536"), ERR("REPLICATE must be between 1 and 65535")),
        (("ADDJOB", "q", "b", "0", "RETRY", "-1"), ERR("RETRY time must be a non negative number")),
        (("ADDJOB", "q", "b", "0", "DELAY", "1x"), ERR("DELAY time must be a non negative number")),
        (("ADDJOB", "q", "b", "0", "MAXLEN", "0"), ERR("MAXLEN must be a positive number")),
        (("ADDJOB", "q", "b", "0", "TTL"), errors.syntax()),
        (("ADDJOB", "q", "b", "0", "TTL", "9223372036854775808"), ERR("TTL must be a number > 0")),
        (("ADDJOB", "q", "b", "0", "TTL", "1" * 25), ERR("TTL must be a number > 0")),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "-" + "0" * 25 + "1"), ERR("REPLICATE must be between 1 and 65535")),
        (("ADDJOB", "q", "b", "0", "NOPE", "1"), errors.syntax()),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "2", "RETRY", "0"),
         ERR("With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)")),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "2"), errors.norepl_reach()),
        (("ADDJOB", "q", "b", "0", "DELAY", "10", "TTL", "10"),
         ERR("The specified DELAY is greater than TTL. Job refused since would never be delivered")),
        (("GETJOB", "NOHANG", "q"), errors.syntax()),
        (("GETJOB", "NOHANG"), errors.syntax()),
        (("GETJOB", "FROM"), errors.syntax()),
        (("GETJOB", "COUNT", "0", "FROM", "q"), ERR("COUNT must be a number greater than zero")),
        (("GETJOB", "COUNT", "x", "FROM", "q"), ERR("COUNT must be a number greater than zero")),
        (("GETJOB", "TIMEOUT", "-5", "FROM", "q"), errors.timeout_negative()),
        (("GETJOB", "TIMEOUT", "10", "NOHANG", "FROM", "q"), NIL_ARRAY),
        (("ACKJOB",), 0),
        (("DELJOB", "bad"), errors.badid()),
        (("DEQUEUE", ODD_ID, "bad"), errors.badid()),
        (("WORKING", ODD_ID), errors.nojob()),
        (("SHOW", ODD_ID), None),
        (("SHOW", "bad"), errors.badid()),
        (("QPEEK", "q", "1"), []),
        (("QSTAT", "q"), NIL_ARRAY),
        (("QSCAN", "x"), errors.bad_cursor()),
        (("QSCAN", "MINLEN", "x"), errors.not_integer()),
        (("QSCAN", "1", "2"), errors.syntax()),
        (("QSCAN", "-1"), [b"0", []]),
        (("QSCAN", "+1"), [b"0", []]),
        (("QSCAN", "18446744073709551616"), errors.bad_cursor()),
        (("JSCAN", "STATE"), errors.bad_cursor()),
        (("PAUSE", "q", "bogus"), errors.syntax()),
        (("PAUSE", "q", "in", "none"), Status(b"none")),
    ],
)  # fmt: skip
def test_command_replies(env, argv, expected):
    reply = env.s(*argv)
    if isinstance(expected, DisqueError):
        assert isinstance(reply, DisqueError) and (reply.code, reply.message) == (expected.code, expected.message)
    else:
        assert reply == expected and type(reply) is type(expected)


def test_command_count_counts_the_table(env):
    assert env.s("COMMAND", "COUNT") == len(COMMANDS) == 54  # the spec's 32 + ECHO, SELECT, SCANJOBS, WAITJOB, QSETTINGS, DEADLETTER, SCHEDULE, QCONFIG, RESULT, BATCH, QKEYS + bananaq's 7, okq's 4


def test_command_table_lists_every_command(env):
    table = env.s("COMMAND")
    assert sorted(entry[0] for entry in table) == sorted(c.decode() for c in COMMANDS)
    assert env.s("COMMAND", "DOCS") == []


def test_quit_closes_after_reply(env):
    assert env.s("QUIT", "whatever") == OK
    assert env.core.out.effects[-1].client_id == env.s.client.id


@pytest.mark.parametrize(
    "setup, argv, code",
    [
        ("requirepass", ("QLEN", "q"), "NOAUTH"),
        ("oom", ("ADDJOB", "q", "x", "0"), "OOM"),
        ("misconf", ("PING",), "MISCONF"),
        ("misconf", ("ADDJOB", "q", "x", "0"), "MISCONF"),  # what adds data; ACKJOB and GETJOB go on
        ("loading", ("QLEN", "q"), "LOADING"),
    ],
)
def test_dispatch_checks(env, setup, argv, code):
    core = env.core
    if setup == "requirepass":
        core.config.requirepass = "secret"
        s = Session(core)
    else:
        s = env.s
        if setup == "oom":
            core.config.maxmemory_policy = "noeviction"
            core.config.maxmemory = level2_limit(core.memory.used)
        elif setup == "misconf":
            core.set_aof_error("No space left on device")
        else:
            core.begin_load()
    assert s(*argv).code == code
    assert s("AUTH", "secret") == OK if setup == "requirepass" else s("INFO", "jobs").startswith(b"# Jobs")


def test_a_failing_handler_costs_one_reply(env, monkeypatch):
    from disque.protocols.resp import commands

    def broken(node, client, argv):
        raise RuntimeError("bug")

    monkeypatch.setitem(commands.COMMANDS, b"echo", commands.Command("echo", 2, "rF", broken))
    assert env.s("ECHO", "x").message == "internal error executing 'echo', check the server logs"
    assert env.s("PING") == Status(b"PONG")


def test_async_addjob_on_a_single_node_is_plain(env):
    job_id = bytes(env.s("ADDJOB", "q", "x", 0, "ASYNC"))
    assert env.state(job_id) == "queued"


def test_shutdown_failure_is_reported(env):
    env.host.shutdown_ok = False
    assert env.s("SHUTDOWN").message == "Errors trying to SHUTDOWN. Check logs."


def test_resetstat_zeroes_the_core_counters_and_the_shells(env):
    env.s("PING")
    assert env.core.stats.commands == 1
    assert env.s("CONFIG", "RESETSTAT") == Status(b"OK")
    assert env.core.stats.commands == 0 and list(env.core.stats.calls) == ["config"]  # RESETSTAT itself
    assert ("reset_stats",) in env.host.calls
