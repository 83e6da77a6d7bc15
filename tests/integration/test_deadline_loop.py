"""The server's deadline loop against a core whose deadline is already due:
it must still let the other tasks run between ticks."""

from __future__ import annotations

import trio

from disque.core.config import Config
from disque.shell.server import Server

MAX_TICKS = 100


async def test_a_deadline_in_the_past_does_not_starve_other_tasks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nodes.conf
    server = Server(Config())
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        assert ticks < MAX_TICKS, "the deadline loop never yielded to the other tasks"

    monkeypatch.setattr(server.core, "next_deadline", lambda: 0)  # due since 1970, at every tick
    monkeypatch.setattr(server.core, "tick", tick)
    turns = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server._deadline_loop)

        async def other() -> None:  # another task, taking turns with the ticks
            nonlocal turns
            while ticks < 3:
                turns += 1
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()

        nursery.start_soon(other)
    assert ticks >= 3 and turns >= 3
