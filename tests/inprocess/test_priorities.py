"""Job priorities (docs/priorities.md, spec/commands.md §4.1.1) over the core
under the fake clock: the serving order, aging, the output, the forms a job
travels in, read-behind's levels, and a model of a queue's order."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from disque.cluster.codec import LinkCodec
from disque.cluster.messages import Header, ReplJob
from disque.core.errors import DisqueError
from disque.store.aof import encode_clean_marker, encode_loadjob
from disque.store.job import DEQUEUE, ENQUEUE, Job, State
from disque.store.queue import Queue, effective
from disque.store import records
from disque.store.records import DecodeError, decode_storage, encode_storage, job_from_wire, job_to_wire
from invariants import advance, check_core
from sim.network import SimCluster
from support import START_MS, Session, make_core, replay
from test_items import Memcache

def _id(n: int) -> bytes:
    return b"DI%044dSQ" % n


def bodies(entries: list[Any]) -> list[bytes]:
    return [e[2] for e in entries]


def session(**config: Any) -> Session:
    return Session(make_core(**config)[0])


def test_higher_priorities_first_and_creation_order_within_one() -> None:
    s = session(priority_aging=0)
    for body, priority in [("a", 1), ("b", 9), ("c", None), ("d", 9), ("e", 1), ("f", 5)]:
        s("ADDJOB", "q", body, 0, *(("PRIORITY", priority) if priority is not None else ()))
    assert bodies(s("QPEEK", "q", 10)) == [b"b", b"d", b"c", b"f", b"a", b"e"]
    assert bodies(s("QPEEK", "q", -3)) == [b"e", b"a", b"f"]
    assert bodies(s("GETJOB", "COUNT", 10, "FROM", "q")) == [b"b", b"d", b"c", b"f", b"a", b"e"]
    check_core(s.core)


@pytest.mark.parametrize("value", ["10", "-1", "x", "1.5"])
def test_a_priority_out_of_range_is_refused(value: str) -> None:
    s = session()
    assert str(s("ADDJOB", "q", "b", 0, "PRIORITY", value)) == "ERR PRIORITY must be between 0 and 9"
    assert s("QLEN", "q") == 0


def test_the_output_shows_a_priority_other_than_the_default() -> None:
    s = session()
    plain = bytes(s("ADDJOB", "q", "plain", 0))
    urgent = bytes(s("ADDJOB", "q", "urgent", 0, "PRIORITY", 8))
    assert b"priority" not in dict(s("SHOW", plain)) and len(s("SHOW", plain)) == 15  # as Disque's
    assert dict(s("SHOW", urgent))[b"priority"] == 8
    assert s("QPEEK", "q", 2) == [[b"q", urgent, b"urgent", b"priority", 8], [b"q", plain, b"plain"]]
    assert dict(s("QSTAT", "q"))[b"priorities"] == [8, 1, 5, 1]
    s("GETJOB", "FROM", "q")
    assert b"priorities" not in dict(s("QSTAT", "q"))  # only the default left
    _, shown = s("JSCAN", "REPLY", "ALL")
    assert sorted(dict(job).get(b"priority", 5) for job in shown) == [5, 8]


def test_aging_moves_a_waiting_job_up_one_level_per_period() -> None:
    core, clock, _ = make_core()
    s = Session(core)
    assert s("CONFIG", "GET", "priority-aging") == [("priority-aging", "60000")]
    s("CONFIG", "SET", "priority-aging", "1000")
    s("ADDJOB", "q", "old-low", 0, "PRIORITY", 2)
    advance(core, clock, 2_500)  # two periods: 2 -> 4
    s("ADDJOB", "q", "new-4", 0, "PRIORITY", 4)
    s("ADDJOB", "q", "new-3", 0, "PRIORITY", 3)
    assert bodies(s("QPEEK", "q", 3)) == [b"old-low", b"new-4", b"new-3"]  # 4 as new-4, and older
    assert effective(core.queues.get(b"q").levels[-1].first(), core.now, 1000) == 4
    assert bodies(s("GETJOB", "COUNT", 3, "FROM", "q")) == [b"old-low", b"new-4", b"new-3"]
    s("CONFIG", "SET", "priority-aging", "0")  # off: strict priorities
    s("ADDJOB", "q", "low", 0, "PRIORITY", 0)
    advance(core, clock, 100_000)
    s("ADDJOB", "q", "high", 0, "PRIORITY", 1)
    assert bodies(s("GETJOB", "COUNT", 2, "FROM", "q")) == [b"high", b"low"]
    assert isinstance(s("CONFIG", "SET", "priority-aging", "-1"), DisqueError)
    check_core(core)


def test_aging_stops_at_the_top_and_ties_go_to_the_oldest() -> None:
    core, clock, _ = make_core(priority_aging=10)
    s = Session(core)
    s("ADDJOB", "q", "top", 0, "PRIORITY", 9)
    advance(core, clock, 5)
    s("ADDJOB", "q", "low", 0, "PRIORITY", 0)
    advance(core, clock, 1_000)  # low reaches 9, no further: top is older
    assert bodies(s("QPEEK", "q", 2)) == [b"top", b"low"]
    assert bodies(s("QPEEK", "q", -2)) == [b"low", b"top"]
    assert bodies(s("GETJOB", "COUNT", 2, "FROM", "q")) == [b"top", b"low"]


def test_a_requeued_job_keeps_its_priority_and_its_place() -> None:
    s = session()
    first = bytes(s("ADDJOB", "q", "first", 0, "PRIORITY", 7))
    s("ADDJOB", "q", "second", 0, "PRIORITY", 7)
    s("ADDJOB", "q", "other", 0)
    assert s("GETJOB", "FROM", "q")[0][1] == first
    assert s("NACK", first) == 1
    assert bodies(s("QPEEK", "q", 3)) == [b"first", b"second", b"other"]
    assert s("DEQUEUE", first) == 1 and s("ENQUEUE", first) == 1
    assert bodies(s("QPEEK", "q", 3)) == [b"first", b"second", b"other"]
    check_core(s.core)


def test_a_dead_letter_keeps_the_priority() -> None:
    s = session()
    job_id = bytes(s("ADDJOB", "q", "x", 0, "PRIORITY", 1, "MAXATTEMPTS", 1))
    s("GETJOB", "FROM", "q")
    s("NACK", job_id)
    [entry] = s("QPEEK", "q-dead", 1)
    assert dict(s("SHOW", entry[1]))[b"priority"] == 1 and entry[3:] == [b"priority", 1]
    assert s("DEADLETTER", "REQUEUE", "q-dead") == 1
    assert s("QPEEK", "q", 1)[0][3:] == [b"priority", 1]


def test_a_queue_setting_gives_the_default_for_addjob_and_memcache_set() -> None:
    core, _, _ = make_core()
    core.config.queue_config.set_queue(["urgent", "priority", "8"])
    s, mc = Session(core), Memcache(core)
    assert mc(b"set urgent 0 0 2\r\nmc\r\n") == b"STORED\r\n"
    s("ADDJOB", "urgent", "plain", 0)
    s("ADDJOB", "urgent", "low", 0, "PRIORITY", 1)
    assert [e[3:] for e in s("QPEEK", "urgent", 3)] == [[b"priority", 8], [b"priority", 8], [b"priority", 1]]
    assert dict(s("QSETTINGS", "urgent"))[b"priority"] == b"8"
    with pytest.raises(ValueError, match="from 0 to 9"):
        core.config.queue_config.set_queue(["urgent", "priority", "10"])


def test_a_level_the_queue_no_longer_holds_goes_with_its_tombstones() -> None:
    q = Queue(b"q", 0)
    jobs = [Job(_id(i), b"q", b"", State.ACTIVE, ctime=i, priority=p) for i, p in enumerate([3, 3, 7])]
    for job in jobs:
        job.move(ENQUEUE)
        q.push(job)
    jobs[0].move(DEQUEUE)
    q.discard(jobs[0])  # a tombstone in level 3
    assert q.pop() is jobs[2] and [level.priority for level in q.levels] == [3]  # emptied: gone
    assert q.pop() is jobs[1] and [level.priority for level in q.levels] == [3]  # the last level stays
    assert q.pop() is None and q.eldest() is None
    jobs[0].move(ENQUEUE)
    q.push(jobs[0])  # a fresh entry, not the tombstone
    assert q.pop() is jobs[0]
    assert Queue(b"empty", 0).pop() is None


# ------------------------------------------------------------------ the forms a job travels in


def _job(priority: int) -> Job:
    return Job(_id(1), b"q", b"b", State.QUEUED, ctime=7, etime=100, priority=priority)


def test_the_wire_form_carries_it_and_an_older_frame_means_five() -> None:
    job = _job(2)
    wire = job_to_wire(job, 0)
    assert job_from_wire(wire, 0).priority == 2
    sender, receiver = LinkCodec(), LinkCodec()
    header = Header("a" * 40, 7711, 0)
    body = sender.encode(header, ReplJob(wire, False))
    assert msgpack.unpackb(body)["j"]["pr"] == 2
    assert receiver.decode(body)[1].job["priority"] == 2
    older = msgpack.unpackb(body)
    del older["j"]["pr"]
    assert LinkCodec().decode(msgpack.packb(older))[1].job["priority"] == 5
    sender.positional = True
    arrays = [msgpack.unpackb(sender.encode(header, ReplJob(w, False))) for w in (wire, job_to_wire(_job(5), 0))]
    at = -3 - len(records._DEPENDS)  # (the last failure, the key and the dependencies follow it)
    assert arrays[0][-1][at] == 2 and arrays[1][-1][at] == 5
    del arrays[0][-1][at:]  # an older node's array ends before it
    older_node = LinkCodec()
    assert older_node.decode(msgpack.packb(arrays[0]))[1].job["priority"] == 5
    arrays[1][-1][at] = 10
    with pytest.raises(ValueError, match="priority"):
        older_node.decode(msgpack.packb(arrays[1]))


def test_the_storage_form_carries_it_and_an_older_record_means_five() -> None:
    assert decode_storage(encode_storage(_job(0))).priority == 0
    stored = msgpack.unpackb(encode_storage(_job(9)))
    assert stored["pr"] == 9
    assert "pr" not in msgpack.unpackb(encode_storage(_job(5)))  # left out at its default
    del stored["pr"]
    assert decode_storage(msgpack.packb(stored)).priority == 5
    stored["pr"] = 12
    with pytest.raises(DecodeError):
        decode_storage(msgpack.packb(stored))


def test_an_aof_replay_keeps_the_priorities() -> None:
    src = session()
    for body, priority in [("low", 2), ("high", 8), ("mid", 5)]:
        src("ADDJOB", "q", body, 0, "PRIORITY", priority)
    blob = b"".join(encode_loadjob(job) for job in src.core.jobs.values()) + encode_clean_marker(START_MS)
    core, _, _ = make_core()
    replay(core, blob)
    assert bodies(Session(core)("GETJOB", "COUNT", 3, "FROM", "q")) == [b"high", b"mid", b"low"]


# ------------------------------------------------------------------ read-behind


def test_read_behind_keeps_a_tail_per_priority_and_serves_in_order() -> None:
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=2, priority_aging=0)
    s = Session(core)
    for i in range(6):
        s("ADDJOB", "q", f"low{i}", 0, "PRIORITY", 1)
    for i in range(6):
        s("ADDJOB", "q", f"high{i}", 0, "PRIORITY", 8)
    q = core.queues.get(b"q")
    assert [level.priority for level in q.levels] == [8, 1] and q.head_live() == 2
    assert q.on_disk() == (10, q.nbytes - len(b"high0high1"))
    check_core(core)
    assert bodies(s("QPEEK", "q", 12)) == [f"high{i}".encode() for i in range(6)] + [f"low{i}".encode() for i in range(6)]
    got = [body for _ in range(12) for body in bodies(s("GETJOB", "FROM", "q"))]
    assert got == [f"high{i}".encode() for i in range(6)] + [f"low{i}".encode() for i in range(6)]
    assert core.queues.get(b"q").on_disk() == (0, 0)
    check_core(core)


def test_read_behind_loads_a_lower_level_only_when_its_turn_comes() -> None:
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=1, priority_aging=0)
    s = Session(core)
    low = [bytes(s("ADDJOB", "q", f"low{i}", 0, "PRIORITY", 0)) for i in range(3)]
    high = bytes(s("ADDJOB", "q", "high", 0, "PRIORITY", 9))
    assert core.queues.get(b"q").on_disk()[0] == 3  # the one job in memory is the one to serve
    assert bodies(s("GETJOB", "COUNT", 2, "FROM", "q")) == [b"high", b"low0"]
    check_core(core)
    assert s("ACKJOB", high, *low) == 4 and s("QLEN", "q") == 0
    check_core(core)


def test_read_behind_refills_from_the_levels_that_have_a_tail() -> None:
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=3, priority_aging=0)
    s = Session(core)
    for name, priority in [("low", 0), ("high", 9)]:
        for i in range(3):
            s("ADDJOB", "q", f"{name}{i}", 0, "PRIORITY", priority)
    q = core.queues.get(b"q")
    assert [level.tail is None for level in q.levels] == [True, False] and q.on_disk()[0] == 3
    assert bodies(s("GETJOB", "FROM", "q")) == [b"high0"]
    assert q.on_disk()[0] == 2 and q.head_live() == 3  # the end of the step loaded low0
    assert bodies(s("QPEEK", "q", -3)) == [b"low2", b"low1", b"low0"]
    check_core(core)


# ------------------------------------------------------------------ the cluster


async def test_federation_hands_out_the_higher_priorities_first(autojump_clock: Any) -> None:
    async with SimCluster(2, seed=5, node_timeout=1000) as cluster:
        await cluster.form()
        for body, priority in [("low", 1), ("high", 9), ("mid", 5)]:
            await cluster.call(0, "ADDJOB", "q", body, 0, "REPLICATE", 1, "PRIORITY", priority)
        got = await cluster.call(1, "GETJOB", "TIMEOUT", 5000, "FROM", "q")
        assert bodies(got) == [b"high"]  # NEEDJOBS brought the highest first
        shown = await cluster.call(1, "SHOW", got[0][1])
        assert dict(zip(shown[::2], shown[1::2]))[b"priority"] == 9


async def test_replicas_agree_on_the_priority(autojump_clock: Any) -> None:
    async with SimCluster(3, seed=3, node_timeout=1000) as cluster:
        await cluster.form()
        job_id = bytes(await cluster.call(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "PRIORITY", 0))
        for i in range(3):
            shown = await cluster.call(i, "SHOW", job_id)
            assert dict(zip(shown[::2], shown[1::2]))[b"priority"] == 0
        await trio.sleep(0)


# ------------------------------------------------------------------ a model of the order


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 3), st.booleans()), min_size=1, max_size=40),
       st.sampled_from([0, 7, 50]))  # fmt: skip
def test_a_queue_serves_as_the_model_says(ops: list[tuple[int, int, bool]], aging: int) -> None:
    """Push jobs of random priorities at random times, pop now and then:
    each pop gives the job of the highest effective priority, then the oldest."""
    q, now, held, n = Queue(b"q", 0), 0, [], 0
    for priority, wait, pop in ops:
        now += wait * 10
        n += 1
        job = Job(_id(n), b"q", b"", State.ACTIVE, ctime=now * 1_000_000 + n, priority=priority)
        job.move(ENQUEUE)
        q.push(job)
        held.append(job)
        if pop:
            best = min(held, key=lambda j: (-effective(j, now, aging), j.ctime))
            assert q.oldest(now, aging).__next__() is best
            assert q.pop(now, aging) is best
            held.remove(best)
    assert sorted(j.ctime for j in q.oldest(now, aging)) == sorted(j.ctime for j in held)
    assert len(q) == len(held)
