"""The job store's timer (store/jobs.py): millisecond buckets, rescheduling,
stale entries, and passes bounded in the number of jobs."""

from __future__ import annotations

from disque.store.job import Job
from disque.store.jobs import JobStore
from support import START_MS, Session, make_core


def test_more_due_jobs_than_one_pass_takes():
    store = JobStore()
    jobs = [Job(b"%048d" % i, b"q", b"") for i in range(7)]
    for job in jobs:
        store.add(job)
        store.schedule(job, 100 if job is not jobs[-1] else 50)
    assert store.due(100, limit=3) == [jobs[-1], *jobs[:2]]  # earliest bucket first, then a split
    assert store.next_awake() == 100
    assert store.due(100, limit=3) == jobs[2:5]
    assert store.due(99, limit=3) == []
    assert store.due(100, limit=3) == jobs[5:6] and store.next_awake() is None


def test_timer_reschedule_and_stale_heap_keys():
    store = JobStore()
    a, b = Job(b"a" * 48, b"q", b""), Job(b"b" * 48, b"q", b"")
    for job in (a, b):
        store.add(job)
    store.schedule(a, 10)
    store.schedule(a, 10)  # unchanged: nothing moves
    store.schedule(b, 10)
    store.schedule(b, 20)  # leaves a alone in bucket 10
    assert store.next_awake() == 10
    store.schedule(a, 30)  # bucket 10 empties: its heap key goes stale
    assert store.next_awake() == 20
    store.schedule(b, 5)
    store.unschedule(b)
    store.unschedule(b)  # not scheduled: no-op
    assert store.due(25) == [] and store.next_awake() == 30
    store.remove(a)
    assert store.next_awake() is None and len(store) == 1  # b: registered, not scheduled


def test_timer_entries_of_jobs_that_left_are_skipped_and_compacted():
    store = JobStore()
    jobs = [Job(b"%048d" % i, b"q", b"") for i in range(60)]
    for job in jobs:
        store.add(job)
        store.schedule(job, 10)
    for job in jobs[:50]:  # leave bucket 10: its stale entries are dropped, not kept to its time
        store.schedule(job, 20)
    assert len(store._buckets[10].jobs) <= 2 * 10 + 16
    back = jobs[0]
    store.schedule(back, 10)
    store.schedule(back, 20)
    store.schedule(back, 10)  # listed twice at 10 now (and once more at 20): taken once
    assert store.due(15) == jobs[50:] + [back]
    assert store.next_awake() == 20
    assert store.due(25, limit=3) == jobs[1:4]  # a split bucket keeps the rest, in order
    store.schedule(jobs[1], 20)  # back into the split bucket
    assert store.due(25) == jobs[4:50] + [jobs[1]]
    assert store.next_awake() is None and store.due(30) == []


def test_a_new_job_enters_the_timer_once_at_its_first_awake_time():
    """ADDJOB puts a job on the timer once, when it is queued: no entry (nor
    heap key) for the moment it was registered, however the clock reads."""
    for start in (0, START_MS):  # at 0, RETRY 0 and no DELAY make qtime 0: never queued, still timed
        core, clock, _ = make_core()
        clock.ms = start
        s = Session(core)
        once = core.jobs.get(bytes(s("ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 0, "TTL", 60)))
        later = core.jobs.get(bytes(s("ADDJOB", "q", "y", 0, "REPLICATE", 1, "RETRY", 30, "DELAY", 5)))
        assert once is not None and later is not None
        assert (once.awake, later.awake) == (start + 61_000, start + 5_000)
        assert sorted(core.jobs._heap) == sorted(core.jobs._buckets) == [start + 5_000, start + 61_000]
        clock.advance(61_000)
        core.tick()
        assert once.id not in core.jobs  # expired on time
