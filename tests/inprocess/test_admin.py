"""Tests for disque.protocols.resp.admin: the INFO sections, CONFIG, CLIENT, both HELLO
forms, DEBUG and CLUSTER, driven through the command layer of one core
with the exact replies and errors of spec/commands.md §7-9 and spec/config.md §3-4."""

from __future__ import annotations

import errno
import itertools
import re
from dataclasses import dataclass

import pytest

from disque import __version__
from disque.protocols.resp import admin
from disque.cluster.membership import FORGET_BLACKLIST_MS
from disque.core.effects import CloseClient, DropLink
from disque.core.errors import DisqueError
from disque.core.types import BLOCKED, REPLY_OFF, REPLY_ON, REPLY_SKIP, SILENT, Map, Status
from disque.core.node import NodeCore
from disque.store.job import Job
from support import NODE_ID, START_MS, Env, Session, linked_core, make_core

OK = Status(b"OK")

PEER = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"  # linked
LONELY = "1" * 40  # known, no outgoing link
SUSPECT = "2" * 40  # PFAIL
DEAD = "3" * 40  # FAIL
GONE = "4" * 40  # LEAVING, linked
MESH_CONF = (
    f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n"
    f"{PEER} 127.0.0.1:7712 noflags 0 1 connected\n"
    f"{LONELY} 127.0.0.1:7713 noflags 0 0 disconnected\n"
    f"{SUSPECT} 127.0.0.1:7714 fail? 1 0 disconnected\n"
    f"{DEAD} 127.0.0.1:7715 fail 0 0 disconnected\n"
    f"{GONE} 127.0.0.1:7716 leaving 0 1 connected\n"
)


def error(reply: object) -> str:
    """The error line a client would read (without '-' and CRLF)."""
    assert isinstance(reply, DisqueError), reply
    return reply.wire().decode()


def closed(core: NodeCore) -> list[int]:
    """IDs of the clients the core asked the shell to close."""
    return [e.client_id for e in core.out.effects if isinstance(e, CloseClient)]


@pytest.fixture
def env() -> Env:
    return Env.of(*make_core())


@pytest.fixture
def mesh() -> Env:
    """A node that knows five peers in every reachability state; PEER and
    GONE have an outgoing link."""
    return Env.of(*linked_core(MESH_CONF, (PEER, GONE), seed=3))


# ---------------------------------------------------------------- INFO


def section_titles(reply: bytes) -> list[str]:
    return re.findall(r"^# (\w+)\r$", reply.decode(), re.MULTILINE)


def test_info_default_and_all_choose_their_sections(env):
    default = ["Server", "Clients", "Memory", "Jobs", "Queues", "Persistence", "Stats", "CPU"]
    assert section_titles(env.s("INFO")) == default
    assert section_titles(env.s("INFO", "default")) == default
    assert section_titles(env.s("INFO", "ALL")) == default + [
        "Security", "Commandstats", "Kestrel", "Groups", "Federation", "Schedules", "Keys", "Limits", "Workflows"
    ]


def test_info_server_reports_uptime_and_run_id(env):
    env.clock.advance(90_061_000)  # one day, one hour, one minute, one second
    fields = dict(line.split(":", 1) for line in env.s("INFO", "server").decode().splitlines()[1:])
    assert (fields["uptime_in_seconds"], fields["uptime_in_days"]) == ("90061", "1")
    assert fields["run_id"] == env.core.run_id and re.fullmatch("[0-9a-f]{40}", fields["run_id"])
    assert (fields["tcp_port"], fields["hz"], fields["process_id"]) == ("7711", "10", "1")


@pytest.mark.parametrize("section", ["nope", "Server2", ""])
def test_info_unknown_section_is_an_empty_bulk(env, section):
    assert env.s.raw("INFO", section) == b"$0\r\n\r\n"


