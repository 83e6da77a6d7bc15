"""Long commands run in slices (Blocking.in_slices): DEADLETTER REQUEUE,
DELJOB and the other commands of many IDs, JSCAN with a large COUNT take
SLICE jobs per step, other clients run in between, and the client gets the
whole reply at the end; a client gone meanwhile stops its command."""

from __future__ import annotations

from disque.core.lifecycle import SLICE
from disque.core.types import BLOCKED
from invariants import check_core
from support import Session, make_core


def test_a_long_requeue_runs_in_slices_and_other_clients_run_between():
    core, clock, _ = make_core()
    s, other = Session(core), Session(core)
    n = 2 * SLICE + 7
    for i in range(n):
        core.lifecycle.move_job(core.jobs.get(bytes(s("ADDJOB", "q", f"b{i}", 0, "RETRY", 30))), b"q-dead", 0, 0, 1, b"q", b"q", ())
    assert s("DEADLETTER", "REQUEUE", "q-dead") is BLOCKED  # the first slice done, the rest to come
    assert s.core.next_deadline() == core.lifecycle.now and s("QLEN", "q") == SLICE  # (s runs nothing meanwhile ...)
    assert other("PING") == b"PONG" and other("QLEN", "q-dead") == n - SLICE  # ... but the other client does
    core.tick()
    assert s.pending() == [] and other("QLEN", "q") == 2 * SLICE
    core.tick()
    assert s.pending() == [n] and other("QLEN", "q") == n and other("QLEN", "q-dead") == 0
    assert not core.blocking.sliced and core.next_deadline() > core.lifecycle.now
    check_core(core)


def test_a_client_gone_mid_requeue_stops_it():
    core, _, _ = make_core()
    s, other = Session(core), Session(core)
    for i in range(2 * SLICE):
        core.lifecycle.move_job(core.jobs.get(bytes(s("ADDJOB", "q", f"b{i}", 0, "RETRY", 30))), b"q-dead", 0, 0, 1, b"q", b"q", ())
    assert s("DEADLETTER", "REQUEUE", "q-dead") is BLOCKED
    core.disconnect(s.client.id)
    core.tick()
    assert not core.blocking.sliced and other("QLEN", "q-dead") == SLICE  # the rest stays, for another call


def test_a_mass_deljob_and_a_large_jscan_run_in_slices():
    core, _, _ = make_core()
    s, other = Session(core), Session(core)
    ids = [bytes(s("ADDJOB", "q", f"b{i}", 0, "RETRY", 30)) for i in range(2 * SLICE + 3)]
    assert s("JSCAN", 0, "COUNT", 10_000) is BLOCKED and other("PING") == b"PONG"
    core.tick()
    core.tick()
    [[cursor, listed]] = s.pending()
    assert cursor == b"0" and sorted(listed) == sorted(ids)
    assert s("DELJOB", *ids) is BLOCKED and other("QLEN", "q") == len(ids) - SLICE
    core.tick()
    assert s.pending() == [] and other("QLEN", "q") == 3
    core.tick()
    assert s.pending() == [len(ids)] and other("QLEN", "q") == 0
    assert s("DELJOB", *ids[:2]) == 0  # a few IDs: answered at once
    check_core(core)
