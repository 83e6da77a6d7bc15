"""Read-behind (core/read_behind.py, store/spill.py): long queues keep their
newest jobs on disk, replicas go there past the budget, every command sees
them as if they were in memory."""

from __future__ import annotations

import errno
import os
import random
import tracemalloc
from typing import Any
from array import array

import pytest

import support
from disque.core.effects import AofAppend
from disque.core.figures import node_figures
from disque.core.read_behind import ReadBehind
from disque.shell import segments as seg
from disque.store.aof import RecordReader, encode_clean_marker, encode_deljob, encode_loadjob
from disque.store.job import DEQUEUE, ENQUEUE, Job, State
from disque.store.queue import Queue
from disque.store.scan import NBUCKETS
from disque.store.spill import IN_TAIL, LIVE, SpillIndex, Tail
from invariants import advance, check_core
from mesh import Mesh
from support import START_MS, Session, all_jobs, applied, make_core, replay

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def forced(prefetch: int = 2, **overrides):
    core, clock, host = make_core(read_behind="force", read_behind_prefetch=prefetch, **overrides)
    return core, clock, Session(core)


def info(core) -> dict[str, str]:
    return dict(core.read_behind.info_fields())


def add(s, n: int, queue: str = "q", *opts) -> list[bytes]:
    return [bytes(s("ADDJOB", queue, f"body{i}", 0, *opts)) for i in range(n)]


def bodies(entries) -> list[bytes]:
    return [e[2] for e in entries]


# ---------------------------------------------------------------- the index


def test_the_index_finds_reuses_and_rebuilds():
    index = SpillIndex()
    slots = [index.add(b"id%d" % i, b"q", i * 10, 10, 3, i, 0) for i in range(2000)]  # past one table rebuild
    assert len(index) == 2000 and index.live_bytes == 20000
    assert [s for s in index.find(b"id1500") if index.loc[s] == 15000] == [1500]
    assert list(index.find(b"nope")) == []
    index.kill(slots[7])
    assert list(index.find(b"id7")) == [] and not index.is_live(7) and len(index) == 1999
    assert index.add(b"new", b"r", 0, 10, 3, 0, IN_TAIL) == 7  # a free slot is reused
    assert index.queue_of(7) == b"r" and index.flags[7] == LIVE | IN_TAIL
    index.kill(7)
    assert index.flags[7] == IN_TAIL  # still listed by a tail: not free yet
    assert index.add(b"newer", b"q", 0, 10, 3, 0, 0) == 2000
    index.leave_tail(7)
    assert index.add(b"newest", b"q", 0, 10, 3, 0, 0) == 7
    assert 7 in index.in_bucket(hash(b"newest") % NBUCKETS)  # as in memory ("newer", slot 2000, may share its bucket)
    assert 1 not in index.in_bucket(hash(b"id1") % NBUCKETS + 1)


def test_a_bucket_is_not_found_across_two_entries():
    index = SpillIndex()
    for i in range(3):
        index.add(b"id%d" % i, b"q", 0, 10, 3, i, 0)
    index.bucket[:] = b"".join(b.to_bytes(2, "little") for b in (256, 3, 769))  # 00 01|03 00|01 03
    assert list(index.in_bucket(769)) == [2]  # not slot 0's high byte and slot 1's low byte


def test_jobs_go_into_a_tail_at_their_place():
    index = SpillIndex()
    tail = Tail(index, lambda slot: None)
    slots = [index.add(b"%d" % i, b"q", 0, 1, 2, i, IN_TAIL) for i in range(14)]
    tail.insert(slots[6:10], 8)  # an empty tail
    tail.insert(slots[3:6], 6)  # older than the front, no room before it: a new array
    assert list(tail.oldest()) == slots[3:10] and tail.pos == 0
    for slot in slots[3:5]:
        tail.take(slot)
        index.kill(slot)
    assert tail.front() == slots[5] and tail.pos == 2
    tail.insert(slots[1:3], 4)  # in the room the consumed entries left
    assert list(tail.oldest()) == [*slots[1:3], *slots[5:10]] and tail.live == 7 and tail.nbytes == 14
    tail.insert(slots[12:14], 4)  # newer than the last: at the end
    assert tail.last_ctime == 13
    tail.take(slots[8])
    index.kill(slots[8])  # a dead entry in the middle keeps its place
    tail.insert([slots[0], slots[10], slots[11]], 6)  # one before the front, two among them: merged
    assert list(tail.oldest()) == [slots[0], *slots[1:3], *slots[5:8], *slots[9:14]]
    assert tail.live == 11 and tail.nbytes == 22 and tail.last_ctime == 13 and tail.pos == 0
    assert list(tail.slots) == [slots[0], *slots[1:3], *slots[5:14]]  # the dead entry still listed, in order


