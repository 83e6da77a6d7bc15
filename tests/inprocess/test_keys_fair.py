"""Fair GETJOB (store/queue.py's `Fair`, docs/keys.md): the keys of a
queue take turns, plain jobs taking one turn among them; per key, creation
order; requeues, DEQUEUE, QPEEK, flushes; and a model of the turns."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from disque.store.job import ENQUEUE, Job, State
from disque.store.queue import Queue

from invariants import check_core
from jobenv import env, make_env  # noqa: F401 (fixtures)
from support import Session, make_core


def bodies(entries: list) -> list[bytes]:
    return [e[2] for e in entries]


def test_a_tenant_with_many_jobs_does_not_starve_one_with_few(env) -> None:
    for n in range(5):
        env.add("q", f"a{n}", "KEY", "tenant-a")
    env.add("q", "b0", "KEY", "tenant-b")
    env.add("q", "b1", "KEY", "tenant-b")
    assert bodies(env.s("GETJOB", "COUNT", 7, "FROM", "q")) == [b"a0", b"b0", b"a1", b"b1", b"a2", b"a3", b"a4"]
    env.check()


def test_plain_jobs_take_one_turn_among_the_keys(env) -> None:
    env.add("q", "p0")
    env.add("q", "p1")
    for n in range(3):
        env.add("q", f"a{n}", "KEY", "a")
    assert bodies(env.s("QPEEK", "q", 10)) == [b"p0", b"p1", b"a0", b"a1", b"a2"]  # by creation
    assert bodies(env.s("QPEEK", "q", -2)) == [b"a2", b"a1"]
    assert bodies(env.s("GETJOB", "COUNT", 5, "FROM", "q")) == [b"p0", b"a0", b"p1", b"a1", b"a2"]
    env.add("q", "p2")  # no keyed job left: the plain path
    assert bodies(env.s("GETJOB", "COUNT", 5, "FROM", "q")) == [b"p2"]
    env.check()


def test_a_requeued_keyed_job_keeps_its_place_and_dequeue_leaves_a_tombstone(env) -> None:
    first = env.add("q", "a0", "KEY", "a")
    second = env.add("q", "a1", "KEY", "a")
    env.add("q", "b0", "KEY", "b")
    assert env.s("GETJOB", "FROM", "q")[0][1] == first
    assert env.s("NACK", first) == 1  # back at the front of its key
    assert env.s("DEQUEUE", second) == 1 and env.s("ENQUEUE", second) == 1  # revived in place
    assert env.s("QLEN", "q") == 3
    assert bodies(env.s("GETJOB", "COUNT", 3, "FROM", "q")) == [b"b0", b"a0", b"a1"]
    assert env.s("DEQUEUE", first) == 0
    env.check()


def test_the_eldest_and_a_drain_see_the_keyed_jobs(env) -> None:
    env.add("q", "a0", "KEY", "a")
    env.add("q", "p0")
    assert env.core.queues.get(b"q").eldest().body == b"a0"
    env.s("DEBUG", "FLUSHALL")
    assert env.s("QLEN", "q") == 0
    q = Queue(b"q", 0)
    for n, key in enumerate([b"a", b"", b"b"]):
        job = Job(_id(n), b"q", b"", State.ACTIVE, ctime=n, key=key)
        job.move(ENQUEUE)
        q.push(job)
    assert sorted(j.ctime for j in q.drain()) == [0, 1, 2] and len(q) == 0 and q.pop() is None


def test_many_tombstones_in_a_key_are_compacted(env) -> None:
    ids = [env.add("q", f"a{n}", "KEY", "a") for n in range(200)]
    for job_id in ids[50:180]:
        assert env.s("DEQUEUE", job_id) == 1
    lane = env.core.queues.get(b"q").fair.lanes[b"a"]
    assert len(lane.items) < 200 and lane.live == 70
    assert len(env.s("GETJOB", "COUNT", 100, "FROM", "q")) == 70
    env.check()


def _id(n: int) -> bytes:
    return b"DI%044dSQ" % n


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.sampled_from([b"", b"a", b"b", b"c"]), min_size=1, max_size=60))
def test_keys_take_turns_and_keep_their_order(keys: list[bytes]) -> None:
    """Every job out once; each key's in creation order; after each pop the
    keys that still have jobs were served within one of each other."""
    q = Queue(b"q", 0)
    for n, key in enumerate(keys):
        job = Job(_id(n), b"q", b"", State.ACTIVE, ctime=n, key=key)
        job.move(ENQUEUE)
        q.push(job)
    served: Counter[bytes] = Counter()
    left = Counter(keys)
    out: list[Job] = []
    while (job := q.pop()) is not None:
        out.append(job)
        served[job.key] += 1
        left[job.key] -= 1
        waiting = [served[k] for k in left if left[k]]
        assert not waiting or max(waiting) - min(waiting) <= 1
    assert sorted(j.id for j in out) == sorted(_id(n) for n in range(len(keys))) and len(q) == 0
    for key in set(keys):
        mine = [j.ctime for j in out if j.key == key]
        assert mine == sorted(mine)


def test_read_behind_leaves_keyed_jobs_in_memory() -> None:
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=2)
    s = Session(core)
    for n in range(6):
        s("ADDJOB", "q", f"a{n}", 0, "KEY", "a")
    for n in range(6):
        s("ADDJOB", "q", f"p{n}", 0)
    figures = dict(core.read_behind.info_fields())
    assert figures["jobs_on_disk"] == 4  # the plain jobs' tail only
    assert bodies(s("GETJOB", "COUNT", 4, "FROM", "q")) == [b"p0", b"a0", b"p1", b"a1"]
    check_core(core)
