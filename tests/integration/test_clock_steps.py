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


def test_a_node_whose_clock_was_ahead_fires_no_tick_early(spawn: Callable[..., NodeProcess], tmp_path: Path) -> None:
    """A node started with its wall clock 300 s ahead, then corrected: its
    node clock leans back 1 % a second, so it stays about 300 s ahead for
    hours; its ticks follow the time its two peers' PING and PONG say."""
    assert LIBFAKETIME, "libfaketime is missing: `make tools-clock` installs it"
    step = Step(tmp_path / "faketime")
    step("+300")
    env = {"LD_PRELOAD": LIBFAKETIME[0], "FAKETIME_TIMESTAMP_FILE": str(step.path), "FAKETIME_NO_CACHE": "1",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1"}  # fmt: skip
    ahead = spawn("--schedule-grace", "500", env=env)
    others = [spawn("--schedule-grace", "500") for _ in range(2)]
    step("+0")
    clients = [redis.Redis(port=n.port, protocol=2) for n in (ahead, *others)]
    for other in others:
        clients[0].execute_command("CLUSTER", "MEET", other.host, other.port)
    wait_for(lambda: all(len(c.execute_command("HELLO")) - 2 == 3 for c in clients), timeout=15, what="three nodes")
    assert clients[0].execute_command("TIME")[0] < time.time() + 5  # its wall clock is right again ...
    clients[0].execute_command("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1, "TTL", 600)
    wait_for(lambda: sum(c.execute_command("INFO", "schedules")["schedule_ticks_fired"] for c in clients) >= 5, timeout=20,
             what="five ticks")  # fmt: skip
    now_ms = time.time() * 1000
    for c in clients:
        show = c.execute_command("SCHEDULE", "SHOW", "s")
        last = dict(zip(show[::2], show[1::2]))[b"last-tick"]
        assert last <= now_ms + 100, (last - now_ms)  # ... and no tick came 300 s early
    # It takes its turns (which node fires a tick is drawn per tick: waited for, not counted on among the first five).
    wait_for(lambda: clients[0].execute_command("INFO", "schedules")["schedule_ticks_fired"] >= 1, timeout=30, what="a tick of its own")
    show = clients[0].execute_command("SCHEDULE", "SHOW", "s")
    assert dict(zip(show[::2], show[1::2]))[b"last-tick"] <= time.time() * 1000 + 100  # none of them early either
    for c in clients:
        c.close()
