"""Real `disque-server` processes on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from disque.testing.devcluster import NodeProcess, free_port
from support import FORCE_READ_BEHIND

if FORCE_READ_BEHIND:  # every node of this suite with read-behind forced on (tests/support.py)
    _init = NodeProcess.__init__

    def _forced(self: NodeProcess, port: int, workdir: Path, *extra: str, **kwargs: object) -> None:
        _init(self, port, workdir, *extra, "--read-behind", "force", "--read-behind-prefetch", "2", **kwargs)  # type: ignore[arg-type]

    NodeProcess.__init__ = _forced  # type: ignore[method-assign]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Start nodes; every node started is stopped (by PID) at teardown."""
    started: list[NodeProcess] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> NodeProcess:
        port = free_port()
        node = NodeProcess(port, tmp_path / f"node-{port}", *extra, env=env)
        started.append(node)
        return node.start()

    yield start
    for node in started:
        node.stop()


@pytest.fixture
def node(spawn: Callable[..., NodeProcess]) -> NodeProcess:
    return spawn()


@pytest.fixture
def r(node: NodeProcess) -> Iterator[redis.Redis]:
    """redis-py 8 with its default settings (RESP3 handshake included)."""
    client = redis.Redis(host=node.host, port=node.port)
    yield client
    client.close()