def test_info_sections_are_separated_by_one_empty_line(env):
    reply = env.s("INFO", "all")
    assert reply.startswith(b"# Server\r\ndisque_version:" + __version__.encode() + b"\r\n")
    assert b"\r\nconfig_file:\r\n\r\n# Clients\r\nconnected_clients:1\r\n" in reply
    assert reply.count(b"\r\n\r\n# ") == 17 and b"\r\n\r\n\r\n" not in reply
    assert reply.endswith(b"\r\n") and not reply.endswith(b"\r\n\r\n")


def test_info_commandstats_lists_called_commands_in_table_order(env):
    # in microseconds, then INFO itself takes no time
    durations = itertools.chain([1000, 2001, 500], itertools.repeat(0))
    env.clock.since_us = lambda: next(durations)
    env.s("QLEN", "q")
    env.s("PING")
    env.s("PING")
    assert env.s("INFO", "COMMANDSTATS") == (
        b"# Commandstats\r\n"
        b"cmdstat_qlen:calls=1,usec=1000,usec_per_call=1000.00\r\n"
        b"cmdstat_ping:calls=2,usec=2501,usec_per_call=1250.50\r\n"
    )


def test_info_commandstats_forgets_calls_counted_before_resetstat(env):
    env.s("PING")
    env.s("CONFIG", "RESETSTAT")
    assert env.s("INFO", "commandstats") == b"# Commandstats\r\ncmdstat_config:calls=1,usec=0,usec_per_call=0.00\r\n"


# ---------------------------------------------------------------- CONFIG


def test_config_get_returns_name_value_pairs(env):
    reply = env.s("CONFIG", "GET", "maxmemory")
    assert isinstance(reply, Map) and list(reply) == [("maxmemory", str(1 << 30))]
    assert env.s.raw("CONFIG", "GET", "maxmemory") == b"*2\r\n$9\r\nmaxmemory\r\n$10\r\n1073741824\r\n"
    assert env.s.raw("CONFIG", "GET", "MAXMEMORY") == b"*0\r\n"  # the pattern is case-sensitive
    names = [name for name, _ in env.s("CONFIG", "GET", "maxmemory*")]
    assert names == ["maxmemory", "maxmemory-samples", "maxmemory-policy"]


def test_config_set_applies_and_tells_the_host(env):
    assert env.s("CONFIG", "SET", "MaxMemory", "2mb") == OK
    assert env.core.config.maxmemory == 2 << 20
    assert env.host.calls == [("apply_config", ("maxmemory",))]
    assert list(env.s("CONFIG", "GET", "maxmemory")) == [("maxmemory", str(2 << 20))]
    assert env.s("CONFIG", "set", "maxmemory", str(2 << 20)) == OK  # unchanged: no attribute to apply
    assert env.host.calls[-1] == ("apply_config", ())


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("port", "7000", "ERR Unsupported CONFIG parameter: port"),
        ("nope", "1", "ERR Unsupported CONFIG parameter: nope"),
        ("maxmemory", "-1", "ERR Invalid argument '-1' for CONFIG SET 'maxmemory'"),
        ("appendonly", "maybe", "ERR Invalid argument 'maybe' for CONFIG SET 'appendonly'"),
    ],
)
def test_config_set_rejects_without_applying(env, name, value, expected):
    before = env.core.config.maxmemory, env.core.config.appendonly
    assert error(env.s("CONFIG", "SET", name, value)) == expected
    assert (env.core.config.maxmemory, env.core.config.appendonly) == before
    assert env.host.calls == []


@pytest.mark.parametrize(
    "argv, expected",
    [
        (("NOPE",), "ERR CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE"),
        (("GET",), "ERR Wrong number of arguments for CONFIG GET"),
        (("get", "a", "b"), "ERR Wrong number of arguments for CONFIG get"),
        (("Set", "maxmemory"), "ERR Wrong number of arguments for CONFIG Set"),
        (("RESETSTAT", "x"), "ERR Wrong number of arguments for CONFIG RESETSTAT"),
        (("rewrite", "x"), "ERR Wrong number of arguments for CONFIG rewrite"),
    ],
)
def test_config_argument_errors(env, argv, expected):
    assert error(env.s("CONFIG", *argv)) == expected
    assert env.host.calls == []


