"""A simulated Disque cluster: N node cores on a faulty network in one trio run.

Theory of operation: `SimCluster` runs inside `trio.run(..., clock=
MockClock(autojump_threshold=0))`, so time only moves when every task
sleeps, and a minute of cluster life costs what its events cost.  Each
`SimNode` is a real `NodeCore` with a clock read from `trio.current_time()`
(`START_MS` + virtual ms, plus the node's own offset, which `step_clock`
makes jump), its own seeded `random.Random`, and the two tasks
a shell runs, under the node's own cancel scope: a deadline loop that sleeps
until `next_deadline()` and calls `tick()`, and a 100 ms link cron that
reconciles `bus_links()` with the simulated links (connect what is wanted,
close what is not).  After every call into a core, `SimNode.drain` carries out
the effects and saves nodes.conf when the membership is dirty.  Clients speak RESP to the node through the shell's own
session runner (`disque.shell.session.Sessions`): it runs their requests and
carries out every effect (bus messages, AOF records, replies to blocked
clients) exactly as for a real connection; only the transport is a stand-in.

The network: a `SimConnection` is one TCP connection from an outgoing link
(node A, link key) to an incoming connection (node B, conn id).  Each
direction is a `Pipe`: frames are encoded with the sender's header
(`codec.encode_frame`), then each frame is dropped, duplicated (except the
`NOT_REPLAYED` kinds) and delayed by the cluster's seeded rng, and a pump
task delivers them in order (TCP keeps order) through a `FrameDecoder` on the
receiving side.  `lose_next` drops one chosen message, for regression
tests that need a precise fault.  A partition (possibly with bridge nodes in
two groups) makes deliveries and new connections between groups fail
silently, as a firewall dropping packets would: existing connections stay
"up" and the cores find out by themselves.  Killing a node closes its
connections (the peers see EOF); `restart` boots a fresh core with the same
node ID and the membership of the nodes.conf it last saved, and either no jobs
(the AOF is gone) or the jobs of its AOF.  Every core logs to an in-memory
AOF: the shell writes the records of a batch of effects before it sends
anything, and a killed process loses nothing it wrote (only a power loss
would), so the log holds every AofAppend the node ever produced; a restart
with AOF loads it with the shell's own loader (shell/aof_loader.py: seals
checked, a damaged record skipped, a torn tail cut off).  The disk model
(`damage`) is what a lying disk leaves of a dead node's file: the tail
written since its last "fsync" lost (the file counts as fsynced once per
simulated second, as with `appendfsync everysec`), its last record torn,
or bits flipped at random offsets.

Determinism: every random choice comes from the cluster seed, and trio's
scheduler is made deterministic for the run (`deterministic_scheduling`),
so one seed replays the same history.  `check_invariants` runs the
structural invariants of tests/inprocess/invariants.py on every live core (queues
hold exactly the queued jobs, every job has one timer, ...) plus a cluster
one, every simulated second and at the end.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import tempfile
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import Any

import trio
from trio.testing import MockClock

from disque.cluster.codec import FrameDecoder, encode_frame
from disque.cluster.membership import Membership
from disque.cluster.messages import YourJobs
from disque.core.config import Config
from disque.client import encode_command
from disque.core.errors import DisqueError
from disque.core.types import NIL_ARRAY, Status
from disque.core.node import NodeCore
from disque.shell.aof_loader import AofLoader
from disque.store.job import State
from disque.protocols.resp.front import RESP
from disque.shell.session import Conn, Sessions
from inprocess.invariants import check_core
from support import START_MS, FakeHost, all_jobs, read_behind, session_runner

BUS_PORT_INCR = 10_000
CONNECT_TIMEOUT = 1.0  # seconds: a connection into a partition fails after this
LINK_CRON = 0.1
INVARIANT_PERIOD = 1.0
MAX_TICKS_PER_MS = 1000  # more ticks than this at one instant: the core spins
MAX_CALLS_PER_INSTANT = 10_000  # more client calls than this: a client spins
# Frames the network never duplicates.  A replayed YOURJOBS re-creates an
# at-most-once job that its importer already delivered and deleted, and
# nothing in the protocol can tell the replay from a new import: the real bus
# (TCP) never replays a frame, so this fault would only report that.
NOT_REPLAYED = (YourJobs,)


class ConnectionLost:
    """The reply of a call whose node died (or was killed) before answering."""

    def __repr__(self) -> str:
        return "ConnectionLost"


CONNECTION_LOST = ConnectionLost()


def now_ms() -> int:
    return START_MS + round(trio.current_time() * 1000)


def trio_time(ms: int) -> float:
    return (ms - START_MS) / 1000


class SimConn(Conn):
    """A client connection without a socket: `call` writes the request and
    waits for `kick` (a reply queued by another client's command, or the
    node's death)."""

    __slots__ = ("kicked",)

    def __init__(self, client: Any) -> None:
        super().__init__(client, RESP)
        self.kicked = trio.Event()

    def kick(self) -> None:
        self.kicked.set()

    abort = kick


def decode_reply(data: bytes) -> Any:
    """One RESP2 reply as the core's values: Status, DisqueError, NIL_ARRAY."""
    value, end = _decode(data, 0)
    assert end == len(data), "one request, one reply"
    return value


def _decode(data: bytes, pos: int) -> tuple[Any, int]:
    end = data.index(b"\r\n", pos)
    kind, line, pos = data[pos : pos + 1], data[pos + 1 : end], end + 2
    if kind == b"+":
        return Status(line), pos
    if kind == b"-":
        code, _, message = line.decode().partition(" ")
        return DisqueError(code, message), pos
    if kind == b":":
        return int(line), pos
    n = int(line)
    if kind == b"$":
        return (None, pos) if n < 0 else (data[pos : pos + n], pos + n + 2)
    assert kind == b"*", kind
    if n < 0:
        return NIL_ARRAY, pos
    items = []
    for _ in range(n):
        item, pos = _decode(data, pos)
        items.append(item)
    return items, pos


class SimClock:
    """The injected clock of a core: unix-like ms derived from virtual time,
    plus its node's `clock_offset` (a clock that is wrong, or jumps)."""

    def __init__(self, node: SimNode) -> None:
        self.node = node

    def now_ms(self) -> int:
        self.read_at = trio.current_time()
        return now_ms() + self.node.clock_offset

    def since_us(self) -> int:
        return round((trio.current_time() - self.read_at) * 1_000_000)

    def wall_us(self) -> int:
        return (START_MS + self.node.clock_offset) * 1000 + round(trio.current_time() * 1_000_000)


class SimHost(FakeHost):
    """A FakeHost whose nodes.conf saves land in the node's `conf_text`."""

    def __init__(self, node: SimNode) -> None:
        super().__init__()
        self.node = node

    def save_cluster_config(self, fsync: bool) -> None:
        core = self.node.core
        assert core is not None
        self.node.conf_text = core.cluster_conf()


@contextmanager
def deterministic_scheduling(seed: int) -> Iterator[None]:
    """Make trio pick runnable tasks in a seeded order (trio does this itself
    when Hypothesis is loaded; we also seed its shuffler per run)."""
    from trio._core import _run

    saved = _run._ALLOW_DETERMINISTIC_SCHEDULING, _run._r.getstate()
    _run._ALLOW_DETERMINISTIC_SCHEDULING = True
    _run._r.seed(seed)
    try:
        yield
    finally:
        _run._ALLOW_DETERMINISTIC_SCHEDULING = saved[0]
        _run._r.setstate(saved[1])


class Pipe:
    """One direction of a connection: faulty, ordered delivery of frames."""

    def __init__(self, conn: SimConnection, src: SimNode, dst: SimNode) -> None:
        self.conn = conn
        self.src, self.dst = src, dst
        self.decoder = FrameDecoder()
        self.last_at = 0.0
        self.tx, self.rx = trio.open_memory_channel[tuple[float, bytes]](math.inf)

    def send(self, msg: Any, header: Any) -> None:
        net = self.conn.net
        rng = net.rng
        frame = encode_frame(header, msg)
        if net.take_loss(self.src, self.dst, msg) or rng.random() < net.drop:
            net.stats["dropped"] += 1
            return
        copies = 2 if rng.random() < net.dup and type(msg) not in NOT_REPLAYED else 1
        net.stats["duplicated"] += copies - 1
        for _ in range(copies):
            self.last_at = max(self.last_at, trio.current_time() + net.latency())
            self.tx.send_nowait((self.last_at, frame))

    async def pump(self) -> None:
        async for at, frame in self.rx:
            await trio.sleep_until(at)
            if not self.conn.open or not self.conn.net.can_talk(self.src, self.dst):
                self.conn.net.stats["cut"] += 1
                continue
            self.decoder.feed(frame)
            while (decoded := self.decoder.next_frame()) is not None:
                self.conn.deliver(self, *decoded)


class SimConnection:
    """A bus connection from `client`'s outgoing link `key` to `server`."""

    def __init__(self, net: SimCluster, client: SimNode, key: int, server: SimNode) -> None:
        self.net = net
        self.id = next(net.conn_ids)
        self.client, self.key, self.server = client, key, server
        self.open = True
        self.up = Pipe(self, client, server)  # PING, MEET, job messages
        self.down = Pipe(self, server, client)  # PONG answers
        self.scope = trio.CancelScope()
        net.nursery.start_soon(self._run)

    async def _run(self) -> None:
        with self.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.up.pump)
                nursery.start_soon(self.down.pump)

    def deliver(self, pipe: Pipe, header: Any, msg: Any) -> None:
        node = pipe.dst
        core = node.core
        assert core is not None  # a dead node's connections are closed
        self.net.stats["delivered"] += 1
        if pipe is self.up:
            core.handle_bus(header, msg, conn=self.id, peer_ip=self.client.ip, local_ip=self.server.ip)
        else:
            core.handle_bus(header, msg, key=self.key)
        node.drain()

    def close(self) -> None:
        self.open = False
        self.scope.cancel()
        self.server.conns.pop(self.id, None)


