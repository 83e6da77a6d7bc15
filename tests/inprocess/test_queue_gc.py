"""Queue GC: idle queues are collected after a time that shrinks with the
memory level, never while in use, across a big table; a destroyed queue
leaves its jobs active."""

from __future__ import annotations

import pytest

from disque.core.types import NIL_ARRAY
from disque.store.job import IN_LIST, State

from jobenv import env, make_env
from support import Session


@pytest.mark.parametrize(
    "maxmemory, level, idle_ms", [(1 << 30, 0, 300_000), (120_000, 1, 10_000), (100_000, 2, 2_000)]
)
def test_idle_queue_threshold_follows_memory_level(maxmemory, level, idle_ms):
    env = make_env(maxmemory=maxmemory)
    env.s("GETJOB", "NOHANG", "FROM", "tmp")
    assert env.core.memory.level() == level
    env.wait(idle_ms - 1)
    assert env.s("QSTAT", "tmp") is not NIL_ARRAY
    env.wait(100)
    assert env.s("QSTAT", "tmp") is NIL_ARRAY
    env.check()


@pytest.mark.parametrize("setup", ["paused", "blocked", "queued"])
def test_queue_in_use_is_never_collected(env, setup):
    if setup == "paused":
        env.s("PAUSE", "q", "in")
    elif setup == "blocked":
        Session(env.core)("GETJOB", "FROM", "q")
    else:
        env.add("q", "x", "RETRY", 1000)
    env.wait(301_000)
    assert dict(env.s("QSTAT", "q"))[b"name"] == b"q"


def test_queue_gc_reaches_every_queue_of_a_big_table(env):
    for i in range(40):
        env.s("GETJOB", "NOHANG", "FROM", f"q{i}")
    env.wait(300_000)
    assert len(env.core.queues) == 40  # not idle long enough yet
    env.wait(1_000)
    assert len(env.core.queues) == 0


def test_destroying_a_queue_with_jobs_leaves_them_active(env):
    """Only flushes destroy a non-empty queue; its jobs must not stay queued."""
    ids_ = [env.add("q", str(i)) for i in range(3)]
    env.s("DEQUEUE", ids_[1])
    env.core.lifecycle.destroy_queue(env.core.queues.get(b"q"))
    assert [env.core.jobs.get(i).state for i in ids_] == [State.ACTIVE] * 3
    assert not any(env.core.jobs.get(i).flags & IN_LIST for i in ids_)
    assert env.s("ENQUEUE", *ids_) == 3 and [e[1] for e in env.s("QPEEK", "q", 10)] == ids_
    env.check()