def test_config_rewrite_needs_a_config_file(env):
    assert error(env.s("CONFIG", "REWRITE")) == "ERR The server is running without a config file"
    assert env.host.calls == []
    env.core.config.config_file = "/etc/disque.conf"
    assert env.s("CONFIG", "REWRITE") == OK
    assert env.host.calls == [("rewrite_config",)]


# ---------------------------------------------------------------- CLIENT


def test_client_list_describes_every_connection(env):
    consumer = Session(env.core)
    assert consumer("CLIENT", "SETNAME", "worker") == OK
    assert consumer("GETJOB", "FROM", "q") is BLOCKED
    env.clock.advance(5_000)
    me, other = env.s.client, consumer.client
    assert env.s("CLIENT", "LIST").decode() == (
        f"id={me.id} addr={me.addr} fd=-1 name= age=5 idle=0 flags=N qbuf=0 qbuf-free=0 "
        f"obl=0 oll=0 omem=0 events=r cmd=client\n"
        f"id={other.id} addr={other.addr} fd=-1 name=worker age=5 idle=5 flags=b qbuf=0 qbuf-free=0 "
        f"obl=0 oll=0 omem=0 events=r cmd=getjob\n"
    )


def test_client_list_flags_a_producer_waiting_for_replication(mesh):
    producer = Session(mesh.core)
    assert producer("ADDJOB", "q", "x", 0, "REPLICATE", 2) is BLOCKED
    line = mesh.s("CLIENT", "LIST").decode().splitlines()[1]
    assert line.startswith(f"id={producer.client.id} ") and " flags=b " in line and line.endswith(" cmd=addjob")


def test_client_names(env):
    assert env.s("CLIENT", "GETNAME") is None
    assert env.s("CLIENT", "SETNAME", "job-runner") == OK
    assert env.s("CLIENT", "GETNAME") == b"job-runner"
    assert env.s("CLIENT", "SETNAME", "") == OK  # an empty name clears it
    assert env.s("CLIENT", "GETNAME") is None


@pytest.mark.parametrize("name", ["with space", "new\nline", "tab\t", "del\x7f", "caf\u00e9"])
def test_client_setname_rejects_special_characters(env, name):
    env.s("CLIENT", "SETNAME", "kept")
    reply = env.s("CLIENT", "SETNAME", name)
    assert error(reply) == "ERR Client names cannot contain spaces, newlines or special characters."
    assert env.s.client.name == b"kept"


def test_client_id_and_setinfo(env):
    assert env.s("CLIENT", "ID") == env.s.client.id
    assert env.s("CLIENT", "SETINFO", "LIB-NAME", "redis-py") == OK
    assert env.s("CLIENT", "SETINFO", "lib-ver", "5.0.1") == OK
    assert (env.s.client.lib_name, env.s.client.lib_ver) == (b"redis-py", b"5.0.1")
    assert error(env.s("CLIENT", "SETINFO", "lib-os", "x")) == "ERR Unrecognized option 'lib-os'"
    assert (env.s.client.lib_name, env.s.client.lib_ver) == (b"redis-py", b"5.0.1")


def test_client_kill_by_address(env):
    victim = Session(env.core)
    assert error(env.s("CLIENT", "KILL", "127.0.0.1:1")) == "ERR No such client"
    assert closed(env.core) == [] and not victim.client.closing
    assert env.s("CLIENT", "KILL", victim.client.addr) == OK
    assert closed(env.core) == [victim.client.id] and victim.client.closing
    assert not env.s.client.closing


@dataclass
class Trio:
    core: NodeCore
    me: Session
    a: Session
    b: Session


@pytest.fixture
def trio(env) -> Trio:
    return Trio(env.core, env.s, Session(env.core), Session(env.core))


def test_client_kill_filter_by_id(trio):
    assert trio.me("CLIENT", "KILL", "ID", trio.a.client.id) == 1
    assert closed(trio.core) == [trio.a.client.id]
    assert trio.me("CLIENT", "KILL", "ID", 999) == 0
    assert closed(trio.core) == [trio.a.client.id]


