"""Rolling upgrades (spec/cluster.md §2.3): a node says in its PING, PONG
and MEET which messages it reads beyond the first version's (`features`),
and WAITING goes only to the peers that said they read it, so a node of an
older version, which drops the link on a message type it does not know,
never gets one.

Three halves: the codec (an older node's PING reads as no features, in
either form, and an older node reads ours); the fake-clock mesh with one
node that speaks as an older version (tests/inprocess/mesh.py `make_older`);
and one core whose peers are fakes, fed the PONGs and PINGs they would send.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from disque.cluster import codec
from disque.cluster import messages as m
from disque.cluster.codec import LinkCodec, decode_body, encode_body
from disque.core.effects import Send
from disque.core.federation import WAIT_REFRESH_MS
from disque.core.types import BLOCKED, Status
from invariants import advance
from mesh import Mesh
from support import NODE_ID, Session, linked_core

HEADER = m.Header("a" * 40, 7711, 0)
JOB_ID = b"DI" + b"a" * 8 + b"0" * 32 + b"0005SQ"
OLDER_PING = codec._Kind(1, "PING", m.Ping, (codec._GOSSIP,))  # the row as the first version had it


# ---------------------------------------------------------------- the codec


def test_an_older_nodes_ping_says_no_features_in_either_form():
    body = {"v": 1, "t": "PING", "s": HEADER.sender, "p": HEADER.port, "f": 0, "m": 0, "g": []}
    assert decode_body(msgpack.packb(body)) == (HEADER, m.Ping((), 0))
    positional = [0, HEADER.sender, HEADER.port, HEADER.flags, 1, 0, []]  # [header, code, mflags, gossip]
    assert LinkCodec().decode(msgpack.packb(positional)) == (HEADER, m.Ping((), 0))


def test_an_older_node_reads_our_ping_in_either_form():
    ours = m.Ping((), m.FEATURES)
    as_map = msgpack.unpackb(encode_body(HEADER, ours))
    assert as_map["ft"] == m.FEATURES and OLDER_PING.load.check(as_map) == {"gossip": (), "mflags": 0}
    sender = LinkCodec()
    sender.positional = True
    as_array = msgpack.unpackb(sender.encode(HEADER, ours))
    assert as_array[4:] == [1, 0, [], m.FEATURES, "", 0]  # the zone and the clock after it (none)
    assert OLDER_PING.load_pos.check(as_array[4:]) == {"gossip": (), "mflags": 0}  # the extra item is ignored


@pytest.mark.parametrize(
    "msg",
    [m.Ping((), 5), m.Queued(JOB_ID, True, False, 7), m.DelJob(JOB_ID, False), m.Claimed(3, True, False, JOB_ID)],
    ids=lambda msg: type(msg).__name__,
)
def test_a_positional_body_without_the_optional_fields_that_end_its_row_takes_their_defaults(msg: Any):
    """As a map without their keys does: a row's new fields go at its end,
    with a default, so the body of a node that predates them reads."""
    kind = codec._BY_CLASS[type(msg)]
    full = kind.pack_pos.pack(msg, (kind.code, kind.mflags_of(msg)))
    optional = [f for f in kind.fields if f.default is not None]
    for cut in range(1, len(optional) + 1):
        expected = dict(kind.load_pos.check(full), **{f.name: f.default for f in optional[-cut:]})
        assert kind.load_pos.check(full[:-cut]) == expected
    with pytest.raises(codec.DecodeError, match="missing field"):
        kind.load_pos.check(full[: -len(optional) - 1])  # a required one is still required


# ---------------------------------------------------------------- the mesh: one node of an older version


def formed(older: tuple[int, ...] = (2,)) -> Mesh:
    mesh = Mesh(3)
    for i in older:
        mesh.make_older(i, (m.Waiting, m.SchedSet, m.Ticked))
    for i in (1, 2):
        mesh.meet(i, 0)
    mesh.wait_for(lambda: all(len(c.membership.reachable()) == 2 for c in mesh.cores if c is not None), 5000)
    return mesh


def add(mesh: Mesh, i: int, *args: Any) -> bytes:
    reply = mesh.call(i, "ADDJOB", *args)
    reply = mesh.reply(reply) if isinstance(reply, int) else reply
    assert isinstance(reply, Status), reply
    return bytes(reply)


def peer(mesh: Mesh, i: int, j: int) -> Any:
    """Node j in node i's table."""
    return mesh.core(i).membership.nodes[mesh.my_id(j)]