def test_the_wheel_gives_due_slots_once():
    index = SpillIndex()
    a, b, c = (index.add(b"%d" % i, b"q", 0, 1, 0, i, 0) for i in range(3))
    index.wake_at(a, 10)
    index.wake_at(b, 12)
    index.wake_at(c, 10)
    index.wake_at(c, 11)  # moved: its entry at 10 is stale
    assert index.next_awake() == 10
    assert index.due(10, 10) == [a]
    assert index.due(11, 10) == [c]
    index.kill(b)
    assert index.due(20, 10) == [] and index.next_awake() is None
    for i in range(3):
        index.wake_at(index.add(b"x%d" % i, b"q", 0, 1, 0, i, 0), 30)
    assert len(index.due(30, 2)) == 2 and len(index.due(30, 2)) == 1  # bounded passes


def test_a_tail_skips_dead_entries_and_drops_its_consumed_front():
    index = SpillIndex()
    tail = Tail(index, lambda slot: None)
    slots = [index.add(b"%d" % i, b"q", 0, 1, 5, i, IN_TAIL) for i in range(6000)]
    for slot in slots:
        tail.append(slot, index.ctime[slot], 5)
    assert tail.live == 6000 and tail.nbytes == 30000
    for slot in slots[:5000]:
        tail.take(slot)
        index.kill(slot)
    assert tail.front() == slots[5000] and tail.pos == 0 and len(tail.slots) == 1000  # the consumed part went
    assert list(tail.jobs(iter(slots[5000:5002]))) == []  # unreadable: skipped
    assert list(tail.newest())[:2] == [slots[-1], slots[-2]]
    assert tail.drop() == slots[5000:] and tail.live == 0 and tail.front() is None
    assert not any(index.flags[s] & IN_TAIL for s in slots)


# ---------------------------------------------------------------- a queue on disk


def test_a_long_queue_keeps_its_oldest_jobs_in_memory_and_serves_in_order():
    core, clock, s = forced()
    ids = add(s, 10)
    assert s("QLEN", "q") == 10
    figures = info(core)
    assert (figures["jobs_in_memory"], figures["jobs_on_disk"], figures["queued_jobs_on_disk"]) == (2, 8, 8)
    assert ids[9] in core.jobs and info(core)["jobs_on_disk"] == 8  # `in` reads, does not load
    assert s("QPEEK", "q", 20) == [[b"q", i, b"body%d" % n] for n, i in enumerate(ids)]
    assert bodies(s("QPEEK", "q", -3)) == [b"body9", b"body8", b"body7"]
    assert bodies(s("GETJOB", "COUNT", 4, "FROM", "q")) == [b"body0", b"body1", b"body2", b"body3"]
    assert info(core)["prefetch_misses"] == 2  # one command took more than the head held
    assert bodies(s("GETJOB", "FROM", "q")) == [b"body4"]  # the end of the last step refilled the head
    assert info(core)["prefetch_hits"] == 3
    assert bodies(s("GETJOB", "COUNT", 10, "FROM", "q")) == [b"body%d" % i for i in range(5, 10)]
    assert core.queues.get(b"q").levels[0].tail is None  # drained: read-behind over for this queue
    check_core(core)


def test_lookups_by_id_bring_a_job_back_where_it_was():
    core, clock, s = forced()
    ids = add(s, 8)
    shown = dict(s("SHOW", ids[5]))
    assert shown[b"state"] == "queued" and shown[b"body"] == b"body5" and info(core)["jobs_on_disk"] == 5
    assert s("DEQUEUE", ids[6]) == 1 and dict(s("SHOW", ids[6]))[b"state"] == "active"
    assert s("ENQUEUE", ids[6]) == 1
    assert s("ACKJOB", ids[7]) == 1 and s("SHOW", ids[7]) is None
    assert s("NACK", ids[4]) == 0  # queued, not delivered: nothing to do
    assert s("FASTACK", ids[3]) == 1 and s("DELJOB", ids[2]) == 1
    assert s("QLEN", "q") == 5
    check_core(core)
    assert bodies(s("GETJOB", "COUNT", 10, "FROM", "q")) == [b"body0", b"body1", b"body4", b"body5", b"body6"]
    assert ids[0] in core.jobs and b"D-nothing" not in core.jobs


def test_a_job_queued_again_is_served_before_newer_ones_on_disk():
    core, clock, s = forced()
    ids = add(s, 6)
    [[_, first, _]] = s("GETJOB", "FROM", "q")
    assert first == ids[0] and s("NACK", first) == 1
    assert [e[1] for e in s("GETJOB", "COUNT", 6, "FROM", "q")] == ids
    check_core(core)


