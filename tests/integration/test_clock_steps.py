"""Steps of the wall clock under a running node (libfaketime, whose offset
is re-read from a file at every call): timers keep running on the monotonic
clock, whatever the step."""

from __future__ import annotations

import glob
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from support import wait_for
from disque.testing.devcluster import NodeProcess

LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))


class Step:
    def __init__(self, path: Path) -> None:
        self.path = path
        self("+0")

    def __call__(self, offset: str) -> None:
        """Set the wall clock `offset` seconds from the true time ("-60", "+3600")."""
        tmp = self.path.with_suffix(".new")
        tmp.write_text(offset + "\n")
        tmp.replace(self.path)


@pytest.fixture
def stepped(spawn: Callable[..., NodeProcess], tmp_path: Path) -> Iterator[tuple[redis.Redis, Step]]:
    assert LIBFAKETIME, "libfaketime is missing: `make tools-clock` installs it"
    step = Step(tmp_path / "faketime")
    env = {
        "LD_PRELOAD": LIBFAKETIME[0],
        "FAKETIME_TIMESTAMP_FILE": str(step.path),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    node = spawn(env=env)
    r = redis.Redis(port=node.port)
    yield r, step
    r.close()


def test_a_step_back_neither_freezes_delays_nor_blocking_timeouts(stepped):
    r, step = stepped
    start = time.monotonic()
    r.execute_command("ADDJOB", "qt", "j", 0, "TTL", 300, "DELAY", 5, "RETRY", 30)
    step("-60")
    assert r.execute_command("GETJOB", "TIMEOUT", 2000, "FROM", "empty") is None
    blocked = time.monotonic() - start
    step("+0")
    assert 1.9 <= blocked < 3.5, f"GETJOB TIMEOUT 2000 returned after {blocked:.1f} s"
    wait_for(lambda: r.execute_command("QLEN", "qt") == 1, timeout=15)
    queued = time.monotonic() - start
    assert 4.9 <= queued < 7.0, f"a DELAY 5 job was queued after {queued:.1f} s"


def test_a_step_back_of_an_hour_does_not_stop_new_delays(stepped):
    r, step = stepped
    step("-3600")
    start = time.monotonic()
    r.execute_command("ADDJOB", "q1", "j", 0, "DELAY", 1)
    wait_for(lambda: r.execute_command("QLEN", "q1") == 1, timeout=15)
    assert time.monotonic() - start < 3.0


def test_a_step_forward_does_not_expire_jobs_at_once(stepped):
    r, step = stepped
    ids = [r.execute_command("ADDJOB", "q", f"job{i}", 0, "TTL", 60) for i in range(10)]
    step("+600")
    # Nothing to wait for but the absence of an event: a second of the
    # node's cron (ten 100 ms ticks) would have expired them all.
    time.sleep(1.0)
    assert r.execute_command("QLEN", "q") == 10
    assert len(r.execute_command("SHOW", ids[0])) > 0
