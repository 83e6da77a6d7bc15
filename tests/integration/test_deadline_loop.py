"""The server's deadline pass (its timer, served by the client loop)
against a core whose deadline is already due: the other tasks must still
run between ticks."""

from __future__ import annotations

from typing import Any

import trio

from disque.core.config import Config
from disque.shell.gc_freeze import FREEZE_EVERY_MS, GcFreezer
from disque.shell.server import Server

MAX_TICKS = 100


class DueCore:
    """The server's core with its deadline due since 1970, at every tick,
    and its ticks counted."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.ticks = 0

    def next_deadline(self) -> int:
        return 0

    def tick(self) -> None:
        self.ticks += 1
        assert self.ticks < MAX_TICKS, "the deadline pass never yielded to the other tasks"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


async def test_a_deadline_in_the_past_does_not_starve_other_tasks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nodes.conf
    server = Server(Config())
    core = DueCore(server.core)
    monkeypatch.setattr(server, "core", core)
    turns = 0
    server.tcp.watch(server.timer.fd, server._timer_fired)
    server.timer.arm(0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.tcp.run)

        async def other() -> None:  # another task, taking turns with the ticks
            nonlocal turns
            while core.ticks < 3:
                turns += 1
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()

        nursery.start_soon(other)
    assert core.ticks >= 3 and turns >= 3
    server.timer.close()


async def test_a_wake_brings_the_deadline_pass_forward(tmp_path, monkeypatch):
    """A client blocked until sooner than the next deadline (`Host.wake`)
    gets its tick then, not at the deadline the timer was armed for."""
    monkeypatch.chdir(tmp_path)
    server = Server(Config())
    core = FarCore(server.core)
    monkeypatch.setattr(server, "core", core)
    server.tcp.watch(server.timer.fd, server._timer_fired)
    server.timer.arm(0)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.tcp.run)
            while core.ticks < 1:  # the first pass arms the timer an hour ahead
                await trio.sleep(0.01)
            server.wake(server.clock.now_ms() + 20)
            while core.ticks < 2:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    server.timer.close()


class FarCore(DueCore):
    """The server's core with its next deadline an hour ahead."""

    def next_deadline(self) -> int:
        return self.core.clock.now_ms() + 3_600_000


def test_the_deadline_pass_freezes_what_survived_every_second(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = Server(Config())
    collector = Collector()
    server.gc_freezer = GcFreezer(collector, now_ms=server.clock.now_ms() - FREEZE_EVERY_MS)
    server._deadline_pass()
    server._deadline_pass()  # within the second: nothing more
    assert collector.calls == ["collect", "freeze"]
    server.timer.close()


class Collector:
    """Stands in for the gc module: records the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self, generation: int = 2) -> None:
        self.calls.append("collect")

    def freeze(self) -> None:
        self.calls.append("freeze")