def test_jobs_on_disk_expire_on_time():
    core, clock, s = forced()
    add(s, 6, "q", "TTL", 5)
    add(s, 3, "keep")
    advance(core, clock, 5_000)
    assert s("QLEN", "q") == 6
    advance(core, clock, 1_000)
    assert s("QLEN", "q") == 0 and s("QLEN", "keep") == 3
    assert core.queues.get(b"q").expired == 6
    check_core(core)


def test_jscan_walks_the_jobs_on_disk_too():
    core, clock, s = forced()
    ids = add(s, 7) + add(s, 3, "other")
    seen, cursor = [], b"0"
    while True:
        cursor, found = s("JSCAN", cursor, "COUNT", 2)
        seen += found
        if cursor == b"0":
            break
    assert sorted(seen) == sorted(ids)
    _, found = s("JSCAN", "0", "BUSYLOOP", "QUEUE", "other", "REPLY", "ALL")
    assert len(found) == 3
    assert core.jobs.scan(1 << 40, 10, None) == (0, [])  # a cursor past every bucket


def test_jscan_finds_the_jobs_that_move_between_memory_and_disk_during_a_scan():
    core, clock, s = forced(prefetch=1)
    ids = add(s, 200)
    seen, cursor = set(), b"0"
    while True:
        cursor, found = s("JSCAN", cursor, "COUNT", 3)
        seen.update(found)
        for job_id in ids[::7]:  # loaded into memory, then to disk again when taken back out of it
            s("SHOW", job_id)
        s("GETJOB", "NOHANG", "FROM", "q")  # the head refills from disk
        if cursor == b"0":
            break
    assert seen == set(ids)  # each one was there for the whole scan


def test_kestrel_figures_tell_memory_from_disk():
    core, clock, s = forced()
    add(s, 5)
    stats = dict(core.items.queue_stats())[b"q"]
    assert (stats["items"], stats["mem_items"]) == (5, 2) and stats["mem_bytes"] == 10 and stats["bytes"] == 25
    assert node_figures(core)["jobs"]["queued"] == 5
    core.items.flush(b"q")
    assert s("QLEN", "q") == 0 and info(core)["jobs_on_disk"] == 0


def test_destroying_a_queue_brings_its_jobs_back_first():
    core, clock, s = forced()
    ids = add(s, 5)
    core.lifecycle.destroy_queue(core.queues.get(b"q"))
    assert {dict(s("SHOW", i))[b"state"] for i in ids} == {"active"}
    assert info(core)["jobs_on_disk"] == 0


def test_flushall_deletes_the_jobs_on_disk_and_logs_it():
    core, clock, s = forced()
    core.aof.state = "on"
    ids = add(s, 6)
    core.take_effects()
    s("DEBUG", "FLUSHALL")
    deleted = [e.record for e in core.take_effects() if isinstance(e, AofAppend) and b"DELJOB" in e.record]
    assert len(deleted) == 6 and all(any(i in r for r in deleted) for i in ids)
    assert len(core.jobs) == 0 and info(core)["jobs_on_disk"] == 0 and info(core)["dead_bytes"] == info(core)["segment_bytes"]


# ---------------------------------------------------------------- the budget


def budgeted(prefetch: int):
    """A core with read-behind on a budget (not forced)."""
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=prefetch)
    core.read_behind.force = False
    return core, clock, Session(core)


def test_the_node_budget_starts_and_stops_spilling_with_hysteresis():
    core, clock, s = budgeted(10)
    core.config.job_memory_limit = core.memory.data() + 50 * core.memory.job_size(Job(b"D" * 48, b"q", b"x" * 100))
    add_big = lambda n: [s("ADDJOB", "q", "x" * 100, 0) for _ in range(n)]  # noqa: E731
    add_big(40)
    assert info(core)["jobs_on_disk"] == 0 and info(core)["read_behind_spilling"] == 0
    add_big(20)  # past the limit: spilled until a tenth of the room was free again
    assert info(core)["jobs_on_disk"] > 0 and core.memory.data() < core.read_behind.limit()
    add_big(10)  # the queue is in read-behind: new jobs go to its tail
    on_disk = info(core)["jobs_on_disk"]
    assert on_disk >= 10
    core.config.job_memory_limit = core.memory.data() - 2000  # the jobs on disk count too: the head gives way
    add_big(1)
    assert info(core)["jobs_on_disk"] > on_disk + 1 and core.memory.data() < core.config.job_memory_limit
    assert bodies(s("QPEEK", "q", 1)) == [b"x" * 100]
    check_core(core)
    for entry in s("GETJOB", "COUNT", 80, "FROM", "q"):
        s("ACKJOB", entry[1])
    assert info(core)["read_behind_spilling"] == 0 and s("QLEN", "q") == 0
    check_core(core)


