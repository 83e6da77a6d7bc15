"""The NFQUEUE delayer of jepsen-lite (jepsen-lite/delayer.py), the delay of
the `netem` fault in netns mode on kernels without tc netem.

The wire-format tests run anywhere.  The namespace test (root, network
namespaces, iptables, nfnetlink_queue) builds a 2-node NetnsNet, forces the
fallback (`use_netem = False`) and measures TCP echo round trips over the
veth addresses: the delayer holds a node's egress packets, so a delay of
100 ms on the echo server's node adds about 100 ms to a round trip, and the
same delay on both ends adds about 200 ms; after `heal()` the round trips are
back to normal."""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jepsen-lite"))

import delayer
from net import NetnsNet

# ------------------------------------------------------------ wire format


def test_verdict_message_layout() -> None:
    msg = delayer.verdict(7, 0x01020304)
    length, kind, flags, _seq, _pid = struct.unpack_from("=IHHII", msg)
    assert length == len(msg) == 16 + 4 + 12
    assert kind == (3 << 8) | 1 and flags == 1  # NFNL_SUBSYS_QUEUE, NFQNL_MSG_VERDICT; NLM_F_REQUEST
    assert msg[16:20] == bytes([0, 0, 0, 7])  # family, version, queue 7 big endian
    assert struct.unpack_from("=HH", msg, 20) == (12, 2)  # NFQA_VERDICT_HDR
    assert struct.unpack_from("!II", msg, 24) == (1, 0x01020304)  # NF_ACCEPT, id


def test_config_messages_bind_then_set_and_ask_for_acks() -> None:
    msgs = delayer.config_messages(3, 5000)
    assert len(msgs) == 4
    for k, msg in enumerate(msgs):
        length, kind, flags, seq, _ = struct.unpack_from("=IHHII", msg)
        assert (length, kind, flags & 0x5, seq) == (len(msg), (3 << 8) | 2, 0x5, k + 1)
        assert len(msg) % 4 == 0
    assert struct.unpack_from("=HHBxH", msgs[0], 20) == (8, 1, 1, socket.htons(socket.AF_INET))  # BIND
    assert struct.unpack_from("=HH", msgs[1], 20) == (9, 2) and msgs[1][24:29] == b"\0\0\0\0\x01"  # META


def test_parse_packet_and_error_messages() -> None:
    other = delayer.attr(5, b"\xaa" * 3)  # an attribute before the header, padded
    hdr = delayer.attr(1, struct.pack("!IHB", 4242, 0x0800, 3))
    packet = delayer.message(0, 3, other + hdr, seq=0)
    error = struct.pack("=IHHII", 36, 2, 0, 9, 0) + struct.pack("=i", -16) + b"\0" * 16
    assert delayer.parse(packet + error) == [("packet", 4242), ("error", (9 << 32) | 16)]
    assert delayer.parse(b"\x01\x02") == []


# ------------------------------------------------------------ in namespaces


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "iptables", "iptables-restore"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    if not os.path.exists("/proc/net/netfilter/nfnetlink_queue"):
        return "no nfnetlink_queue in this kernel"
    return None


def in_ns(name: str | None, fn: Callable[[], Any]) -> Any:
    """fn() in a new thread, moved into namespace `name` if given (the calling
    thread stays where it is)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            if name:
                NetnsNet.enter(name)
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(30)
    if "error" in box:
        raise box["error"]
    return box["value"]


def echo_server(listener: socket.socket) -> None:
    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(64):
                conn.sendall(data)

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def rtt_ms(conn: socket.socket) -> float:
    t = time.monotonic()
    conn.sendall(b"x")
    assert conn.recv(1) == b"x"
    return (time.monotonic() - t) * 1000


def median_rtt(conn: socket.socket, k: int = 5) -> float:
    return statistics.median(rtt_ms(conn) for _ in range(k))


def poll(conn: socket.socket, ok: Callable[[float], bool], timeout: float = 10.0) -> float:
    """Round trips until one satisfies `ok` (the last one measured)."""
    deadline = time.monotonic() + timeout
    while True:
        r = rtt_ms(conn)
        if ok(r) or time.monotonic() > deadline:
            return r


@pytest.mark.timeout(120)
def test_delayer_delays_egress_and_heal_restores() -> None:
    why = _why_not()
    if why:
        pytest.skip(why)
    net = NetnsNet(2, tag=f"jd{os.getpid() % 100000}")
    net.use_netem = False  # the fallback even where the kernel has netem
    try:
        in_ns(None, net.setup)  # moves only a throwaway thread into the client namespace
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"network namespaces unavailable: {e}")
    conns: list[socket.socket] = []
    listener = None
    try:
        listener = in_ns(net.ns(0), lambda: socket.create_server((net.hosts[0], 0)))
        port = listener.getsockname()[1]
        threading.Thread(target=echo_server, args=(listener,), daemon=True).start()
        for ns in (net.client_ns, net.ns(1)):
            c = in_ns(ns, lambda: socket.create_connection((net.hosts[0], port), timeout=5))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conns.append(c)
        client, peer = conns  # client namespace -> node 0, node 1 -> node 0
        base = max(median_rtt(client), median_rtt(peer))
        assert base < 50, base

        # node 0's egress held 100 ms: its echo replies come back 100 ms late
        net.netem([0], 0, 100, 0)
        assert any("NFQUEUE delayer" in n for n in net.notes), net.notes
        assert poll(client, lambda r: r >= base + 90) >= base + 90
        slow = [median_rtt(client), median_rtt(peer)]
        assert all(base + 90 <= r < base + 170 for r in slow), (base, slow)

        net.heal()
        assert not net.delayers
        assert poll(client, lambda r: r < base + 30) < base + 30
        assert median_rtt(client) < base + 30 and median_rtt(peer) < base + 30

        # both ends held: node 1's requests and node 0's replies, about 200 ms
        net.netem([0, 1], 0, 100, 0)
        assert poll(peer, lambda r: r >= base + 150) >= base + 150
        both = median_rtt(peer)
        assert base + 150 <= both < base + 300, (base, both)
        assert base + 90 <= median_rtt(client) < base + 170  # the client namespace is not delayed

        # jitter: 100 +- 50 ms, spread out
        net.heal()
        assert poll(peer, lambda r: r < base + 30) < base + 30
        net.netem([0], 0, 100, 50)
        samples = [rtt_ms(client) for _ in range(12)]
        assert all(base + 45 <= r < base + 250 for r in samples), samples
        assert max(samples) - min(samples) > 10, samples

        net.heal()
        assert poll(client, lambda r: r < base + 30) < base + 30
        assert median_rtt(peer) < base + 30
        runs = [r for r in net.delayer_runs if r["packets"]]
        assert len(runs) == 4 and min(r["min_ms"] for r in runs) >= 45, net.delayer_runs
        assert min(r["min_ms"] for r in runs[:3]) >= 99, net.delayer_runs
        assert not any("exited with" in n for n in net.notes), net.notes
    finally:
        for c in conns:
            c.close()
        if listener is not None:
            listener.close()
        net.close()
    assert any(n.startswith("NFQUEUE delayer:") for n in net.notes), net.notes
