"""A connection's own settings and life: CLIENT REPLY, HELLO's protocol,
MONITOR, the idle timeout."""

from __future__ import annotations

from disque.core.types import SILENT, Status

from jobenv import OK, env
from support import START_MS, Session


def test_client_reply_modes(env):
    s = env.s
    assert s("CLIENT", "REPLY", "SKIP") is SILENT
    assert s("PING") is SILENT and s("PING") == Status(b"PONG")
    assert s("CLIENT", "REPLY", "OFF") is SILENT and s("PING") is SILENT
    assert s("CLIENT", "REPLY", "ON") == OK and s("PING") == Status(b"PONG")


def test_redis_hello_switches_protocol(env):
    reply = env.s("HELLO", "3")
    assert dict(reply)[b"proto"] == 3 and env.s.client.proto == 3
    assert env.s.raw("QSTAT", "nope") == b"_\r\n"


def test_monitor_quotes_arguments(env):
    watcher = Session(env.core)
    assert watcher("MONITOR") == OK
    env.s("PING", b'a\r\n"b\\\x00\xff')
    watcher("PING")  # its own commands are not echoed
    (line,) = watcher.pending()
    addr = env.s.client.addr.encode()
    assert line == Status(b'%d.000000 [%s] "PING" "a\\r\\n\\"b\\\\\\x00\\xff"' % (START_MS // 1000, addr))
    env.core.disconnect(watcher.client.id)
    env.s("PING")
    assert watcher.pending() == []


def test_idle_clients_are_closed_per_timeout_directive(env):
    env.core.config.timeout = 2
    idle, blocked, watcher = Session(env.core), Session(env.core), Session(env.core)
    blocked("GETJOB", "FROM", "q")
    watcher("MONITOR")
    env.wait(1_500)
    env.s("PING")
    env.core.out.effects.clear()
    env.wait(600)
    closed = {e.client_id for e in env.core.out.effects if type(e).__name__ == "CloseClient"}
    assert closed == {idle.client.id}