def test_a_queue_past_its_max_memory_size_spills_alone():
    core, clock, s = budgeted(2)
    core.config.queue_config.set_queue(["small", "max_memory_size", "300"])
    for _ in range(6):
        s("ADDJOB", "small", "y" * 100, 0)
        s("ADDJOB", "big", "y" * 100, 0)
    assert core.queues.get(b"big").levels[0].tail is None
    assert core.queues.get(b"small").levels[0].tail.live == 4  # two kept, the rest past 300 bytes went
    check_core(core)


def test_below_its_limit_a_queue_moves_to_disk_a_few_jobs_at_a_time(monkeypatch):
    from disque.core import read_behind

    monkeypatch.setattr(read_behind, "SPILL_STEP", 2)
    core, clock, s = budgeted(2)
    ids = [bytes(s("ADDJOB", "big", "x" * 10, 0)) for _ in range(60)]
    big = core.queues.get(b"big")
    level = big.levels[0]
    assert level.tail is None  # under every limit
    core.config.queue_config.set_queue(["big", "max_memory_size", "400"])
    ids.append(bytes(s("ADDJOB", "big", "x" * 10, 0)))
    assert level.tail.live == 21  # down to the limit at once (610 -> 400 bytes), no further
    assert core.read_behind.draining
    advance(core, clock, 1_000)  # later steps (ticks) go on, 2 jobs per 50 ms, down to 90 %
    assert level.tail.live == 25 and big.nbytes - level.tail.nbytes == 360
    assert not core.read_behind.draining
    check_core(core)
    assert [e[1] for e in s("QPEEK", "big", 61)] == ids  # in order across memory and disk


def test_replicas_go_to_disk_and_come_back_when_their_time_comes(monkeypatch):
    monkeypatch.setattr(support, "FORCE_READ_BEHIND", True)
    mesh = Mesh(2, node_timeout=1000)
    mesh.meet(1, 0)
    mesh.wait_for(lambda: all(len(c.membership.reachable()) == 1 for c in mesh.cores if c), 5000)
    ids = [mesh.reply(mesh.call(0, "ADDJOB", "q", f"body{i}", 0, "REPLICATE", 2, "RETRY", 2)) for i in range(5)]
    job_id = ids[0]
    holder = mesh.core(1)
    assert holder.read_behind.counts() == (0, 5) and mesh.core(0).read_behind.counts() == (3, 0)  # copies on disk
    mesh.advance(2_000)  # the copies' WILLQUEUE: the creator reads the jobs it has on disk, and leaves them there
    assert mesh.core(0).read_behind.counts() == (3, 0)
    mesh.kill(0)
    mesh.advance(4_000)  # their retry comes: the copies are loaded and queued here (three go back to disk, queued)
    assert holder.read_behind.counts() == (3, 0) and Session(holder)("QLEN", "q") == 5
    assert dict(Session(holder)("SHOW", job_id))[b"state"] == "queued"


# ---------------------------------------------------------------- failures


