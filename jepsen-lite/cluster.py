"""Real `disque-server` processes for a run, and a tiny RESP connection."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hiredis

from disque.testing.devcluster import DEFAULT_CONF


class Conn:
    """One blocking RESP connection (replies parsed by hiredis)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.reader = hiredis.Reader()

    def call(self, *args: Any, timeout: float | None = None) -> Any:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        payload = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        if timeout is not None:
            self.sock.settimeout(timeout)
        self.sock.sendall(payload)
        while True:
            reply = self.reader.gets()
            if reply is not False:
                return reply
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("connection closed")
            self.reader.feed(data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def call_once(host: str, port: int, *args: Any, timeout: float = 3.0) -> Any:
    c = Conn(host, port, timeout)
    try:
        return c.call(*args)
    finally:
        c.close()


def libfaketime() -> str:
    """The path of libfaketime (Debian's faketime package, `make tools-clock`)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        raise SystemExit("the clock fault needs libfaketime: apt-get install faketime (make tools-clock)")
    return found[0]


class Node:
    """A node started with `prefix` (e.g. `ip netns exec NS`), AOF on.  With
    `fake_clock`, it runs under libfaketime, its wall clock `set_clock`
    seconds off the true time (its monotonic clock untouched)."""

    def __init__(self, index: int, host: str, port: int, workdir: Path, prefix: list[str], conf_extra: str,
                 fake_clock: bool = False) -> None:  # fmt: skip
        self.index, self.host, self.port, self.workdir, self.prefix = index, host, port, workdir, prefix
        self.conf_extra = conf_extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.env: dict[str, str] | None = None
        if fake_clock:
            self.env = {
                **os.environ,
                "LD_PRELOAD": libfaketime(),
                "FAKETIME_TIMESTAMP_FILE": str(workdir / "faketime"),
                "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }

    def set_clock(self, offset_s: int) -> None:
        """Step the node's wall clock to `offset_s` seconds from the true time."""
        tmp = self.workdir / "faketime.new"
        tmp.write_text(f"{offset_s:+d}\n")
        tmp.replace(self.workdir / "faketime")

    def start(self, wait: float = 20.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "disque.conf"
        if not conf.exists():
            conf.write_text(
                DEFAULT_CONF.read_text()
                + f'\ndir "{self.workdir}"\nport {self.port}\nbind {self.host}\nlogfile log.txt\n'
                + self.conf_extra
            )
        if self.env is not None and not (self.workdir / "faketime").exists():
            self.set_clock(0)
        err = open(self.workdir / "stderr.txt", "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "disque", str(conf)],
            stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=self.env,
        )  # fmt: skip
        err.close()
        self.paused = False
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.index} exited with {self.proc.returncode}, see {self.workdir}")
            try:
                if call_once(self.host, self.port, "PING", timeout=1) == b"PONG":
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"node {self.index} did not answer within {wait}s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive() and self.paused:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.resume()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def join(nodes: list[Node], timeout: float = 30.0) -> None:
    """MEET everyone with node 0, both ways (bus protected mode admits only
    nodes a node knows), then wait until each node reaches all others."""
    first = nodes[0]
    for node in nodes[1:]:
        call_once(node.host, node.port, "CLUSTER", "MEET", first.host, first.port)
        call_once(first.host, first.port, "CLUSTER", "MEET", node.host, node.port)
    wait_mesh(nodes, timeout)


def wait_mesh(nodes: list[Node], timeout: float) -> bool:
    want = b"cluster_reachable_nodes:%d" % (len(nodes) - 1)
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending:
        try:
            if want in call_once(pending[0].host, pending[0].port, "CLUSTER", "INFO", timeout=2):
                pending.pop(0)
                continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
