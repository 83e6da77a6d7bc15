"""Memory pressure (core/memory.py): the levels and what they refuse, INFO
memory, eviction of delivered at-most-once and acknowledged jobs, OOM."""

from __future__ import annotations

import pytest

from disque.core import errors, figures
from disque.core.types import Status
from disque.core.memory import BASE_MEMORY, QUEUE_OVERHEAD

from jobenv import ODD_ID, duo, env, level2_limit


def test_level1_adds_need_external_replication(env):
    env.core.config.maxmemory = env.core.memory.used * 100 // 80
    assert env.core.memory.level() == 1
    reply = env.s("ADDJOB", "q", "x", 0)
    assert reply.code == "NOREPL" and reply.message.endswith("reason: I'm out of memory")
    assert env.s("ADDJOB", "q", "x", 0, "REPLICATE", 3).message == errors.norepl_reach().message


def test_info_memory_shows_the_data_the_fixed_part_and_the_level(env):
    """used_memory is the data; the process's fixed part (the shell's
    measure at start) and its RSS are shown apart; the level is named, in
    INFO and in the figures."""

    def memory() -> dict[bytes, bytes]:
        lines = env.s("INFO", "memory").split(b"\r\n")[1:-1]
        return dict(line.split(b":", 1) for line in lines)

    env.add("q", "x" * 1000)
    used = env.core.memory.used
    fields = memory()
    assert int(fields[b"used_memory"]) == used > BASE_MEMORY + 1000
    assert (fields[b"used_memory_rss"], fields[b"used_memory_startup"]) == (b"10000000", b"9000000")
    assert fields[b"mem_fragmentation_ratio"] == b"%.2f" % (10_000_000 / (9_000_000 + used))
    assert (fields[b"maxmemory"], fields[b"maxmemory_policy"]) == (b"%d" % (1 << 30), b"acks")
    for maxmemory, level, name in ((1 << 30, 0, b"ok"), (used * 100 // 80, 1, b"warning"), (level2_limit(used), 2, b"oom")):
        env.core.config.maxmemory = maxmemory
        fields = memory()
        assert (fields[b"mem_level"], fields[b"mem_level_name"]) == (b"%d" % level, name)
        assert figures.node_figures(env.core)["mem_level"] == level


def test_eviction_drops_delivered_retry0_jobs_only(env):
    big = "x" * 50_000
    delivered = [env.add("q", big, "RETRY", 0) for _ in range(2)]
    env.s("GETJOB", "COUNT", 2, "FROM", "q")
    kept = [env.add("q", "never delivered", "RETRY", 0), env.add("r", "at least once", "RETRY", 5)]
    env.s("GETJOB", "FROM", "r")
    env.core.config.maxmemory = level2_limit(env.core.memory.used - 2 * 49_000)
    assert env.core.memory.level() == 2
    assert env.s("PING") == Status(b"PONG")  # any command evicts
    assert [env.show(i) for i in delivered] == [None, None]
    assert env.core.memory.level() < 2 and all(env.show(i) for i in kept)
    env.check()


@pytest.mark.parametrize("policy", ["acks", "noeviction"])
def test_oom_when_nothing_can_be_evicted(env, policy):
    job_id = env.add("q", "x" * 10_000)
    delivered = env.add("q", "y", "RETRY", 0)
    env.s("DEQUEUE", job_id)
    env.s("GETJOB", "FROM", "q")
    env.core.config.maxmemory_policy = policy
    env.core.config.maxmemory = level2_limit(env.core.memory.used - 5_000)
    for argv in (("ADDJOB", "q", "z", 0), ("ENQUEUE", job_id), ("NACK", job_id)):
        assert env.s(*argv).code == "OOM"
    assert env.s("QLEN", "q") == 0 and env.s("DEQUEUE", job_id) == 0  # not deny-OOM
    assert (env.show(delivered) is None) == (policy == "acks")


@pytest.mark.parametrize("evictable", [0, 30])
def test_eviction_stops_when_under_95_percent_or_after_10_misses(env, evictable):
    body = "x" * 10_000
    for i in range(12):
        env.add("keep", f"k{i}")
    doomed = [env.add("q", body, "RETRY", 0) for _ in range(evictable)]
    env.s("GETJOB", "COUNT", 100, "FROM", "q")
    env.core.config.maxmemory = level2_limit(env.core.memory.used - 5 * 10_000 - 1_000)
    reply = env.s("ADDJOB", "keep", "x", 0)
    if evictable:  # only as many as needed go, then it stops
        gone = sum(env.show(i) is None for i in doomed)
        assert 5 <= gone < evictable and reply.code == "NOREPL"  # level 1: no local copy
    else:
        assert reply.code == "OOM" and env.s("QLEN", "keep") == 12


def test_eviction_without_jobs_collects_every_idle_queue(env):
    for i in range(40):
        env.s("GETJOB", "NOHANG", "FROM", f"q{i}")
    env.clock.advance(2_000)  # no tick: the command itself must do it
    env.core.config.maxmemory = level2_limit(env.core.memory.used)
    assert env.s("INFO", "queues") == b"# Queues\r\nregistered_queues:0\r\n"


def test_maxmemory_zero_never_answers_oom(env):
    env.core.config.maxmemory = 0
    assert env.core.memory.level() == 2 and env.core.memory.evict()
    assert env.s("ADDJOB", "q", "x", 0).message.endswith("reason: I'm out of memory")
    assert env.s("ADDJOB", "q", "x", 0, "REPLICATE", 2).message == errors.norepl_reach().message


def test_acked_jobs_are_evicted(duo):
    assert duo.s("ACKJOB", ODD_ID) == 0  # a dummy ACK: acked, kept for GC
    assert duo.state(ODD_ID) == "acked"
    duo.core.config.maxmemory = level2_limit(duo.core.memory.used)
    duo.s("PING")
    assert duo.show(ODD_ID) is None


def test_peak_memory_tracks_the_maximum(env):
    job_id = env.add("q", "x" * 1000)
    peak = env.core.memory.peak
    env.s("DELJOB", job_id)
    assert env.core.memory.peak == peak > env.core.memory.used == BASE_MEMORY + QUEUE_OVERHEAD + 1


def test_evict_is_a_no_op_below_95_percent(env):
    assert env.core.memory.level() == 0 and env.core.memory.evict()
