"""The figures snapshot the metrics endpoint and the dashboard render."""

from __future__ import annotations

from disque.cluster import messages as m
from disque.core.figures import node_figures
from invariants import advance
from support import NODE_ID, START_MS, FakeClock, Session, linked_core, make_core

PEER = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
CONF = f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n{PEER} 127.0.0.1:7712 noflags 0 0 connected\n"


def test_jobs_queues_and_counters_of_one_node():
    core, clock, _ = make_core()
    s = Session(core)
    a = bytes(s("ADDJOB", "q", "a", 0, "RETRY", 1))
    s("ADDJOB", "q", "b", 0)
    s("ADDJOB", "other", "c", 0)
    clock.advance(1500)
    assert s("GETJOB", "FROM", "q")[0][1] == a
    assert s("NACK", a) == 1  # back in q, counted as a nack
    assert s("GETJOB", "COUNT", 2, "FROM", "q")[0][1] == a
    advance(core, clock, 1500)  # a's retry timer queues it again
    s("ACKJOB", bytes(s("ADDJOB", "gone", "d", 0)))
    s("PAUSE", "other", "out")
    fig = node_figures(core)
    assert fig["node_id"] == NODE_ID and fig["clients"] == 1
    assert fig["jobs"] == {"wait-repl": 0, "active": 1, "queued": 2, "acked": 0}
    queues = {q["name"]: q for q in fig["queues"]}
    q = queues["q"]
    assert (q["len"], q["jobs_in"], q["jobs_out"], q["nacks"], q["redeliveries"]) == (1, 4, 3, 1, 1)
    assert q["oldest_age_ms"] == clock.ms - START_MS and q["blocked"] == 0 and q["pause"] == "none"
    assert queues["other"]["pause"] == "out" and queues["gone"]["len"] == 0 and queues["gone"]["oldest_age_ms"] == 0
    assert fig["commands"]["addjob"][:1] == [4] and sum(fig["commands"]["addjob"][2:]) == 4
    assert fig["aof"]["aof_enabled"] == 0 and fig["used_memory"] > 0
    assert fig["nodes"] == [{"id": NODE_ID, "addr": ":7711", "flags": "myself", "myself": True, "link": True, "zone": ""}]


class SlowClock(FakeClock):
    """Every command takes 5 µs."""

    def since_us(self) -> int:
        return 5


def test_latency_buckets_are_powers_of_two_microseconds():
    core, _, _ = make_core()
    core.gate.clock = SlowClock()  # the gate times the commands
    s = Session(core)
    s("PING")
    calls = node_figures(core)["commands"]["ping"]
    assert calls[:2] == [1, 5] and calls[2 + 3] == 1  # 4 <= 5 < 8: bucket 3


def test_cluster_figures_replication_and_federation():
    core, clock, _ = linked_core(CONF, (PEER,))
    s = Session(core)
    job_id = s("ADDJOB", "q", "x", 0, "REPLICATE", 2)  # waits for the peer
    fig = node_figures(core)
    assert fig["jobs"]["wait-repl"] == 1 and fig["blocked_clients"] == 1 and fig["replication"]["pending"] == 1
    peer = core.membership.nodes[PEER]
    core.handle_bus(m.Header(PEER, 7712, 0), m.GotJob(job_id_of(core)), key=peer.key)
    fig = node_figures(core)
    assert fig["replication"] == {"pending": 0, "achieved": 1, "aborted": 0}
    assert {n["id"]: n["link"] for n in fig["nodes"]} == {NODE_ID: True, PEER: True}
    assert job_id is not None
    waiting = Session(core)
    waiting("GETJOB", "TIMEOUT", 0, "FROM", "empty")
    advance(core, clock, 200)
    assert node_figures(core)["federation"]["needjobs_sent"] >= 1
    core.handle_bus(m.Header(PEER, 7712, 0), m.NeedJobs(b"q", 1), key=peer.key)
    assert node_figures(core)["federation"]["jobs_exported"] == 1


def job_id_of(core) -> bytes:
    [job] = core.jobs.values()
    return job.id


def test_queues_beyond_the_cap_are_summed_and_groups_are_capped():
    """With max_queues, the longest queues are listed (ties: the first in the
    table) and the rest summed; group_figures lists groups in name order up
    to its cap, and counts them all."""
    from disque.core.figures import group_figures

    core, _, _ = make_core()
    s = Session(core)
    for i, name in enumerate(["a", "b", "c", "d"]):
        for _ in range(i + 1):
            s("ADDJOB", name, "x", 0)
    s("GETJOB", "FROM", "a")
    every = node_figures(core)
    assert every["queues_total"] == 4 and every["other_queues"]["count"] == 0 and len(every["queues"]) == 4
    fig = node_figures(core, max_queues=2)
    assert sorted(q["name"] for q in fig["queues"]) == ["c", "d"] and fig["queues_total"] == 4
    assert fig["other_queues"] == {"count": 2, "len": 2, "jobs_in": 3, "jobs_out": 1, "blocked": 0}
    s("QADD", "q0", 60, "e")  # an event queue no group read yet
    for queue in ("q1", "q2"):
        for group in ("g1", "g2", "g3"):
            s("QADD", queue, 60, "e")
            s("QGET", queue, group)
    shown, total = group_figures(core, 4)
    assert total == 6 and [(q, [g for g, _ in groups]) for q, _, groups in shown] == [(b"q1", [b"g1", b"g2", b"g3"]), (b"q2", [b"g1"])]
    assert group_figures(core, 3)[0] == shown[:1] and group_figures(core, 0) == ([], 6)