def test_client_kill_filter_by_address_and_type(trio):
    assert trio.me("CLIENT", "KILL", "addr", trio.b.client.addr, "TYPE", "Normal") == 1
    assert closed(trio.core) == [trio.b.client.id]


def test_client_kill_filters_combine(trio):
    assert trio.me("CLIENT", "KILL", "ID", trio.a.client.id, "ADDR", trio.b.client.addr) == 0
    assert closed(trio.core) == []


def test_client_kill_by_type_skips_the_caller_by_default(trio):
    assert trio.me("CLIENT", "KILL", "TYPE", "normal") == 2
    assert sorted(closed(trio.core)) == sorted([trio.a.client.id, trio.b.client.id])
    assert not trio.me.client.closing


def test_client_kill_skipme(trio):
    me = trio.me.client.id
    assert trio.me("CLIENT", "KILL", "ID", me) == 0
    assert trio.me("CLIENT", "KILL", "ID", me, "SKIPME", "yes") == 0
    assert closed(trio.core) == []
    assert trio.me("CLIENT", "KILL", "ID", me, "SKIPME", "NO") == 1
    assert closed(trio.core) == [me] and trio.me.client.closing


@pytest.mark.parametrize(
    "filters, expected",
    [
        (("ID", "1", "TYPE"), "ERR syntax error"),
        (("ID", "x"), "ERR syntax error"),
        (("ID", "1.0"), "ERR syntax error"),
        (("TYPE", "master"), "ERR Unknown client type 'master'"),
        (("SKIPME", "maybe"), "ERR syntax error"),
        (("USER", "default"), "ERR syntax error"),
        (("TYPE", "normal", "LADDR", "x"), "ERR syntax error"),
    ],
)
def test_client_kill_filter_errors_kill_nobody(trio, filters, expected):
    assert error(trio.me("CLIENT", "KILL", *filters)) == expected
    assert closed(trio.core) == []


def test_client_pause_sets_the_deadline(env):
    env.clock.advance(250)
    assert env.s("CLIENT", "PAUSE", 1500) == OK
    assert env.core.client_pause_until == START_MS + 250 + 1500


@pytest.mark.parametrize(
    "value, expected", [("-1", "ERR timeout is negative"), ("soon", "ERR timeout is not an integer or out of range")]
)
def test_client_pause_rejects_bad_timeouts(env, value, expected):
    assert error(env.s("CLIENT", "PAUSE", value)) == expected
    assert env.core.client_pause_until == 0


def test_client_reply_off_silences_until_on(env):
    assert env.s("CLIENT", "REPLY", "OFF") is SILENT
    assert env.s.client.reply_mode == REPLY_OFF
    assert env.s("PING") is SILENT and env.s("PING") is SILENT
    assert env.s("CLIENT", "reply", "on") == OK
    assert env.s.client.reply_mode == REPLY_ON and env.s("PING") == Status(b"PONG")


def test_client_reply_skip_silences_the_next_command_only(env):
    assert env.s("CLIENT", "REPLY", "Skip") is SILENT
    assert env.s.client.reply_mode == REPLY_SKIP
    assert env.s("PING") is SILENT
    assert env.s("PING") == Status(b"PONG") and env.s.client.reply_mode == REPLY_ON


CLIENT_SYNTAX = "ERR Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME connection-name)"


@pytest.mark.parametrize(
    "argv",
    [
        ("NOPE",),
        ("LIST", "x"),
        ("GETNAME", "x"),
        ("SETNAME",),
        ("SETNAME", "a", "b"),
        ("ID", "x"),
        ("SETINFO", "lib-name"),
        ("KILL",),
        ("PAUSE",),
        ("REPLY",),
        ("REPLY", "sometimes"),
    ],
)
def test_client_syntax_errors(env, argv):
    assert error(env.s("CLIENT", *argv)) == CLIENT_SYNTAX
    assert env.s.client.reply_mode == 0 and closed(env.core) == []


# ---------------------------------------------------------------- HELLO


