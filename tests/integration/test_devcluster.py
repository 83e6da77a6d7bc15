"""`make run` (python -m disque.testing.devcluster): a local cluster that Ctrl-C
stops cleanly, whenever the Ctrl-C comes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support import wait_for

from disque.testing.devcluster import CLAIM_BLOCK, _bindable, command, ephemeral_range, free_port, node_ports, overlap, ports_below_ephemeral, signals_held

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


def start(base: int, workdir: Path, *extra: str) -> subprocess.Popen[str]:
    # Its own process group, as a shell gives a foreground job: Ctrl-C at a
    # terminal sends SIGINT to that whole group.
    return subprocess.Popen(
        [sys.executable, "-m", "disque.testing.devcluster", "--nodes", str(NODES), "--port", str(base), "--dir", str(workdir), *extra],
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
        wait_for(lambda: all(listening(base + i) for i in range(nodes_up)), 20, what=f"{nodes_up} node(s) listening")
        out, err = ctrl_c_and_collect(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in err, err
    assert not any(listening(base + i) for i in range(NODES))
    stopped_by_parent(tmp_path, base, nodes_up)


def test_a_ctrl_c_while_a_node_is_forked_comes_once_its_pid_is_known() -> None:
    """Regression: a Ctrl-C inside Popen left a node running that nobody
    knew the PID of.  Held, it is raised once the block is over."""
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held(signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the signal")
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_free_ports_never_meet_a_port_given_before() -> None:
    """Nodes of one cluster get their ports before any of them starts: no
    client port may be another's client or bus port."""
    ports = [free_port() for _ in range(200)]
    assert len(set(ports) | {p + 10000 for p in ports}) == 400


def test_free_ports_sit_below_the_ephemeral_range() -> None:
    """Outgoing connections take their source ports from the ephemeral range:
    a node's port there is taken sooner or later (EADDRINUSE at start)."""
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(p + 10000 < low for p in ports), ports


def test_two_processes_searching_at_once_get_ports_of_their_own() -> None:
    """Two test runs search the same ports from the same start: what one
    process found, and has not bound yet, another does not get."""
    mine = node_ports(ports_below_ephemeral(3), 3)
    script = "from disque.testing.devcluster import ports_below_ephemeral; print(ports_below_ephemeral(3))"
    theirs = node_ports(int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60).stdout), 3)
    assert all(_bindable("127.0.0.1", p) for p in mine)  # free when the other process looked
    assert not {p // CLAIM_BLOCK for p in mine} & {p // CLAIM_BLOCK for p in theirs}


def test_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ephemeral_range(str(path)) == (40000, 50000)
    assert ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
    assert overlap([39999, 40000, 50000, 50001], (40000, 50000)) == [40000, 50000]


def test_a_port_range_in_the_ephemeral_range_is_refused_clearly(tmp_path: Path) -> None:
    low, high = ephemeral_range()
    done = subprocess.run(
        [sys.executable, "-m", "disque.testing.devcluster", "--nodes", "48", "--port", str(low + 1232), "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"ephemeral range {low}-{high}" in done.stderr and "--port auto" in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())  # no node started
    # the bus ports count too: client ports below the range whose bus ports reach it
    done = subprocess.run(
        [sys.executable, "-m", "disque.testing.devcluster", "--nodes", "3", "--port", str(low - 10001), "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and f"ports {low}-{low + 1} of this cluster" in done.stderr, done.stderr


def test_twelve_nodes_on_auto_ports_join(tmp_path: Path) -> None:
    """`--port auto`: free ports below the ephemeral range, said so; twelve
    nodes join into a full mesh, and Ctrl-C stops them all."""
    n = 12
    proc = subprocess.Popen(
        [sys.executable, "-m", "disque.testing.devcluster", "--nodes", str(n), "--port", "auto", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        said = proc.stdout.readline()
        assert "below the ephemeral range" in said, said
        base = int(said.split()[1].split("-")[0])
        assert base + 10000 + n - 1 < ephemeral_range()[0]
        ready = proc.stdout.readline()  # printed once every node sees the others
        assert f"{n} node(s) on 127.0.0.1:{base}-{base + n - 1}" in ready, (ready, proc.stderr and proc.stderr.read())
        for i in range(n):
            nodes = [line for line in command("127.0.0.1", base + i, "CLUSTER", "NODES").decode().splitlines()[1:] if line]  # after $<length>
            assert len(nodes) == n and not any("fail" in line.split()[2] for line in nodes), nodes
        out, err = ctrl_c_and_collect(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in err, err
    assert not any(listening(base + i) for i in range(n))