def test_a_disk_that_cannot_write_keeps_the_jobs_and_refuses_writes(monkeypatch):
    core, clock, s = forced()
    add(s, 4)
    real = os.pwrite
    s("ADDJOB", "q", "delayed", 0, "DELAY", 1)
    monkeypatch.setattr(os, "pwrite", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    advance(core, clock, 200)  # the cron writes the buffer
    assert s("ADDJOB", "q", "more", 0).code == "MISCONF"
    assert bodies(s("QPEEK", "q", 4)) == [b"body0", b"body1", b"body2", b"body3"]  # readable meanwhile
    advance(core, clock, 1_000)  # the delayed job is queued: it stays in memory
    assert info(core)["jobs_on_disk"] == 2
    monkeypatch.setattr(os, "pwrite", real)
    advance(core, clock, 200)
    assert info(core)["read_behind_error"] == "" and isinstance(s("ADDJOB", "q", "more", 0), bytes)
    assert s("QLEN", "q") == 6


def test_consumers_drain_the_backlog_that_filled_the_disk(monkeypatch):
    core, clock, s = forced()
    ids = add(s, 6)
    monkeypatch.setattr(os, "pwrite", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    advance(core, clock, 200)  # the cron writes the buffer: the disk is full
    assert info(core)["read_behind_error"] == "No space left on device"
    for refused in (s("ADDJOB", "q", "more", 0), s("QADD", "events", 60, "e"), s("ENQUEUE", ids[0]), s("PING")):
        assert refused.code == "MISCONF" and "read-behind" in str(refused)  # what adds data (and PING)
    got = s("GETJOB", "COUNT", 10, "FROM", "q")  # read back from disk, two at a time, as usual
    assert bodies(got) == [b"body%d" % i for i in range(6)]
    assert s("ACKJOB", *(e[1] for e in got)) == 6 and s("QLEN", "q") == 0 and info(core)["jobs_on_disk"] == 0
    assert s("DELJOB", ids[0]) == 0 and s("QLEN", "q") == 0 and s("WORKING", ids[1]).code == "NOJOB"
    monkeypatch.undo()
    advance(core, clock, 200)
    assert info(core)["read_behind_error"] == "" and s("PING") == b"PONG"
    check_core(core)


def test_a_disk_that_cannot_read_leaves_the_jobs_there(monkeypatch):
    core, clock, s = forced()
    add(s, 8)
    s("GETJOB", "COUNT", 2, "FROM", "q")  # the head refills with two, four stay on disk
    core.read_behind.bodies.flush()
    monkeypatch.setattr(os, "pread", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))
    assert bodies(s("QPEEK", "q", 3)) == [b"body2", b"body3"]  # what can be read
    assert s("QLEN", "q") == 6 and info(core)["read_behind_error"] == "Input/output error"
    refused = s("ADDJOB", "q", "more", 0)  # what adds data is refused
    assert refused.code == "MISCONF" and "read-behind" in str(refused)
    assert bodies(s("GETJOB", "COUNT", 9, "FROM", "q")) == [b"body2", b"body3"]  # consumers get what can be read
    monkeypatch.undo()
    advance(core, clock, 200)  # the cron reads again: the error is over
    assert info(core)["read_behind_error"] == "" and s("QLEN", "q") == 4
    assert bodies(s("GETJOB", "COUNT", 9, "FROM", "q")) == [b"body%d" % i for i in range(4, 8)]


def test_clients_kept_waiting_by_the_disk_are_served_once_it_reads_again(monkeypatch):
    core, clock, s = forced()
    s("PAUSE", "q", "out")
    add(s, 4)  # two in memory, two on disk
    waiters = [Session(core) for _ in range(3)]
    for waiter in waiters:
        assert waiter("GETJOB", "TIMEOUT", 5000, "FROM", "q") is not None  # blocked: the queue is paused
    core.read_behind.bodies.flush()
    monkeypatch.setattr(os, "pread", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))
    s("PAUSE", "q", "none")  # two served from memory; the disk fails the third
    assert [bodies(w.pending()[0]) for w in waiters[:2]] == [[b"body0"], [b"body1"]] and waiters[2].pending() == []
    monkeypatch.undo()
    advance(core, clock, 200)
    assert bodies(waiters[2].pending()[0]) == [b"body2"]


def test_a_damaged_record_is_a_lost_copy_not_a_crash():
    core, clock, s = forced()
    add(s, 4)
    store = core.read_behind.bodies
    store.flush()
    path = os.path.join(store.dir, "0.seg")
    data = bytearray(open(path, "rb").read())
    data[40] ^= 0xFF  # inside the first record on disk
    open(path, "wb").write(data)
    got = s("GETJOB", "COUNT", 4, "FROM", "q")
    assert bodies(got) == [b"body0", b"body1", b"body3"]
    assert info(core)["lost_records"] == 1 and s("QLEN", "q") == 0
    check_core(core)


def test_mostly_dead_segments_are_compacted(monkeypatch):
    monkeypatch.setattr(seg, "SEGMENT_BYTES", 1000)
    core, clock, s = forced()
    ids = add(s, 40)
    store = core.read_behind.bodies
    assert store.figures()["segments"] > 2
    for job_id in ids[2:30]:
        s("ACKJOB", job_id)
    advance(core, clock, 1_000)
    assert info(core)["compacted_bytes"] > 0
    assert store.figures()["segments"] <= 3
    assert bodies(s("GETJOB", "COUNT", 20, "FROM", "q")) == [b"body%d" % i for i in (0, 1, *range(30, 40))]
    check_core(core)


# ---------------------------------------------------------------- the AOF


def _blob(n: int, marker: bool, ordered: bool = False) -> tuple[bytes, list[bytes]]:
    src, _, _ = make_core(read_behind="no")
    s = Session(src)
    ids = add(s, n)
    s("GETJOB", "FROM", "q")  # the first one is active
    jobs = sorted(src.jobs.values(), key=Job.sort_key) if ordered else src.jobs.values()  # (the table's order: not)
    blob = b"".join(encode_loadjob(job) for job in jobs)
    return blob + (encode_clean_marker(START_MS) if marker else b""), ids


@pytest.mark.parametrize("ordered", [False, True])
def test_a_replay_past_the_budget_spills_and_requeues_in_order_when_trusted(ordered):
    blob, ids = _blob(30, marker=True, ordered=ordered)
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=2)
    assert replay(core, blob) == 29
    s = Session(core)
    assert s("QLEN", "q") == 29
    core.tick()
    assert info(core)["jobs_on_disk"] >= 27
    assert [e[1] for e in s("GETJOB", "COUNT", 30, "FROM", "q")] == ids[1:]
    check_core(core)