def test_hello_lists_every_node_with_its_priority(mesh):
    reply = mesh.s("HELLO")
    assert reply[:2] == [1, NODE_ID] and len(reply) == 2 + 6
    entries = {entry[0]: entry[1:] for entry in reply[2:]}
    assert entries == {
        NODE_ID: ["127.0.0.1", b"7711", b"1"],
        PEER: ["127.0.0.1", b"7712", b"1"],
        LONELY: ["127.0.0.1", b"7713", b"5"],
        SUSPECT: ["127.0.0.1", b"7714", b"10"],
        DEAD: ["127.0.0.1", b"7715", b"100"],
        GONE: ["127.0.0.1", b"7716", b"100"],
    }


def test_hello_priority_of_a_leaving_myself(mesh):
    assert mesh.s("CLUSTER", "LEAVING", "yes") == OK
    entries = {entry[0]: entry[3] for entry in mesh.s("HELLO")[2:]}
    assert entries[NODE_ID] == b"100" and entries[PEER] == b"1"


def test_hello_includes_handshake_nodes(env):
    env.s("CLUSTER", "MEET", "10.0.0.2", 7711)
    (handshake,) = [entry for entry in env.s("HELLO")[2:] if entry[0] != NODE_ID]
    assert handshake[1:] == ["10.0.0.2", b"7711", b"5"] and len(handshake[0]) == 40


def test_redis_hello_reply_and_setname(env):
    reply = env.s("HELLO", "2", "SETNAME", "api")
    assert isinstance(reply, Map)
    assert list(reply) == [
        (b"server", b"disque"),
        (b"version", __version__.encode()),
        (b"proto", 2),
        (b"id", env.s.client.id),
        (b"mode", b"cluster"),
        (b"role", b"master"),
        (b"modules", []),
        (b"node-id", NODE_ID.encode()),
    ]
    assert env.s.client.name == b"api" and env.s.client.proto == 2


@pytest.mark.parametrize(
    "args, expected",
    [
        (("x",), "ERR Protocol version is not an integer or out of range"),
        (("1",), "NOPROTO unsupported protocol version"),
        (("4",), "NOPROTO unsupported protocol version"),
        (("3", "SETNAME"), "ERR Syntax error in HELLO option 'SETNAME'"),
        (("3", "AUTH", "default"), "ERR Syntax error in HELLO option 'AUTH'"),
        (("3", "Bogus", "x"), "ERR Syntax error in HELLO option 'Bogus'"),
        (("3", "AUTH", "default", "secret"), "WRONGPASS invalid username-password pair or user is disabled."),
        (("3", "SETNAME", "a b"), "ERR Client names cannot contain spaces, newlines or special characters."),
    ],
)
def test_redis_hello_errors_keep_the_protocol(env, args, expected):
    assert error(env.s("HELLO", *args)) == expected
    assert env.s.client.proto == 2 and env.s.client.name == b""


@pytest.fixture
def locked(env) -> Env:
    env.core.config.requirepass = "secret"
    return env


def test_redis_hello_authenticates(locked):
    reply = locked.s("HELLO", "3", "auth", "default", "secret", "setname", "app")
    assert dict(reply)[b"proto"] == 3
    assert locked.s.client.authenticated and locked.s.client.proto == 3 and locked.s.client.name == b"app"
    assert locked.s("QLEN", "q") == 0


@pytest.mark.parametrize("user, password", [("default", "wrong"), ("admin", "secret")])
def test_redis_hello_rejects_bad_credentials(locked, user, password):
    reply = locked.s("HELLO", "3", "AUTH", user, password)
    assert error(reply) == "WRONGPASS invalid username-password pair or user is disabled."
    assert not locked.s.client.authenticated and locked.s.client.proto == 2


def test_redis_hello_without_auth_needs_a_prior_auth(locked):
    assert error(locked.s("HELLO", "3", "SETNAME", "app")) == "NOAUTH Authentication required."
    assert locked.s.client.proto == 2 and locked.s.client.name == b""
    assert locked.s("AUTH", "secret") == OK
    assert dict(locked.s("HELLO", "3"))[b"proto"] == 3


