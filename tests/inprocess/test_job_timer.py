"""The job store's timer (store/jobs.py): millisecond buckets, rescheduling,
stale entries, and passes bounded in the number of jobs."""

from __future__ import annotations

from disque.store.job import Job
from disque.store.jobs import JobStore


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