def test_a_replay_moves_the_jobs_it_kept_in_memory_to_disk_as_its_slots_outgrow_the_budget():
    src, _, _ = make_core(read_behind="no")
    Session(src)("QADD", "events", 600, "e")  # an event: never on disk, kept
    ids = add(Session(src), 1000)
    Session(src)("GETJOB", "FROM", "q")  # the first one is active
    jobs = sorted(src.jobs.values(), key=Job.sort_key)
    records = [encode_loadjob(job) for job in jobs]
    records.insert(4, encode_deljob(ids[2]))  # gone before the room is made
    blob = b"".join(records) + encode_clean_marker(START_MS)
    core, _, s = budgeted(2)
    core.config.job_memory_limit = core.memory.data() + 30_000  # room for about 50 jobs
    rep = applied(core, blob)
    # 999 slots (72 KB) alone pass the 30 KB of room: no job stays in memory but the event
    assert [job.queue for job in core.jobs.values()] == [b"events"] and info(core)["jobs_on_disk"] == 999
    assert rep.finish() == 998
    core.end_load()
    check_core(core)
    assert [e[1] for e in s("GETJOB", "COUNT", 1000, "FROM", "q")] == ids[1:2] + ids[3:]
    assert dict(s("SHOW", ids[0]))[b"state"] == "active"


def test_jobs_a_crash_left_on_disk_stay_there_when_their_retry_queues_them_again():
    """After kill -9 every job comes back active and its RETRY queues it
    again: the jobs queued again fall among those the queue already has on
    disk, and must go there too, while the RETRY timers of a whole second
    must not bring its jobs into memory at once."""
    src, _, _ = make_core(read_behind="no")
    ids = [bytes(Session(src)("ADDJOB", "q", b"%04d" % i + b"x" * 1000, 0, "RETRY", 1)) for i in range(3000)]
    blob = b"".join(encode_loadjob(job) for job in src.jobs.values())  # no clean marker: a crash
    core, clock, s = budgeted(100)
    room = 300 * core.memory.job_size(src.jobs.get(ids[0]))
    core.config.job_memory_limit = core.memory.data() + room
    rep = core.begin_load()
    reader = RecordReader()
    reader.feed(blob)
    for n, (offset, args) in enumerate(reader):
        rep.apply(offset, args)
        if n % 100 == 99:  # a replay that takes 300 ms: every RETRY falls due within a second
            clock.advance(10)
            rep.refresh_time()
    assert rep.finish() == 0
    core.end_load()
    most = 0

    def bounded() -> None:
        nonlocal most
        most = max(most, info(core)["jobs_in_memory"])
        assert core.memory.data() <= core.read_behind.limit() + room // 10  # (a tick loads a tenth of the room)

    advance(core, clock, 3_000, bounded)
    assert s("QLEN", "q") == 3000 and info(core)["jobs_on_disk"] > 2800
    assert most < 200  # the 100 kept for consumers, and what a tick loads (not 2,978 as before)
    check_core(core)
    assert [e[1] for e in s("GETJOB", "COUNT", 3000, "FROM", "q")] == ids  # in order


def test_a_job_its_retry_queued_while_the_replay_ran_goes_to_disk_only_through_its_queue():
    src, _, _ = make_core(read_behind="no")
    ids = [bytes(Session(src)("ADDJOB", "q", b"%04d" % i + b"x" * 1000, 0, "RETRY", 1)) for i in range(1000)]
    blob = b"".join(encode_loadjob(job) for job in src.jobs.values())
    core, clock, s = budgeted(10)
    core.config.job_memory_limit = core.memory.data() + 100 * core.memory.job_size(src.jobs.get(ids[0]))
    rep = core.begin_load()
    reader = RecordReader()
    reader.feed(blob)
    for n, (offset, args) in enumerate(reader):
        rep.apply(offset, args)
        if n % 50 == 49:  # a replay of 4 s, with the ticks the event loop runs between its steps
            clock.advance(200)
            core.tick()
            rep.refresh_time()
    rep.finish()
    core.end_load()
    check_core(core, settled=False)  # (the replay moved jobs queued meanwhile to disk as active ones, left in the queue too)
    advance(core, clock, 2_000)
    check_core(core)
    got = [e[1] for e in s("GETJOB", "COUNT", 2000, "FROM", "q")]
    assert sorted(got) == sorted(ids) and got == ids


def test_slots_are_sorted_by_creation_time_in_runs_then_merged(monkeypatch):
    from disque.core import read_behind

    monkeypatch.setattr(read_behind, "SORT_RUN", 7)
    rng = random.Random(3)
    ctime = array("Q", (rng.randrange(10**18) for _ in range(100)))
    slots = array("I", rng.sample(range(100), 60))
    ordered = read_behind.by_ctime(slots, ctime)
    assert list(ordered) == sorted(slots, key=ctime.__getitem__) and ordered.typecode == "I"


