"""jepsen-lite's mode selection: where the netns mode cannot run (a tool
missing, or iptables not working inside a namespace), `--mode auto` falls
back to the proxy mode with one log line saying why, and `--mode netns`
exits with that line instead of a traceback.  Nothing is left behind."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jepsen-lite"))

import run
from net import NetnsNet, ProxyNet, Unavailable


def path_with(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only `tools` (linked from the real PATH, when there)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def test_a_missing_iptables_falls_back_to_proxies_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", path_with(tmp_path, "ip"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as root, so the tool check is what refuses
    net = run.make_net(argparse.Namespace(mode="auto", nodes=3), random.Random(1))
    assert isinstance(net, ProxyNet)
    [line] = capsys.readouterr().out.splitlines()
    assert "netns mode unavailable" in line and "falling back to proxy mode" in line, line
    assert "iptables-restore (Debian package iptables)" in line, line
    assert net.notes == [line.split("] ", 1)[1]]  # results.json says why the run used proxies

    with pytest.raises(SystemExit, match=r"^netns mode unavailable: not installed: .*iptables-restore"):
        run.make_net(argparse.Namespace(mode="netns", nodes=3), random.Random(1))


def test_without_root_the_reason_is_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(Unavailable, match="^network namespaces need root$"):
        NetnsNet(2).setup()


# What iptables-nft says on a kernel without nf_tables.
NFT_REFUSED = "iptables-restore v1.8.9 (nf_tables): Could not fetch rule set generation id: Invalid argument"


def namespaces() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


@pytest.mark.timeout(60)
def test_iptables_failing_inside_a_namespace_is_unavailable_and_cleaned_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to build namespaces")
    fake = tmp_path / "iptables-restore"
    fake.write_text(f"#!/bin/sh\necho '{NFT_REFUSED}' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    net = NetnsNet(2, tag=f"jf{os.getpid() % 100000}")
    raised: list[BaseException] = []

    def setup() -> None:  # in a throwaway thread: on success setup() moves its caller into a namespace
        try:
            net.setup()
        except BaseException as e:  # noqa: BLE001
            raised.append(e)

    worker = threading.Thread(target=setup)
    worker.start()
    worker.join(30)
    assert len(raised) == 1 and isinstance(raised[0], Unavailable), raised
    assert str(raised[0]) == f"`ip netns exec {net.ns(0)} iptables-restore` failed: {NFT_REFUSED}"
    assert not {name for name in namespaces() if name.startswith(f"{net.tag}-")}

