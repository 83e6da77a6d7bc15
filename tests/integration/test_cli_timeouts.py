"""The CLI never waits forever: with one of three real nodes stopped
(SIGSTOP: its sockets accept, nothing answers), every cluster-wide view
ends within its timeout, names the stopped node on stderr and exits 1 after
showing the others; the connected node stopped fails the same way."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from client_helpers import mesh, start_all

from disque.client import Client
from disque.testing.devcluster import NodeProcess, free_port

VIEWS = (
    ["qlen", "q"], ["qstat", "q"], ["top", "-n", "1"], ["qscan", "--cluster"], ["jscan", "--cluster"],
    ["schedule", "stats"], ["deadletter", "requeue", "dead"],
)  # fmt: skip


@pytest.fixture
def nodes(tmp_path) -> Iterator[list[NodeProcess]]:
    started = [NodeProcess(free_port(), tmp_path / f"n{i}") for i in range(3)]
    try:
        start_all([node.start for node in started])
        mesh(started)
        yield started
    finally:
        started[2].signal(signal.SIGCONT)
        for node in started:
            node.stop()


def disque(node: NodeProcess, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(node.port), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return done, time.monotonic() - began


@pytest.mark.slow
def test_a_stopped_node_is_named_and_the_views_end(nodes):
    with Client((nodes[0].host, nodes[0].port), failover=False) as client:
        client.add_job("q", "body", replicate=1)
        stopped = Client((nodes[2].host, nodes[2].port), failover=False)
        stopped_id = stopped.hello().node_id
        stopped.close()
    nodes[2].signal(signal.SIGSTOP)
    for view in VIEWS:
        done, took = disque(nodes[0], "--timeout", "1", *view)
        assert done.returncode == 1, (view, done.stdout, done.stderr)
        assert f"node {stopped_id}" in done.stderr and "left out of the view" in done.stderr, (view, done.stderr)
        assert took < 15, (view, took)
    done, took = disque(nodes[0], "qlen", "q")  # the default timeout: a few seconds
    assert done.returncode == 1 and f"node {stopped_id}" in done.stderr and took < 20
    done, took = disque(nodes[2], "--timeout", "1", "PING")  # the connected node itself
    assert done.returncode == 1 and "timed out" in done.stderr and took < 15, done.stderr
