"""Two network namespaces joined by a veth pair (10.213.0.1 and 10.213.0.2),
for tests that need a peer whose address is not loopback; nodes run in them
with `ip netns exec`.  Needs root and iproute2 (`make tools-net`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from disque.testing.devcluster import DEFAULT_CONF

ASK = "import sys; from disque.testing.devcluster import command; sys.stdout.buffer.write(command(sys.argv[1], int(sys.argv[2]), *sys.argv[3:]))"
ADDRS = ("10.213.0.1", "10.213.0.2")
PORT = 7711  # the namespaces are new: every port is free


class Pair:
    def __init__(self, tag: str) -> None:
        self.ns = (f"dq-a{tag}", f"dq-b{tag}")
        self.devs = (f"dqa{tag}", f"dqb{tag}")
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_node(self, side: int, workdir: Path, conf_extra: str = "") -> None:
        """A node in namespace `side` on every address, port PORT."""
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "disque.conf"
        conf.write_text(DEFAULT_CONF.read_text() + f"\nport {PORT}\nlogfile log.txt\n{conf_extra}")
        self.procs.append(subprocess.Popen(["ip", "netns", "exec", self.ns[side], sys.executable, "-m", "disque", str(conf), "--dir", str(workdir)],
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           cwd=workdir))  # fmt: skip

    def ask(self, side: int, host: str, *args: str, port: int = PORT) -> bytes:
        """One command from inside namespace `side`; the raw reply."""
        done = subprocess.run(["ip", "netns", "exec", self.ns[side], sys.executable, "-c", ASK, host, str(port), *args],
                              capture_output=True, timeout=20)  # fmt: skip
        return done.stdout

    def run(self, side: int, code: str) -> str:
        """Python `code` inside namespace `side`; its stdout."""
        done = subprocess.run(["ip", "netns", "exec", self.ns[side], sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout


@contextmanager
def namespace_pair() -> Iterator[Pair]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    pair = Pair(str(os.getpid() % 100000))
    (a, b), (da, db) = pair.ns, pair.devs
    setup = [
        ["ip", "netns", "add", a],
        ["ip", "netns", "add", b],
        ["ip", "link", "add", da, "type", "veth", "peer", "name", db],
        ["ip", "link", "set", da, "netns", a],
        ["ip", "link", "set", db, "netns", b],
        ["ip", "-n", a, "addr", "add", f"{ADDRS[0]}/30", "dev", da],
        ["ip", "-n", b, "addr", "add", f"{ADDRS[1]}/30", "dev", db],
        *(["ip", "-n", ns, "link", "set", dev, "up"] for ns, dev in ((a, da), (b, db), (a, "lo"), (b, "lo"))),
    ]  # fmt: skip
    try:
        for argv in setup:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"cannot build the network namespaces ({' '.join(argv)}: {done.stderr.strip()})")
        yield pair
    finally:
        for proc in pair.procs:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for ns in pair.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