# ---------------------------------------------------------------- DEBUG


def test_debug_flushall_drops_jobs_and_queues(env):
    env.s("ADDJOB", "q1", "x", 0)
    env.s("ADDJOB", "q2", "y", 0)
    assert env.s("DEBUG", "FlushAll") == OK
    assert len(env.core.jobs) == 0 and len(env.core.queues) == 0
    assert env.s("INFO", "jobs") == b"# Jobs\r\nregistered_jobs:0\r\n"


def test_debug_error_replies_the_text_verbatim(env):
    assert env.s.raw("DEBUG", "ERROR", "CUSTOM something broke") == b"-CUSTOM something broke\r\n"
    assert env.s.raw("DEBUG", "error", "two\r\nlines") == b"-two  lines\r\n"


def test_debug_structsize(env):
    assert env.s("DEBUG", "STRUCTSIZE") == b"job:%d\r\n" % Job.__basicsize__


@pytest.mark.parametrize(
    "raw, seconds",
    [
        ("1.5", b"1.5"),
        ("2", b"2.0"),
        (".25", b"0.25"),
        ("  3.5xyz", b"3.5"),
        ("1e-3", b"0.001"),
        ("abc", b"0.0"),
        ("", b"0.0"),
        ("nan", b"0.0"),
        ("-3", b"0.0"),
        ("0", b"0.0"),
        ("1e20", b"2147483648"),
        ("1e400", b"2147483648"),
    ],
)
def test_debug_sleep_reads_seconds_like_strtod(env, raw, seconds):
    assert env.s("DEBUG", "SLEEP", raw) == OK
    assert env.host.calls == [("debug", "sleep", (seconds,))]


@pytest.mark.parametrize(
    "argv, call",
    [
        (("RESTART",), ("restart", ())),
        (("restart", "250"), ("restart", (b"250",))),
        (("RESTART", "-5"), ("restart", (b"0",))),
        (("RESTART", "9223372036854775807"), ("restart", (b"%d" % (admin.MAX_SLEEP_S * 1000),))),
        (("CRASH-AND-RECOVER",), ("crash-and-recover", ())),
        (("crash-and-recover", "10"), ("crash-and-recover", (b"10",))),
        (("LOADAOF",), ("loadaof", ())),
        (("SEGFAULT",), ("segfault", ())),
        (("assert",), ("assert", ())),
        (("OOM",), ("oom", ())),
        (("AOF-FAULT", "FSYNC"), ("aof-fault", (b"fsync",))),
        (("aof-fault", "write"), ("aof-fault", (b"write",))),
        (("AOF-FAULT", "OFF"), ("aof-fault", (b"off",))),
    ],
)
def test_debug_host_subcommands(env, argv, call):
    assert env.s("DEBUG", *argv) == OK
    assert env.host.calls == [("debug", *call)]


def test_debug_restart_delay_must_be_an_integer(env):
    assert error(env.s("DEBUG", "RESTART", "soon")) == "ERR value is not an integer or out of range"
    assert env.host.calls == []


@pytest.mark.parametrize(
    "argv",
    [("Nope",), ("SLEEP",), ("SLEEP", "1", "2"), ("FLUSHALL", "x"), ("ERROR",), ("STRUCTSIZE", "x"),
     ("RESTART", "1", "2"), ("LOADAOF", "x"), ("OOM", "now"), ("AOF-FAULT",), ("AOF-FAULT", "READ")],
)  # fmt: skip
def test_debug_unknown_or_wrong_arity(env, argv):
    reply = env.s("DEBUG", *argv)
    assert error(reply) == f"ERR Unknown DEBUG subcommand or wrong number of arguments for '{argv[0]}'"
    assert env.host.calls == []


# ---------------------------------------------------------------- CLUSTER


def test_cluster_nodes_on_a_fresh_node(env):
    assert env.s("CLUSTER", "NODES") == f"{NODE_ID} :7711 myself 0 0 connected\n".encode()


