"""Several node cores on one fake clock, joined by an instant, lossless bus.

For regression tests that need a few whole nodes talking (handshakes,
replication, a node that dies and comes back) but none of the simulated
network's faults or trio: `advance(ms)` moves the shared `FakeClock`,
calling every live core's `tick()` at its deadlines and reconciling the
outgoing links every 100 ms as the shell's link cron does; after every call
into a core the mesh carries out its effects at once (frames encoded and
decoded by the real codec, delivered in order), the way the trio shell
would.  `kill(i)` makes a node vanish (its peers see their links close);
`restart(i)` boots a fresh core from the nodes.conf it last saved, so it
keeps its ID; `lose_next` drops one chosen message; `make_older` makes a
node behave as one of an older version on the wire; `stall(i, ms)` freezes
a node's process (no timer runs, what is sent to it waits in its socket; on
waking its timer runs before it reads, as a starved event loop's may).
Every node listens on 127.0.0.1, client port 7711 + index.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from typing import Any

from disque.cluster.codec import FrameDecoder, encode_frame
from disque.cluster.membership import Membership
from disque.cluster.messages import Meet, Ping, Pong
from disque.core.effects import Answer, DropLink, Reply, Send
from disque.core.types import BLOCKED
from disque.core.node import NodeCore
from disque.protocols.resp.front import RESP
from support import FakeClock, FakeHost, make_config, read_behind

IP = "127.0.0.1"
LINK_CRON_MS = 100


class _Host(FakeHost):
    """Saves nodes.conf into the mesh, where `restart` finds it."""

    def __init__(self, mesh: Mesh, i: int) -> None:
        super().__init__()
        self.mesh, self.i = mesh, i

    def save_cluster_config(self, fsync: bool) -> None:
        core = self.mesh.cores[self.i]
        assert core is not None
        self.mesh.confs[self.i] = core.membership.to_conf()
        core.membership.dirty = False


class Mesh:
    def __init__(self, n: int, *, seed: int = 1, node_timeout: int = 1000) -> None:
        self.clock = FakeClock()
        self.seed, self.node_timeout = seed, node_timeout
        self.cores: list[NodeCore | None] = [None] * n
        self.confs = [""] * n  # nodes.conf as last saved
        self.boots = [0] * n
        self.links: dict[tuple[int, int], tuple[int, int]] = {}  # (node, link key) -> (peer, conn id)
        self.conns: dict[int, tuple[int, int]] = {}  # conn id -> (node, link key) it serves
        self.replies: dict[int, Any] = {}  # client id -> its reply, once given
        self.frames: deque[tuple[int, bytes, int | None, int | None]] = deque()
        self.losses: list[tuple[int, type]] = []  # see lose_next
        self.older: dict[int, tuple[type, ...]] = {}  # see make_older
        self.refused: list[tuple[int, type]] = []  # (node, message type) an older node dropped a link for
        self.stalled: dict[int, int] = {}  # see stall: node -> the ms it wakes at
        self.held: deque[tuple[int, bytes, int | None, int | None]] = deque()  # frames to a stalled node
        self._ids = 0
        self._next_cron = self.clock.ms
        for i in range(n):
            self.boot(i)

    # ------------------------------------------------------------ nodes

    def core(self, i: int) -> NodeCore:
        core = self.cores[i]
        assert core is not None, f"node {i} is down"
        return core

    def my_id(self, i: int) -> str:
        return self.core(i).membership.my_id

    def boot(self, i: int) -> None:
        self.boots[i] += 1
        rng = random.Random(f"{self.seed}/{i}/{self.boots[i]}")
        port = 7711 + i
        conf = self.confs[i]
        members = Membership.from_conf(conf, port, rng=rng, now=self.clock.ms) if conf else None
        config = make_config(port=port, cluster_node_timeout=self.node_timeout)
        self.cores[i] = NodeCore(
            config, "%040x" % rng.getrandbits(160), clock=self.clock, rng=rng, host=_Host(self, i), membership=members,
            **read_behind(config),
        )  # fmt: skip
        self.core(i).host.save_cluster_config(fsync=True)

    def kill(self, i: int) -> None:
        """The process dies: its connections close, peers see EOF at once
        (a stalled one too: what waited in its socket is lost)."""
        self.cores[i] = None
        self.stalled.pop(i, None)
        self.held = deque(f for f in self.held if f[0] != i)
        for (node, key), (peer, conn) in list(self.links.items()):
            if i in (node, peer):
                del self.links[node, key]
                del self.conns[conn]
                if node != i:
                    self.core(node).link_closed(key, False)
        self.flush()

    def restart(self, i: int) -> None:
        assert self.cores[i] is None
        self.boot(i)

    # ------------------------------------------------------------ clients

    def call(self, i: int, *args: Any) -> Any:
        """A command on node i from a new client: its reply, or the client
        id when it blocks (see `reply`)."""
        self._ids += 1
        core = self.core(i)
        client = core.connect(self._ids, f"{IP}:{40000 + self._ids}")
        reply = core.handle_command(client, [a if isinstance(a, bytes) else str(a).encode() for a in args], RESP.run)
        self.flush()
        return self._ids if reply is BLOCKED else reply

    def reply(self, client_id: int) -> Any:
        return self.replies.get(client_id)

    def lose_next(self, dst: int, kind: type) -> None:
        """Drop the next `kind` message sent to node `dst`."""
        self.losses.append((dst, kind))

    def make_older(self, i: int, unknown: tuple[type, ...]) -> None:
        """Node i speaks as a node of an older version: its PING, PONG and
        MEET say no features, and a message of a type in `unknown` makes it
        drop the connection it came on, as its codec would (in `refused`)."""
        self.older[i] = unknown

    def stall(self, i: int, ms: int) -> None:
        """Node i's process stops for `ms` (starved of CPU, SIGSTOP)."""
        self.stalled[i] = self.clock.ms + ms

    def _wake(self) -> None:
        for i in [i for i, until in self.stalled.items() if until <= self.clock.ms]:
            del self.stalled[i]
            self.core(i).tick()  # its timer first, then what waited in its socket
            self.frames.extend(f for f in self.held if f[0] == i)
            self.held = deque(f for f in self.held if f[0] != i)
            self.flush()

    def meet(self, i: int, j: int) -> None:
        assert self.call(i, "CLUSTER", "MEET", IP, 7711 + j) == b"OK"

    # ------------------------------------------------------------ time and links

    def advance(self, ms: int) -> None:
        end = self.clock.ms + ms
        while self.clock.ms < end:
            live = [c for c in self.cores if c is not None]
            due = min([self._next_cron, *(c.next_deadline() for c in live), *self.stalled.values()])
            self.clock.ms = min(end, max(self.clock.ms + 1, due))
            self._wake()
            if self.clock.ms >= self._next_cron:
                self._next_cron += LINK_CRON_MS
                for i in range(len(self.cores)):
                    if self.cores[i] is not None and i not in self.stalled:
                        self._reconcile(i)
            for i, core in enumerate(self.cores):
                if core is not None and i not in self.stalled and core.next_deadline() <= self.clock.ms:
                    core.tick()
                    self.flush()

    def wait_for(self, condition: Any, ms: int) -> int:
        """Advance until `condition()` holds; the ms it took."""
        start = self.clock.ms
        while not condition():
            assert self.clock.ms - start < ms, "condition not reached in time"
            self.advance(10)
        return self.clock.ms - start

    def _reconcile(self, i: int) -> None:
        core = self.core(i)
        wanted = core.bus_links()
        for key, addr in wanted.items():
            if (i, key) in self.links:
                continue
            peer = next((j for j, c in enumerate(self.cores) if c is not None and (IP, 7711 + j + 10000) == addr), None)
            if peer is None:
                core.link_closed(key, True)
            else:
                self._ids += 1
                self.links[i, key] = (peer, self._ids)
                self.conns[self._ids] = (i, key)
                core.link_connected(key)
            self.flush()

    # ------------------------------------------------------------ effects

    def flush(self) -> None:
        """Carry out every pending effect, and deliver frames until quiet."""
        while True:
            for i, core in enumerate(self.cores):
                if core is None:
                    continue
                effects, core.out.effects = core.out.effects, []
                for effect in effects:
                    self._apply(i, core, effect)
                if core.membership.dirty:
                    core.host.save_cluster_config(fsync=False)
            if not self.frames:
                return
            dst, frame, key, conn = self.frames.popleft()
            if dst in self.stalled:
                self.held.append((dst, frame, key, conn))
                continue
            core = self.cores[dst]
            if core is not None:
                decoder = FrameDecoder()
                decoder.feed(frame)
                header, msg = decoder.next_frame()
                if isinstance(msg, self.older.get(dst, ())):
                    self.refused.append((dst, type(msg)))
                    self._drop_connection(dst, key, conn)
                    continue
                core.handle_bus(header, msg, key=key, conn=conn, peer_ip=IP if conn else "", local_ip=IP if conn else "")

    def _drop_connection(self, dst: int, key: int | None, conn: int | None) -> None:
        """Node dst closes the connection a frame came on: its own link
        (`key`), or the incoming connection of a peer's link (`conn`)."""
        node, key = (dst, key) if conn is None else self.conns[conn]
        link = self.links.pop((node, key), None)
        if link is not None:
            del self.conns[link[1]]
            self.core(node).link_closed(key, False)

    def _apply(self, i: int, core: NodeCore, effect: Any) -> None:
        kind = type(effect)
        if i in self.older and isinstance(getattr(effect, "msg", None), (Ping, Pong, Meet)):
            effect = dataclasses.replace(effect, msg=dataclasses.replace(effect.msg, features=0))  # what its encoder leaves out
        if kind is Send:
            link = self.links.get((i, effect.key))
            if link is not None and (link[0], type(effect.msg)) in self.losses:
                self.losses.remove((link[0], type(effect.msg)))
            elif link is not None:
                self.frames.append((link[0], encode_frame(core.header(), effect.msg), None, link[1]))
        elif kind is Answer:
            origin = self.conns.get(effect.conn)
            if origin is not None:
                self.frames.append((origin[0], encode_frame(core.header(), effect.msg), origin[1], None))
        elif kind is DropLink:
            link = self.links.pop((i, effect.key), None)
            if link is not None:
                del self.conns[link[1]]
                core.link_closed(effect.key, False)
        elif kind is Reply:
            self.replies[effect.client_id] = effect.value
