"""AUTH with requirepass: long passwords never match, repeated failures are
answered later and later, counted and logged."""

from __future__ import annotations

from disque.core import figures
from disque.core.types import BLOCKED, Status
from disque.core.node import BLOCKED_CRON_MS

from jobenv import OK, env
from support import Session


def test_auth(env):
    env.core.config.requirepass = "secret"
    s = Session(env.core)
    assert s("AUTH", "wrong").message == "invalid password"
    assert s("AUTH", "secret") == OK and s("QLEN", "q") == 0
    assert s("AUTH", "x" * 600).message == "invalid password" and s("QLEN", "q").code == "NOAUTH"
    env.core.config.requirepass = "y" * 600
    assert s("AUTH", "y" * 600).message == "invalid password"  # longer than 512: never matches


def test_repeated_wrong_passwords_are_answered_later_and_later_counted_and_logged(env, caplog):
    """Three wrong passwords answer at once; then each is answered after a
    delay that doubles from 100 ms up to 5 s, during which the connection
    runs nothing.  Other connections are not slowed; failures are counted
    in INFO and logged at most once per 10 s."""
    env.core.config.requirepass = "secret"
    s, other = Session(env.core), Session(env.core)
    assert other("AUTH", "secret") == OK
    for _ in range(3):
        assert s("AUTH", "wrong").message == "invalid password"
    delays = []
    for _ in range(8):
        assert s("AUTH", "wrong") is BLOCKED
        assert other("PING") == Status(b"PONG")
        waited = 0
        while not s.pending():
            env.wait(10)
            waited += 10
        delays.append(waited)
    wanted = [100, 200, 400, 800, 1600, 3200, 5000, 5000]
    assert all(want <= got <= want + BLOCKED_CRON_MS for want, got in zip(wanted, delays, strict=True)), delays
    assert s("HELLO", "3", "AUTH", "default", "wrong") is BLOCKED  # HELLO's AUTH is the same door
    env.wait(5_000 + BLOCKED_CRON_MS)
    assert [getattr(r, "code", None) for r in s.pending()] == ["WRONGPASS"]
    assert s("AUTH", "secret") == OK and s("QLEN", "q") == 0
    assert env.core.stats.auth_failures == 12 and figures.node_figures(env.core)["auth_failures"] == 12
    logged = [r for r in caplog.records if "Failed AUTH" in r.getMessage()]
    assert 2 <= len(logged) <= 3  # about 21 s of failures, one line per 10 s at most