def test_an_older_node_gets_no_waiting_and_keeps_its_links():
    mesh = formed()
    links = {(i, j): peer(mesh, i, j).link_time for i in range(3) for j in range(3) if i != j}
    assert peer(mesh, 0, 1).features == m.FEATURES and peer(mesh, 0, 2).features == 0
    waiting = mesh.call(0, "GETJOB", "TIMEOUT", 60_000, "FROM", "lq")
    mesh.advance(3 * WAIT_REFRESH_MS)  # the announcement, and its refreshes
    assert mesh.refused == [] and list(mesh.core(1).federation.wanted) == [b"lq"]
    assert {pair: peer(mesh, *pair).link_time for pair in links} == links  # no link went down
    assert all(peer(mesh, *pair).link for pair in links)
    # A job added on the newer node comes at once; one added on the older
    # node when the broadcast NEEDJOBS was answered already, by the next one.
    start = mesh.clock.ms
    job_id = add(mesh, 1, "lq", "a", 0, "REPLICATE", 1)
    assert mesh.reply(waiting) == [[b"lq", job_id, b"a"]] and mesh.clock.ms == start
    waiting = mesh.call(0, "GETJOB", "TIMEOUT", 60_000, "FROM", "lq")
    job_id = add(mesh, 2, "lq", "b", 0, "REPLICATE", 1)
    assert mesh.wait_for(lambda: mesh.reply(waiting) is not None, 40_000) > 0
    assert mesh.reply(waiting) == [[b"lq", job_id, b"b"]] and mesh.refused == []


def test_an_older_node_gets_no_schedules_and_keeps_its_links():
    mesh = formed()
    links = {(i, j): peer(mesh, i, j).link_time for i in range(3) for j in range(3) if i != j}
    assert mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1) == b"OK"
    mesh.advance(4000)  # the record, and ticks fired and told
    assert mesh.core(1).schedules.names() == [b"s"] and mesh.core(1).schedules.runs[b"s"].last > 0
    assert mesh.refused == [] and mesh.core(2).schedules.names() == []
    assert {pair: peer(mesh, *pair).link_time for pair in links} == links


def test_without_the_check_the_older_node_would_drop_the_link():
    """What the check spares (and what the simulation of an older node does)."""
    mesh = formed()
    mesh.core(0).out.send(mesh.my_id(2), m.Waiting((m.WaitEntry(b"lq", 1),)))
    mesh.flush()
    assert mesh.refused == [(2, m.Waiting)] and not peer(mesh, 0, 2).link
    mesh.advance(200)  # the link comes up again, and the older node still says no features
    assert peer(mesh, 0, 2).link and peer(mesh, 0, 2).features == 0


def test_a_node_upgraded_in_place_hears_of_the_waiting_consumers_as_it_comes_back():
    mesh = formed()
    mesh.call(0, "GETJOB", "TIMEOUT", 60_000, "FROM", "lq")
    mesh.kill(2)
    del mesh.older[2]
    mesh.restart(2)
    assert mesh.wait_for(lambda: b"lq" in mesh.core(2).federation.wanted, 2 * WAIT_REFRESH_MS) < WAIT_REFRESH_MS
    assert peer(mesh, 0, 2).features == m.FEATURES and mesh.refused == []


def test_a_node_downgraded_in_place_gets_no_more_waiting():
    mesh = formed(older=())
    mesh.call(0, "GETJOB", "TIMEOUT", 60_000, "FROM", "lq")
    assert b"lq" in mesh.core(2).federation.wanted
    mesh.kill(2)
    mesh.make_older(2, (m.Waiting,))
    mesh.restart(2)
    mesh.advance(3 * WAIT_REFRESH_MS)
    assert peer(mesh, 0, 2).link and peer(mesh, 0, 2).features == 0 and mesh.refused == []


# ---------------------------------------------------------------- one core, fake peers

NEW, OLD = "b0" * 20, "c1" * 20
PORTS = {NEW: 7712, OLD: 7713}


