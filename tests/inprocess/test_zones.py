"""Zone-aware replication (docs/zones.md): the `zone` each node gossips,
placement over zones, ADDJOB ZONES and `min-zones`, and federation's
preference for the consumer's zone.

Whole-cluster flows run on the fake-clock mesh (tests/inprocess/mesh.py); the
federation's choices drive one core whose peers are linked fakes, reading
what it sends from its effects.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from disque.cluster import messages as m
from disque.cluster.codec import LinkCodec, decode_body, encode_body
from disque.cluster.membership import Membership
from disque.core.effects import Send
from disque.core.errors import DisqueError
from disque.core.federation import CLIENTS_WAITING, NEAR_FIRST_MS
from disque.core.types import BLOCKED, Status
from disque.protocols.resp.admin import hello, node_line
from invariants import check_core
from mesh import Mesh
from disque.store.records import job_to_wire
from support import NODE_ID, Session, linked_core

T = 1000  # node timeout (ms)
ZONES = ("a", "a", "b", "b", "c", "c")


def zoned(zones: tuple[str, ...] = ZONES) -> Mesh:
    """A formed cluster, node i in zones[i] ("" for none), every node knowing every zone."""
    mesh = Mesh(len(zones), node_timeout=T)
    for i in range(1, len(zones)):
        mesh.meet(i, 0)
    for i, zone in enumerate(zones):
        assert mesh.call(i, "CONFIG", "SET", "zone", zone) == b"OK"
    mesh.wait_for(
        lambda: all(
            len(c.membership.reachable()) == len(zones) - 1
            and [c.membership.nodes[mesh.my_id(j)].zone for j in range(len(zones))] == list(zones)
            for c in mesh.cores
            if c is not None
        ),
        20_000,
    )
    return mesh


def add(mesh: Mesh, i: int, *args: Any) -> Any:
    """ADDJOB on node i: its reply once the bus carried the copies."""
    reply = mesh.call(i, "ADDJOB", *args)
    if isinstance(reply, int):
        reply = mesh.reply(reply)
    return reply


def refused(reply: Any, text: str) -> bool:
    return isinstance(reply, DisqueError) and text in str(reply)


def zones_of(mesh: Mesh, job_id: bytes) -> list[str]:
    """The zone of each node holding a copy of the job."""
    return sorted(ZONES[i] for i, c in enumerate(mesh.cores) if c is not None and job_id in c.jobs)


def test_nodes_learn_each_others_zones_and_show_them():
    mesh = zoned()
    core = mesh.core(0)
    assert core.membership.myself.zone == "a" and core.membership.zoned
    assert node_line(core, core.membership.myself).endswith(" connected zone=a\n")
    entries = hello(core)[2:]
    assert sorted(e[4] for e in entries) == sorted(ZONES)
    assert b"cluster_reachable_zones:3\r\n" in mesh.call(0, "CLUSTER", "INFO")
    assert b"zone:a\r\n" in mesh.call(0, "INFO", "server")
    assert mesh.call(0, "CONFIG", "GET", "zone") == [("zone", "a")]


def test_a_cluster_without_zones_shows_none():
    mesh = zoned(("", "", ""))
    core = mesh.core(0)
    assert not core.membership.zoned
    assert node_line(core, core.membership.myself).endswith(" connected\n")
    assert all(len(e) == 4 for e in hello(core)[2:])
    assert b"zones" not in mesh.call(0, "CLUSTER", "INFO")


@pytest.mark.parametrize("repl, spread", [(2, 2), (3, 3), (4, 3), (6, 3)])
def test_copies_spread_over_as_many_zones_as_there_are(repl: int, spread: int):
    mesh = zoned()
    for n in range(20):
        job_id = add(mesh, n % 6, "q", "body", 0, "REPLICATE", repl)
        assert isinstance(job_id, Status), job_id
        held = zones_of(mesh, bytes(job_id))
        assert len(held) == repl and len(set(held)) == spread, held
        assert max(held.count(z) for z in set(held)) - min(held.count(z) for z in set(held)) <= 1  # round the zones
    for core in mesh.cores:
        check_core(core)


def test_zones_that_cannot_be_reached_refuse_the_job():
    mesh = zoned()
    mesh.kill(4)
    mesh.kill(5)
    mesh.wait_for(lambda: len(mesh.core(0).membership.reachable()) == 3, 10_000)  # zone c flagged failing
    assert mesh.core(0).membership.reachable_zones(include_me=True) == {"a", "b"}
    assert refused(add(mesh, 0, "q", "body", 0, "REPLICATE", 3, "ZONES", 3), "NOREPL Not enough reachable zones")
    job_id = add(mesh, 0, "q", "body", 0, "REPLICATE", 3, "ZONES", 2)
    assert len(set(zones_of(mesh, bytes(job_id)))) == 2
    assert mesh.call(0, "CONFIG", "SET", "min-zones", 3) == b"OK"
    assert refused(add(mesh, 0, "q", "body", 0, "REPLICATE", 3), "NOREPL Not enough reachable zones")
    assert isinstance(add(mesh, 0, "q", "body", 0, "REPLICATE", 2), Status)  # min-zones: at most REPLICATE
    assert refused(add(mesh, 0, "q", "body", 0, "REPLICATE", 3, "ASYNC"), "NOREPL Not enough reachable zones")  # ASYNC checks as well


def test_zones_greater_than_the_replication_level_is_an_error():
    mesh = zoned()
    assert refused(add(mesh, 0, "q", "body", 0, "REPLICATE", 2, "ZONES", 3), "ZONES can't be greater")
    assert refused(add(mesh, 0, "q", "body", 0, "ZONES", 0), "ZONES must be between")


def test_the_producer_waits_until_its_copies_span_the_zones():
    """Zone c's nodes are gone but not flagged failing yet: enough nodes
    confirm, in two zones only, so a job needing three times out."""
    mesh = zoned()
    mesh.kill(4)
    mesh.kill(5)
    assert add(mesh, 0, "q", "body", 0, "REPLICATE", 3, "ZONES", 2) is not None
    client = mesh.call(0, "ADDJOB", "q", "body", 300, "REPLICATE", 3, "ZONES", 3)
    mesh.advance(200)
    assert mesh.reply(client) is None  # three copies confirmed by now, in two zones
    held = [i for i in range(4) if mesh.core(i).jobs]
    assert len(held) == 4
    mesh.advance(200)
    assert isinstance(mesh.reply(client), DisqueError) and "NOREPL Timeout" in str(mesh.reply(client))


def test_a_holder_forgotten_while_the_job_waits_counts_in_no_zone():
    mesh = zoned(("a", "a", "a", "b", "b", "b", "c", "c"))
    mesh.kill(6)
    mesh.kill(7)  # zone c: gone, not flagged failing yet
    client = mesh.call(0, "ADDJOB", "q", "body", 500, "REPLICATE", 3, "ZONES", 3)
    job = next(iter(mesh.core(0).jobs.values()))
    forgotten = next(n for n in job.nodes_delivered if n != mesh.my_id(0))
    assert mesh.call(0, "CLUSTER", "FORGET", forgotten) == b"OK"
    mesh.advance(200)  # the retries place copies with a holder this node no longer knows
    assert mesh.reply(client) is None and len(job.nodes_delivered) > 3
    mesh.advance(500)
    assert refused(mesh.reply(client), "NOREPL Timeout")


def test_a_lost_copy_is_sent_again_and_the_job_spans_every_zone():
    mesh = zoned()
    mesh.lose_next(4, m.ReplJob)
    mesh.lose_next(5, m.ReplJob)
    for _ in range(4):  # some pick a zone-c target whose copy is lost: the retry sends it again
        client = mesh.call(0, "ADDJOB", "q", "body", 0, "REPLICATE", 3, "ZONES", 3)
        mesh.advance(300)
        job_id = mesh.reply(client)
        assert isinstance(job_id, Status)
        assert set(zones_of(mesh, bytes(job_id))) == {"a", "b", "c"}
    assert not mesh.losses


def test_a_leaving_node_places_every_copy_elsewhere_over_the_zones():
    mesh = zoned()
    assert mesh.call(0, "CLUSTER", "LEAVING", "yes") == b"OK"
    mesh.advance(200)
    job_id = add(mesh, 0, "q", "body", 0, "REPLICATE", 3, "ZONES", 3)
    assert isinstance(job_id, Status)
    assert job_id not in mesh.core(0).jobs
    holders = [i for i in range(1, 6) if bytes(job_id) in mesh.core(i).jobs]
    assert len({ZONES[i] for i in holders}) == 3
    queued = [i for i in holders if mesh.core(i).jobs.get(bytes(job_id)).state.name == "QUEUED"]
    assert queued == [1]  # the one holder in the producer's zone queues it


# ---------------------------------------------------------------- the wire


def test_zone_travels_in_pings_and_is_optional():
    header = m.Header("ab" * 20, 7711, 0)
    assert decode_body(encode_body(header, m.Ping((), 0, "eu-1")))[1] == m.Ping((), 0, "eu-1")
    assert "z" not in msgpack.unpackb(encode_body(header, m.Pong(())))  # no zone: the frame of a node without zones
    codec = LinkCodec()
    old = msgpack.packb([0, header.sender, header.port, header.flags, 1, 0, []])  # a positional PING with no zone
    assert codec.decode(old) == (header, m.Ping(()))


@pytest.mark.parametrize("zone", ["has space", "x" * 65, 5])
def test_a_bad_zone_in_a_frame_is_refused(zone: Any):
    body = msgpack.packb({"v": 1, "t": "PING", "s": "ab" * 20, "p": 7711, "f": 0, "m": 0, "g": [], "z": zone})
    with pytest.raises(Exception, match="zone|expected str"):
        decode_body(body)


def test_config_refuses_a_bad_zone():
    mesh = Mesh(1)
    assert refused(mesh.call(0, "CONFIG", "SET", "zone", "two words"), "Invalid argument")
    assert mesh.call(0, "CONFIG", "SET", "zone", "") == b"OK"


def test_zones_are_not_kept_in_nodes_conf():
    mesh = zoned(("a", "b"))
    conf = mesh.core(0).membership.to_conf()
    restored = Membership.from_conf(conf, 7711, rng=mesh.core(0).rng, now=0)
    assert all(n.zone == "" for n in restored.nodes.values())  # learnt again from the first PONG


# ---------------------------------------------------------------- federation


PEER = "b0" * 20  # zone a, as this node
PEER2 = "c1" * 20  # zone b
PORTS = {PEER: 7712, PEER2: 7713}


class Node:
    """A core in zone a whose peers are linked fakes: PEER in zone a, PEER2 in b."""

    def __init__(self) -> None:
        lines = [f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n"]
        lines += [f"{p} 127.0.0.1:{port} noflags 0 0 disconnected\n" for p, port in PORTS.items()]
        self.core, self.clock, _ = linked_core("".join(lines), PORTS, zone="a")
        for peer, zone in ((PEER, "a"), (PEER2, "b")):
            self.core.handle_bus(m.Header(peer, PORTS[peer], 0), m.Ping((), zone=zone))
        self.core.out.effects.clear()

    def sent(self, kind: type) -> list[str]:
        out = [self.core.membership.by_key[e.key].id for e in self.core.out.effects if isinstance(e, Send) and isinstance(e.msg, kind)]
        self.core.out.effects.clear()
        return out


def test_a_node_asks_its_own_zone_first():
    node = Node()
    core, fed = node.core, node.core.federation
    queue = core.lifecycle.queue(b"q")
    fed.need_jobs(queue, CLIENTS_WAITING)
    assert node.sent(m.NeedJobs) == [PEER]
    fed.need_jobs(queue, CLIENTS_WAITING)
    assert node.sent(m.NeedJobs) == []  # the other zones a little later
    node.clock.ms += NEAR_FIRST_MS
    core.read_clock()
    fed.need_jobs(queue, CLIENTS_WAITING)
    assert node.sent(m.NeedJobs) == [PEER2]
    fed.need_jobs(queue, CLIENTS_WAITING)
    assert node.sent(m.NeedJobs) == []  # the broadcast's backoff
    # Responders of this zone are asked without the others.
    wire = [_wire(core, i) for i in range(2)]
    core.handle_bus(m.Header(PEER2, 7713, 0), m.YourJobs((wire[0],)))
    core.handle_bus(m.Header(PEER, 7712, 0), m.YourJobs((wire[1],)))
    node.sent(m.NeedJobs)
    queue = core.queues.get(b"q")
    fed.need_jobs(queue, 1)  # REACHED_ZERO: the responders at once
    assert node.sent(m.NeedJobs) == [PEER]


def _wire(core: Any, n: int) -> Any:
    """A job of queue q in its bus form, as a peer would send it."""
    reply = Session(core)("ADDJOB", "tmp", f"b{n}", 0, "REPLICATE", 1)
    job = core.jobs.get(bytes(reply))
    wire = job_to_wire(job, core.now)
    core.lifecycle.delete_job(job)
    return {**wire, "queue": b"q", "id": bytes(reply)}


def test_jobs_go_to_waiting_consumers_of_this_zone_first():
    node = Node()
    core = node.core
    for peer in (PEER2, PEER):  # the other zone announced first
        core.handle_bus(m.Header(peer, PORTS[peer], 0), m.Waiting((m.WaitEntry(b"q", 1),)))
    assert Session(core)("ADDJOB", "q", "b", 0, "REPLICATE", 1) is not BLOCKED
    assert node.sent(m.YourJobs) == [PEER]
    Session(core)("ADDJOB", "q", "b", 0, "REPLICATE", 1)
    assert node.sent(m.YourJobs) == [PEER2]
    check_core(core)
