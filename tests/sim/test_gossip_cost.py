"""Gossip as the cluster grows (gossip_cost.py): a heartbeat carries a tenth
of the table (at least 3 entries), failing nodes first; a killed node is
flagged FAIL everywhere within 2 x node-timeout and a new node becomes known
everywhere.  The 100- and 500-node figures run in `make scale` (DISQUE_SCALE=1)."""

from __future__ import annotations

import os
import random

import pytest

from disque.cluster.membership import FAIL, HANDSHAKE, NOADDR, PFAIL, Membership, Peer
from disque.cluster.messages import GossipEntry, Ping
from gossip_cost import GossipSim, measure

scale = pytest.mark.skipif(not os.environ.get("DISQUE_SCALE"), reason="the 100- and 500-node runs: make scale")


class _Sent:
    def __init__(self) -> None:
        self.sent: list[tuple[int, object]] = []

    def send_key(self, key: int, msg: object) -> None:
        self.sent.append((key, msg))

    def answer(self, conn: int, msg: object) -> None:
        self.sent.append((conn, msg))

    def drop_link(self, key: int) -> None:
        pass


def table_of(n: int, seed: int = 1) -> Membership:
    """A node that knows n - 1 others, each with a link."""
    rng = random.Random(seed)
    conf = "".join(f"{'%040x' % rng.getrandbits(160)} 127.0.0.1:{7000 + i} {'myself' if i == 0 else 'noflags'} 0 0 connected\n" for i in range(n))
    members = Membership.from_conf(conf, 7000, rng=rng, now=0)
    members.wire = _Sent()
    for node in members.nodes.values():
        node.link = True
    return members


@pytest.mark.parametrize("n, wanted", [(4, 2), (10, 3), (30, 3), (50, 5), (200, 20)])
def test_a_heartbeat_carries_a_tenth_of_the_table_and_at_least_3(n: int, wanted: int) -> None:
    members = table_of(n)
    sizes = [len(members.gossip()) for _ in range(200)]
    assert max(sizes) == wanted
    assert sum(sizes) / len(sizes) >= 0.9 * wanted  # lost draws (myself, duplicates) are rare
    for entry in members.gossip():
        assert entry.node_id != members.my_id


def test_the_sample_skips_nodes_in_handshake_without_address_or_link() -> None:
    members = table_of(40)
    others = [n for n in members.table if n is not members.myself]
    keep = others[:6]
    for node in others[6:]:
        node.link = False
    keep[0].flags |= HANDSHAKE
    keep[1].flags |= NOADDR
    seen = {e.node_id for _ in range(200) for e in members.gossip()}
    assert seen == {n.id for n in keep[2:]}


def test_failing_nodes_come_first_even_without_a_link() -> None:
    members = table_of(100)
    others = [n for n in members.table if n is not members.myself]
    for node in others[:3]:
        node.flags |= PFAIL
        node.link = False
        members.failing[node.key] = node
    others[3].flags |= FAIL | NOADDR  # no address: never gossiped
    members.failing[others[3].key] = others[3]
    for _ in range(50):
        ids = [e.node_id for e in members.gossip()]
        assert ids[:3] == [n.id for n in others[:3]] and others[3].id not in ids and len(ids) >= 8


def test_more_failing_nodes_than_a_sample_holds_are_sampled() -> None:
    members = table_of(40)  # a sample of 4
    failing = [n for n in members.table if n is not members.myself][:10]
    for node in failing:
        node.flags |= PFAIL
        members.failing[node.key] = node
    samples = [{e.node_id for e in members.gossip()} for _ in range(100)]
    assert all(len(s) == 4 and s <= {n.id for n in failing} for s in samples)
    assert set().union(*samples) == {n.id for n in failing}


def test_the_failing_set_follows_the_flags() -> None:
    """PFAIL on a timed-out PING, FAIL with the quorum, cleared by a PONG,
    loaded from nodes.conf, dropped with the node."""
    members = table_of(3)
    a, b = [n for n in members.table if n is not members.myself]
    members.timeout = 1000
    members.now = 600
    members.cron()  # no PONG for over timeout/2: PINGs both
    assert {type(m) for _, m in members.wire.sent} == {Ping}
    members.now = 2000
    members.cron()  # no PONG for over the timeout: PFAIL (no FAIL: no report from the other)
    assert set(members.failing.values()) == {a, b} and a.flags & PFAIL and not a.flags & FAIL
    conf = members.to_conf()
    loaded = Membership.from_conf(conf, 7000, rng=random.Random(1), now=0)
    assert {n.id for n in loaded.failing.values()} == {a.id, b.id}
    members.forget(b.id)
    assert list(members.failing.values()) == [a]
    members.reset(hard=False)
    assert members.failing == {}


def test_a_node_with_no_other_sends_no_gossip() -> None:
    members = table_of(2)
    assert members.gossip() == ()
    assert isinstance(members.table[0], Peer)


def test_a_small_cluster_detects_a_death_and_learns_a_newcomer() -> None:
    """30 nodes, node-timeout 2 s: gossip stays a tenth of the table, a killed
    node is FAIL everywhere within 2 x node-timeout, a new node known within it."""
    f = measure(30, timeout=2_000, idle_ms=4_000)
    assert f.gossip_entries_per_frame == pytest.approx(3, abs=0.2)
    # every node PINGs each other about every timeout/2 (plus the cron's granularity) and answers theirs: about 2 x 29 / 1 s
    assert 50 <= f.frames_per_node_s <= 70
    assert 0 < f.fail_s <= 4.0
    assert 0 < f.known_s <= 4.0


def test_a_pong_for_a_connection_closed_meanwhile_is_lost() -> None:
    sim = GossipSim(3, timeout=2_000)
    sim.run_for(100)
    sent = sim.frames
    sim.answer(0, 1 << 32 | 999, Ping())  # no such connection
    assert sim.frames == sent


@scale
@pytest.mark.slow
def test_gossip_at_100_and_500_nodes() -> None:
    """Per-node traffic grows as N² (a tenth of the table per heartbeat, a
    heartbeat to each node per timeout/2), no faster; FAIL within 2 x timeout."""
    small, large = measure(100, idle_ms=10_000), measure(500, idle_ms=5_000)
    assert large.gossip_entries_per_frame == pytest.approx(50, abs=1)
    assert large.bytes_per_node_s / small.bytes_per_node_s <= 1.2 * (500 / 100) ** 2
    assert 0 < large.fail_s <= 30.0
    assert 0 < large.known_s <= 30.0


def test_a_node_is_gossiped_as_it_is_now() -> None:
    """The entry made for a node is sent again while its ID, address and
    flags hold, and made again when any of them changes."""
    members = table_of(3)
    node = next(n for n in members.table if n is not members.myself)

    def entry() -> GossipEntry:  # a draw may miss it: draw until it is in
        return next(e for _ in range(100) for e in members.gossip() if e.node_id == node.id)

    first = entry()
    assert entry() is first
    changes = [("flags", PFAIL), ("port", 7100), ("ip", "127.0.0.2"), ("id", "f" * 40)]
    for attr, value in changes:
        setattr(node, attr, value)
        now = entry()
        assert now is not first and (now.node_id, now.ip, now.port, now.flags) == (node.id, node.ip, node.port, node.flags)
        first = now
