"""QSCAN and JSCAN: their filters and cursors."""

from __future__ import annotations

from disque.core import errors
from disque.core.types import Status

from jobenv import env


def test_scan_filters(env):
    a, b = env.add("q1", "x"), env.add("q2", "y")
    env.add("q2", "z")
    env.s("GETJOB", "FROM", "q1")
    cursor, names = env.s("QSCAN", "BUSYLOOP", "MINLEN", 1, "MAXLEN", 5, "IMPORTRATE", 0)
    assert sorted(names) == [b"q2"]
    assert sorted(env.s("QSCAN", "COUNT", 1000)[1]) == [b"q1", b"q2"]
    assert env.s("JSCAN", "BUSYLOOP", "STATE", "active", "STATE", "queued", "QUEUE", "q1")[1] == [Status(a)]
    assert b in env.s("JSCAN", "BUSYLOOP", "QUEUE", "q2", "REPLY", "id")[1]


def test_huge_cursor_is_an_invalid_cursor(env):
    reply = env.s("QSCAN", "9" * 5000)
    assert (reply.code, reply.message) == ("ERR", errors.bad_cursor().message)
