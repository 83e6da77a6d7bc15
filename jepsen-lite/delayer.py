#!/usr/bin/env python3
"""A userspace packet delayer over nfnetlink_queue, for kernels without netem.

    ip netns exec NS python jepsen-lite/delayer.py --queue N --delay-ms D [--jitter-ms J] [--seed S]

Theory of operation
-------------------
An iptables rule in the namespace, e.g.

    -A OUTPUT -o eth0 -j NFQUEUE --queue-num N --queue-bypass

hands each matching packet to queue N of nfnetlink_queue: the kernel keeps the
packet and sends a NFQNL_MSG_PACKET to whichever netlink socket bound that
queue, then waits for a NFQNL_MSG_VERDICT naming the packet id.  This program
is that socket.  It never looks at the packet: it asks for metadata only
(copy mode META) and reads just the packet id from NFQA_PACKET_HDR.  Each id
goes into a heap with a due time of now + delay ± jitter (uniform, never
below zero), and when the due time comes it issues NF_ACCEPT, which lets the
kernel carry on with the packet.  So every packet leaves D ± J ms late, like
`tc qdisc ... netem delay D J` on the same interface (egress only when the rule
is on OUTPUT); as with netem, jitter may reorder packets.

The wire format is the one of libnetfilter_queue, written out with `struct`:

* every message: nlmsghdr (len, type, flags, seq, portid; host byte order),
  then nfgenmsg (family, version 0, res_id = queue number, big endian), then
  attributes (nlattr: len, type; payload padded to 4 bytes);
* the message type is (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_*;
* NFQNL_MSG_CONFIG with NFQA_CFG_CMD (BIND), NFQA_CFG_PARAMS (copy range 0,
  mode META), NFQA_CFG_QUEUE_MAXLEN and NFQA_CFG_FLAGS (FAIL_OPEN: accept
  rather than drop when the queue is full; GSO: no segmentation for us), each
  sent with NLM_F_ACK and checked against the NLMSG_ERROR reply;
* NFQNL_MSG_VERDICT with NFQA_VERDICT_HDR (verdict, id; big endian).

Netlink sockets belong to the network namespace they are created in, so the
delayer must run inside the namespace of the iptables rule (`ip netns exec`).
With `--queue-bypass` on the rule, packets pass undelayed while no socket has
the queue bound (before the delayer is up, or if it dies); the kernel drops
what is still held when the socket closes, so the delayer lets everything go
before it exits.

It prints `ready` on stdout once the queue is bound.  SIGTERM or SIGINT makes
it accept every packet it holds at once, print a one-line JSON summary (the
packets let go when due with min / mean / p50 / max of their hold time in ms,
and how many were let go early at the stop) and exit 0.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33

NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4

NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2

NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 0x1
NFQA_CFG_F_GSO = 0x4

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NF_DROP, NF_ACCEPT = 0, 1

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, portid
NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (queue number)
NLATTR = struct.Struct("=HH")  # len, type


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = NLATTR.pack(NLATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(msg: int, queue: int, attrs: bytes, seq: int = 0, flags: int = NLM_F_REQUEST, family: int = socket.AF_UNSPEC) -> bytes:
    """A nfnetlink_queue message of type NFQNL_MSG_<msg> for `queue`."""
    body = NFGENMSG.pack(family, 0, queue) + attrs
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def config_messages(queue: int, maxlen: int) -> list[bytes]:
    """Bind `queue`, metadata only, a longer queue, fail open."""
    flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO
    parts = [
        attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET)),
        attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),
        attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen)),
        attr(NFQA_CFG_FLAGS, struct.pack("!I", flags)) + attr(NFQA_CFG_MASK, struct.pack("!I", flags)),
    ]
    flag = NLM_F_REQUEST | NLM_F_ACK
    return [message(NFQNL_MSG_CONFIG, queue, p, seq=k + 1, flags=flag, family=socket.AF_INET) for k, p in enumerate(parts)]


def verdict(queue: int, packet_id: int, what: int = NF_ACCEPT) -> bytes:
    return message(NFQNL_MSG_VERDICT, queue, attr(NFQA_VERDICT_HDR, struct.pack("!II", what, packet_id)))


def parse(buf: bytes) -> list[tuple[str, int]]:
    """The messages of one datagram: ("packet", id) or ("error", seq<<32|errno)
    are the ones we use; anything else is skipped."""
    out: list[tuple[str, int]] = []
    off = 0
    while off + NLMSGHDR.size <= len(buf):
        length, kind, _flags, seq, _pid = NLMSGHDR.unpack_from(buf, off)
        if length < NLMSGHDR.size or off + length > len(buf):
            break
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", buf, off + NLMSGHDR.size)
            out.append(("error", (seq << 32) | -err))
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            a = off + NLMSGHDR.size + NFGENMSG.size
            while a + NLATTR.size <= off + length:
                alen, atype = NLATTR.unpack_from(buf, a)
                if alen < NLATTR.size:
                    break
                if atype & 0x3FFF == NFQA_PACKET_HDR:
                    out.append(("packet", struct.unpack_from("!I", buf, a + NLATTR.size)[0]))
                    break
                a += (alen + 3) & ~3
        off += (length + 3) & ~3
    return out


class Delayer:
    def __init__(self, queue: int, delay_ms: float, jitter_ms: float, seed: int, maxlen: int = 10000) -> None:
        self.queue, self.delay, self.jitter = queue, delay_ms / 1000, jitter_ms / 1000
        self.rng = random.Random(seed)
        self.held: list[tuple[float, int, float]] = []  # (due, id, arrival)
        self.holds_ms: list[float] = []  # of the packets let go when due
        self.flushed = 0  # let go early, when told to stop
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        for msg in config_messages(queue, maxlen):
            self._request(msg)

    def _request(self, msg: bytes) -> None:
        (seq,) = struct.unpack_from("=I", msg, 8)
        self.sock.send(msg)
        while True:
            for kind, value in parse(self.sock.recv(1 << 16)):
                if kind == "packet":
                    self._hold(value)
                elif value >> 32 == seq:
                    if value & 0xFFFFFFFF:
                        raise OSError(value & 0xFFFFFFFF, f"nfnetlink_queue config of queue {self.queue}")
                    return

    def _hold(self, packet_id: int) -> None:
        now = time.monotonic()
        due = now + max(0.0, self.delay + self.rng.uniform(-self.jitter, self.jitter))
        heapq.heappush(self.held, (due, packet_id, now))

    def _release(self, until: float) -> None:
        while self.held and self.held[0][0] <= until:
            _, packet_id, arrival = heapq.heappop(self.held)
            self.sock.send(verdict(self.queue, packet_id))
            self.holds_ms.append((time.monotonic() - arrival) * 1000)

    def _flush(self) -> None:
        while self.held:
            _, packet_id, _ = heapq.heappop(self.held)
            self.sock.send(verdict(self.queue, packet_id))
            self.flushed += 1

    def _receive(self) -> None:
        """Everything the socket has now (non-blocking)."""
        while True:
            try:
                buf = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            for kind, value in parse(buf):
                if kind == "packet":
                    self._hold(value)

    def run(self, stop_fd: int) -> None:
        while True:
            timeout = max(0.0, self.held[0][0] - time.monotonic()) if self.held else None
            ready, _, _ = select.select([self.sock, stop_fd], [], [], timeout)
            if self.sock in ready:
                self._receive()
            if stop_fd in ready:
                self._receive()
                self._release(time.monotonic())
                self._flush()
                return
            self._release(time.monotonic())

    def summary(self) -> dict[str, float]:
        """Hold times of the packets let go when due; `flushed` counts those
        let go early at the stop."""
        h = sorted(self.holds_ms)
        if not h:
            return {"packets": 0, "flushed": self.flushed}
        return {"packets": len(h), "flushed": self.flushed, "mean_ms": round(sum(h) / len(h), 1),
                "min_ms": round(h[0], 1), "p50_ms": round(h[len(h) // 2], 1), "max_ms": round(h[-1], 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Delay the packets of an NFQUEUE queue (see the module docstring).")
    p.add_argument("--queue", type=int, required=True, help="queue number of the iptables NFQUEUE rule")
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="seeds the jitter")
    p.add_argument("--maxlen", type=int, default=10000, help="packets the kernel may hold for us")
    args = p.parse_args(argv)
    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_w, False)
    signal.set_wakeup_fd(stop_w)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    d = Delayer(args.queue, args.delay_ms, args.jitter_ms, args.seed, args.maxlen)
    print("ready", flush=True)
    d.run(stop_r)
    print(json.dumps(d.summary()), flush=True)
    d.sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
