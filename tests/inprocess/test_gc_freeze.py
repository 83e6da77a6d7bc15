"""The collector schedule: freeze survivors every second, a full pass hourly."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from disque.shell.gc_freeze import FREEZE_EVERY_MS, FULL_PASS_EVERY_MS, GcFreezer


class FakeCollector:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def collect(self, *generation: int) -> int:
        self.calls.append(("collect", *generation))
        return 0

    def freeze(self) -> None:
        self.calls.append(("freeze",))

    def unfreeze(self) -> None:
        self.calls.append(("unfreeze",))


def test_survivors_are_frozen_each_second_after_a_young_collection() -> None:
    fake = FakeCollector()
    freezer = GcFreezer(fake, now_ms=5_000)
    freezer.tick(5_999)
    assert fake.calls == []
    freezer.tick(6_000)
    assert fake.calls == [("collect", 1), ("freeze",)]
    freezer.tick(6_500)
    assert len(fake.calls) == 2  # the next one is due a second after the last
    freezer.tick(7_200)
    assert fake.calls[2:] == [("collect", 1), ("freeze",)]
    assert freezer.next_freeze == 7_200 + FREEZE_EVERY_MS


def test_a_full_pass_over_unfrozen_objects_runs_every_hour() -> None:
    fake = FakeCollector()
    freezer = GcFreezer(fake, now_ms=0)
    for now in range(FREEZE_EVERY_MS, FULL_PASS_EVERY_MS, FREEZE_EVERY_MS):
        freezer.tick(now)
    assert ("unfreeze",) not in fake.calls and ("collect",) not in fake.calls
    fake.calls.clear()
    freezer.tick(FULL_PASS_EVERY_MS)
    assert fake.calls == [("unfreeze",), ("collect",), ("freeze",)]
    fake.calls.clear()
    freezer.tick(2 * FULL_PASS_EVERY_MS - 1)
    assert fake.calls == [("collect", 1), ("freeze",)]
    fake.calls.clear()
    freezer.tick(2 * FULL_PASS_EVERY_MS)
    assert fake.calls == [("unfreeze",), ("collect",), ("freeze",)]


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    """Only the test's own calls move objects between generations."""
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.enable()


@pytest.mark.usefixtures("no_automatic_collection")
def test_frozen_cycles_are_collected_only_by_the_full_pass() -> None:
    """With the real collector: a cycle that becomes garbage after it was
    frozen survives ordinary collections and goes at the hourly pass."""
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    gone = weakref.ref(a)
    freezer = GcFreezer(gc, now_ms=0)
    freezer.tick(FREEZE_EVERY_MS)
    assert gc.get_freeze_count() > 0
    del a, b
    gc.collect()
    assert gone() is not None  # frozen: skipped
    freezer.tick(FULL_PASS_EVERY_MS)
    assert gone() is None


@pytest.mark.usefixtures("no_automatic_collection")
def test_young_garbage_is_collected_before_freezing() -> None:
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    gone = weakref.ref(a)
    del a, b
    GcFreezer(gc, now_ms=0).tick(FREEZE_EVERY_MS)
    assert gone() is None
