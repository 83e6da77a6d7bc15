"""REPLICATE <n> MINREPL <m> (docs/replication.md): a producer settles for
m synchronous copies only when a target is out of good standing (no link,
or flagged PFAIL/FAIL) and no other node is left to ask; the other copies
are made in the background.  A default ADDJOB settles for a majority of
min(3, cluster size); an explicit REPLICATE alone keeps Disque's meaning
(waiting for a node that comes back: test_mesh_cluster.py)."""

from __future__ import annotations

from typing import Any

from disque.cluster import messages as m
from disque.cluster.codec import MAX_FRAME, frame_limit
from disque.core.lifecycle import default_minrepl, replication_level
from disque.core.errors import DisqueError
from disque.core.replication import BACKGROUND_MS, resend_ms
from disque.core.types import Status
from disque.store.job import Job

import pytest

from mesh import Mesh

T = 1000  # node timeout


def formed(n: int = 3) -> Mesh:
    mesh = Mesh(n, node_timeout=T)
    for i in range(1, n):
        mesh.meet(i, 0)
    mesh.wait_for(lambda: all(len(c.membership.reachable()) == n - 1 for c in mesh.cores if c), 5000)
    return mesh


def holders(mesh: Mesh, job_id: bytes) -> list[int]:
    return [i for i, c in enumerate(mesh.cores) if c is not None and job_id in c.jobs]


def show(mesh: Mesh, i: int, job_id: bytes) -> dict[bytes, Any]:
    return dict(mesh.call(i, "SHOW", job_id))


def flagged(mesh: Mesh, observer: int, dead: str) -> bool:
    return bool(mesh.core(observer).membership.nodes[dead].flags & (m.PFAIL | m.FAIL))