def test_cluster_nodes_shows_flags_times_and_links(mesh):
    t = START_MS
    assert mesh.s("CLUSTER", "NODES").decode().splitlines() == [
        f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected",
        f"{PEER} 127.0.0.1:7712 noflags {t} {t} connected",
        f"{LONELY} 127.0.0.1:7713 noflags 0 0 disconnected",
        f"{SUSPECT} 127.0.0.1:7714 fail? {t} 0 disconnected",
        f"{DEAD} 127.0.0.1:7715 fail 0 0 disconnected",
        f"{GONE} 127.0.0.1:7716 leaving {t} {t} connected",
    ]


def test_cluster_info_counts(mesh):
    assert mesh.s("CLUSTER", "INFO") == (
        b"cluster_state:ok\r\n"
        b"cluster_known_nodes:6\r\n"
        b"cluster_reachable_nodes:2\r\n"  # PEER and LONELY
        b"cluster_size:6\r\n"
        b"cluster_stats_messages_sent:2\r\n"  # the PINGs on the two new links
        b"cluster_stats_messages_received:0\r\n"
    )


def test_cluster_meet_starts_one_handshake(env):
    assert env.s("CLUSTER", "MEET", "10.0.0.2", "7712") == OK
    assert env.s("CLUSTER", "MEET", "10.0.0.2", "7712") == OK  # already in progress
    assert env.s("CLUSTER", "MEET", "::1", "+7713") == OK
    others = [n for n in env.core.membership.nodes.values() if n.id != NODE_ID]
    assert [(n.ip, n.port) for n in others] == [("10.0.0.2", 7712), ("::1", 7713)]
    lines = env.s("CLUSTER", "NODES").decode().splitlines()
    assert lines[1] == f"{others[0].id} 10.0.0.2:7712 handshake 0 0 disconnected"
    assert b"cluster_known_nodes:3\r\ncluster_reachable_nodes:0\r\ncluster_size:1\r\n" in env.s("CLUSTER", "INFO")


@pytest.mark.parametrize(
    "ip, port, expected",
    [
        ("10.0.0.2", "x", "ERR Invalid TCP port specified: x"),
        ("10.0.0.2", "7712.0", "ERR Invalid TCP port specified: 7712.0"),
        ("localhost", "7712", "ERR Invalid node address specified: localhost:7712"),
        ("10.0.0.256", "7712", "ERR Invalid node address specified: 10.0.0.256:7712"),
        ("10.0.0.2", "0", "ERR Invalid node address specified: 10.0.0.2:0"),
        ("10.0.0.2", "55536", "ERR Invalid node address specified: 10.0.0.2:55536"),
        ("10.0.0.2", "-1", "ERR Invalid node address specified: 10.0.0.2:-1"),
    ],
)
def test_cluster_meet_rejects_bad_addresses(env, ip, port, expected):
    assert error(env.s("CLUSTER", "MEET", ip, port)) == expected
    assert list(env.core.membership.nodes) == [NODE_ID]


@pytest.mark.parametrize("port", ["1", "55535"])
def test_cluster_meet_port_bounds(env, port):
    assert env.s("CLUSTER", "MEET", "10.0.0.2", port) == OK
    assert len(env.core.membership.nodes) == 2


def test_cluster_forget_removes_and_blacklists(mesh):
    key = mesh.core.membership.nodes[PEER].key
    assert mesh.s("CLUSTER", "FORGET", PEER) == OK
    assert PEER not in mesh.core.membership.nodes
    assert mesh.core.membership.blacklist[PEER] == START_MS + FORGET_BLACKLIST_MS
    assert DropLink(key) in mesh.core.out.effects
    assert b"cluster_known_nodes:5\r\n" in mesh.s("CLUSTER", "INFO")


