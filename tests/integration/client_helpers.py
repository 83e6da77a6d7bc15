"""Helpers for the client and CLI tests: a node shared by a module, polling
with a deadline, and a program driven through a pseudo-terminal (stdlib
`os.openpty`, no pexpect).  Import the fixtures into a test module to use them."""

from __future__ import annotations

import os
import random
import re
import secrets
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from fcntl import ioctl

import pytest

from disque.client import Address, Client, NodePlanner
from disque.testing.devcluster import NodeProcess, command, free_port, join

# CSI/OSC escape sequences, and the other control bytes a full-screen prompt emits.
_ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]|\x1b[=>78]|[\x00-\x08\x0e-\x1f]")


class PtyProcess:
    """A child process whose stdin/stdout/stderr is a pseudo-terminal."""

    def __init__(self, argv: list[str], env: dict[str, str], columns: int = 200, rows: int = 40) -> None:
        master, slave = os.openpty()
        ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.master = master
        self.output = b""  # everything read so far, escape sequences removed
        self.mark = 0  # expect() searches from here

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, pattern: str, timeout: float = 10.0) -> re.Match[bytes]:
        """Read until `pattern` (a regex) appears after the previous match."""
        regex = re.compile(pattern.encode())
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.output, self.mark)
            if match:
                self.mark = match.end()
                return match
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{pattern!r} not seen; output after last match:\n{self.output[self.mark :].decode(errors='replace')}")
            if select.select([self.master], [], [], left)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"{pattern!r} not seen before the program ended; output:\n{self.output[self.mark :].decode(errors='replace')}")
                self.output += _ANSI.sub(b"", chunk.replace(b"\r", b""))

    def wait(self, timeout: float = 10.0) -> int:
        """Wait for the exit, draining the terminal so the child never blocks writing."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if select.select([self.master], [], [], 0.05)[0]:
                try:
                    os.read(self.master, 65536)
                except OSError:
                    pass
        return self.proc.wait(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(5)
        os.close(self.master)


def start_all(starters: list[Callable[[], NodeProcess]]) -> list[NodeProcess]:
    """Start nodes side by side: most of a node's start-up is Python importing."""
    with ThreadPoolExecutor(len(starters)) as pool:
        return list(pool.map(lambda start: start(), starters))


def mesh(nodes: list[NodeProcess]) -> None:
    """MEET every pair (faster than waiting for gossip), then wait for the full mesh."""
    for i, a in enumerate(nodes):
        for b in nodes[i + 1 :]:
            command(a.host, a.port, "CLUSTER", "MEET", b.host, str(b.port))
    join(nodes)


def rng_trying_first(seeds: list[Address], first: Address) -> random.Random:
    """A Random with which a client given `seeds` tries `first` before the others."""
    seed = next(s for s in range(1000) if NodePlanner(list(seeds), random.Random(s)).plan()[0] == first)
    return random.Random(seed)


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node for a whole module; tests keep apart by using their own queues."""
    node = NodeProcess(free_port(), tmp_path_factory.mktemp("shared-node"))
    try:
        yield node.start()
    finally:
        node.stop()


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    """A queue name no other test uses."""
    return f"{request.node.name}-{secrets.token_hex(3)}"


@pytest.fixture
def client(shared_node: NodeProcess) -> Iterator[Client]:
    with Client((shared_node.host, shared_node.port)) as c:
        yield c
