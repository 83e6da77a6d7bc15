"""The job path keeps nothing a job leaves behind: jobs added, fetched,
deleted and moved to disk, over and over, leave the memory the Python
allocator traces where it was.  In the compiled build this also holds the
compiler to its reference counts (a mypyc whose bytes concatenation kept a
reference to its left operand left every job's ID prefix behind, 75 bytes
a job: RSS past maxmemory's bound with read-behind)."""

from __future__ import annotations

import gc
import tracemalloc

from support import Session, make_core

LEFT = 100_000  # bytes 3,000 jobs may leave: the timer's heap keeps up to 1,024 keys of emptied buckets


def traced_growth(step, rounds: int) -> int:
    """What `rounds` calls of `step` (after one to warm up) left traced."""
    step()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(rounds):
            step()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_jobs_that_come_and_go_leave_nothing_behind():
    core, clock, _ = make_core()
    s = Session(core)

    def step() -> None:
        ids = [bytes(s("ADDJOB", "q", b"x" * 600, 0, "RETRY", 300)) for _ in range(100)]
        assert len(s("GETJOB", "COUNT", 100, "FROM", "q")) == 100
        assert s("DELJOB", *ids[:50]) + s("DELJOB", *ids[50:]) == 100  # within a slice: answered at once (an acknowledged ID is remembered a while: store/collected.py)
        clock.advance(100)
        core.tick()  # its cron writes out the body store's buffer

    grown = traced_growth(step, 30)  # 3,000 jobs
    assert grown < LEFT, grown


def test_jobs_moved_to_disk_and_back_leave_nothing_behind():
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=2)
    s = Session(core)

    def step() -> None:
        ids = [bytes(s("ADDJOB", "q", b"x" * 600, 0, "RETRY", 300)) for _ in range(100)]
        assert core.read_behind.index.live >= 90  # the queue's newest went to disk
        assert len(s("GETJOB", "COUNT", 100, "FROM", "q")) == 100  # and came back
        assert s("DELJOB", *ids[:50]) + s("DELJOB", *ids[50:]) == 100  # within a slice: answered at once (an acknowledged ID is remembered a while: store/collected.py)
        clock.advance(100)
        core.tick()  # its cron writes out the body store's buffer

    grown = traced_growth(step, 30)
    assert grown < LEFT, grown
