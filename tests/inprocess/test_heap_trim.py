"""shell/heap_trim.py: the heap is trimmed after jobs went to disk, and only then."""

from __future__ import annotations

from types import SimpleNamespace

import trio
import trio.testing

from disque.core.read_behind import NoReadBehind
from disque.shell import heap_trim
from disque.shell.heap_trim import M_MMAP_THRESHOLD, MMAP_THRESHOLD, TRIM_EVERY_S, malloc_trim, map_large_blocks, trim_after_spills


def test_glibc_has_malloc_trim():
    trim = malloc_trim()
    assert trim is not None and trim(0) in (0, 1)


def test_large_blocks_stay_mapped_at_a_fixed_threshold():
    calls: list[tuple[int, int]] = []
    assert map_large_blocks(lambda param, value: calls.append((param, value)) or 1)
    assert calls == [(M_MMAP_THRESHOLD, MMAP_THRESHOLD)]
    assert not map_large_blocks(lambda param, value: 0)  # refused


def test_the_heap_is_trimmed_once_per_period_in_which_jobs_moved_to_disk():
    calls: list[int] = []
    core = SimpleNamespace(read_behind=SimpleNamespace(spilled=0))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trim_after_spills, core, calls.append)
            await trio.sleep(TRIM_EVERY_S + 0.1)
            assert calls == []  # nothing moved
            core.read_behind.spilled = 10
            await trio.sleep(TRIM_EVERY_S)
            assert calls == [0]
            await trio.sleep(TRIM_EVERY_S)
            assert calls == [0]  # nothing more moved
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_without_a_libc_trim_there_is_nothing_to_do(monkeypatch):
    monkeypatch.setattr(heap_trim, "malloc_trim", lambda: None)

    async def main() -> None:
        with trio.move_on_after(10 * TRIM_EVERY_S) as waited:
            await trim_after_spills(SimpleNamespace(read_behind=NoReadBehind()))
        assert not waited.cancelled_caught and trio.current_time() == 0  # the task returned at once: no timer left running

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