@pytest.mark.parametrize(
    "node_id, expected",
    [
        ("abc", "ERR Invalid node identifier"),
        (PEER + "0", "ERR Invalid node identifier"),
        (NODE_ID, "ERR I tried hard but I can't forget myself..."),
        ("9" * 40, "ERR Unknown node " + "9" * 40),
    ],
)
def test_cluster_forget_errors(mesh, node_id, expected):
    assert error(mesh.s("CLUSTER", "FORGET", node_id)) == expected
    assert len(mesh.core.membership.nodes) == 6 and mesh.core.membership.blacklist == {}


@pytest.mark.parametrize("argv", [("RESET",), ("RESET", "SOFT"), ("reset", "soft")])
def test_cluster_soft_reset_forgets_peers_and_flushes(mesh, argv):
    assert isinstance(mesh.s("ADDJOB", "q", "x", 0, "REPLICATE", 1), Status)
    assert mesh.s("CLUSTER", *argv) == OK
    assert list(mesh.core.membership.nodes) == [NODE_ID] and mesh.s("CLUSTER", "MYID") == NODE_ID.encode()
    assert len(mesh.core.jobs) == 0 and len(mesh.core.queues) == 0
    assert mesh.host.calls == [("save_cluster_config", True)]


def test_cluster_hard_reset_takes_a_new_id(mesh):
    assert mesh.s("CLUSTER", "RESET", "HARD") == OK
    new_id = mesh.s("CLUSTER", "MYID").decode()
    assert new_id != NODE_ID and re.fullmatch("[0-9a-f]{40}", new_id)
    assert list(mesh.core.membership.nodes) == [new_id]
    assert mesh.host.calls == [("save_cluster_config", True)]


def test_cluster_reset_with_a_bad_mode_changes_nothing(mesh):
    mesh.s("ADDJOB", "q", "x", 0, "REPLICATE", 1)
    assert error(mesh.s("CLUSTER", "RESET", "medium")) == "ERR syntax error"
    assert len(mesh.core.membership.nodes) == 6 and len(mesh.core.jobs) == 1
    assert mesh.host.calls == []


def test_cluster_saveconfig(env):
    assert env.s("CLUSTER", "SAVECONFIG") == OK
    assert env.host.calls == [("save_cluster_config", True)]


@pytest.mark.parametrize("argv", [("SAVECONFIG",), ("RESET",)])
def test_cluster_config_save_failure_is_reported(env, monkeypatch, argv):
    def failing(fsync: bool) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(env.host, "save_cluster_config", failing)
    assert error(env.s("CLUSTER", *argv)) == "ERR error saving the cluster node config: No space left on device"


def test_cluster_leaving_round_trip(env):
    assert env.s("CLUSTER", "LEAVING", "YES") == OK
    assert env.s("CLUSTER", "LEAVING") == Status(b"yes")
    assert f"{NODE_ID} :7711 myself,leaving 0 0 connected\n".encode() == env.s("CLUSTER", "NODES")
    assert env.s("CLUSTER", "leaving", "no") == OK
    assert env.s("CLUSTER", "LEAVING") == Status(b"no")
    reply = env.s("CLUSTER", "LEAVING", "maybe")
    assert error(reply) == "ERR Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'"
    assert not env.core.membership.leaving


@pytest.mark.parametrize(
    "argv",
    [("NOPE",), ("MYID", "x"), ("NODES", "x"), ("INFO", "x"), ("LEAVING", "yes", "now"), ("MEET", "10.0.0.2"),
     ("FORGET",), ("RESET", "SOFT", "now"), ("SAVECONFIG", "x"), ("SLOTS",)],
)  # fmt: skip
def test_cluster_wrong_subcommand_or_arity(mesh, argv):
    assert error(mesh.s("CLUSTER", *argv)) == "ERR Wrong CLUSTER subcommand or number of arguments"
    assert len(mesh.core.membership.nodes) == 6 and mesh.host.calls == []



def test_info_limits_counts_the_limited_queues(env):
    env.s("QCONFIG", "q", "SET", "concurrency", 2)
    fields = dict(line.split(":", 1) for line in env.s("INFO", "limits").decode().splitlines()[1:])
    assert fields["limited_queues"] == "1" and fields["limited_jobs_out"] == "0" and fields["limit_records_dropped"] == "0"
