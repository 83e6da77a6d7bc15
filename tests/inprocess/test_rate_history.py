"""The per-queue rate history (core/rate_history.py): slots on a given
clock, bounded in slots and in queues, summed over nodes."""

from __future__ import annotations

import trio
import trio.testing

from disque.core.rate_history import COUNT_MAX, RateHistory, merge
from disque.shell.dashboard import History
from support import Session, make_core

T0 = 1_790_000_000  # seconds, on a slot boundary


def small(max_queues: int = 3) -> RateHistory:
    return RateHistory(slot_seconds=10, slots=6, max_queues=max_queues)


def test_each_slot_counts_what_the_counters_grew():
    h = small()
    h.sample(T0 + 9, [(b"a", 100, 90)])  # the counters before the history began: not counted
    h.sample(T0 + 19, [(b"a", 105, 92), (b"b", 3, 0)])  # b is new: counted from zero
    h.sample(T0 + 29, [(b"a", 105, 95), (b"b", 7, 1)])
    snap = h.snapshot()
    assert snap["slot_seconds"] == 10 and snap["end"] == T0 + 30
    assert snap["queues"]["a"] == {"in": [0, 0, 0, 0, 5, 0], "out": [0, 0, 0, 0, 2, 3]}
    assert snap["queues"]["b"] == {"in": [0, 0, 0, 0, 3, 4], "out": [0, 0, 0, 0, 0, 1]}
    assert snap["other"] == {"in": [0] * 6, "out": [0] * 6}


def test_two_samples_in_a_slot_add_up_and_a_clock_that_went_back_counts_in_the_newest():
    h = small()
    h.sample(T0, [(b"a", 0, 0)])
    h.sample(T0 + 3, [(b"a", 2, 0)])
    h.sample(T0 + 8, [(b"a", 5, 0)])
    h.sample(T0 - 100, [(b"a", 6, 0)])
    assert h.snapshot()["queues"]["a"]["in"][-1] == 6


def test_old_slots_leave_the_window_and_a_long_gap_empties_it():
    h = small()
    h.sample(T0, [(b"a", 0, 0)])
    h.sample(T0 + 10, [(b"a", 1, 0)])
    h.sample(T0 + 40, [(b"a", 3, 0)])  # two empty slots between
    assert h.snapshot()["queues"]["a"]["in"] == [0, 0, 1, 0, 0, 2]
    h.sample(T0 + 70, [(b"a", 4, 0)])
    assert h.snapshot()["queues"]["a"]["in"] == [0, 0, 2, 0, 0, 1]
    h.sample(T0 + 1000, [(b"a", 9, 0)])
    assert h.snapshot()["queues"]["a"]["in"] == [0, 0, 0, 0, 0, 5]


def test_a_queue_made_again_counts_from_zero_and_a_count_saturates():
    h = small()
    h.sample(T0, [(b"a", 50, 50)])
    h.sample(T0 + 10, [(b"a", 4, 1)])  # collected and made again: its counters restarted
    assert h.snapshot()["queues"]["a"] == {"in": [0] * 5 + [4], "out": [0] * 5 + [1]}
    h.sample(T0 + 11, [(b"a", 4 + COUNT_MAX, 1)])
    assert h.snapshot()["queues"]["a"]["in"][-1] == COUNT_MAX


def test_queues_past_the_bound_count_in_other_until_an_idle_one_gives_way():
    h = small(max_queues=2)
    h.sample(T0, [(b"a", 0, 0), (b"b", 0, 0), (b"c", 0, 0)])
    h.sample(T0 + 10, [(b"a", 1, 0), (b"b", 0, 0), (b"c", 5, 5)])
    snap = h.snapshot()
    assert sorted(snap["queues"]) == ["a", "b"] and snap["other"]["in"][-1] == 5 and snap["other"]["out"][-1] == 5
    h.sample(T0 + 60, [(b"a", 2, 0), (b"b", 0, 0), (b"c", 6, 5)])  # b idle for the whole window: it gives way to c
    assert sorted(h.series) == [b"a", b"c"] and h.snapshot()["other"]["in"][-1] == 1  # c's first interval
    h.sample(T0 + 70, [(b"a", 3, 0), (b"b", 0, 0), (b"c", 8, 5)])
    assert h.snapshot()["queues"]["c"]["in"][-1] == 2
    h.sample(T0 + 80, [(b"a", 3, 0), (b"b", 4, 0), (b"c", 8, 5), (b"d", 1, 1)])  # no idle series: no room
    snap = h.snapshot()
    assert sorted(h.series) == [b"a", b"c"] and (snap["other"]["in"][-1], snap["other"]["out"][-1]) == (5, 1)


def test_a_queue_gone_is_dropped_once_idle_for_the_window():
    h = small()
    h.sample(T0, [(b"a", 0, 0)])
    h.sample(T0 + 10, [(b"a", 1, 0)])
    h.sample(T0 + 20, [])  # collected: its counts stay shown
    assert "a" in h.snapshot()["queues"] and h.snapshot()["other"]["in"][-1] == 0  # the sum went down: not below zero
    h.sample(T0 + 80, [])
    assert h.series == {}


def test_a_snapshot_before_any_sample_is_empty():
    assert small().snapshot() == {"slot_seconds": 10, "end": 0, "queues": {}, "other": {"in": [], "out": []}}


def test_merge_lines_nodes_up_on_the_latest_slot():
    a, b = small(), small()
    a.sample(T0, [(b"q", 0, 0)])
    a.sample(T0 + 10, [(b"q", 2, 1)])
    b.sample(T0 - 10, [(b"q", 0, 0), (b"r", 0, 0)])
    b.sample(T0, [(b"q", 3, 0), (b"r", 1, 1)])  # b's newest slot is a's previous one
    merged = merge([a.snapshot(), b.snapshot(), small().snapshot()])
    assert merged["end"] == T0 + 20
    assert merged["queues"]["q"] == {"in": [0, 0, 0, 0, 3, 2], "out": [0, 0, 0, 0, 0, 1]}
    assert merged["queues"]["r"] == {"in": [0, 0, 0, 0, 1, 0], "out": [0, 0, 0, 0, 1, 0]}


def test_merge_leaves_out_another_layout_and_has_an_empty_answer():
    a = small()
    a.sample(T0, [(b"q", 0, 0)])
    a.sample(T0 + 10, [(b"q", 1, 0)])
    other = RateHistory(slot_seconds=60, slots=6)
    other.sample(T0, [(b"q", 0, 0)])
    other.sample(T0 + 60, [(b"q", 9, 0)])
    assert merge([a.snapshot(), other.snapshot()])["queues"]["q"]["in"] == [0] * 5 + [1]
    assert merge([]) == RateHistory().snapshot()
    assert merge([small().snapshot()]) == small().snapshot()


async def test_the_jobs_of_a_nodes_first_slot_are_counted(autojump_clock):
    """Regression: the first periodic sample (up to a slot after the HTTP
    port started) took the counters as they were then as its starting point,
    so the jobs added before it were never counted."""
    core, clock, _ = make_core()
    history = History(core)
    Session(core)("ADDJOB", "q", "before", 0)  # before the history began: not counted
    async with trio.open_nursery() as nursery:
        nursery.start_soon(history.run)
        await trio.testing.wait_all_tasks_blocked()  # the run took its starting point and sleeps
        for i in range(5):
            Session(core)("ADDJOB", "q", f"job {i}", 0)
        clock.advance(10_000)
        await trio.sleep(10)  # the run's first sample
        nursery.cancel_scope.cancel()
    assert sum(history.history.snapshot()["queues"]["q"]["in"]) == 5
