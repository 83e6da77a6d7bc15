"""SLOWLOG: slow commands recorded, bounded, reset."""

from __future__ import annotations

from jobenv import env
from support import START_MS


def test_slowlog_records_slow_commands(env):
    env.clock.since_us = lambda: 20_000  # every command takes 20 ms
    env.core.config.slowlog_max_len = 2
    for n in range(3):
        env.s("QLEN", f"q{n}")
    entries = env.s("SLOWLOG", "GET")
    assert entries == [[3, START_MS // 1000, 20_000, [b"QLEN", b"q2"]], [2, START_MS // 1000, 20_000, [b"QLEN", b"q1"]]]
    assert env.s("SLOWLOG", "LEN") == 2
    assert [e[3] for e in env.s("SLOWLOG", "GET", 1)] == [[b"SLOWLOG", b"LEN"]]
    env.core.config.slowlog_log_slower_than = -1
    env.s("SLOWLOG", "RESET")
    env.s("QLEN", "q")
    assert env.s("SLOWLOG", "LEN") == 0
