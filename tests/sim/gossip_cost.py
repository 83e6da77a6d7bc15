"""Gossip cost as the cluster grows: N nodes' membership (the core's own
`Membership`, nothing else) on one fake clock and a lossless bus of 1 ms.

Theory of operation: each node is a `Membership` fed as the node core feeds
it: its 100 ms `cron` (phases spread at random), the frames that reach it,
and its links reconciled with `bus_links()` every cron, as the shell does
(a connection to a dead node fails; a failing key is retried at most once a
second).  A PING or MEET goes on the sender's link and is answered with a
PONG on the same connection.  Frames are counted with their size as the real
codec encodes them (`encode_frame`), cached per kind and gossip count.

The cluster starts formed (each node loads a nodes.conf naming everyone,
with its last PONGs spread over the past node-timeout/2, as a cluster that
has run a while), then `measure()` reports:
- frames and bytes sent per node per second, idle;
- seconds from a node's death until every live node flags it FAIL;
- seconds from a new node's CLUSTER MEET with one member until every node
  knows it (not in handshake).

`python tests/sim/gossip_cost.py` prints the table for 10, 50, 100 and 500
nodes and writes docs/gossip-cost.png (`make scale`); tests/sim/test_gossip_cost.py
checks a small cluster in `make test` and the 500-node figures in `make scale`.
"""

from __future__ import annotations

import heapq
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disque.cluster.codec import encode_frame
from disque.cluster.membership import FAIL, HANDSHAKE, Membership
from disque.cluster.messages import Header, Meet, Ping

IP = "127.0.0.1"
FIRST_PORT = 10_000
LATENCY_MS = 1
CRON_MS = 100
RETRY_MS = 1_000  # a failing link is retried at most this often, as the bus's backoff does at most


@dataclass
class Figures:
    nodes: int
    frames_per_node_s: float
    bytes_per_node_s: float
    gossip_entries_per_frame: float
    fail_s: float  # a killed node flagged FAIL by every live node
    known_s: float  # a new node known by every node


class _Wire:
    """What a Membership sends, handed to the simulation."""

    def __init__(self, sim: GossipSim, i: int) -> None:
        self.sim, self.i = sim, i

    def send_key(self, key: int, msg: Any) -> None:
        self.sim.send(self.i, key, msg)

    def answer(self, conn: int, msg: Any) -> None:
        self.sim.answer(self.i, conn, msg)

    def drop_link(self, key: int) -> None:
        self.sim.drop(self.i, key)