class SimNode:
    def __init__(self, net: SimCluster, index: int) -> None:
        self.net = net
        self.index = index
        self.ip = f"10.0.0.{index + 1}"
        self.port = 7711
        self.core: NodeCore | None = None
        self.last_id = ""  # the node ID, kept while the node is down
        self.generation = 0
        self.conf_text = ""  # nodes.conf as last saved
        self.aof = bytearray()  # the append-only file
        self.synced = 0  # its size at its last "fsync" (once per simulated second)
        self.synced_at = 0.0
        self.held_at_death: list[str] = []  # IDs of the jobs the node held when killed
        self.clock_offset = 0  # ms its clock is ahead of the true time (see step_clock)
        self.links: dict[int, SimConnection] = {}  # outgoing, by link key
        self.connecting: set[int] = set()
        self.conns: dict[int, SimConnection] = {}  # incoming, by conn id
        self.sessions: Sessions | None = None  # the clients of the running core
        self.scope = trio.CancelScope()
        self.nursery: trio.Nursery | None = None
        self._wakeup: trio.CancelScope | None = None

    @property
    def alive(self) -> bool:
        return self.core is not None

    @property
    def bus_addr(self) -> tuple[str, int]:
        return (self.ip, self.port + BUS_PORT_INCR)

    @property
    def node_id(self) -> str:
        """The current ID (CLUSTER RESET HARD changes it), or the last one."""
        return self.core.membership.my_id if self.core is not None else self.last_id

    def held(self) -> list[str]:
        """IDs of every job the node holds now, in any state."""
        assert self.core is not None
        return sorted(job.id.decode() for job in all_jobs(self.core))

    def __repr__(self) -> str:
        return f"<SimNode {self.index} {self.core.membership.my_id[:8] if self.core else 'dead'}>"

    # ------------------------------------------------------------ lifecycle

    async def boot(self, conf_text: str = "", aof: bool = False) -> None:
        """Start a core: a new node, or the one nodes.conf `conf_text`
        describes, with the jobs of its AOF if `aof` (else the file is gone)."""
        self.generation += 1
        net = self.net
        rng = random.Random(f"{net.seed}/{self.index}/{self.generation}")
        membership = Membership.from_conf(conf_text, self.port, rng=rng, now=now_ms()) if conf_text else None
        config = Config()
        config.port = self.port
        config.cluster_node_timeout = net.node_timeout
        config.zone = net.zones[self.index] if net.zones else None
        node_id = self.last_id = membership.my_id if membership else "%040x" % rng.getrandbits(160)
        core = NodeCore(
            config, node_id, clock=SimClock(self), rng=rng, host=SimHost(self), membership=membership, **read_behind(config)
        )
        self.core = core
        self.sessions = session_runner(core, self, self, lambda: core.host.save_cluster_config(fsync=False))
        if aof:
            self._load_aof(core)
        else:
            self.aof.clear()
        self.synced = len(self.aof)
        core.aof.state = "on"
        core.host.save_cluster_config(fsync=True)
        self.scope = trio.CancelScope()
        await net.nursery.start(self._run, rng.random() * LINK_CRON)

    def _load_aof(self, core: NodeCore) -> None:
        """The shell's loader over the file as the disk kept it; the file
        then is what the loader left of it (a torn tail cut off)."""
        with tempfile.TemporaryDirectory(prefix="disque-sim-") as tmp:
            path = os.path.join(tmp, "disque.aof")
            with open(path, "wb") as f:
                f.write(self.aof)
            for _ in AofLoader(core, core.config).steps(path):
                pass
            with open(path, "rb") as f:
                self.aof = bytearray(f.read())

    def damage(self, how: str, rng: random.Random) -> None:
        """The disk model (a dead node's file): `lose-tail` (a power cut: what
        was written since the last fsync), `torn` (the last record cut in the
        middle) or `bitflip` (8 bits flipped at random offsets)."""
        aof = self.aof
        if not aof:
            return
        if how == "lose-tail":
            del aof[self.synced :]
        elif how == "torn":
            del aof[len(aof) - rng.randint(1, min(200, len(aof))) :]
        else:
            for _ in range(8):
                aof[rng.randrange(len(aof))] ^= 1 << rng.randrange(8)

    async def _run(self, phase: float, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self._deadline_loop)
                task_status.started()
                await trio.sleep(phase)  # desynchronise the nodes' crons
                nursery.start_soon(self._link_cron)

    def kill(self) -> None:
        assert self.core is not None and self.sessions is not None
        self.held_at_death = self.held()
        self.last_id = self.core.membership.my_id
        self.scope.cancel()
        clients = list(self.sessions.conns.values())
        self.core = self.sessions = None
        self.nursery = None
        for conn in list(self.links.values()):
            conn.close()
        self.links.clear()
        self.connecting.clear()
        for conn in list(self.conns.values()):
            conn.close()
            peer = conn.client
            if peer.nursery is not None:  # the peer sees EOF after a while
                peer.nursery.start_soon(peer.link_lost, conn)
        for client in clients:  # their calls see the node gone
            client.kick()

    def step_clock(self, offset_ms: int) -> None:
        """Set the node's clock `offset_ms` from the true time: a jump, forward
        or back, as a wrong clock put right (or wrong) does."""
        self.clock_offset = offset_ms
        if self.core is not None:
            self._rearm()

    # ------------------------------------------------------------ shell tasks

    async def _deadline_loop(self) -> None:
        spins, last = 0, -1
        while True:
            core = self.core
            assert core is not None
            with trio.CancelScope(deadline=trio_time(core.next_deadline() - self.clock_offset)) as self._wakeup:
                await trio.sleep_forever()
            self._wakeup = None
            now = now_ms()
            spins = spins + 1 if now == last else 0
            last = now
            assert spins < MAX_TICKS_PER_MS, f"{self}: next_deadline() does not move past {now}"
            core.tick()
            self.drain()

    async def _link_cron(self) -> None:
        while True:
            self.reconcile_links()
            await trio.sleep(LINK_CRON)

    def reconcile_links(self) -> None:
        core = self.core
        assert core is not None and self.nursery is not None
        wanted = core.bus_links()
        for key, conn in list(self.links.items()):
            if wanted.get(key) != conn.server.bus_addr:
                self._close_link(key)
        self.drain()
        for key, addr in wanted.items():
            if key not in self.links and key not in self.connecting:
                self.connecting.add(key)
                self.nursery.start_soon(self._connect, key, addr)

    async def _connect(self, key: int, addr: tuple[str, int]) -> None:
        net = self.net
        target = net.listening_at(addr)
        try:
            if target is None:  # refused
                await trio.sleep(net.latency())
            elif not net.can_talk(self, target):  # SYNs dropped
                await trio.sleep(CONNECT_TIMEOUT)
            else:
                await trio.sleep(2 * net.latency())
                if target.alive and net.can_talk(self, target):
                    conn = SimConnection(net, self, key, target)
                    self.links[key] = conn
                    target.conns[conn.id] = conn
                    self._call_core("link_connected", key)
                    return
            self._call_core("link_closed", key, True)
        finally:
            self.connecting.discard(key)

    async def link_lost(self, conn: SimConnection) -> None:
        """Our outgoing link's peer died: EOF reaches us one latency later."""
        await trio.sleep(self.net.latency())
        if self.links.get(conn.key) is conn:
            del self.links[conn.key]
            self._call_core("link_closed", conn.key, False)

    def _close_link(self, key: int) -> None:
        conn = self.links.pop(key, None)
        if conn is not None:
            conn.close()
            assert self.core is not None
            self.core.link_closed(key, False)

    def _call_core(self, method: str, *args: Any) -> None:
        getattr(self.core, method)(*args)
        self.drain()

    # ------------------------------------------------------------ effects

    def drain(self) -> None:
        """Carry out the effects of the last core call, as the shell does."""
        assert self.sessions is not None
        self.sessions.effects.apply(None)
        self._rearm()

    def _rearm(self) -> None:
        """The deadline loop sleeps until the core's new next deadline."""
        if self._wakeup is not None and self.core is not None:
            self._wakeup.deadline = min(self._wakeup.deadline, trio_time(self.core.next_deadline() - self.clock_offset))

    # The session runner's bus and AOF ports.

    def send(self, key: int, msg: Any) -> None:
        conn = self.links.get(key)
        if conn is not None and conn.open:
            assert self.core is not None
            conn.up.send(msg, self.core.header())

    def answer(self, conn_id: int, msg: Any) -> None:
        conn = self.conns.get(conn_id)
        if conn is not None and conn.open:
            assert self.core is not None
            conn.down.send(msg, self.core.header())

    def drop_link(self, key: int) -> None:
        self._close_link(key)

    def append(self, record: bytes, sync: bool = False) -> None:
        now = trio.current_time()
        if now - self.synced_at >= 1.0:  # the everysec fsync of what was written before
            self.synced, self.synced_at = len(self.aof), now
        self.aof += record  # a killed process loses nothing it wrote

    def flush(self, current: Any = None) -> None:
        """Records are in the (in-memory) file as soon as appended."""

    # ------------------------------------------------------------ clients

    async def call(self, args: tuple[Any, ...]) -> Any:
        core, sessions = self.core, self.sessions
        if core is None or sessions is None:
            return CONNECTION_LOST
        conn = SimConn(sessions.new_client(f"10.1.0.1:{next(self.net.client_ids) % 60000 + 1024}"))
        sessions.opened(conn)
        try:
            assert sessions.received(conn, encode_command(args))
            sessions.run(conn)
            self._rearm()
            while not conn.out:  # blocked: the reply comes with a later call into the core
                if self.core is not core or conn.closing:
                    return CONNECTION_LOST
                await conn.kicked.wait()
                conn.kicked = trio.Event()
            return decode_reply(b"".join(conn.out))
        finally:  # the client goes away, also when cancelled
            if self.core is core:
                sessions.gone(conn)
                self._rearm()


