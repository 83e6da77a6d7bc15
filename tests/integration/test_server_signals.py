"""A SIGTERM that comes as soon as the server's first port listens, before
any of its tasks ran, is a clean shutdown, not the signal's default death
(a supervisor or Ctrl-C does not wait for the log's "Ready" line)."""

from __future__ import annotations

import logging
import os
import signal

import trio

from disque.core.config import Config
from disque.testing.devcluster import free_port
from disque.shell.server import Server


async def test_a_sigterm_right_after_the_port_listens_shuts_the_server_down(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # nodes.conf
    config = Config()
    config.port = free_port()
    server = Server(config)
    opened = server._open_listeners

    async def open_then_signal(port: int | None = None) -> list[trio.SocketListener]:
        listeners = await opened(port)
        if listeners:
            os.kill(os.getpid(), signal.SIGTERM)
        return listeners

    monkeypatch.setattr(server, "_open_listeners", open_then_signal)
    missed: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: missed.append(signum))  # not the default death
    try:
        with caplog.at_level(logging.WARNING), trio.fail_after(20):
            await server.serve()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not missed
    assert "Received SIGTERM scheduling shutdown" in caplog.text
