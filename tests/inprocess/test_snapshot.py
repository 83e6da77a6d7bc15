"""core/snapshot.py: what an AOF rewrite holds, as one stream of records
(jobs in memory, jobs read-behind keeps on disk, consumer groups, schedules)."""

from __future__ import annotations

from itertools import count

from support import Session, make_core, replay


def test_a_snapshot_holds_jobs_in_memory_and_on_disk_then_the_state_records():
    core, _, _ = make_core(read_behind="force", read_behind_prefetch=2)
    s = Session(core)
    ids = {bytes(s("ADDJOB", "q", f"body{i}", 0)) for i in range(6)}
    assert s("SCHEDULE", "ADD", "tick", "other", "tock", "EVERY", 60_000) == b"OK"
    assert core.read_behind.counts() == (4, 0)  # two in memory, four on disk
    snapshot = core.snapshot()
    assert len(snapshot) == 6 and len(snapshot.spilled) == 4 and snapshot.queued() == 2
    records = list(snapshot.records())
    snapshot.release()
    assert snapshot.other and records[-len(snapshot.other) :] == snapshot.other  # the schedule, last
    copy, _, _ = make_core()
    replay(copy, b"".join(records))
    assert {job.id for job in copy.jobs.values() if job.queue == b"q"} == ids


def test_a_job_that_leaves_before_it_is_written_is_left_out():
    core, _, _ = make_core()
    s = Session(core)
    kept, gone = (bytes(s("ADDJOB", "q", body, 0)) for body in ("kept", "gone"))
    snapshot = core.snapshot()
    s("ACKJOB", gone)
    blob = b"".join(snapshot.records())
    assert kept in blob and gone not in blob
    assert len(snapshot.spilled) == 0  # no read-behind: nothing on disk
    snapshot.release()


def test_a_cancelled_snapshot_stops_reading():
    core, _, _ = make_core(read_behind="force", read_behind_prefetch=2)
    s = Session(core)
    for i in range(4):
        s("ADDJOB", "q", f"body{i}", 0)
    snapshot = core.snapshot()
    assert list(snapshot.records(stop=lambda: True)) == []
    asked = count()
    written = list(snapshot.records(stop=lambda: next(asked) > 0))  # stops before the jobs on disk
    assert len(written) == 2 and all(r.startswith(b"*3\r\n$7\r\nLOADJOB") for r in written)
    snapshot.release()


def test_without_read_behind_its_do_nothing_form_answers():
    core, _, _ = make_core(read_behind="no")
    assert core.read_behind.counts() == (0, 0) and core.read_behind.spilled == 0
    assert core.read_behind.info_fields() == [("read_behind", "no")]
