"""Structural invariants of a `NodeCore`, checked after every step by the
stateful model test and the command fuzzer.

`check_core` looks at the core's internals (the job table, the timer, the
queues, the blocked clients, the memory estimate) and at what INFO reports;
it knows nothing about how the core got there.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine

from disque.protocols.resp import admin
from disque.core.memory import QUEUE_OVERHEAD
from disque.core.node import NodeCore
from disque.core.read_behind import ReadBehind
from disque.store.job import DELIVERED, IN_LIST, IN_TIMER, State
from disque.store.spill import IN_TAIL, LIVE


def check_core(core: NodeCore, *, settled: bool = True) -> None:
    """Raise AssertionError on the first broken invariant.

    `settled`: the shell has run `tick()` at every deadline so far, so no
    job is overdue (true when time only moves through the `tick` helper)."""
    jobs = {job.id: job for job in core.jobs.values()}
    spill = core.read_behind if isinstance(core.read_behind, ReadBehind) else None  # (not its do-nothing form)
    on_disk = 0 if spill is None else spill.index.live
    assert len(jobs) + on_disk == len(core.jobs)
    now = core.clock.now_ms()
    if spill is not None:
        check_spilled(core, settled)

    # -- queues hold only queued jobs, in (ctime, id) order ----------------
    listed: dict[int, object] = {}  # id(job) -> job, every deque entry
    live_in: dict[bytes, bytes] = {}  # job id -> queue name
    for queue in core.queues.values():
        assert core.queues.get(queue.name) is queue
        priorities = [level.priority for level in queue.levels]
        assert priorities == sorted(set(priorities), reverse=True), f"queue {queue.name!r}: levels {priorities}"
        total = 0
        lanes = [(level, None) for level in queue.levels]  # (a level, the key of a keyed job's: fair GETJOB)
        if queue.fair is not None:
            assert set(queue.fair.turns) == {b"", *queue.fair.lanes}, f"queue {queue.name!r}: turns and lanes differ"
            assert queue.fair.live == sum(lane.live for lane in queue.fair.lanes.values())
            lanes += [(lane, key) for key, lane in queue.fair.lanes.items()]
        for level, key in lanes:
            entries = list(level.items)
            for job in entries:
                assert job.flags & IN_LIST, f"{job} in {queue.name!r} without IN_LIST"
                assert id(job) not in listed, f"{job} listed twice"
                if key is None:
                    assert job.priority == level.priority, f"{job} in the level of priority {level.priority}"
                    assert not job.key, f"keyed {job} in a level"
                else:
                    assert job.key == key, f"{job} in the lane of {key!r}"
                listed[id(job)] = job
            live = [job for job in entries if job.state == State.QUEUED]
            assert level.live == len(live) + (level.tail.live if level.tail else 0), (queue.name, level.priority)
            total += level.live
            keys = [job.sort_key() for job in live]
            assert keys == sorted(set(keys)), f"queue {queue.name!r} out of order"
            for job in live:
                assert jobs.get(job.id) is job, f"unregistered {job} queued in {queue.name!r}"
                assert job.queue == queue.name
                live_in[job.id] = queue.name
        assert len(queue) == total, (queue.name, len(queue), total)
        if queue.waiters and not queue.pause & 2:  # PAUSE_OUT
            assert not len(queue) or queue.name in core.limits.throttled, f"queue {queue.name!r} has both waiters and jobs"
    assert not core.blocking.ready, "ready queues left unserved"

    # -- every job: one state, consistent timers and flags -----------------
    buckets = core.jobs._buckets
    for at, bucket in buckets.items():
        listed_at = [(pos, job) for pos, job in enumerate(bucket.jobs) if job is not None]  # None: a job left
        assert all(job.flags & IN_TIMER and job.awake == at and job.tpos == pos for pos, job in listed_at)
        assert bucket.live == len(listed_at) > 0, f"bucket {at} counts {bucket.live} jobs, lists {len(listed_at)}"
    scheduled = sum(b.live for b in buckets.values())
    assert scheduled == len(jobs), f"{scheduled} jobs in the timer, {len(jobs)} in the store"
    assert set(buckets) <= set(core.jobs._heap)
    for job in jobs.values():
        assert job.state in State
        assert (job.id in live_in) == (job.state == State.QUEUED), job
        if not job.flags & IN_LIST:
            assert id(job) not in listed
        assert job.flags & IN_TIMER and job.awake in buckets, f"{job} has no awake time"
        assert buckets[job.awake].jobs[job.tpos] is job
        assert job.awake <= job.etime * 1000 + 1000
        if settled:
            assert job.awake > now, f"{job} overdue: awake {job.awake} <= now {now}"
            assert now < job.etime * 1000 + 1000, f"{job} outlived its TTL"
        if job.state in (State.ACTIVE, State.QUEUED):
            assert job.queue is not None and job.body is not None
            if job.retry == 0:
                if job.state == State.QUEUED or job.flags & DELIVERED:
                    assert job.qtime == 0, f"RETRY 0 {job} may be queued again"
            else:
                assert job.qtime != 0 or job.parents, f"{job} would never be requeued"  # (held: core/dependencies.py)
        if core.membership.size() == 1 and set(job.nodes_delivered) <= set(core.membership.nodes):
            # (a node alone after CLUSTER FORGET keeps the jobs it shared with the peers it forgot)
            assert job.state != State.ACKED, f"single node kept acked {job}"
            assert job.nodes_delivered == (core.membership.my_id,)
    awake = core.jobs.next_awake()
    assert awake == (min(j.awake for j in jobs.values()) if jobs else None)

    # -- blocked clients ---------------------------------------------------
    for client_id, waiter in core.blocking.blocked.items():
        assert waiter.client.id == client_id and waiter.client.waiter is waiter
        assert core.clients.get(client_id) is waiter.client
        for job_id in waiter.jobs or ():  # WAITJOB: indexed by every job it waits for, each still pending here
            assert waiter in core.blocking.job_waits[job_id] and job_id in core.jobs  # (`get` would load a job on disk)
        for name in waiter.queues:
            queue = core.queues.get(name)
            assert queue is not None and queue.waiters.get(client_id) is waiter
    for queue in core.queues.values():
        for client_id, waiter in queue.waiters.items():
            assert core.blocking.blocked.get(client_id) is waiter and queue.name in waiter.queues
    for client in core.clients.values():
        assert client.waiter is None or core.blocking.blocked.get(client.id) is client.waiter
    for job_id, waits in core.blocking.job_waits.items():
        assert waits and all(core.blocking.blocked.get(w.client.id) is w and job_id in (w.jobs or ()) for w in waits)

    # -- memory estimate and INFO ------------------------------------------
    held = 0 if spill is None else spill.held  # the index as allocated, beyond the empty one
    if spill is not None:
        assert held == spill.index.nbytes() - spill._empty
    expected = core.memory.base + sum(core.memory.job_size(j) for j in jobs.values()) + held
    expected += sum(QUEUE_OVERHEAD + len(q.name) for q in core.queues.values()) + core.groups.size() + core.schedules.size()
    expected += core.keys.size()
    assert core.memory.data() == expected, (core.memory.data(), expected)
    assert core.memory.retained >= 0 and (spill is not None or not core.memory.retained)
    assert core.memory.peak >= core.memory.used
    info = admin.info(core, "jobs") + admin.info(core, "queues")
    assert b"registered_jobs:%d\r\n" % (len(jobs) + on_disk) in info
    assert b"registered_queues:%d\r\n" % len(core.queues) in info


def check_spilled(core: NodeCore, settled: bool) -> None:
    """Read-behind: the index, the queues' tails and the wheel agree."""
    spill = core.read_behind
    assert isinstance(spill, ReadBehind)
    index = spill.index
    flags = index.flags
    live = [slot for slot in range(len(flags)) if flags[slot] & LIVE]
    assert len(live) == index.live
    assert sum(index.size[slot] for slot in live) == index.live_bytes
    assert sum(1 for v in index._table if v not in (0, 0xFFFFFFFF)) == index.live, "the ID table lists exactly the live slots"
    tailed: set[int] = set()
    for queue in core.queues.values():
        for level in queue.levels:
            tail = level.tail
            if tail is None:
                continue
            slots = list(tail.oldest())
            assert len(slots) == tail.live and sum(index.blen[s] for s in slots) == tail.nbytes
            assert all(flags[s] & IN_TAIL and index.queue_of(s) == queue.name for s in slots)
            assert all(index.priority[s] == level.priority for s in slots)
            ctimes = [index.ctime[s] for s in slots]
            assert ctimes == sorted(ctimes), f"tail of {queue.name!r} out of order"
            tailed.update(slots)
    assert tailed == {slot for slot in live if flags[slot] & IN_TAIL}
    now_s = core.clock.now_ms() // 1000
    for slot in live:
        second = index.awake[slot]
        assert slot in index.wheel.get(second, ()), f"slot {slot} has no wheel entry"
        if settled:
            assert second > now_s, f"slot {slot} overdue: second {second}, now {now_s}"
        job = spill.peek(slot)
        assert job is not None and job.id not in core.jobs._jobs, "a job both in memory and on disk"
        assert job.state == (State.QUEUED if flags[slot] & IN_TAIL else State.ACTIVE)


def advance(core: NodeCore, clock, ms: int, on_tick=None) -> None:
    """Move the fake clock forward by `ms`, calling `tick()` at every deadline
    on the way as the shell does (and `on_tick()` after each one)."""
    end = clock.ms + ms
    while clock.ms < end:
        clock.ms = min(end, max(clock.ms + 1, core.next_deadline()))
        core.tick()
        if on_tick is not None:
            on_tick()


def quick_and_slow(machine: type[RuleBasedStateMachine], quick: tuple[int, int], slow: tuple[int, int]) -> tuple[type, type]:
    """Test cases for a stateful machine: one run by default and a longer one
    marked slow, each with its (examples, steps per example)."""

    def case(cls: type[RuleBasedStateMachine], examples: int, steps: int) -> type:
        test_case = cls.TestCase
        test_case.settings = settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        )
        return test_case

    longer = type(f"{machine.__name__}Long", (machine,), {})
    return case(machine, *quick), pytest.mark.timeout(3600)(pytest.mark.slow(case(longer, *slow)))