def test_the_levels_and_their_defaults():
    assert [default_minrepl(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert replication_level(None, None, 5) == (3, 2)  # the default: a majority of min(3, size)
    assert replication_level(None, None, 1) == (1, 1)
    assert replication_level(3, None, 5) == (3, 3)  # Disque's exact meaning
    assert replication_level(None, 1, 5) == (3, 1)
    assert replication_level(4, 2, 5) == (4, 2)
    with pytest.raises(DisqueError, match="MINREPL can't be greater than the replication level"):
        replication_level(2, 3, 5)


def test_a_healthy_cluster_still_gets_every_copy_before_the_answer():
    mesh = formed()
    job_id = mesh.reply(mesh.call(0, "ADDJOB", "q", "b", 0))
    assert holders(mesh, job_id) == [0, 1, 2]
    assert b"min-repl" not in show(mesh, 0, job_id)  # nothing left to make


def test_a_dead_node_lets_a_default_addjob_settle_for_two_copies_then_gets_its_own():
    """Killed, not flagged yet: its link is down, so it is out of good
    standing at once; the job it missed reaches it when it is back."""
    mesh = formed()
    dead = mesh.my_id(2)
    mesh.kill(2)
    assert not flagged(mesh, 0, dead)
    job_id = mesh.reply(mesh.call(0, "ADDJOB", "q", "b", 0))
    assert holders(mesh, job_id) == [0, 1]
    assert show(mesh, 0, job_id)[b"min-repl"] == 2
    assert mesh.core(0).replication.settled_count == 1
    mesh.restart(2)
    mesh.wait_for(lambda: holders(mesh, job_id) == [0, 1, 2], 5 * BACKGROUND_MS)
    mesh.advance(2 * BACKGROUND_MS)
    assert not mesh.core(0).replication.background and b"min-repl" not in show(mesh, 0, job_id)
    assert sorted(show(mesh, 2, job_id)[b"nodes-delivered"]) == sorted(mesh.my_id(i) for i in range(3))


def test_a_stalled_target_is_waited_for_until_it_is_flagged():
    """A hung node keeps its link: it is in good standing until PFAIL, so
    the producer waits that long (under 2 node timeouts), then settles."""
    mesh = formed()
    mesh.stall(2, 10 * T)
    client = mesh.call(0, "ADDJOB", "q", "b", 0)
    mesh.advance(T // 2)
    assert mesh.reply(client) is None
    took = mesh.wait_for(lambda: mesh.reply(client) is not None, 2 * T)
    assert T // 2 + took < 2 * T
    job_id = mesh.reply(client)
    assert holders(mesh, job_id) == [0, 1]  # its copy waits in its socket
    mesh.advance(10 * T)
    assert holders(mesh, job_id) == [0, 1, 2] and not mesh.core(0).replication.background  # it answered once awake


def test_a_flagged_target_is_replaced_at_once_by_another_node():
    """Five nodes, REPLICATE 3 MINREPL 2: a target that stops answering and
    is flagged is replaced by an unasked node in good standing before the
    job settles, so it still gets its three copies."""
    mesh = formed(5)
    for i in (3, 4):
        mesh.stall(i, 10 * T)
    client = mesh.call(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "MINREPL", 2)
    mesh.wait_for(lambda: mesh.reply(client) is not None, 3 * T)
    job_id = mesh.reply(client)
    confirmed = [i for i in (1, 2) if job_id in mesh.core(i).jobs]
    assert confirmed == [1, 2]  # every live node holds it: at least three copies before the answer


def test_minrepl_is_the_floor_below_it_norepl():
    mesh = formed()
    for i in (1, 2):
        mesh.kill(i)
    client = mesh.call(0, "ADDJOB", "q", "b", 500)  # not flagged yet: both still count, as in Disque
    mesh.advance(600)
    assert str(mesh.reply(client)).startswith("NOREPL Timeout reached")
    mesh.wait_for(lambda: not mesh.core(0).membership.reachable(), 5 * T)
    assert str(mesh.call(0, "ADDJOB", "q", "b", 0)).startswith("NOREPL Not enough reachable nodes")
    client = mesh.call(0, "ADDJOB", "q", "b", 0, "MINREPL", 1)
    mesh.advance(200)  # the next replication step finds nobody to ask
    assert isinstance(mesh.reply(client), Status)
    assert str(mesh.call(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "MINREPL", 2)).startswith("NOREPL Not enough")


def test_minrepl_options_are_checked():
    mesh = formed()
    assert str(mesh.call(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "MINREPL", 3)) == (
        "ERR MINREPL can't be greater than the replication level"
    )
    assert str(mesh.call(0, "ADDJOB", "q", "b", 0, "MINREPL", 0)) == "ERR MINREPL must be between 1 and 65535"
    assert str(mesh.call(0, "SCHEDULE", "ADD", "s", "q", "b", "EVERY", 1000, "MINREPL", 2)).startswith(
        "ERR MINREPL does not apply to SCHEDULE"
    )


def test_an_async_job_short_of_targets_gets_them_in_the_background():
    mesh = formed()
    mesh.kill(2)
    assert isinstance(mesh.call(0, "ADDJOB", "q", "b", 0, "ASYNC"), Status)
    (job_id,) = [j.id for j in mesh.core(0).jobs.values()]
    assert holders(mesh, job_id) == [0, 1] and show(mesh, 0, job_id)[b"min-repl"] == 2
    mesh.restart(2)
    mesh.wait_for(lambda: not mesh.core(0).replication.background, 5 * BACKGROUND_MS)
    assert holders(mesh, job_id) == [0, 1, 2]


def test_the_background_ends_with_the_job():
    mesh = formed()
    mesh.kill(2)
    acked = mesh.reply(mesh.call(0, "ADDJOB", "q", "b", 0))
    deleted = mesh.reply(mesh.call(0, "ADDJOB", "q", "b", 0))
    assert set(mesh.core(0).replication.background) == {acked, deleted}
    assert mesh.call(0, "ACKJOB", acked) == 1 and mesh.call(0, "DELJOB", deleted) == 1
    mesh.advance(2 * BACKGROUND_MS)
    assert not mesh.core(0).replication.background
    mesh.core(0).replication.got(mesh.my_id(1), deleted)  # a late GOTJOB changes nothing


def test_a_leaving_node_settles_and_hands_the_job_over():
    """External replication (this node leaving): the settled job is queued
    by a replica and forgotten here, nothing left in the background."""
    mesh = formed(4)
    mesh.kill(3)
    assert mesh.call(0, "CLUSTER", "LEAVING", "yes") == b"OK"
    job_id = mesh.reply(mesh.call(0, "ADDJOB", "q", "b", 0))
    assert holders(mesh, job_id) == [1, 2] and not mesh.core(0).replication.background


def test_a_big_copy_is_sent_again_on_the_same_link_only_once_it_had_time_to_arrive():
    """A lost REPLJOB is sent again; for a big job not on every 50 ms step
    but once the time its copy takes at 10 MB/s passed."""
    mesh = formed(2)
    body = b"x" * (4 << 20)
    wait = resend_ms(Job(b"", b"q", body))
    assert wait > 400
    mesh.lose_next(1, m.ReplJob)
    client = mesh.call(0, "ADDJOB", "q", body, 0)
    mesh.advance(wait - 100)
    assert mesh.reply(client) is None
    mesh.advance(200)
    assert isinstance(mesh.reply(client), Status)


def test_a_new_link_gets_the_copy_at_once():
    """A target whose link came up again (it may have restarted) is sent the
    copy at once, however big."""
    mesh = formed()
    mesh.kill(2)
    client = mesh.call(0, "ADDJOB", "q", b"x" * (4 << 20), 60_000, "REPLICATE", 3)
    mesh.advance(100)
    mesh.restart(2)
    mesh.wait_for(lambda: mesh.reply(client) is not None, 300)


def test_a_target_that_dies_is_replaced_at_once_when_the_minimum_is_reached():
    """Four nodes, REPLICATE 3 MINREPL 2: one target dies before it answers;
    the other's GOTJOB brings the minimum, and the unasked node is asked
    then, before the next 50 ms step, so the job still gets three copies."""
    mesh = formed(4)
    for i in (1, 2, 3):
        mesh.stall(i, 30)
    client = mesh.call(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "MINREPL", 2)
    (job,) = mesh.core(0).jobs.values()
    a, b = (mesh.core(0).membership.nodes[n] for n in job.nodes_delivered[1:])
    index = {mesh.my_id(i): i for i in (1, 2, 3)}
    mesh.kill(index[a.id])
    mesh.wait_for(lambda: mesh.reply(client) is not None, 40)
    assert sorted(holders(mesh, job.id)) == sorted([0, *(i for n, i in index.items() if n != a.id)])


def test_the_minimum_must_span_the_zones_asked():
    """ZONES 2 MINREPL 2 with the only other zone down: two copies in one
    zone are not enough, the producer waits until its timeout."""
    mesh = Mesh(3, node_timeout=T)
    for i in (1, 2):
        mesh.meet(i, 0)
    for i, zone in enumerate(("a", "a", "b")):
        assert mesh.call(i, "CONFIG", "SET", "zone", zone) == b"OK"
    mesh.wait_for(lambda: all(len(c.membership.reachable()) == 2 and c.membership.zoned for c in mesh.cores if c), 5000)
    mesh.stall(2, 10 * T)
    client = mesh.call(0, "ADDJOB", "q", "b", 3 * T, "REPLICATE", 3, "MINREPL", 2, "ZONES", 2)
    mesh.advance(3 * T + 100)
    assert str(mesh.reply(client)).startswith("NOREPL Timeout reached")


# ---------------------------------------------------------------- max-job-size


def test_max_job_size_refuses_a_bigger_job_on_every_command_that_adds_one():
    mesh = formed(1)
    assert dict(mesh.call(0, "CONFIG", "GET", "max-job-size")) == {"max-job-size": "67108864"}
    assert mesh.call(0, "CONFIG", "SET", "max-job-size", "10") == b"OK"
    too_big = "ERR Job body of 11 bytes is larger than max-job-size (10 bytes)"
    for command in (
        ("ADDJOB", "q", "x" * 11, 0),
        ("QADD", "q", 60, "x" * 11),
        ("SCHEDULE", "ADD", "s", "q", "x" * 11, "EVERY", 1000),
    ):
        assert str(mesh.call(0, *command)) == too_big
    assert isinstance(mesh.call(0, "ADDJOB", "q", "x" * 10, 0), Status)
    assert str(mesh.call(0, "CONFIG", "SET", "max-job-size", "0")).startswith("ERR")


def test_the_bus_frame_limit_follows_max_job_size():
    assert frame_limit(10) == frame_limit(64 << 20) == MAX_FRAME  # never below the default's
    assert frame_limit(200 << 20) == (201 << 20)


def test_a_schedule_tick_with_a_node_down_gets_its_level_in_the_background():
    mesh = formed()
    mesh.kill(2)
    assert mesh.call(0, "SCHEDULE", "ADD", "s", "q", "b", "EVERY", 1000) == b"OK"
    mesh.wait_for(lambda: any(len(mesh.core(i).jobs) for i in (0, 1)), 5000)
    (job_id,) = [j.id for i in (0, 1) for j in mesh.core(i).jobs.values()][:1]
    origin = next(i for i in (0, 1) if job_id in mesh.core(i).replication.background)
    assert show(mesh, origin, job_id)[b"repl"] == 3 and show(mesh, origin, job_id)[b"min-repl"] == 1
    assert mesh.call(0, "SCHEDULE", "DEL", "s") == 1
    mesh.restart(2)
    mesh.wait_for(lambda: holders(mesh, job_id) == [0, 1, 2], 5 * BACKGROUND_MS)
