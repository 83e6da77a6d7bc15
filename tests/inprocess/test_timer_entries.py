"""The job timer's entries (store/jobs.py) never keep alive a job that left
memory: one read-behind moved to disk, or one deleted, is freed at once,
its body with it, not when its bucket's time comes."""

from __future__ import annotations

import gc

from disque.store.job import Job
from disque.store.jobs import JobStore
from invariants import check_core
from support import Session, make_core


def job_objects() -> set[bytes]:
    """The IDs of every Job object alive in this process."""
    gc.collect()
    return {o.id for o in gc.get_objects() if type(o) is Job}


def listed(store: JobStore) -> list[Job]:
    return [job for bucket in store._buckets.values() for job in bucket.jobs if job is not None]


def test_a_job_that_leaves_its_bucket_leaves_no_entry_holding_it():
    store = JobStore()
    jobs = [Job(b"%048d" % i, b"q", b"body") for i in range(40)]
    for job in jobs:
        store.add(job)
        store.schedule(job, 10)
    for job in jobs[:5]:
        store.remove(job)  # deleted, or moved to disk
    for job in jobs[5:10]:
        store.schedule(job, 20)
    assert listed(store) == jobs[10:] + jobs[5:10]  # below the packing threshold, with holes
    assert store._buckets[10].jobs[:10] == [None] * 10
    assert store.due(15) == jobs[10:] and store.due(25) == jobs[5:10]


def test_a_job_read_behind_moved_to_disk_is_freed():
    """Jobs made in the same millisecond share their timer buckets (RETRY's
    jitter spreads them over 500): the head's stay, the tail's go to disk
    from the same buckets, and only the jobs in memory stay alive."""
    core, _, _ = make_core(read_behind="force", read_behind_prefetch=300)
    s = Session(core)
    ids = [bytes(s("ADDJOB", "q", b"%04d" % i, 0, "RETRY", 300)) for i in range(1500)]
    resident = {job.id for job in core.jobs.values()}
    assert len(resident) == 300 and core.read_behind.index.live == 1200
    assert {job.id for job in listed(core.jobs)} == resident
    assert job_objects() & set(ids) == resident
    check_core(core)


def test_an_acknowledged_job_is_freed():
    core, _, _ = make_core()
    s = Session(core)
    ids = [bytes(s("ADDJOB", "q", b"%04d" % i, 0, "RETRY", 300)) for i in range(200)]
    assert len(s("GETJOB", "COUNT", 200, "FROM", "q")) == 200  # out of the queue, in the timer
    assert s("ACKJOB", *ids[::2]) == 100
    assert job_objects() & set(ids) == set(ids[1::2])
    check_core(core)