def test_an_untrusted_replay_leaves_the_jobs_on_disk_active():
    blob, ids = _blob(10, marker=False)
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=2)
    assert replay(core, blob) == 0
    assert core.read_behind.counts() == (0, 10) and not core.read_behind.index.flags.count(4)
    assert dict(Session(core)("SHOW", ids[3]))[b"state"] == "active"
    clock.advance(400_000)  # past its requeue time (RETRY 300) with no tick: loaded late, it gets the visits it missed
    assert dict(Session(core)("SHOW", ids[4]))[b"state"] == "queued"


def test_a_rewrite_snapshot_lists_the_journaled_jobs_on_disk():
    core, clock, s = forced()
    core.config.queue_config.set_queue(["transient", "journal", "false"])
    add(s, 5)
    add(s, 5, "transient")
    spilled = core.read_behind.snapshot()
    assert len(spilled) == 3
    assert {decode_queue(payload) for payload in spilled.payloads()} == {b"q"}
    spilled.release()


def decode_queue(payload: bytes) -> bytes:
    from disque.store.records import decode_storage

    return decode_storage(payload).queue  # type: ignore[return-value]


# ---------------------------------------------------------------- memory


def test_a_job_on_disk_costs_less_than_120_bytes():
    core, clock, s = forced()
    s("ADDJOB", "warm", "x", 0)
    n = 20_000
    used = core.memory.used
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            core.handle_command(s.client, [b"ADDJOB", b"q", b"%099d" % i, b"0"], support.RESP.run)
        core.read_behind.bodies.flush()
        traced = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert info(core)["jobs_on_disk"] == n - 2
    assert traced <= 120, traced
    counted = (core.memory.used - used) / n
    assert abs(counted - traced) <= 0.1 * traced, (counted, traced)  # `used_memory` counts what the index holds


# ---------------------------------------------------------------- edges


class Unloadable:
    """The job store's view of read-behind where every job on disk can be
    seen but none can be loaded."""

    def __init__(self, spilled: ReadBehind) -> None:
        self.spilled = spilled

    def load_id(self, job_id: bytes) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spilled, name)

    def __len__(self) -> int:
        return len(self.spilled)


def failing_reads(monkeypatch) -> None:
    monkeypatch.setattr(os, "pread", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))


def test_a_job_loaded_after_its_requeue_time_keeps_the_timer_phase_it_had_in_memory():
    core, clock, s = forced()
    ids = add(s, 5, "q", "RETRY", 2)  # requeue visits at 2 s, 4 s, 6 s... (each +-250 ms of jitter)
    advance(core, clock, 5_000)
    shown = dict(s("SHOW", ids[4]))  # on disk all along: its requeue time had stood still at 2 s
    assert 0 < shown[b"next-requeue-within"] <= 1_500  # the 6 s visit, not 5 s + RETRY
    assert s("DEQUEUE", ids[4]) == 1
    advance(core, clock, 1_500)
    assert s("QLEN", "q") == 5  # requeued at the 6 s visit, as in memory
    check_core(core)


def test_ids_that_share_a_hash_are_told_apart_by_their_record(monkeypatch):
    from disque.store import spill

    monkeypatch.setattr(spill, "id_hash", lambda job_id: 42)
    core, clock, s = forced()
    ids = add(s, 6)
    unknown = ids[0][:20] + (b"0" if ids[0][20:21] != b"0" else b"1") + ids[0][21:]
    assert dict(s("SHOW", ids[3]))[b"body"] == b"body3" and s("SHOW", unknown) is None
    assert sorted(j.id for j in all_jobs(core)) == sorted(ids)


def test_only_copies_that_can_move_go_to_disk():
    core, clock, s = budgeted(5)
    rb = core.read_behind
    ids = add(s, 3, "r")
    arrived = core.jobs.get(ids[0])
    rb.note_arrival(arrived)
    core.settle()  # under the budget: nothing moves
    assert rb.counts() == (0, 0)
    core.config.read_behind_prefetch = 2
    rb.force = True
    core.queues.get(b"r").levels[0].newest_in_head().nodes_confirmed = set()
    rb.grown[b"r"] = None
    core.settle()  # the newest cannot move: none of those before it does either
    assert rb.counts() == (0, 0)
    core.lifecycle.destroy_queue(core.queues.get(b"r"))  # no tail: nothing to bring back
    core, clock, s = forced()
    rb = core.read_behind
    ids = add(s, 3)
    kept = core.jobs.get(ids[0])
    rb.note_arrival(kept)  # queued: not an active copy
    rb.grown[b"gone"] = None  # a queue that went in the same step
    rb.drained[b"gone"] = None
    core.settle()
    assert core.jobs.resident(kept) and rb.counts() == (1, 0)
    s("ADDJOB", "q", "confirming", 0)
    confirming = core.queues.get(b"q").levels[0].newest_in_head()
    confirming.nodes_confirmed = set()  # its replication is being confirmed: it stays
    s("ADDJOB", "other", "x", 0)
    s("ADDJOB", "q", "late", 0, "DELAY", 1)
    advance(core, clock, 1_000)
    assert core.jobs.resident(confirming) and dict(s("SHOW", ids[2]))[b"state"] == "queued"


