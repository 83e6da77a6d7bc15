"""The server's deadline loop against a core whose deadline is already due:
it must still let the other tasks run between ticks."""

from __future__ import annotations

from typing import Any

import trio

from disque.core.config import Config
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
        assert self.ticks < MAX_TICKS, "the deadline loop never yielded to the other tasks"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


async def test_a_deadline_in_the_past_does_not_starve_other_tasks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nodes.conf
    server = Server(Config())
    core = DueCore(server.core)
    monkeypatch.setattr(server, "core", core)
    turns = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server._deadline_loop)

        async def other() -> None:  # another task, taking turns with the ticks
            nonlocal turns
            while core.ticks < 3:
                turns += 1
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()

        nursery.start_soon(other)
    assert core.ticks >= 3 and turns >= 3