class GossipSim:
    def __init__(self, n: int, *, timeout: int = 15_000, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.now = 0
        self.timeout = timeout
        self.events: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self.members: list[Membership] = []
        self.alive: list[bool] = []
        self.by_port: dict[int, int] = {}
        self.links: dict[tuple[int, int], int] = {}  # (node, link key) -> peer
        self.out: list[dict[int, int]] = []  # per node: link key -> peer (the same links)
        self.retry_at: dict[tuple[int, int], int] = {}
        self.frames = self.bytes = self.entries = 0
        self._sizes: dict[tuple[type, int], int] = {}
        ids = ["%040x" % self.rng.getrandbits(160) for _ in range(n)]
        for i in range(n):
            conf = "".join(
                f"{node_id} {IP}:{FIRST_PORT + j} {'myself' if j == i else 'noflags'} 0 0 connected\n"
                for j, node_id in enumerate(ids)
            )
            members = Membership.from_conf(conf, FIRST_PORT + i, rng=random.Random(self.rng.random()), now=0)
            for node in members.nodes.values():  # last PONGs spread as in a cluster that has run a while
                node.pong_received = -self.rng.randrange(timeout // 2)
            self._add_member(members)

    # ------------------------------------------------------------ nodes

    def _add_member(self, members: Membership) -> int:
        i = len(self.members)
        members.wire = _Wire(self, i)
        members.timeout = self.timeout
        members.now = self.now
        self.members.append(members)
        self.out.append({})
        self.alive.append(True)
        self.by_port[members.myself.port] = i
        self._at(self.now + self.rng.randrange(CRON_MS), lambda: self._cron(i))
        return i

    def kill(self, i: int) -> None:
        """The process dies: its connections reset, its peers see their links close."""
        self.alive[i] = False
        for (src, key), dst in list(self.links.items()):
            if i in (src, dst):
                self._unlink(src, key)
                if src != i:
                    self._call(src, lambda m, key=key: m.link_closed(key, False))

    def add_node(self, meet: int) -> int:
        """A new node, told to CLUSTER MEET node `meet`."""
        port = FIRST_PORT + len(self.members)
        members = Membership("%040x" % self.rng.getrandbits(160), port, rng=random.Random(self.rng.random()))
        i = self._add_member(members)
        self._call(i, lambda m: m.meet(IP, FIRST_PORT + meet))
        return i

    # ------------------------------------------------------------ the bus

    def _call(self, i: int, what: Callable[[Membership], Any]) -> None:
        members = self.members[i]
        members.now = self.now
        what(members)

    def _cron(self, i: int) -> None:
        if not self.alive[i]:
            return
        self._call(i, lambda m: m.cron())
        wanted = self.members[i].bus_links()
        for key in [k for k in self.out[i] if k not in wanted]:
            self._unlink(i, key)
        for key, (_, bus_port) in wanted.items():
            if key in self.out[i] or self.retry_at.get((i, key), 0) > self.now:
                continue
            peer = self.by_port.get(bus_port - 10_000)
            if peer is not None and self.alive[peer]:
                self.links[i, key] = self.out[i][key] = peer
                self._call(i, lambda m, key=key: m.link_connected(key))
            else:
                self.retry_at[i, key] = self.now + RETRY_MS
                self._call(i, lambda m, key=key: m.link_closed(key, True))
        self._at(self.now + CRON_MS, lambda: self._cron(i))

    def _count(self, i: int, msg: Any) -> Header:
        members = self.members[i]
        header = Header(members.my_id, members.myself.port, members.myself.flags)
        gossip = getattr(msg, "gossip", ())
        size_key = (type(msg), len(gossip))
        if size_key not in self._sizes:
            self._sizes[size_key] = len(encode_frame(header, msg))
        self.frames += 1
        self.bytes += self._sizes[size_key]
        self.entries += len(gossip)
        return header

    def send(self, i: int, key: int, msg: Any) -> None:
        peer = self.links.get((i, key))
        if peer is None:
            return
        header = self._count(i, msg)
        conn = i << 32 | key  # the connection this frame arrives on, at the peer
        self._deliver(peer, header, msg, None, conn)

    def answer(self, i: int, conn: int, msg: Any) -> None:
        src, key = conn >> 32, conn & 0xFFFFFFFF
        if self.links.get((src, key)) != i:
            return  # the connection is gone
        self._deliver(src, self._count(i, msg), msg, key, None)

    def _unlink(self, i: int, key: int) -> None:
        del self.out[i][key]
        del self.links[i, key]

    def drop(self, i: int, key: int) -> None:
        if key in self.out[i]:
            self._unlink(i, key)
            self._at(self.now, lambda: self._call(i, lambda m: m.link_closed(key, False)))

    def _deliver(self, dst: int, header: Header, msg: Any, key: int | None, conn: int | None) -> None:
        def arrive() -> None:
            if self.alive[dst]:
                self._call(dst, lambda m: m.receive(header, msg, key, conn, IP, IP))

        self._at(self.now + LATENCY_MS, arrive)

    # ------------------------------------------------------------ time

    def _at(self, when: int, what: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.events, (when, self._seq, what))

    def run_until(self, condition: Callable[[], bool], limit_ms: int, check_ms: int = 100) -> int | None:
        """Run until `condition` holds (checked every `check_ms`); the ms it
        took, or None after `limit_ms`."""
        started = self.now
        next_check = self.now
        while self.now - started <= limit_ms:
            if self.now >= next_check:
                if condition():
                    return self.now - started
                next_check = self.now + check_ms
            when, _, what = heapq.heappop(self.events)
            self.now = max(self.now, when)
            what()
        return None

    def run_for(self, ms: int) -> None:
        self.run_until(lambda: False, ms, check_ms=ms)

    # ------------------------------------------------------------ what the table says

    def flagged_fail_everywhere(self, j: int) -> bool:
        target = self.members[j].my_id
        return all(
            (node := m.nodes.get(target)) is not None and node.flags & FAIL
            for i, m in enumerate(self.members) if self.alive[i] and i != j
        )  # fmt: skip

    def known_everywhere(self, j: int) -> bool:
        target = self.members[j].my_id
        return all(
            (node := m.nodes.get(target)) is not None and not node.flags & HANDSHAKE
            for i, m in enumerate(self.members) if self.alive[i] and i != j
        )  # fmt: skip


def measure(n: int, *, timeout: int = 15_000, idle_ms: int = 20_000, seed: int = 1) -> Figures:
    sim = GossipSim(n, timeout=timeout, seed=seed)
    sim.run_for(timeout // 2 + 1_000)  # settle: links up, a round of PINGs (the last PONGs go back timeout/2)
    frames, size, entries, started = sim.frames, sim.bytes, sim.entries, sim.now
    sim.run_for(idle_ms)
    seconds = (sim.now - started) / 1000
    sent = sim.frames - frames
    figures = Figures(n, sent / n / seconds, (sim.bytes - size) / n / seconds, (sim.entries - entries) / max(sent, 1), -1.0, -1.0)
    victim = sim.rng.randrange(n)
    sim.kill(victim)
    failed = sim.run_until(lambda: sim.flagged_fail_everywhere(victim), 4 * timeout)
    newcomer = sim.add_node(meet=(victim + 1) % n)
    known = sim.run_until(lambda: sim.known_everywhere(newcomer), 4 * timeout)
    figures.fail_s = -1.0 if failed is None else failed / 1000
    figures.known_s = -1.0 if known is None else known / 1000
    return figures


def table(rows: list[Figures], timeout: int) -> str:
    lines = [
        f"Gossip cost (simulation, node-timeout {timeout / 1000:.0f} s, 1 ms links; FAIL bound 2 x timeout = {2 * timeout / 1000:.0f} s)",
        f"{'N':>5}  {'frames/node/s':>13}  {'bytes/node/s':>12}  {'entries/frame':>13}  {'FAIL everywhere s':>17}  {'new node known s':>16}",
    ]
    for f in rows:
        lines.append(
            f"{f.nodes:>5}  {f.frames_per_node_s:>13.1f}  {f.bytes_per_node_s:>12,.0f}  {f.gossip_entries_per_frame:>13.1f}"
            f"  {f.fail_s:>17.1f}  {f.known_s:>16.1f}"
        )
    return "\n".join(lines)


def plot(rows: list[Figures], timeout: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [f.nodes for f in rows]
    fig, (traffic, times) = plt.subplots(1, 2, figsize=(10, 4))
    traffic.loglog(ns, [f.bytes_per_node_s for f in rows], "o-", label="bytes sent per node per s")
    scale = rows[0].bytes_per_node_s / ns[0] ** 2
    traffic.loglog(ns, [scale * n**2 for n in ns], "--", color="grey", label="N² (a tenth of the table per heartbeat)")
    traffic.set_xlabel("nodes")
    traffic.legend(fontsize=8)
    traffic.set_title("gossip traffic per node")
    times.semilogx(ns, [f.fail_s for f in rows], "o-", label="killed node FAIL everywhere")
    times.semilogx(ns, [f.known_s for f in rows], "s-", label="new node known everywhere")
    times.axhline(2 * timeout / 1000, color="red", linestyle=":", label="2 x node-timeout")
    times.set_xlabel("nodes")
    times.set_ylabel("seconds")
    times.legend(fontsize=8)
    times.set_title(f"detection and joining (node-timeout {timeout / 1000:.0f} s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [10, 50, 100, 500]
    timeout = 15_000
    rows = []
    for n in sizes:
        rows.append(measure(n, timeout=timeout, idle_ms=20_000 if n <= 100 else 5_000))
        print(table(rows[-1:], timeout).splitlines()[-1], flush=True)
    print(table(rows, timeout))
    path = Path(__file__).resolve().parents[2] / "docs" / "gossip-cost.png"
    plot(rows, timeout, path)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
