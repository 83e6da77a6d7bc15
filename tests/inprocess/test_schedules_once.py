"""One job per tick on a healthy but slow cluster (core/schedules.py): a
link being made again, or a node whose process stalled for less than the
grace, must not let two nodes fire the same tick.  And a copy of an
acknowledged job that federation hands back is not queued again (it would
deliver a tick, or any job, a second time on the node that acknowledged it)."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.schedules import _turn
from disque.store.records import job_to_wire
from mesh import Mesh
from support import Session, make_core
from test_schedules import all_tick_jobs, firers, mesh  # noqa: F401 - `mesh`: the fixture of three nodes


def next_tick(mesh: Mesh) -> int:
    return (mesh.clock.ms // 1000 + 1) * 1000


def in_line(mesh: Mesh, t: int) -> list[int]:
    """The nodes in the order they take their turn at tick t of schedule s."""
    return sorted(range(3), key=lambda i: _turn(b"s", t, mesh.my_id(i)))


def once_each(mesh: Mesh) -> bool:
    held = all_tick_jobs(mesh)
    return firers(mesh) == len(held) > 0 and all(len(h) == 1 for h in held.values())


def test_a_peer_whose_link_is_being_made_again_keeps_its_turn(mesh):
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1)
    t = next_tick(mesh)
    first, second, _ = in_line(mesh, t)
    peer = mesh.core(second).membership.nodes[mesh.my_id(first)]
    mesh.advance(t - 50 - mesh.clock.ms)
    peer.link = False  # the second's link to the first is down (a PING answered late), the first not flagged
    mesh.advance(1000)
    peer.link = True
    mesh.advance(3000)
    assert once_each(mesh)
    assert mesh.core(second).schedules.runs[b"s"].fired[t] == mesh.my_id(first)


@pytest.mark.parametrize("ms", [700, 1500])
def test_a_node_that_stalled_through_its_turn_fires_nothing_another_fired(mesh, ms):
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1)
    t = next_tick(mesh)
    first = in_line(mesh, t)[0]
    mesh.advance(t - 50 - mesh.clock.ms)
    mesh.stall(first, ms)  # its peers drop their links to it (and flag it failing after the node timeout)
    mesh.advance(5000)
    assert once_each(mesh)
    assert dict(mesh.core(first).schedules.info_fields())["schedule_ticks_collapsed"] == 0


def test_a_node_that_stalled_through_its_turn_lets_the_next_ones_pass_first():
    """Not flagged (a long node timeout), it wakes a grace/2 before the next
    in line's turn: firing then would race it, so it waits for that turn to
    pass, and half a grace more, and fires only if it heard nothing."""
    mesh = Mesh(3, node_timeout=15_000)
    mesh.meet(0, 1)
    mesh.meet(0, 2)
    mesh.advance(3500)
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 60_000, "REPLICATE", 1)
    t = (mesh.clock.ms // 60_000 + 1) * 60_000
    first, second, third = in_line(mesh, t)
    mesh.advance(t - 50 - mesh.clock.ms)
    mesh.kill(second)  # the next in line is gone, and not flagged yet
    mesh.stall(first, 1050)
    mesh.advance(2900)
    assert all_tick_jobs(mesh) == {}  # not at its wake + grace/2 (the second's turn, t + grace)
    mesh.advance(200)
    assert list(all_tick_jobs(mesh).values()) == [[first]]  # at the second's turn + grace/2: nobody else fired it
    mesh.advance(2000)
    assert list(all_tick_jobs(mesh).values()) == [[first]] and firers(mesh) == 1  # the third heard


def test_nodes_that_stall_together_fire_each_tick_once(mesh):
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1)
    mesh.advance(next_tick(mesh) - 50 - mesh.clock.ms)
    for i in range(3):
        mesh.stall(i, 1500 + 10 * i)  # the whole machine starved: each wakes to stale links
    mesh.advance(6000)
    assert once_each(mesh) and len(all_tick_jobs(mesh)) == 6  # none missing either


def test_a_stall_delays_a_lone_nodes_ticks_and_loses_none():
    core, clock, _ = make_core()
    s = Session(core)
    s("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)

    def run(ms: int) -> None:
        for _ in range(ms // 100):
            clock.advance(100)
            core.tick()

    run(3000)
    before = core.schedules.fired
    clock.advance(1500)  # a stall: the ticks it passed fire once it has listened a while
    core.tick()
    assert core.schedules.fired == before
    run(1000)
    assert core.schedules.fired == before + 2


def test_a_copy_of_an_acknowledged_job_handed_back_is_not_queued_again():
    mesh = Mesh(2)
    mesh.meet(0, 1)
    mesh.advance(2000)
    job_id = mesh.call(0, "ADDJOB", "q", "x", 0, "REPLICATE", 1)
    wire = job_to_wire(mesh.core(0).jobs.get(job_id), mesh.clock.ms)
    assert mesh.call(0, "FASTACK", job_id) == 1
    mesh.core(1).out.send(mesh.my_id(0), m.YourJobs((wire,), True))  # a stale copy node 1 still had queued
    mesh.flush()
    assert mesh.core(0).jobs.get(job_id) is None and mesh.call(0, "QLEN", "q") == 0
    assert job_id in mesh.core(1).collected  # told to drop its copy