class Core:
    """A core linked to NEW, which says it reads WAITING, and OLD, which does not."""

    def __init__(self) -> None:
        lines = [f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n"]
        lines += [f"{p} 127.0.0.1:{port} noflags 0 0 disconnected\n" for p, port in PORTS.items()]
        self.core, self.clock, _ = linked_core("".join(lines), PORTS)
        self.pong(NEW, m.FEATURES)
        self.pong(OLD, 0)

    def key(self, peer: str) -> int:
        return self.core.membership.nodes[peer].key

    def pong(self, peer: str, features: int) -> None:
        self.core.handle_bus(m.Header(peer, PORTS[peer], 0), m.Pong((), features), key=self.key(peer))

    def ping(self, peer: str, features: int) -> None:
        """A PING on the peer's own link to us (our answer is its PONG)."""
        self.core.handle_bus(m.Header(peer, PORTS[peer], 0), m.Ping((), features), conn=9)

    def waiting_to(self) -> list[str]:
        """The peers sent a WAITING since the last call."""
        effects, self.core.out.effects = self.core.out.effects, []
        keys = {self.key(p): p for p in PORTS}
        return [keys[e.key] for e in effects if isinstance(e, Send) and isinstance(e.msg, m.Waiting)]


def test_waiting_goes_only_to_the_peers_that_said_they_read_it():
    node = Core()
    assert Session(node.core)("GETJOB", "FROM", "q") is BLOCKED
    assert node.waiting_to() == [NEW]
    advance(node.core, node.clock, WAIT_REFRESH_MS)
    assert node.waiting_to() == [NEW]
    node.ping(OLD, m.FEATURES)  # upgraded: it says so on its own link as well as in a PONG
    assert node.waiting_to() == [OLD]  # and gets the announcements at once
    node.ping(OLD, m.FEATURES)
    node.pong(NEW, m.FEATURES)
    assert node.waiting_to() == []  # said again: nothing new to send
    node.pong(NEW, 0)  # a PONG of a node that no longer reads it
    advance(node.core, node.clock, WAIT_REFRESH_MS)
    assert node.waiting_to() == [OLD]


def test_a_link_that_comes_up_waits_for_the_peer_to_say_what_it_reads():
    """It may reach another process than before (restarted, of another
    version): until its PONG, it is sent no WAITING, refreshes included."""
    node = Core()
    assert Session(node.core)("GETJOB", "FROM", "q") is BLOCKED
    assert node.waiting_to() == [NEW]
    node.core.link_closed(node.key(NEW), connect_failed=False)
    node.core.link_connected(node.key(NEW))
    advance(node.core, node.clock, WAIT_REFRESH_MS)
    assert node.waiting_to() == []
    node.pong(NEW, m.FEATURES)
    assert node.waiting_to() == [NEW]


def test_a_node_that_says_a_feature_without_a_link_gets_nothing_yet():
    node = Core()
    assert Session(node.core)("GETJOB", "FROM", "q") is BLOCKED
    assert node.waiting_to() == [NEW]
    node.core.link_closed(node.key(OLD), connect_failed=False)
    node.ping(OLD, m.FEATURES)  # its link to us is up, ours to it is not
    assert node.waiting_to() == []
    node.core.link_connected(node.key(OLD))
    node.pong(OLD, m.FEATURES)
    assert node.waiting_to() == [OLD]


@pytest.mark.parametrize("features", [m.FEATURE_WAITING, m.FEATURE_SCHEDULES])
def test_a_peer_that_reads_one_feature_gets_what_is_kept_of_that_one_only(features: int):
    node = Core()
    assert Session(node.core)("GETJOB", "FROM", "q") is BLOCKED
    assert Session(node.core)("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000) == b"OK"
    node.core.out.effects = []
    node.pong(OLD, features)  # an intermediate version: one of the two
    sent = {type(e.msg) for e in node.core.out.effects if isinstance(e, Send) and e.key == node.key(OLD)}
    assert sent == ({m.Waiting} if features == m.FEATURE_WAITING else {m.SchedSet})


def test_a_positional_body_that_is_not_an_array_is_refused():
    with pytest.raises(codec.DecodeError, match="expected an array, got dict"):
        codec._BY_CLASS[m.Ping].load_pos.check({"g": []})
