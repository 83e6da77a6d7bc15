"""The queue (store/queue.py): late arrivals in creation order, tombstones
revived in place, compaction when tombstones dominate."""

from __future__ import annotations

from disque.store.job import DEQUEUE, ENQUEUE, IN_LIST, Job, State
from disque.store.queue import Queue


def queued(ctime: int, name: bytes = b"q") -> Job:
    job = Job(b"%048d" % ctime, name, b"", ctime=ctime, state=State.QUEUED)
    return job


def test_queue_orders_late_arrivals_and_revives_tombstones():
    q = Queue(b"q", 0)
    jobs = {c: queued(c) for c in (5, 1, 3, 9, 3)}
    for job in jobs.values():
        q.push(job)
    assert [j.ctime for j in q.oldest()] == [1, 3, 5, 9] and [j.ctime for j in q.newest()] == [9, 5, 3, 1]
    jobs[3].move(DEQUEUE)
    q.discard(jobs[3])
    jobs[1].move(DEQUEUE)
    q.discard(jobs[1])
    assert len(q) == 2 and q.pop() is jobs[5]  # the tombstones at the front are dropped
    jobs[3].move(ENQUEUE)
    q.push(jobs[3])  # tombstone already dropped: a fresh entry
    assert [j.ctime for j in q.oldest()] == [3, 9]
    jobs[9].move(DEQUEUE)
    q.discard(jobs[9])
    jobs[9].move(ENQUEUE)
    q.push(jobs[9])  # revived in place
    assert len(q.levels[0].items) == 2 and [j.ctime for j in q.oldest()] == [3, 9]
    assert q.drain() == [jobs[3], jobs[9]] and len(q) == 0 and q.pop() is None
    assert not any(j.flags & IN_LIST for j in jobs.values())


def test_queue_compacts_when_tombstones_dominate():
    q = Queue(b"q", 0)
    jobs = [queued(c) for c in range(200)]
    for job in jobs:
        q.push(job)
    for job in jobs[:150]:
        job.move(DEQUEUE)
        q.discard(job)
    assert len(q.levels[0].items) < 200 and len(q) == 50
    assert all(j.flags & IN_LIST for j in q.levels[0].items) and [j.ctime for j in q.oldest()] == list(range(150, 200))
    assert not any(j.flags & IN_LIST for j in jobs[:150] if j not in q.levels[0].items)
    for job in jobs[:150]:
        job.move(ENQUEUE)
        q.push(job)
    assert [j.ctime for j in q.oldest()] == list(range(200))
