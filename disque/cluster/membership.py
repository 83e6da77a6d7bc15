"""The node table: joining, gossip, failure detection, nodes.conf.

Theory of operation: `Membership` holds one `Peer` per known node, myself
included, with the flags of spec/cluster.md §2.1.  It is driven by the core with
the three bus inputs (a link went up or down, a PING/PONG/MEET/FAIL arrived)
and a 100 ms `cron`, and it answers the questions the job layer asks:
`size()` (known nodes not in handshake, failing ones included), `reachable()`
(replication candidates) and `has_link()`.

Links: every node with an address gets one outgoing link, identified by the
node's `key`, an int that survives the handshake renaming a node; the shell
keeps exactly the links `bus_links()` lists and reports them up and down.
PINGs, MEETs and everything else we send go on outgoing links; PONGs answer
on the incoming connection the PING came in on.

Joining (§3): MEET creates a HANDSHAKE entry with a random temporary ID; the
PONG that answers our MEET/PING renames it to the sender's real ID.  Gossip
about unknown nodes from known senders starts more handshakes, so a chain of
MEETs ends in a full mesh.  Failure detection (§4): an unanswered PING older
than the node timeout flags PFAIL; PFAIL plus reports from a majority makes
FAIL, broadcast to all; any PONG clears both.

Cost as the cluster grows (docs/cluster.md, "Large clusters"): every node
pings each other node at least every node-timeout/2, and each PING or PONG
carries a sample of the table, a tenth of it and at least 3 entries, as
Redis Cluster does (upstream Disque's rule too), so a node's gossip traffic
grows as N^2/timeout entries per second, not N^3.  The sample is drawn from
`table` (every node, kept as a list between additions and deletions)
without scanning the table, failing nodes first (`failing`, kept as their
flags change): their reports are what the FAIL quorum counts.

Zones (docs/zones.md): every PING, PONG and MEET carries the sender's
zone, so a node knows a peer's zone from its first answer on (it is not
kept in nodes.conf: a restarted node learns it again within a ping).
Nodes with no zone share the unnamed one; `zoned` tells whether any known
node has a zone at all, so a cluster without zones pays nothing for them.

Identity: `myself` is the one record of who this node is.  Everything else
(job IDs, replication targets, owner lists, the bus header) reads `my_id` or
`solo` when it needs them and keeps no copy, so `reset(hard=True)`, the only
place that changes the ID, is followed everywhere at once.

Features (spec/cluster.md §2.3): every PING, PONG and MEET carries the
FEATURE_* bits of the messages its sender reads beyond the first version's;
a node's `features` are those it said since our link to it came up (a link
that comes up may reach another process: a restarted, older one), and a
node that says one it did not have goes on `new_features`, where the core
finds it once the frames of a read are handled.

Whenever something that nodes.conf records changes, `dirty` is set and the
shell saves the file (`to_conf()`) before it sleeps.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from disque.cluster.messages import (
    FAIL,
    FEATURES,
    HANDSHAKE,
    LEAVING,
    MEET,
    MYSELF,
    NOADDR,
    PFAIL,
    Fail,
    GossipEntry,
    Header,
    Meet,
    Ping,
    Pong,
)

if TYPE_CHECKING:  # annotations only: the core draws from the injected rng
    import random

FORGET_BLACKLIST_MS = 60_000
CRON_MS = 100


@dataclass(slots=True, eq=False)
class Peer:
    id: str
    ip: str = ""
    port: int = 0
    flags: int = 0
    ping_sent: int = 0
    pong_received: int = 0
    ctime: int = 0
    fail_time: int = 0
    key: int = 0
    link: bool = False
    link_time: int = 0
    reports: dict[str, int] = field(default_factory=dict)  # reporter id -> when
    features: int = 0  # FEATURE_* bits its PING/PONG/MEET said since our link to it came up
    zone: str = ""  # where the node runs (docs/zones.md): its PING/PONG/MEET say it; "" is no zone
    clock_offset: int | None = None  # its clock minus this node's, as its last PING/PONG/MEET said (None: not said)
    entry: GossipEntry | None = None  # what gossip last said of it, said again while it holds


FLAG_NAMES = ((MYSELF, "myself"), (PFAIL, "fail?"), (FAIL, "fail"), (HANDSHAKE, "handshake"), (NOADDR, "noaddr"), (LEAVING, "leaving"))
FLAG_BITS = {name: bit for bit, name in FLAG_NAMES} | {"noflags": 0}
UNREACHABLE = HANDSHAKE | LEAVING | PFAIL | FAIL


def flags_text(flags: int) -> str:
    names = [name for bit, name in FLAG_NAMES if flags & bit]
    return ",".join(names) if names else "noflags"


def valid_address(ip: str, port: int) -> bool:
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        return False
    return 1 <= port <= 55535


def _entry(node: Peer) -> GossipEntry:
    """The gossip entry of `node`: the one made last time while its ID,
    address and flags are the same (building one costs more than checking)."""
    flags = node.flags & ~MYSELF
    entry = node.entry
    if entry is None or entry.flags != flags or entry.port != node.port or entry.ip != node.ip or entry.node_id != node.id:
        entry = node.entry = GossipEntry(node.id, node.ip, node.port, flags)
    return entry


class Wire(Protocol):
    """What membership needs from the core to talk on the bus."""

    def send_key(self, key: int, msg: Any) -> None: ...

    def answer(self, conn: int, msg: Any) -> None: ...

    def drop_link(self, key: int) -> None: ...


def _mutates(method: Callable[..., Any]) -> Callable[..., Any]:
    """Entry points that may change the table drop the cached size and
    reachable set before and after they run."""

    @functools.wraps(method)
    def wrapper(self: Membership, *args: Any, **kwargs: Any) -> Any:
        self.touch()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.touch()

    return wrapper


class ConfError(Exception):
    """nodes.conf is corrupted (the node refuses to start)."""


class Membership:
    def __init__(self, myself_id: str, port: int, *, rng: random.Random, wire: Wire | None = None) -> None:
        self.rng = rng
        self.wire: Wire = wire  # type: ignore[assignment]  # NodeCore sets itself
        self.now = 0
        self.timeout = 15_000
        self.nodes: dict[str, Peer] = {}
        self.by_key: dict[int, Peer] = {}
        self._next_key = 0
        self.myself = self._add(Peer(myself_id, port=port, flags=MYSELF, link=True))
        self.solo: tuple[str, ...] = (myself_id,)  # nodes_delivered of a job only this node holds, shared by all of them
        self.blacklist: dict[str, int] = {}
        self.dirty = False  # nodes.conf must be saved
        self._ticks = 0
        self._size: int | None = None
        self._reachable: list[Peer] | None = None
        self.new_features: list[Peer] = []  # peers that said they have features, taken by the core
        self._zoned: bool | None = None  # some known node has a zone; None: to count again
        self._table: list[Peer] | None = None  # every node, myself included; None after an addition or deletion
        self._links: dict[int, tuple[str, int]] | None = None  # bus_links(); None after an addition, deletion or move
        self.failing: dict[int, Peer] = {}  # by key: the nodes flagged PFAIL or FAIL

    # ------------------------------------------------------------ queries

    @property
    def my_id(self) -> str:
        return self.myself.id

    @property
    def leaving(self) -> bool:
        return bool(self.myself.flags & LEAVING)

    def size(self) -> int:
        if self._size is None:
            self._size = sum(1 for n in self.nodes.values() if not n.flags & HANDSHAKE)
        return self._size

    def reachable(self) -> list[Peer]:
        if self._reachable is None:
            self._reachable = [n for n in self.nodes.values() if not n.flags & (UNREACHABLE | MYSELF)]
        return self._reachable

    def up_ids(self) -> list[str]:
        """The nodes this one sees up, itself first: those not flagged,
        linked or not (a link is made again after a PING answered late, well
        before the peer would be flagged).  Schedules take turns among them
        and homes are chosen from them (core/homes.py)."""
        return [self.my_id] + [n.id for n in self.reachable() if not n.flags & NOADDR]

    def touch(self) -> None:
        """Forget the cached size and reachable set: called by every entry
        point that may change the table (ADDJOB asks on every call)."""
        self._size = self._reachable = self._zoned = None

    @property
    def zoned(self) -> bool:
        """Whether any known node, this one included, has a zone."""
        if self._zoned is None:
            self._zoned = any(n.zone for n in self.nodes.values())
        return self._zoned

    def set_zone(self, zone: str) -> None:
        """This node's zone (the `zone` directive), sent in every PING/PONG/MEET."""
        if zone != self.myself.zone:
            self.myself.zone = zone
            self.touch()

    def zone_of(self, node_id: str) -> str | None:
        node = self.nodes.get(node_id)
        return None if node is None else node.zone

    def reachable_zones(self, include_me: bool) -> set[str]:
        """The zones of the reachable nodes (and of this one if `include_me`)."""
        zones = {n.zone for n in self.reachable()}
        if include_me:
            zones.add(self.myself.zone)
        return zones

    def near(self, node_ids: list[str]) -> list[str]:
        """Those of `node_ids` in this node's zone (none when it has no zone)."""
        zone, nodes = self.myself.zone, self.nodes
        if not zone:
            return []
        return [i for i in node_ids if (n := nodes.get(i)) is not None and n.zone == zone]

    def has_link(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.link and not node.flags & MYSELF

    def linked_ids(self, include_handshake: bool = False, features: int = 0) -> list[str]:
        """The nodes with a link; with `features`, only those that have them."""
        skip = MYSELF if include_handshake else MYSELF | HANDSHAKE
        return [n.id for n in self.nodes.values() if n.link and not n.flags & skip and n.features & features == features]

    def node_of_key(self, key: int) -> Peer | None:
        return self.by_key.get(key)

    def key_of(self, node_id: str) -> int | None:
        node = self.nodes.get(node_id)
        return None if node is None or not node.link else node.key

    def bus_links(self) -> dict[int, tuple[str, int]]:
        """Link key -> bus address of every node to keep a link to; the
        shell asks every 100 ms, so it is kept until a node is added,
        deleted or moves (callers must not change it)."""
        if self._links is None:
            self._links = {
                n.key: (n.ip, n.port + 10000)
                for n in self.nodes.values()
                if not n.flags & (MYSELF | NOADDR) and n.ip and n.port
            }
        return self._links

    # ------------------------------------------------------------ table edits

    def _add(self, node: Peer) -> Peer:
        self._next_key += 1
        node.key = self._next_key
        node.ctime = self.now
        self.nodes[node.id] = node
        self.by_key[node.key] = node
        self._table = self._links = None
        return node

    def _delete(self, node: Peer) -> None:
        self.nodes.pop(node.id, None)
        self.by_key.pop(node.key, None)
        self.failing.pop(node.key, None)
        self._table = self._links = None
        if node.link:
            self.wire.drop_link(node.key)
        for other in self.nodes.values():
            other.reports.pop(node.id, None)
        self.dirty = True

    def _random_id(self) -> str:
        return "%040x" % self.rng.getrandbits(160)

    @_mutates
    def meet(self, ip: str, port: int, flags: int = HANDSHAKE | MEET) -> None:
        """Start a handshake with ip:port (CLUSTER MEET, or gossip)."""
        ip = str(ipaddress.ip_address(ip))
        for n in self.nodes.values():
            if n.flags & HANDSHAKE and n.ip == ip and n.port == port:
                return
        self._add(Peer(self._random_id(), ip=ip, port=port, flags=flags))

    @_mutates
    def forget(self, node_id: str) -> Peer:
        node = self.nodes[node_id]
        self._delete(node)
        self.blacklist[node_id] = self.now + FORGET_BLACKLIST_MS
        return node

    @_mutates
    def reset(self, hard: bool) -> None:
        """CLUSTER RESET: forget every other node and the FORGET blacklist.
        HARD also makes this node a new one, as on a first start: a new ID,
        no learned IP, not leaving."""
        for node in [n for n in self.nodes.values() if n is not self.myself]:
            self._delete(node)
        self.blacklist.clear()
        if hard:
            me = self.myself
            del self.nodes[me.id]
            me.id = self._random_id()
            me.ip, me.flags = "", MYSELF
            self.nodes[me.id] = me
            self.solo = (me.id,)
        self.dirty = True

    @_mutates
    def set_leaving(self, leaving: bool) -> None:
        me = self.myself
        me.flags = me.flags | LEAVING if leaving else me.flags & ~LEAVING
        self.dirty = True

    # ------------------------------------------------------------ links

    @_mutates
    def link_connected(self, key: int) -> None:
        node = self.by_key.get(key)
        if node is None:
            self.wire.drop_link(key)
            return
        node.link = True
        node.link_time = self.now
        node.features = 0  # the other end may be another process now: its PONG tells
        if node.flags & MEET:
            node.flags &= ~MEET
            self._ping(node, Meet)
        else:
            self._ping(node, Ping)

    @_mutates
    def link_closed(self, key: int, connect_failed: bool) -> None:
        node = self.by_key.get(key)
        if node is None:
            return
        node.link = False
        if connect_failed and not node.ping_sent:
            node.ping_sent = self.now  # failure detection progresses without a link

    def _ping(self, node: Peer, kind: type[Ping | Meet]) -> None:
        if not node.ping_sent:
            node.ping_sent = self.now
        self.wire.send_key(node.key, kind(self.gossip(), FEATURES, self.myself.zone, self.now))

    @property
    def table(self) -> list[Peer]:
        if self._table is None:
            self._table = list(self.nodes.values())
        return self._table

    def gossip(self) -> tuple[GossipEntry, ...]:
        """A tenth of the table, at least 3 entries (upstream's rule): up to
        that many failing nodes first, then nodes drawn at random, at most
        3 draws per entry wanted (a draw of myself, a node in handshake or
        without an address or a link is lost, as upstream's).  Failing nodes
        are gossiped even without a link (we usually have none to them):
        their failure reports are what the FAIL quorum counts."""
        table = self.table
        wanted = min(max(3, len(table) // 10), len(table) - 2)
        if wanted <= 0:
            return ()
        chosen: dict[str, Peer] = {}
        failing = [n for n in self.failing.values() if not n.flags & NOADDR]
        for node in failing if len(failing) <= wanted else self.rng.sample(failing, wanted):
            chosen[node.id] = node
        choice = self.rng.choice
        for _ in range(3 * wanted):
            if len(chosen) >= wanted:
                break
            node = choice(table)
            if node.link and not node.flags & (MYSELF | HANDSHAKE | NOADDR):
                chosen[node.id] = node
        return tuple([_entry(n) for n in chosen.values()])

    # ------------------------------------------------------------ messages

    def receive(self, header: Header, msg: Any, key: int | None, conn: int | None, peer_ip: str, local_ip: str) -> bool:
        """Handle a membership message.  Returns whether the sender is known
        (job messages from unknown senders are ignored by the caller)."""
        sender = self.nodes.get(header.sender)
        if sender is not None and sender.flags & HANDSHAKE:
            sender = None  # a temporary ID is never a real sender
        kind = type(msg)
        if kind is Ping or kind is Meet or kind is Pong or kind is Fail:  # a job message leaves the table as it is
            self._receive(header, msg, sender, key, conn, peer_ip, local_ip)
        return sender is not None

    @_mutates
    def _receive(self, header: Header, msg: Any, sender: Peer | None, key: int | None, conn: int | None, peer_ip: str, local_ip: str) -> None:
        kind = type(msg)
        if kind is Ping or kind is Meet:
            self._receive_ping(header, msg, sender, conn, peer_ip, local_ip)
        elif kind is Pong:
            self._receive_pong(header, msg, key)
        else:
            node = self.nodes.get(msg.node)
            if sender is not None and node is not None and not node.flags & (FAIL | MYSELF):
                self._mark_fail(node, broadcast=False)

    def _receive_ping(self, header: Header, msg: Any, sender: Peer | None, conn: int | None, peer_ip: str, local_ip: str) -> None:
        is_meet = type(msg) is Meet
        if local_ip and (is_meet or not self.myself.ip) and self.myself.ip != local_ip:
            self.myself.ip = local_ip
            self.dirty = True
        if is_meet and sender is None and peer_ip:
            self.meet(peer_ip, header.port, flags=HANDSHAKE)
        if conn is not None:
            self.wire.answer(conn, Pong(self.gossip(), FEATURES, self.myself.zone, self.now))
        if sender is None:
            if is_meet:
                self._gossip_in(msg.gossip, None)
            return
        if type(msg) is Ping and peer_ip and (sender.ip, sender.port) != (peer_ip, header.port):
            if sender.link:
                self.wire.drop_link(sender.key)
                sender.link = False
            sender.ip, sender.port = peer_ip, header.port
            sender.flags &= ~NOADDR
            self._links = None
            self.dirty = True
        self._copy_leaving(sender, header)
        self._learn_features(sender, msg.features)
        sender.zone = msg.zone
        self._learn_clock(sender, msg.clock)
        self._gossip_in(msg.gossip, sender)

    def _receive_pong(self, header: Header, msg: Pong, key: int | None) -> None:
        node = self.by_key.get(key) if key is not None else None
        if node is None:
            return
        if node.flags & HANDSHAKE:
            real = self.nodes.get(header.sender)
            if real is not None and real is not node:
                if (real.ip, real.port) != (node.ip, node.port):
                    real.ip, real.port = node.ip, node.port
                    self._links = None
                    if real.link:
                        self.wire.drop_link(real.key)
                        real.link = False
                self._delete(node)
                return
            del self.nodes[node.id]
            node.id = header.sender
            node.flags &= ~HANDSHAKE
            self.nodes[node.id] = node
            self.dirty = True
        elif node.id != header.sender:
            node.flags |= NOADDR
            node.ip, node.port = "", 0
            self._links = None
            self.wire.drop_link(node.key)
            node.link = False
            self.dirty = True
            return
        node.pong_received = self.now
        node.ping_sent = 0
        if node.flags & (PFAIL | FAIL):
            node.flags &= ~(PFAIL | FAIL)
            del self.failing[node.key]
            self.dirty = True
        self._copy_leaving(node, header)
        self._learn_features(node, msg.features)
        node.zone = msg.zone
        self._learn_clock(node, msg.clock)
        self._gossip_in(msg.gossip, node)

    def _copy_leaving(self, node: Peer, header: Header) -> None:
        if (node.flags ^ header.flags) & LEAVING:
            node.flags ^= LEAVING
            self.dirty = True

    def _learn_clock(self, node: Peer, clock: int) -> None:
        """How far the node's clock is from this one's (the message's time
        in flight is within it): the schedules' ticks follow the clock the
        nodes agree on (core/schedules.py)."""
        node.clock_offset = clock - self.now if clock else None

    def agreed_offset(self, mine: int = 0) -> int:
        """How far the clock the nodes agree on is from this node's: the
        lower median of the offsets of this node (`mine`) and of the peers
        it sees up, so that one node ahead or behind, or a node alone with
        a peer, counts for no more than the others."""
        offsets = sorted([mine, *(n.clock_offset for n in self.reachable() if n.clock_offset is not None)])
        return offsets[(len(offsets) - 1) // 2]

    def _learn_features(self, node: Peer, features: int) -> None:
        """What the node understands (rolling upgrades, spec/cluster.md
        §2.3): the core is told of a feature it did not have, and sends
        what it kept from a node that could not read it."""
        if features & ~node.features:
            self.new_features.append(node)
        node.features = features

    def _gossip_in(self, entries: tuple[GossipEntry, ...], sender: Peer | None) -> None:
        for entry in entries:
            if entry.node_id == self.my_id:
                continue
            node = self.nodes.get(entry.node_id)
            if node is not None:
                if sender is not None:
                    if entry.flags & (PFAIL | FAIL):
                        node.reports[sender.id] = self.now
                        self._check_fail(node)
                    else:
                        node.reports.pop(sender.id, None)
                if node.flags & (PFAIL | FAIL) and (entry.ip, entry.port) != (node.ip, node.port) and entry.ip:
                    self.meet(entry.ip, entry.port, flags=HANDSHAKE)
            elif (
                sender is not None
                and not entry.flags & NOADDR
                and entry.ip
                and self.blacklist.get(entry.node_id, 0) <= self.now
            ):
                self.meet(entry.ip, entry.port, flags=HANDSHAKE)

    # ------------------------------------------------------------ failure detection

    def _valid_reports(self, node: Peer) -> int:
        horizon = self.now - 2 * self.timeout
        for reporter in [r for r, t in node.reports.items() if t < horizon]:
            del node.reports[reporter]
        return len(node.reports)

    def _check_fail(self, node: Peer) -> None:
        if node.flags & PFAIL and 1 + self._valid_reports(node) >= self.size() // 2 + 1:
            self._mark_fail(node, broadcast=True)

    def _mark_fail(self, node: Peer, broadcast: bool) -> None:
        node.flags = (node.flags | FAIL) & ~PFAIL
        node.fail_time = self.now
        self.failing[node.key] = node
        self.dirty = True
        if broadcast:
            for other in self.nodes.values():
                if other.link and not other.flags & (MYSELF | HANDSHAKE):
                    self.wire.send_key(other.key, Fail(node.id))

    @_mutates
    def cron(self) -> None:
        """The 100 ms cluster cron (spec/cluster.md §4): expire handshakes,
        ping, drop stale links, flag PFAIL (FAIL once a majority agrees):
        failures show only as unanswered PINGs, so this keeps the reachable
        set, and with it replication, true."""
        now, timeout = self.now, self.timeout
        self._ticks += 1
        for node in self.table:  # a deletion makes a new table: this one stays as it is
            if node.flags & HANDSHAKE and now - node.ctime > max(timeout, 1000):
                self._delete(node)
        if self._ticks % 10 == 0:
            table = self.table
            sample = [self.rng.choice(table) for _ in range(5)]
            sample = [n for n in sample if n.link and not n.ping_sent and not n.flags & (MYSELF | HANDSHAKE)]
            if sample:
                oldest = min(sample, key=lambda n: n.pong_received)
                self._ping(oldest, Ping)
        for node in self.table:
            if node.flags & (MYSELF | HANDSHAKE):
                continue
            if node.link and not node.ping_sent and now - node.pong_received > timeout / 2:
                self._ping(node, Ping)
            if (
                node.link
                and now - node.link_time > timeout
                and node.ping_sent
                and now - node.ping_sent > timeout / 2
                and node.pong_received <= node.ping_sent  # equal after a restart (both "now")
            ):
                self.wire.drop_link(node.key)
                node.link = False
            if node.ping_sent and now - node.ping_sent > timeout and not node.flags & (PFAIL | FAIL):
                node.flags |= PFAIL
                self.failing[node.key] = node
                self._check_fail(node)
        for node_id in [i for i, t in self.blacklist.items() if t <= now]:
            del self.blacklist[node_id]

    # ------------------------------------------------------------ nodes.conf

    def to_conf(self) -> str:
        lines = []
        for n in self.nodes.values():
            if n.flags & HANDSHAKE:
                continue
            link = "connected" if n.link or n.flags & MYSELF else "disconnected"
            lines.append(f"{n.id} {n.ip}:{n.port} {flags_text(n.flags)} {n.ping_sent} {n.pong_received} {link}\n")
        return "".join(lines)

    @classmethod
    def from_conf(cls, text: str, port: int, *, rng: random.Random, now: int) -> Membership:
        """Parse nodes.conf (spec/config.md §5.3); raises ConfError."""
        entries = []
        for line in text.splitlines():
            parts = line.split()
            if not parts or parts[0] == "vars":
                continue
            if len(parts) != 6 or len(parts[0]) != 40 or ":" not in parts[1]:
                raise ConfError("Unrecoverable error: corrupted cluster config file.")
            ip, _, port_text = parts[1].rpartition(":")
            flags = 0
            for word in parts[2].split(","):
                if word not in FLAG_BITS:
                    raise ConfError(f"Unknown flag in cluster config file: {word}")
                flags |= FLAG_BITS[word]
            try:
                entry_port = int(port_text)
            except ValueError:
                raise ConfError("Unrecoverable error: corrupted cluster config file.") from None
            entries.append((parts[0], ip, entry_port, flags, parts[3] != "0", parts[4] != "0"))
        mine = [e for e in entries if e[3] & MYSELF]
        if len(mine) != 1:
            raise ConfError("Unrecoverable error: corrupted cluster config file.")
        my_id, my_ip, _, my_flags, _, _ = mine[0]
        members = cls(my_id, port, rng=rng)
        members.now = now
        members.myself.ip = my_ip
        members.myself.flags = my_flags
        for node_id, ip, entry_port, flags, pinged, ponged in entries:
            if flags & MYSELF:
                continue
            node = members._add(Peer(node_id, ip=ip, port=entry_port, flags=flags & ~HANDSHAKE))
            node.ping_sent = now if pinged else 0
            node.pong_received = now if ponged else 0
            if flags & FAIL:
                node.fail_time = now
            if flags & (PFAIL | FAIL):
                members.failing[node.key] = node
        return members
