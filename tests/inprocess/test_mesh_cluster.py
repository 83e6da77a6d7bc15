"""Whole nodes talking on the fake-clock mesh (tests/inprocess/mesh.py): a cluster
re-formed after CLUSTER RESET, and synchronous replication waiting for a
node that dies and comes back."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.types import Status
from disque.store import records
from invariants import check_core
from mesh import Mesh

T = 1000  # node timeout (ms)


def formed(n: int = 3) -> Mesh:
    mesh = Mesh(n, node_timeout=T)
    for i in range(1, n):
        mesh.meet(i, 0)
    mesh.wait_for(lambda: meshed(mesh), 5000)
    return mesh


def meshed(mesh: Mesh) -> bool:
    live = [c for c in mesh.cores if c is not None]
    return all(len(c.membership.reachable()) == len(live) - 1 == len(c.membership.nodes) - 1 for c in live)


def holders(mesh: Mesh, job_id: bytes) -> dict[int, str]:
    return {
        i: job.state.name.lower()
        for i, core in enumerate(mesh.cores)
        if core is not None and (job := core.jobs.get(job_id)) is not None
    }


def added(reply: object) -> bytes:
    assert isinstance(reply, Status), reply
    return bytes(reply)


# ---------------------------------------------------------------- reset


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_replicated_jobs_stay_on_their_creator_after_a_reset_and_a_new_meet(mode):
    """Regression: after RESET HARD the core still gave new jobs the old ID
    as their only local owner, so the creator took itself for an external
    replicator: it answered the ID, handed the job to a replica and dropped
    its own copy."""
    mesh = formed()
    old = [mesh.my_id(i) for i in range(3)]
    for i in range(3):
        assert mesh.call(i, "CLUSTER", "RESET", mode) == b"OK"
    new = [mesh.my_id(i) for i in range(3)]
    assert all((n == o) == (mode == "soft") for n, o in zip(new, old))
    for i in (1, 2):
        mesh.meet(i, 0)
    mesh.wait_for(lambda: meshed(mesh), 5000)
    for origin, opts in ((0, ("REPLICATE", 3)), (1, ())):  # explicit and default replication
        client = mesh.call(origin, "ADDJOB", "q", "body", 5000, *opts)
        job_id = added(mesh.reply(client))
        assert job_id[2:10] == new[origin][:8].encode()
        assert holders(mesh, job_id) == {i: "queued" if i == origin else "active" for i in range(3)}
        for i in range(3):
            assert set(mesh.core(i).jobs.get(job_id).nodes_delivered) == set(new)
    for i in range(3):
        check_core(mesh.core(i))
        assert set(mesh.core(i).membership.nodes) == set(new)


# ---------------------------------------------------------------- replication


@pytest.mark.parametrize("lost", [False, True])
def test_synchronous_replication_waits_for_a_node_that_comes_back(lost):
    """Node 1 is killed just before (not lost) or just after (lost: its
    REPLJOB died with it) ADDJOB REPLICATE 3, and restarted 2 s later, after
    it was flagged failing: the producer gets its ID once node 1 is back."""
    mesh = formed()
    node1 = mesh.my_id(1)
    if lost:
        mesh.lose_next(1, m.ReplJob)
    else:
        mesh.kill(1)
    client = mesh.call(0, "ADDJOB", "q", "body", 30_000, "REPLICATE", 3)
    (job_id,) = mesh.core(0).replication.pending
    assert (node1 in mesh.core(0).jobs.get(job_id).nodes_delivered) == lost
    if lost:
        mesh.kill(1)
    mesh.advance(2000)
    assert mesh.reply(client) is None
    assert [n.id for n in mesh.core(0).membership.reachable()] == [mesh.my_id(2)]  # node 1 is flagged by now
    mesh.restart(1)
    mesh.wait_for(lambda: mesh.reply(client) is not None, 2 * T)
    assert mesh.reply(client) == Status(job_id)
    assert holders(mesh, job_id) == {0: "queued", 1: "active", 2: "active"}


def test_norepl_when_the_node_is_not_back_before_the_timeout():
    """NOREPL comes at the ADDJOB timeout, not before, and leaves no copy."""
    mesh = formed()
    mesh.kill(1)
    client = mesh.call(0, "ADDJOB", "q", "body", 5000, "REPLICATE", 3)
    mesh.advance(4900)
    assert mesh.reply(client) is None
    mesh.advance(200)
    reply = mesh.reply(client)
    assert (reply.code, reply.message) == ("NOREPL", "Timeout reached before replicating to the requested number of nodes")
    assert len(mesh.core(0).jobs) == len(mesh.core(2).jobs) == 0  # deleted, DELJOB to the replica


# ---------------------------------------------------------------- acknowledgements


def test_an_ack_reaches_a_copy_that_only_another_holder_knows_of():
    """Regression (found by the long schedule simulation): the node that
    acks a job and another holder each list three holders, but not the same
    three.  SETACK carried only the count, the other holder saw nothing
    more than the sender and confirmed, and the GC ended without the copy
    only it knew of, which RETRY then delivered again.  SETACK now carries
    the holders: the other holder sees one more and runs the GC itself."""
    mesh = formed(4)
    client = mesh.call(0, "ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 2)
    job_id = added(mesh.reply(client))
    a, b = sorted(i for i in holders(mesh, job_id) if i != 0)
    (x,) = {1, 2, 3} - {a, b}
    ids = [mesh.my_id(i) for i in range(4)]
    # Node a handed its copy on to x, and so did its view: {0, a, x}.
    wire = records.job_to_wire(mesh.core(a).jobs.get(job_id), mesh.clock.ms)
    mesh.core(x).handle_bus(m.Header(ids[a], 7711 + a, 0), m.ReplJob(wire, noreply=True))
    for i in (a, x):
        mesh.core(i).jobs.get(job_id).nodes_delivered = (ids[0], ids[a], ids[x])
    assert holders(mesh, job_id) == {0: "queued", a: "active", b: "active", x: "active"}
    assert mesh.call(0, "ACKJOB", job_id) == 1
    mesh.wait_for(lambda: not holders(mesh, job_id), 10_000)
    mesh.advance(10_000)  # two RETRY periods: nothing comes back
    assert holders(mesh, job_id) == {}
    for core in mesh.cores:
        assert core is not None and core.jobs.get(job_id) is None
        check_core(core)

