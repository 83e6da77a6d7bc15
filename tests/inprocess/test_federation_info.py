"""INFO federation and the figures behind the metrics (core/federation.py
`info_fields`, docs/cluster.md): what moved between the nodes of a
fake-clock mesh, one of them speaking as an older version."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.figures import node_figures
from mesh import Mesh

FIELDS = (
    "needjobs_sent needjobs_received jobs_exported jobs_imported jobs_pushed_out jobs_pushed_in waiting_sent "
    "waiting_received waiting_queues waiting_peer_queues peers_without_waiting"
).split()


def info(mesh: Mesh, i: int) -> dict[str, int]:
    text = mesh.call(i, "INFO", "federation")
    title, *lines = text.decode().strip().split("\r\n")
    assert title == "# Federation"
    return {key: int(value) for key, value in (line.split(":") for line in lines)}


@pytest.fixture
def mesh() -> Mesh:
    """Three nodes; node 2 reads no WAITING."""
    mesh = Mesh(3)
    mesh.make_older(2, (m.Waiting,))
    for i in (1, 2):
        mesh.meet(i, 0)
    mesh.wait_for(lambda: all(len(c.membership.reachable()) == 2 for c in mesh.cores if c is not None), 5000)
    return mesh


def test_a_fresh_node_counts_nothing_but_its_older_peer(mesh):
    assert list(info(mesh, 0)) == FIELDS
    assert info(mesh, 0) == dict.fromkeys(FIELDS, 0) | {"peers_without_waiting": 1}


def test_a_push_is_counted_on_both_sides(mesh):
    waiting = [mesh.call(0, "GETJOB", "TIMEOUT", 60_000, "FROM", "lq") for _ in range(2)]
    blocked, peer = info(mesh, 0), info(mesh, 1)
    assert blocked["waiting_queues"] == 1 and peer["waiting_peer_queues"] == 1
    # One entry a step while the count grows (1, then 2), to node 1 only;
    # the first GETJOB asked both peers as well (NEEDJOBS, nothing queued there).
    assert (blocked["waiting_sent"], peer["waiting_received"]) == (2, 2)
    assert (blocked["needjobs_sent"], peer["needjobs_received"]) == (2, 1)
    for body in ("a", "b"):
        mesh.call(1, "ADDJOB", "lq", body, 0, "REPLICATE", 1)
    assert all(mesh.reply(c) is not None for c in waiting)
    consumer, producer = info(mesh, 0), info(mesh, 1)
    assert (producer["jobs_exported"], producer["jobs_pushed_out"]) == (2, 2)
    assert (consumer["jobs_imported"], consumer["jobs_pushed_in"]) == (2, 2)
    assert consumer["waiting_queues"] == 0  # served: it said 0 ...
    assert consumer["waiting_sent"] == 3 and producer["waiting_peer_queues"] == 0  # ... and node 1 forgot it
    assert info(mesh, 2)["waiting_received"] == 0 and mesh.refused == []


def test_an_answer_to_needjobs_is_exported_but_not_pushed(mesh):
    mesh.call(2, "ADDJOB", "lq", "a", 0, "REPLICATE", 1)
    waiting = mesh.call(0, "GETJOB", "TIMEOUT", 60_000, "FROM", "lq")
    assert mesh.reply(waiting) is not None  # the broadcast NEEDJOBS found it
    older, consumer = info(mesh, 2), info(mesh, 0)
    assert (older["jobs_exported"], older["jobs_pushed_out"]) == (1, 0)
    assert (consumer["jobs_imported"], consumer["jobs_pushed_in"]) == (1, 0)


def test_the_metrics_read_the_same_fields(mesh):
    mesh.call(0, "GETJOB", "TIMEOUT", 60_000, "FROM", "lq")
    assert node_figures(mesh.core(0))["federation"] == info(mesh, 0)
