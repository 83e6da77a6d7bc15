"""`make run` (python -m disque.devcluster): a local cluster that Ctrl-C
stops cleanly, whenever the Ctrl-C comes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from disque.devcluster import command, free_port

NODES = 3


def free_range(n: int) -> int:
    """A first port such that n consecutive client ports and their bus ports are free."""
    for _ in range(200):
        base = free_port()
        ports = [base + i for i in range(n)] + [base + i + 10000 for i in range(n)]
        if max(ports) > 65535:
            continue
        try:
            for port in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def start(base: int, workdir: Path, *extra: str) -> subprocess.Popen[str]:
    # Its own process group, as a shell gives a foreground job: Ctrl-C at a
    # terminal sends SIGINT to that whole group.
    return subprocess.Popen(
        [sys.executable, "-m", "disque.devcluster", "--nodes", str(NODES), "--port", str(base), "--dir", str(workdir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def ctrl_c_and_collect(proc: subprocess.Popen[str]) -> tuple[str, str]:
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (out, err)
    return out, err


def stopped_by_parent(workdir: Path, base: int, started: int) -> None:
    """The Ctrl-C reached only the parent, which stopped each node by PID
    (SIGTERM): nodes that die of the terminal's SIGINT on their own race the
    parent's start-up and join, which then fail with a traceback."""
    for i in range(started):
        log = (workdir / str(base + i) / "log.txt").read_text()
        assert "Received SIGTERM" in log and "Received SIGINT" not in log, log


def test_the_cluster_forms_and_ctrl_c_stops_every_node(tmp_path: Path) -> None:
    base = free_range(NODES)
    memcache = free_range(NODES)  # as `make run` passes --memcache-port 22133
    proc = start(base, tmp_path, "--memcache-port", str(memcache))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"{NODES} node(s) on 127.0.0.1:{base}-{base + NODES - 1}" in line
        for i in range(NODES):
            info = command("127.0.0.1", base + i, "CLUSTER", "INFO")
            assert b"cluster_state:ok" in info
            assert b"cluster_reachable_nodes:%d" % (NODES - 1) in info
            with socket.create_connection(("127.0.0.1", memcache + i), timeout=5) as s:
                s.sendall(b"version\r\n")
                assert s.recv(100).startswith(b"VERSION ")
        out, err = ctrl_c_and_collect(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "stopping" in out
    assert "Traceback" not in err, err
    assert not any(listening(base + i) for i in range(NODES))
    stopped_by_parent(tmp_path, base, NODES)


@pytest.mark.parametrize("nodes_up", [1, NODES])
def test_ctrl_c_while_starting_or_joining_stops_cleanly(tmp_path: Path, nodes_up: int) -> None:
    """Ctrl-C once the first node (or every node: the join) is up, before the
    cluster is ready: no traceback, and no node left behind."""
    base = free_range(NODES)
    proc = start(base, tmp_path)
    try:
        wait_for(lambda: all(listening(base + i) for i in range(nodes_up)), 20, f"{nodes_up} node(s) listening")
        out, err = ctrl_c_and_collect(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in err, err
    assert not any(listening(base + i) for i in range(NODES))
    stopped_by_parent(tmp_path, base, nodes_up)


def test_free_ports_never_meet_a_port_given_before() -> None:
    """Nodes of one cluster get their ports before any of them starts: no
    client port may be another's client or bus port."""
    ports = [free_port() for _ in range(200)]
    assert len(set(ports) | {p + 10000 for p in ports}) == 400