def test_a_replay_under_the_budget_keeps_everything_in_memory_and_skips_deleted_jobs():
    blob, ids = _blob(6, marker=False)
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=2)
    core.read_behind.force = False
    assert replay(core, blob) == 0 and core.read_behind.counts() == (0, 0)
    blob, ids = _blob(6, marker=False)
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=2)
    trusted = blob + encode_deljob(ids[3]) + encode_clean_marker(START_MS)
    assert replay(core, trusted) == 4  # five stored queued, one deleted later in the file
    assert Session(core)("QLEN", "q") == 4


def test_reads_that_fail_are_tried_again(monkeypatch):
    core, clock, s = forced()
    ids = add(s, 4, "q", "TTL", 2, "RETRY", 0)
    core.read_behind.bodies.flush()
    failing_reads(monkeypatch)
    assert sorted(s("JSCAN", "0", "BUSYLOOP")[1]) == sorted(ids[:2])  # those on disk cannot be read
    advance(core, clock, 3_000)  # due to expire, but unreadable: tried again every second
    assert s("QLEN", "q") == 2
    core.lifecycle.destroy_queue(core.queues.get(b"q"))  # its jobs on disk cannot come back: they stay there
    assert core.read_behind.counts() == (0, 2)
    monkeypatch.undo()
    advance(core, clock, 1_000)
    assert core.read_behind.counts() == (0, 0) and info(core)["read_behind_error"] == ""


def test_flushes_and_compaction_get_past_unreadable_records(monkeypatch):
    monkeypatch.setattr(seg, "SEGMENT_BYTES", 500)
    core, clock, s = forced()
    ids = add(s, 12)  # ten on disk, three records a segment
    for n in (2, 3, 4, 5, 6, 9):
        s("ACKJOB", ids[n])
    store = core.read_behind.bodies
    store.flush()
    assert store.sparse() is not None
    with monkeypatch.context() as broken:
        failing_reads(broken)
        advance(core, clock, 200)  # compaction cannot read: leaves the records
        assert info(core)["compacted_bytes"] == 0
    with monkeypatch.context() as broken:
        broken.setattr(core.jobs, "spilled", Unloadable(core.read_behind))
        core.items.flush(b"q")  # the two in memory go; the rest can be seen but not loaded
        assert s("QLEN", "q") == 4
    with monkeypatch.context() as broken:
        failing_reads(broken)
        s("DEBUG", "FLUSHALL")
        assert core.read_behind.counts() == (0, 4)  # still on disk, their queue gone
    advance(core, clock, 200)
    assert info(core)["read_behind_error"] == ""
    left = [ids[n] for n in (7, 8, 10, 11)]
    assert {dict(s("SHOW", i))[b"state"] for i in left} == {"active"}  # back: out of the queue, as after a flush
    check_core(core)


def test_a_read_error_ends_when_nothing_is_left_to_read(monkeypatch):
    core, clock, s = forced()
    ids = add(s, 3)
    core.read_behind.bodies.flush()
    failing_reads(monkeypatch)
    assert bodies(s("QPEEK", "q", -1)) == [b"body1"]  # the newest one, on disk, cannot be read
    monkeypatch.undo()
    s("DEBUG", "FLUSHALL")
    assert info(core)["jobs_on_disk"] == 0 and ids
    core.read_behind.read_error = "Input/output error"
    advance(core, clock, 200)
    assert info(core)["read_behind_error"] == ""


def test_a_cursor_past_the_buckets_ends_a_scan_without_read_behind():
    core, clock, _ = make_core(read_behind="no")
    assert Session(core)("JSCAN", "5000") == [b"0", []]


def test_a_trusted_replay_queues_a_long_backlog_in_steps():
    blob, ids = _blob(1100, marker=True)
    core, clock, _ = make_core(read_behind="no")
    assert replay(core, blob) == 1099  # in two steps: the event loop runs between them (the shell's `requeue`)
    assert Session(core)("QLEN", "q") == 1099


def test_the_newest_job_in_memory_skips_the_tombstones_at_the_end():
    q = Queue(b"q", 0)
    jobs = [Job(b"%048d" % i, b"q", b"", State.ACTIVE, ctime=i) for i in range(3)]
    for job in jobs:
        job.move(ENQUEUE)
        q.push(job)
    jobs[2].move(DEQUEUE)
    q.discard(jobs[2])
    level = q.levels[0]
    assert level.newest_in_head() is jobs[1] and level.pop_newest() is jobs[1] and level.newest_in_head() is jobs[0]