class SimCluster:
    """`n` nodes on one simulated network; use inside `trio.run` with a
    MockClock, as `async with SimCluster(...) as cluster:`."""

    def __init__(
        self, n: int, seed: int, *, drop: float = 0.0, dup: float = 0.0,
        delay: tuple[float, float] = (0.1, 2.0), node_timeout: int = 1000, zones: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self.seed = seed
        self.zones = zones  # node index -> its zone (docs/zones.md); () for none
        self.rng = random.Random(f"{seed}/net")
        self.drop, self.dup = drop, dup
        self.delay = delay  # ms
        self.node_timeout = node_timeout
        self.groups: dict[int, set[int]] | None = None  # node index -> its groups
        self.losses: list[tuple[int, int, type]] = []  # see lose_next
        self.nodes = [SimNode(self, i) for i in range(n)]
        self.client_ids = itertools.count(1)
        self.conn_ids = itertools.count(1)
        self.stats = {"delivered": 0, "dropped": 0, "duplicated": 0, "cut": 0}
        self._instant = (-1.0, 0)  # (virtual time, client calls made at it)
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> SimCluster:
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, MockClock) and clock.autojump_threshold == 0, "run under an autojump MockClock"
        self._stack.enter_context(deterministic_scheduling(self.seed))
        self.nursery = await self._stack.enter_async_context(trio.open_nursery())
        self._stack.callback(self.nursery.cancel_scope.cancel)  # runs before the nursery exits
        for node in self.nodes:
            await node.boot()
        self.nursery.start_soon(self._invariant_loop)
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        if exc[0] is None:
            self.check_invariants()
        return await self._stack.__aexit__(*exc)

    # ------------------------------------------------------------ network

    def latency(self) -> float:
        lo, hi = self.delay
        return self.rng.uniform(lo, hi) / 1000

    def can_talk(self, a: SimNode, b: SimNode) -> bool:
        return self.groups is None or bool(self.groups[a.index] & self.groups[b.index])

    def listening_at(self, addr: tuple[str, int]) -> SimNode | None:
        for node in self.nodes:
            if node.alive and node.bus_addr == addr:
                return node
        return None

    def partition(self, groups: list[list[int]]) -> None:
        """Cut the network into `groups` of node indexes: two nodes talk when
        they share a group.  A node in two groups is a bridge; a node in no
        group is isolated."""
        self.groups = {node.index: set() for node in self.nodes}
        for g, members in enumerate(groups):
            for i in members:
                self.groups[i].add(g)

    def heal(self) -> None:
        self.groups = None

    def lose_next(self, src: int, dst: int, kind: type) -> None:
        """Drop the next `kind` message from node `src` to node `dst` (a
        targeted fault, for regression tests)."""
        self.losses.append((src, dst, kind))

    def take_loss(self, src: SimNode, dst: SimNode, msg: Any) -> bool:
        rule = (src.index, dst.index, type(msg))
        if rule in self.losses:
            self.losses.remove(rule)
            return True
        return False

    def kill(self, i: int) -> None:
        self.nodes[i].kill()

    def zone(self, name: str) -> list[int]:
        """The indexes of the nodes of zone `name`."""
        return [i for i, zone in enumerate(self.zones) if zone == name]

    async def restart(self, i: int, aof: bool = False) -> None:
        """Boot killed node `i` again: same ID and nodes.conf, and the jobs
        of its AOF if `aof`, else none."""
        node = self.nodes[i]
        assert not node.alive
        await node.boot(node.conf_text, aof)

    # ------------------------------------------------------------ clients

    async def call(self, i: int, *args: Any) -> Any:
        """Run a command on node `i`, waiting (virtual time) for a blocked
        reply.  Returns the reply value (a DisqueError for errors), or
        CONNECTION_LOST if the node is or goes down first.

        A call answered at once does not let virtual time pass: a client
        that loops on such replies without sleeping would spin forever, so
        that fails here."""
        now = trio.current_time()
        at, calls = self._instant
        calls = calls + 1 if now == at else 1
        self._instant = (now, calls)
        assert calls <= MAX_CALLS_PER_INSTANT, f"{calls} client calls at {now} s: a client spins without sleeping"
        return await self.nodes[i].call(args)

    def core(self, i: int) -> NodeCore:
        core = self.nodes[i].core
        assert core is not None, f"node {i} is down"
        return core

    def node_id(self, i: int) -> str:
        return self.nodes[i].node_id

    async def meet(self, i: int, j: int) -> None:
        """CLUSTER MEET from node i to node j."""
        node = self.nodes[j]
        reply = await self.call(i, "CLUSTER", "MEET", node.ip, node.port)
        assert reply == b"OK", reply

    def meshed(self) -> bool:
        """Every live node knows and reaches every other live node, and has
        a link to it."""
        live = [n for n in self.nodes if n.core is not None]
        for node in live:
            cluster = node.core.membership  # type: ignore[union-attr]
            others = {other.node_id for other in live if other is not node}
            reachable = {n.id for n in cluster.reachable() if n.link}
            if not others <= reachable or cluster.size() < len(live):
                return False
        return True

    async def wait_for(self, predicate: Any, timeout: float, step: float = 0.1) -> float:
        """Sleep until `predicate()` holds; returns the (virtual) seconds
        waited.  Raises TimeoutError."""
        start = trio.current_time()
        with trio.move_on_after(timeout):
            while not predicate():
                await trio.sleep(step)
            return trio.current_time() - start
        raise TimeoutError(f"condition not reached within {timeout} s")

    async def form(self, timeout: float = 60, retry: float = 3) -> None:
        """MEET every node to node 0 and wait for a full mesh.

        Only a MEET makes a node accept a stranger, and on a lossy network a
        MEET can be lost for good (its handshake expires), leaving a node
        that others know but that knows nobody.  So, as an operator would,
        every `retry` s each node MEETs again the live nodes it still does
        not know."""
        first = True
        with trio.fail_after(timeout):
            while not self.meshed():
                for node in self.nodes:
                    if not node.alive:
                        continue
                    known = node.core.membership.nodes  # type: ignore[union-attr]
                    for other in self.nodes:
                        if other is not node and other.alive and other.node_id not in known:
                            if not first or other.index == 0:
                                await self.meet(node.index, other.index)
                first = False
                with trio.move_on_after(retry):
                    await self.wait_for(self.meshed, math.inf)

    # ------------------------------------------------------------ invariants

    async def _invariant_loop(self) -> None:
        while True:
            await trio.sleep(INVARIANT_PERIOD)
            self.check_invariants()

    def check_invariants(self) -> None:
        for node in self.nodes:
            if node.core is not None:
                check_cluster_core(node.core)


def check_cluster_core(core: NodeCore) -> None:
    """The single-node invariants (tests/inprocess/invariants.py) plus one of the
    cluster: a node holding a job lists itself among its possible holders
    (or the ACK garbage collection could finish without it)."""
    check_core(core, settled=False)  # a job may be due at this very instant
    me = core.membership.my_id
    for job in all_jobs(core):
        if job.state != State.WAIT_REPL and not job.is_dummy_ack:
            assert me in job.nodes_delivered, f"{job}: holder {me} not in its nodes_delivered {job.nodes_delivered}"
