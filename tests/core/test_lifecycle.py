"""Focused tests of the job lifecycle, memory pressure, queue GC, blocking,
the stores (timer, queues, scannable dict), IDs, errors and the command
layer: the cases the model and the fuzzer reach rarely or not at all."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque.core import errors, figures
from disque.store import ids
from disque.cluster import messages as m
from disque.protocols.resp.table import COMMANDS
from disque.core.effects import AofAppend
from disque.core.errors import DisqueError
from disque.core.types import BLOCKED, NIL_ARRAY, SILENT, Status
from disque.core.memory import BASE_MEMORY, QUEUE_OVERHEAD
from disque.core.node import BLOCKED_CRON_MS
from disque.store.job import ABORT, ACK, ADOPT, AWAIT_REPL, DEQUEUE, ENQUEUE, FETCH, IN_LIST, RARE_BYTES, REPLICATED, TRANSITIONS, Job, State
from disque.store.jobs import MAX_JOBS_PER_PASS, JobStore
from disque.store.queue import Queue
from disque.store.scan import MIN_SLOTS, NBUCKETS, BucketedDict, JobIndex
from disque.protocols.resp.front import RESP
from invariants import advance, check_core
from support import Env as CoreEnv
from support import NODE_ID, START_MS, Session, bus_sent, linked_core, make_core

PEER = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
ODD_ID = b"DI" + b"f" * 40 + b"05a1SQ"  # unknown, at-least-once TTL field
EVEN_ID = b"DI" + b"f" * 40 + b"05a0SQ"


class Env(CoreEnv):
    """The shared Env with the job helpers these tests use."""

    def add(self, queue="q", body="b", *opts) -> bytes:
        reply = self.s("ADDJOB", queue, body, 0, *opts)
        assert isinstance(reply, Status), reply
        return bytes(reply)

    def show(self, job_id: bytes) -> dict | None:
        return self.s.show(job_id)

    def state(self, job_id: bytes) -> str | None:
        shown = self.show(job_id)
        return None if shown is None else shown["state"]

    def wait(self, ms: int) -> None:
        advance(self.core, self.clock, ms)

    def sent(self) -> list:
        return bus_sent(self.core)

    def check(self) -> None:
        check_core(self.core)


def make_env(**config) -> Env:
    return Env.of(*make_core(**config))


@pytest.fixture
def env() -> Env:
    return make_env()


@pytest.fixture
def duo() -> Env:
    """A node that knows one linked peer (PEER): what it sends is in effects."""
    conf = f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n{PEER} 127.0.0.1:7712 noflags 0 0 connected\n"
    return Env.of(*linked_core(conf, (PEER,)))


def from_peer(env: Env, msg) -> None:
    key = env.core.cluster.nodes[PEER].key
    env.core.handle_bus(m.Header(PEER, 7712, 0), msg, key=key)


# ---------------------------------------------------------------- timers


def test_requeue_happens_exactly_at_qtime_with_willqueue_lead(env):
    job_id = env.add("q", "x", "RETRY", 2)
    shown = env.show(job_id)
    due = shown["next-requeue-within"]
    assert 2000 - 250 <= due <= 2000 + 249 and shown["next-awake-within"] == due - 500
    assert env.s("GETJOB", "FROM", "q")[0][1] == job_id
    env.wait(due - 1)
    assert env.s("QLEN", "q") == 0 and env.show(job_id)["next-awake-within"] == 1  # WILLQUEUE visit done
    env.wait(1)
    assert env.s("QLEN", "q") == 1
    shown = env.show(job_id)
    assert shown["additional-deliveries"] == 1 and 2000 - 250 <= shown["next-requeue-within"] <= 2000 + 249
    env.check()


def test_job_waiting_in_queue_past_qtime_is_not_duplicated(env):
    job_id = env.add("q", "x", "RETRY", 1)
    env.wait(5_000)
    assert env.s("QLEN", "q") == 1 and dict(env.s("QSTAT", "q"))[b"jobs-in"] == 1
    assert 0 < env.show(job_id)["next-requeue-within"] <= 1249
    env.check()


def test_input_pause_postpones_requeue_but_not_delayed_retry0(env):
    again = env.add("q", "again", "RETRY", 1)
    env.s("GETJOB", "FROM", "q")
    once = env.add("q", "once", "RETRY", 0, "DELAY", 1)
    assert env.s("PAUSE", "q", "in") == Status(b"in")
    env.wait(3_000)
    assert env.state(again) == "active" and env.state(once) == "queued"
    pushed = env.show(again)["next-requeue-within"]
    assert 0 < pushed <= 1249
    env.s("PAUSE", "q", "none")
    env.wait(pushed)
    assert env.state(again) == "queued"
    env.check()


@pytest.mark.parametrize("opts", [(), ("DELAY", 2)])
def test_working_on_retry0_job(env, opts):
    job_id = env.add("q", "x", "RETRY", 0, *opts)
    assert env.s("WORKING", job_id) == 0
    assert env.state(job_id) == "active"
    env.wait(3_000)
    if opts:  # a delayed at-most-once job keeps its one queueing
        assert env.s("GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    assert env.s("ENQUEUE", job_id) == 0 and env.s("NACK", job_id) == 0
    assert env.s("GETJOB", "NOHANG", "FROM", "q") is NIL_ARRAY
    env.check()


def test_nack_before_the_first_queueing_leaves_it_silent(env):
    job_id = env.add("q", "x", "RETRY", 5, "DELAY", 2)
    assert env.s("NACK", job_id) == 1
    env.s("GETJOB", "FROM", "q")
    env.wait(6_000)  # the timer's requeue is the first plain queueing: not counted
    shown = env.show(job_id)
    assert shown["state"] == "queued" and (shown["nacks"], shown["additional-deliveries"]) == (1, 0)
    env.s("DEQUEUE", job_id)
    assert env.s("ENQUEUE", job_id) == 1 and env.show(job_id)["additional-deliveries"] == 1


def test_counters_saturate_at_16_bits(env):
    job_id = env.add("q", "x")
    job = env.core.jobs.get(job_id)
    job.nacks = job.deliv = 0xFFFF
    for command in ("NACK", "ENQUEUE"):
        env.s("DEQUEUE", job_id)
        env.s(command, job_id)
    assert (job.nacks, job.deliv) == (0xFFFF, 0xFFFF)


@pytest.mark.parametrize("retry", [3, 0])
def test_early_scheduler_visit_changes_nothing(env, retry):
    """A visit before qtime (the job was rescheduled for another reason)
    must neither queue the job nor move its timer."""
    job_id = env.add("q", "x", "RETRY", retry)
    env.s("GETJOB", "FROM", "q")
    job = env.core.jobs.get(job_id)
    job.flags &= ~2  # WILLQUEUE already announced
    qtime, awake = job.qtime, job.awake
    env.core.jobs.schedule(job, env.clock.ms + 1)
    env.wait(1)
    assert job.state == State.ACTIVE and job.qtime == qtime and job.awake == (qtime or awake)


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


def test_scheduler_pass_is_bounded(env):
    for i in range(MAX_JOBS_PER_PASS + 5):
        env.core.handle_command(env.s.client, [b"ADDJOB", b"q", b"x", b"0", b"TTL", b"1", b"RETRY", b"0"], RESP.run)
    expiry = env.core.jobs.next_awake()
    env.clock.ms = expiry
    env.core.tick()
    assert len(env.core.jobs) == 5 and env.core.next_deadline() == expiry  # the rest: at once
    env.core.tick()
    assert len(env.core.jobs) == 0
    env.check()


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


def test_the_fields_few_jobs_set_share_one_record_made_when_first_needed():
    job = Job(b"a" * 48, b"q", b"")
    job.nacks = job.gc_retry = 0  # (resetting what is unset makes nothing)
    assert job.rare is None and (job.delay, job.nacks, job.max_attempts, job.gc_retry) == (0, 0, 0, 0)
    job.nacks = 1  # a NACK
    assert job.rare is not None and job.nacks == 1 and job.extra_size() == 0  # charged as it was made
    delayed = Job(b"b" * 48, b"q", b"", delay=5)
    assert delayed.delay == 5 and delayed.extra_size() == RARE_BYTES
    delayed.set_attempts(3, b"dead")
    assert (delayed.max_attempts, delayed.dead_letter, delayed.delay) == (3, b"dead", 5)


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


def test_ttl_field_of_ids_is_minutes_and_parity_records_retry():
    cases = [  # spec/commands.md §2.2
        (86400, 1, b"05a1"), (86400, 0, b"05a0"), (59, 1, b"0001"), (59, 0, b"0000"),
        (180, 0, b"0002"), (120, 0, b"0002"), (300_000_000, 1, b"ffff"), (300_000_000, 0, b"fffe"),
    ]  # fmt: skip
    rng = random.Random(3)
    for ttl, retry, field in cases:
        job_id = ids.new_job_id(NODE_ID, rng, ttl, retry)
        assert job_id[42:46] == field and ids.ttl_minutes(job_id) == int(field, 16)
        assert ids.valid_id(job_id) and job_id[:10] == b"DI" + NODE_ID[:8].encode()
        assert ids.node_prefix(job_id) == NODE_ID[:8]
        assert all(c in b"0123456789abcdef" for c in job_id[10:46])


@pytest.mark.parametrize(
    "job_id, valid, minutes",
    [
        (b"DI" + b"x" * 40 + b"05A1SQ", True, 0x5A1),  # case-insensitive
        (b"DI" + b"x" * 40 + b"0g1zSQ", True, 0x010),  # a non-hex digit counts as 0
        (b"DI" + b"x" * 44 + b"SQ", True, 0),
        (b"DJ" + b"x" * 44 + b"SQ", False, 0),
        (b"DI" + b"x" * 44 + b"SX", False, 0),
        (b"DI" + b"x" * 43 + b"SQ", False, 0),
    ],
)
def test_id_validation_and_ttl_field(job_id, valid, minutes):
    assert ids.valid_id(job_id) is valid
    if valid:
        assert ids.ttl_minutes(job_id) == minutes


def test_mixed_node_ids_follow_the_spec_formula():
    job_id = b"DI" + bytes(range(0x41, 0x41 + 44)) + b"SQ"
    expected = bytes(ord(c) ^ job_id[10 + i % 32] for i, c in enumerate(NODE_ID))
    assert ids.mixed(NODE_ID, job_id) == expected


def test_id_collision_is_refused(env):
    state = env.core.rng.getstate()
    job_id = env.add("q", "x")
    env.core.rng.setstate(state)
    reply = env.s("ADDJOB", "q", "y", 0)
    assert reply.message == "Internal error creating the job, check server logs"
    assert env.show(job_id)["body"] == b"x"


# ---------------------------------------------------------------- blocking


def test_clearing_out_pause_serves_blocked_clients(env):
    env.s("PAUSE", "q", "out")
    c1, c2 = Session(env.core), Session(env.core)
    assert c1("GETJOB", "FROM", "q") is BLOCKED and c2("GETJOB", "FROM", "q") is BLOCKED
    first, second = env.add("q", "1"), env.add("q", "2")
    assert c1.pending() == [] and env.s("QLEN", "q") == 2
    assert env.s("PAUSE", "q", "in") == Status(b"in")  # out cleared, in set
    assert c1.pending() == [[[b"q", first, b"1"]]] and c2.pending() == [[[b"q", second, b"2"]]]
    env.check()


def test_blocked_on_several_queues_gets_one_job_with_counters(env):
    c1 = Session(env.core)
    assert c1("GETJOB", "WITHCOUNTERS", "COUNT", 3, "FROM", "a", "b", "a") is BLOCKED
    assert env.core.blocking.blocked[c1.client.id].queues == (b"a", b"b")
    job_id = env.add("b", "x")
    assert c1.pending() == [[[b"b", job_id, b"x", b"nacks", 0, b"additional-deliveries", 0]]]
    assert dict(env.s("QSTAT", "a"))[b"blocked"] == 0
    env.check()


def test_getjob_rounds_over_queues(env):
    a = [env.add("a", f"a{i}") for i in range(3)]
    b = env.add("b", "b0")
    reply = env.s("GETJOB", "NOHANG", "COUNT", 10, "FROM", "a", "b", "a")
    assert [e[1] for e in reply] == [a[0], b, a[1], a[2]]
    c = [env.add("c", f"c{i}") for i in range(2)]
    assert [e[1] for e in env.s("GETJOB", "COUNT", 1, "FROM", "c", "missing")] == c[:1]
    assert env.s("QSTAT", "missing") is NIL_ARRAY  # COUNT reached before it was looked at


def test_leaving_node_answers_blocked_clients_and_refuses_to_block(env):
    c1 = Session(env.core)
    assert c1("GETJOB", "FROM", "q") is BLOCKED
    assert env.s("CLUSTER", "LEAVING", "yes") == Status(b"OK")
    env.wait(100)
    assert [e.code for e in c1.pending()] == ["LEAVING"]
    assert env.s("GETJOB", "FROM", "q").code == "LEAVING"
    assert env.s("GETJOB", "NOHANG", "FROM", "q") is NIL_ARRAY
    assert env.s("ADDJOB", "q", "x", 0).message.endswith("reason: I'm leaving the cluster")
    env.s("CLUSTER", "LEAVING", "no")
    assert isinstance(env.s("ADDJOB", "q", "x", 0), Status)


def test_flushall_answers_blocked_clients_and_forgets_queues(env):
    for name in ("a", "b"):
        env.add(name, "x")
    env.s("PAUSE", "p", "all")
    c1 = Session(env.core)
    c1("GETJOB", "FROM", "empty")
    assert env.s("DEBUG", "FLUSHALL") == Status(b"OK")
    assert c1.pending() == [NIL_ARRAY]
    assert env.s("QSCAN", "BUSYLOOP") == [b"0", []] and env.s("PAUSE", "p", "state") == Status(b"none")
    assert env.core.memory.used == BASE_MEMORY
    env.check()


def test_disconnect_is_idempotent_and_keeps_other_waiters(env):
    c1, c2 = Session(env.core), Session(env.core)
    c1("GETJOB", "FROM", "q")
    c2("GETJOB", "FROM", "q")
    env.core.disconnect(c1.client.id)
    env.core.disconnect(c1.client.id)
    env.core.disconnect(env.s.client.id)  # not blocked
    job_id = bytes(Session(env.core)("ADDJOB", "q", "x", 0))
    assert c2.pending() == [[[b"q", job_id, b"x"]]]


# ---------------------------------------------------------------- queue GC


@pytest.mark.parametrize(
    "maxmemory, level, idle_ms", [(1 << 30, 0, 300_000), (100_000, 1, 10_000), (90_000, 2, 2_000)]
)
def test_idle_queue_threshold_follows_memory_level(maxmemory, level, idle_ms):
    env = make_env(maxmemory=maxmemory)
    env.s("GETJOB", "NOHANG", "FROM", "tmp")
    assert env.core.memory.level() == level
    env.wait(idle_ms - 1)
    assert env.s("QSTAT", "tmp") is not NIL_ARRAY
    env.wait(100)
    assert env.s("QSTAT", "tmp") is NIL_ARRAY
    env.check()


@pytest.mark.parametrize("setup", ["paused", "blocked", "queued"])
def test_queue_in_use_is_never_collected(env, setup):
    if setup == "paused":
        env.s("PAUSE", "q", "in")
    elif setup == "blocked":
        Session(env.core)("GETJOB", "FROM", "q")
    else:
        env.add("q", "x", "RETRY", 1000)
    env.wait(301_000)
    assert dict(env.s("QSTAT", "q"))[b"name"] == b"q"


def test_queue_gc_reaches_every_queue_of_a_big_table(env):
    for i in range(40):
        env.s("GETJOB", "NOHANG", "FROM", f"q{i}")
    env.wait(300_000)
    assert len(env.core.queues) == 40  # not idle long enough yet
    env.wait(1_000)
    assert len(env.core.queues) == 0


def test_destroying_a_queue_with_jobs_leaves_them_active(env):
    """Only flushes destroy a non-empty queue; its jobs must not stay queued."""
    ids_ = [env.add("q", str(i)) for i in range(3)]
    env.s("DEQUEUE", ids_[1])
    env.core.lifecycle.destroy_queue(env.core.queues.get(b"q"))
    assert [env.core.jobs.get(i).state for i in ids_] == [State.ACTIVE] * 3
    assert not any(env.core.jobs.get(i).flags & IN_LIST for i in ids_)
    assert env.s("ENQUEUE", *ids_) == 3 and [e[1] for e in env.s("QPEEK", "q", 10)] == ids_
    env.check()


# ---------------------------------------------------------------- memory


def level2_limit(used: int) -> int:
    """A maxmemory that puts `used` just above 95 %."""
    return (used - 1) * 100 // 95 // 100 * 100


def test_level1_adds_need_external_replication(env):
    env.core.config.maxmemory = env.core.memory.used * 100 // 80
    assert env.core.memory.level() == 1
    reply = env.s("ADDJOB", "q", "x", 0)
    assert reply.code == "NOREPL" and reply.message.endswith("reason: I'm out of memory")
    assert env.s("ADDJOB", "q", "x", 0, "REPLICATE", 3).message == errors.norepl_reach().message


def test_info_memory_shows_the_data_the_fixed_part_and_the_level(env):
    """used_memory is the data; the process's fixed part (the shell's
    measure at start) and its RSS are shown apart; the level is named, in
    INFO and in the figures."""

    def memory() -> dict[bytes, bytes]:
        lines = env.s("INFO", "memory").split(b"\r\n")[1:-1]
        return dict(line.split(b":", 1) for line in lines)

    env.add("q", "x" * 1000)
    used = env.core.memory.used
    fields = memory()
    assert int(fields[b"used_memory"]) == used > BASE_MEMORY + 1000
    assert (fields[b"used_memory_rss"], fields[b"used_memory_startup"]) == (b"10000000", b"9000000")
    assert fields[b"mem_fragmentation_ratio"] == b"%.2f" % (10_000_000 / (9_000_000 + used))
    assert (fields[b"maxmemory"], fields[b"maxmemory_policy"]) == (b"%d" % (1 << 30), b"acks")
    for maxmemory, level, name in ((1 << 30, 0, b"ok"), (used * 100 // 80, 1, b"warning"), (level2_limit(used), 2, b"oom")):
        env.core.config.maxmemory = maxmemory
        fields = memory()
        assert (fields[b"mem_level"], fields[b"mem_level_name"]) == (b"%d" % level, name)
        assert figures.node_figures(env.core)["mem_level"] == level


def test_eviction_drops_delivered_retry0_jobs_only(env):
    big = "x" * 50_000
    delivered = [env.add("q", big, "RETRY", 0) for _ in range(2)]
    env.s("GETJOB", "COUNT", 2, "FROM", "q")
    kept = [env.add("q", "never delivered", "RETRY", 0), env.add("r", "at least once", "RETRY", 5)]
    env.s("GETJOB", "FROM", "r")
    env.core.config.maxmemory = level2_limit(env.core.memory.used - 2 * 49_000)
    assert env.core.memory.level() == 2
    assert env.s("PING") == Status(b"PONG")  # any command evicts
    assert [env.show(i) for i in delivered] == [None, None]
    assert env.core.memory.level() < 2 and all(env.show(i) for i in kept)
    env.check()


@pytest.mark.parametrize("policy", ["acks", "noeviction"])
def test_oom_when_nothing_can_be_evicted(env, policy):
    job_id = env.add("q", "x" * 10_000)
    delivered = env.add("q", "y", "RETRY", 0)
    env.s("DEQUEUE", job_id)
    env.s("GETJOB", "FROM", "q")
    env.core.config.maxmemory_policy = policy
    env.core.config.maxmemory = level2_limit(env.core.memory.used - 5_000)
    for argv in (("ADDJOB", "q", "z", 0), ("ENQUEUE", job_id), ("NACK", job_id)):
        assert env.s(*argv).code == "OOM"
    assert env.s("QLEN", "q") == 0 and env.s("DEQUEUE", job_id) == 0  # not deny-OOM
    assert (env.show(delivered) is None) == (policy == "acks")


@pytest.mark.parametrize("evictable", [0, 30])
def test_eviction_stops_when_under_95_percent_or_after_10_misses(env, evictable):
    body = "x" * 10_000
    for i in range(12):
        env.add("keep", f"k{i}")
    doomed = [env.add("q", body, "RETRY", 0) for _ in range(evictable)]
    env.s("GETJOB", "COUNT", 100, "FROM", "q")
    env.core.config.maxmemory = level2_limit(env.core.memory.used - 5 * 10_000 - 1_000)
    reply = env.s("ADDJOB", "keep", "x", 0)
    if evictable:  # only as many as needed go, then it stops
        gone = sum(env.show(i) is None for i in doomed)
        assert 5 <= gone < evictable and reply.code == "NOREPL"  # level 1: no local copy
    else:
        assert reply.code == "OOM" and env.s("QLEN", "keep") == 12


def test_eviction_without_jobs_collects_every_idle_queue(env):
    for i in range(40):
        env.s("GETJOB", "NOHANG", "FROM", f"q{i}")
    env.clock.advance(2_000)  # no tick: the command itself must do it
    env.core.config.maxmemory = level2_limit(env.core.memory.used)
    assert env.s("INFO", "queues") == b"# Queues\r\nregistered_queues:0\r\n"


def test_maxmemory_zero_never_answers_oom(env):
    env.core.config.maxmemory = 0
    assert env.core.memory.level() == 2 and env.core.memory.evict()
    assert env.s("ADDJOB", "q", "x", 0).message.endswith("reason: I'm out of memory")
    assert env.s("ADDJOB", "q", "x", 0, "REPLICATE", 2).message == errors.norepl_reach().message


def test_acked_jobs_are_evicted(duo):
    assert duo.s("ACKJOB", ODD_ID) == 0  # a dummy ACK: acked, kept for GC
    assert duo.state(ODD_ID) == "acked"
    duo.core.config.maxmemory = level2_limit(duo.core.memory.used)
    duo.s("PING")
    assert duo.show(ODD_ID) is None


def test_peak_memory_tracks_the_maximum(env):
    job_id = env.add("q", "x" * 1000)
    peak = env.core.memory.peak
    env.s("DELJOB", job_id)
    assert env.core.memory.peak == peak > env.core.memory.used == BASE_MEMORY + QUEUE_OVERHEAD + 1


# ---------------------------------------------------------------- AOF records


@pytest.mark.parametrize(
    "prepare, command, logged",
    [
        ((), "ACKJOB", True),
        ((), "FASTACK", True),
        ((), "DELJOB", True),
        (("GETJOB", "FROM", "q"), "DELJOB", True),
        (("DEQUEUE",), "DEQUEUE", False),
        ((), "WORKING", False),
    ],
)
def test_aof_records_follow_the_job(env, prepare, command, logged):
    env.core.aof.state = "on"
    job_id = env.add("q", "x")
    if prepare:
        env.s(*prepare, *([] if prepare[0] == "GETJOB" else [job_id]))
    env.s(command, job_id)
    records = [e.record for e in env.core.out.effects if isinstance(e, AofAppend)]
    deljob = b"*2\r\n$6\r\nDELJOB\r\n$48\r\n%s\r\n" % job_id
    assert len(records) == 1 + logged and records[1:] == ([deljob] if logged else [])
    assert records[0].startswith(b"*2\r\n$7\r\nLOADJOB\r\n") and job_id in records[0]


def test_no_aof_records_when_off(env):
    env.s("ACKJOB", env.add())
    assert not any(isinstance(e, AofAppend) for e in env.core.out.effects)


def test_expiry_is_logged_and_acked_jobs_are_not(duo):
    duo.core.aof.state = "on"
    job_id = duo.add("q", "x", "TTL", 2, "REPLICATE", 1)
    duo.wait(3_100)
    assert duo.show(job_id) is None
    assert [e.record for e in duo.core.out.effects if isinstance(e, AofAppend)][-1].startswith(b"*2\r\n$6\r\nDELJOB")
    duo.core.out.effects.clear()
    duo.s("ACKJOB", ODD_ID)
    assert not any(isinstance(e, AofAppend) for e in duo.core.out.effects)


# ---------------------------------------------------------------- with a peer


def test_dummy_ack_retries_gc_with_backoff_until_peer_answers(duo):
    assert duo.s("ACKJOB", EVEN_ID) == 0 and duo.show(EVEN_ID) is None  # at-most-once: no dummy
    assert duo.s("ACKJOB", ODD_ID) == 0
    assert duo.sent() == [m.SetAck(ODD_ID, 0)]
    shown = duo.show(ODD_ID)
    assert (shown["queue"], shown["body"]) == (None, None)
    assert (shown["nodes-delivered"], shown["nodes-confirmed"]) == ([], [NODE_ID])
    assert shown["repl"] == 0 and duo.s("JSCAN", "BUSYLOOP") == [b"0", []]
    times = []
    for _ in range(400):
        duo.wait(100)
        from_peer(duo, m.Pong())  # keep the link up
        if [x for x in duo.sent() if isinstance(x, m.SetAck)]:
            times.append(duo.clock.ms - START_MS)
    assert len(times) >= 3
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:]))  # backing off
    assert duo.s("ACKJOB", ODD_ID) == 0  # already acked: not counted, one more GC attempt
    assert duo.sent() == [m.SetAck(ODD_ID, 0)]
    from_peer(duo, m.GotAck(ODD_ID, False))
    assert duo.show(ODD_ID) is None


def test_dummy_ack_deleted_when_cluster_shrinks_to_one(duo):
    duo.s("ACKJOB", ODD_ID)
    duo.core.cluster.forget(PEER)
    duo.wait(2_000)
    assert duo.show(ODD_ID) is None


def test_fastack_and_pause_bcast_reach_the_peer(duo):
    assert duo.s("FASTACK", ODD_ID) == 0
    assert duo.sent() == [m.DelJob(ODD_ID)]
    assert duo.s("PAUSE", "q", "out", "bcast") == Status(b"out")
    assert duo.sent() == [m.Pause(b"q", 2)]
    assert duo.s("PAUSE", "q", "state", "bcast") == Status(b"out")
    assert duo.sent() == [m.Pause(b"q", 2)]


def test_job_shared_with_peer(duo):
    """A job replicated to the peer: commands tell the peer what they did."""
    producer = Session(duo.core)
    assert producer("ADDJOB", "q", "x", 0) is BLOCKED  # default REPLICATE 2
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    assert isinstance(repl, m.ReplJob) and duo.state(job_id) == "wait-repl" and duo.s("QLEN", "q") == 0
    from_peer(duo, m.GotJob(job_id))
    assert producer.pending() == [Status(job_id)] and duo.s("QLEN", "q") == 1
    assert duo.s("WORKING", job_id) > 0 and duo.sent() == [m.Working(job_id)]
    assert duo.s("NACK", job_id) == 1 and duo.sent() == [m.Queued(job_id, incr_nacks=True, incr_deliv=False)]
    duo.s("GETJOB", "FROM", "q")
    assert duo.s("ACKJOB", job_id) == 1 and duo.sent() == [m.SetAck(job_id, 2)]
    assert duo.state(job_id) == "acked"
    from_peer(duo, m.GotAck(job_id, True))
    assert duo.sent() == [m.DelJob(job_id)] and duo.show(job_id) is None


def test_one_gotjobs_body_replicates_every_job_it_names(duo):
    """GOTJOBS (the GOTJOBs of one step, in one body) counts for each job it
    names, and skips an ID this node does not know."""
    producers = [Session(duo.core) for _ in range(3)]
    assert all(p("ADDJOB", "q", "x", 0) is BLOCKED for p in producers)
    ids = [repl.job["id"] for repl in duo.sent()]
    assert len(ids) == 3 and duo.s("QLEN", "q") == 0
    from_peer(duo, m.GotJobs((ids[0], ODD_ID, ids[2])))
    assert [p.pending() for p in producers] == [[Status(ids[0])], [], [Status(ids[2])]]
    assert duo.s("QLEN", "q") == 2 and duo.state(ids[1]) == "wait-repl"


def test_nack_delay_holds_the_job_back_and_counts_one_nack(env):
    job_id = env.add("q", "x", "RETRY", 30)
    assert env.s("GETJOB", "FROM", "q")[0][1] == job_id
    assert env.s("NACK", job_id, "DELAY", 5) == 1
    assert env.s("QLEN", "q") == 0 and env.show(job_id)["nacks"] == 1
    env.wait(4_900)
    assert env.s("QLEN", "q") == 0
    env.wait(200)
    assert env.s("QLEN", "q") == 1
    shown = env.show(job_id)
    assert (shown["nacks"], shown["additional-deliveries"], shown["state"]) == (1, 0, "queued")
    assert figures.node_figures(env.core)["queues"][0]["nacks"] == 1
    # Delivered and NACKed again: the delay applies again, and the count goes on.
    env.s("GETJOB", "FROM", "q")
    assert env.s("NACK", job_id, "DELAY", 1) == 1 and env.s("QLEN", "q") == 0
    env.wait(1_100)
    assert env.s("QLEN", "q") == 1 and env.show(job_id)["nacks"] == 2
    env.check()


@pytest.mark.parametrize(
    "args, reply",
    [
        (("DELAY", "0"), 1),  # a plain NACK
        (("DELAY", "-1"), "DELAY time must be a non negative number"),
        (("DELAY", "soon"), "DELAY time must be a non negative number"),
    ],
)
def test_nack_delay_arguments(env, args, reply):
    job_id = env.add("q", "x", "RETRY", 30)
    env.s("GETJOB", "FROM", "q")
    got = env.s("NACK", job_id, *args)
    assert got == reply if isinstance(reply, int) else got.message == reply
    if reply == 1:
        assert env.s("QLEN", "q") == 1


def test_nack_delay_refuses_what_nack_refuses(env):
    once = env.add("q", "x", "RETRY", 0)
    env.s("GETJOB", "FROM", "q")
    queued = env.add("q", "y", "RETRY", 30)
    assert env.s("NACK", once, queued, "DELAY", 5) == 0  # at-most-once delivered; not active
    env.wait(6_000)
    assert env.s("QLEN", "q") == 1  # only `queued`, as before
    env.check()


def test_nack_delay_travels_to_the_nodes_that_hold_the_job(duo):
    producer = Session(duo.core)
    assert producer("ADDJOB", "q", "x", 0, "RETRY", 10) is BLOCKED
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    from_peer(duo, m.GotJob(job_id))
    duo.s("GETJOB", "FROM", "q")
    duo.sent()
    assert duo.s("NACK", job_id, "DELAY", 3) == 1
    assert duo.sent() == [m.Queued(job_id, incr_nacks=True, delay=3)]
    duo.wait(2_000)
    assert duo.s("QLEN", "q") == 0 and duo.sent() == []
    duo.wait(600)  # WILLQUEUE goes 500 ms before the requeue
    assert duo.s("QLEN", "q") == 0 and duo.sent() == [m.WillQueue(job_id)]
    duo.wait(1_000)
    assert duo.s("QLEN", "q") == 1 and duo.sent() == [m.Queued(job_id)]  # no second count


def test_a_peer_nack_delay_postpones_the_local_copy(duo):
    """Receiving QUEUED with a delay: a queued copy is taken out, and the
    local requeue waits for the delay plus RETRY."""
    producer = Session(duo.core)
    producer("ADDJOB", "q", "x", 0, "RETRY", 10)
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    from_peer(duo, m.GotJob(job_id))
    assert duo.s("QLEN", "q") == 1
    from_peer(duo, m.Queued(job_id, incr_nacks=True, delay=3))
    assert duo.s("QLEN", "q") == 0 and duo.show(job_id)["nacks"] == 1
    job = duo.core.jobs.get(job_id)
    assert job.qtime - duo.core.now > 12_000  # the delay, then RETRY (10 s, give or take its jitter)


def test_maxattempts_moves_the_job_to_its_dead_letter_queue_after_the_last_nack(env):
    """MAXATTEMPTS 3: a consumer that always NACKs sees the job three times;
    the third NACK moves it, as a new job carrying the old ID, its body and
    counters, to the dead-letter queue."""
    job_id = env.add("q", "x", "RETRY", 30, "MAXATTEMPTS", 3, "DEADLETTER", "failed")
    assert env.show(job_id)["max-attempts"] == 3 and env.show(job_id)["dead-letter"] == b"failed"
    seen = 0
    while (got := env.s("GETJOB", "NOHANG", "FROM", "q")) is not NIL_ARRAY:
        assert got[0][1] == job_id
        seen += 1
        assert env.s("NACK", job_id) == 1
    assert seen == 3 and env.show(job_id) is None
    [(queue, dead_id, body)] = env.s("GETJOB", "NOHANG", "FROM", "failed")
    dead = env.show(dead_id)
    assert (queue, body, dead["dead-letter-of"], dead["nacks"]) == (b"failed", b"x", job_id, 2)
    assert "max-attempts" not in dead and dict(env.s("QSTAT", "q"))[b"dead-lettered"] == 1
    assert env.core.stats.dead_lettered == 1
    env.check()


@pytest.mark.parametrize("how", ["retry", "nack-delay", "enqueue"])
def test_maxattempts_counts_every_kind_of_redelivery(env, how):
    job_id = env.add("q", "x", "RETRY", 2, "MAXATTEMPTS", 2)  # the default dead-letter queue: q-dead
    assert env.s("GETJOB", "FROM", "q")[0][1] == job_id
    assert env.s("NACK", job_id, "DELAY", 3) == 1  # the first failure: back after 3 s
    env.wait(3_100)
    assert env.s("GETJOB", "FROM", "q")[0][1] == job_id
    if how == "retry":
        env.wait(2_400)  # not acknowledged within RETRY: that was the last attempt
    elif how == "nack-delay":
        assert env.s("NACK", job_id, "DELAY", 60) == 1
    else:
        assert env.s("ENQUEUE", job_id) == 1
    assert env.show(job_id) is None and env.s("QLEN", "q-dead") == 1
    env.check()


def test_maxattempts_needs_no_change_for_other_jobs_and_checks_its_arguments(env):
    plain = env.add("q", "x")
    assert "max-attempts" not in env.show(plain) and "dead-letter-of" not in env.show(plain)
    assert env.s("ADDJOB", "q", "x", 0, "MAXATTEMPTS", 0).message == "MAXATTEMPTS must be between 1 and 65535"
    assert env.s("ADDJOB", "q", "x", 0, "DEADLETTER", "d").message == "DEADLETTER needs MAXATTEMPTS"


def test_a_dead_lettered_job_is_deleted_everywhere_and_its_copy_replicated(duo):
    producer = Session(duo.core)
    producer("ADDJOB", "q", "x", 0, "RETRY", 10, "MAXATTEMPTS", 1)
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    from_peer(duo, m.GotJob(job_id))
    duo.s("GETJOB", "FROM", "q")
    duo.sent()
    assert duo.s("NACK", job_id) == 1
    deljob, copy = duo.sent()
    assert deljob == m.DelJob(job_id, acked=False) and isinstance(copy, m.ReplJob) and copy.noreply
    assert copy.job["queue"] == b"q-dead" and copy.job["origin"] == job_id and copy.job["body"] == b"x"


def test_waitjob_returns_once_every_job_is_acknowledged(env):
    a, b, c = (env.add("q", body) for body in "abc")
    waiter = Session(env.core)
    assert waiter("WAITJOB", a, b, c, a) is BLOCKED  # an ID listed twice counts once
    assert env.s("ACKJOB", a) == 1 and waiter.pending() == []
    assert env.s("FASTACK", b) == 1 and waiter.pending() == []
    assert env.s("ACKJOB", c) == 1 and waiter.pending() == [3]
    assert waiter("WAITJOB", a, b, c) == 3  # collected after their ACK: at once
    env.check()


def test_waitjob_timeout_counts_what_was_acknowledged(env):
    a, b = env.add("q", "a"), env.add("q", "b")
    waiter = Session(env.core)
    assert waiter("WAITJOB", a, b, "TIMEOUT", 1000) is BLOCKED
    env.s("ACKJOB", a)
    env.wait(900)
    assert waiter.pending() == []
    env.wait(200)
    assert waiter.pending() == [1]
    env.check()


def test_waitjob_stops_waiting_for_a_job_that_goes_unacknowledged(env):
    a, b = env.add("q", "a", "TTL", 5), env.add("q", "b")
    waiter, gone = Session(env.core), Session(env.core)
    assert waiter("WAITJOB", a, b) is BLOCKED
    assert gone("WAITJOB", b) is BLOCKED
    env.core.disconnect(gone.client.id)  # a client that leaves stops waiting
    env.s("ACKJOB", b)
    env.wait(6_000)  # `a` expires
    assert waiter.pending() == [1] and env.core.blocking.job_waits == {}
    env.check()


@pytest.mark.parametrize(
    "args, error",
    [
        (("DI0123456789abcdef0123456789abcdef0123456789SQ",), "BADID"),
        (("TIMEOUT", "10"), "ERR"),
        ((ids.new_job_id("a" * 40, random.Random(1), 60, 30),), "NOJOB"),
    ],
)
def test_waitjob_errors(env, args, error):
    assert env.s("WAITJOB", *args).code == error


def test_waitjob_learns_acknowledgements_from_peers(duo):
    producer = Session(duo.core)
    producer("ADDJOB", "q", "x", 0)
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    from_peer(duo, m.GotJob(job_id))
    waiter = Session(duo.core)
    assert waiter("WAITJOB", job_id) is BLOCKED
    from_peer(duo, m.SetAck(job_id, 2))  # acknowledged on the peer
    assert waiter.pending() == [1]
    assert duo.state(job_id) == "acked" and waiter("WAITJOB", job_id) == 1  # acked, not collected yet
    other = duo.s("ADDJOB", "q", "y", 0, "REPLICATE", 1)
    assert waiter("WAITJOB", bytes(other)) is BLOCKED
    from_peer(duo, m.DelJob(bytes(other)))  # a FASTACK elsewhere
    assert waiter.pending() == [1]
    moved = bytes(duo.s("ADDJOB", "q", "z", 0, "REPLICATE", 1))
    assert waiter("WAITJOB", moved) is BLOCKED
    from_peer(duo, m.DelJob(moved, acked=False))  # dead-lettered elsewhere: gone, not acknowledged
    assert waiter.pending() == [0]
    assert waiter("WAITJOB", moved, bytes(other)) == 1  # remembered, each as it went


@pytest.mark.parametrize(
    "how",
    [
        "disconnect",
        "deljob",
        "flushall",
        "timeout",
        "ackjob",
    ],
)
def test_producer_waiting_for_replication(duo, how):
    producer = Session(duo.core)
    assert producer("ADDJOB", "q", "x", 1000) is BLOCKED
    job_id = duo.sent()[0].job["id"]
    if how == "disconnect":
        duo.core.disconnect(producer.client.id)
        assert duo.sent() == [m.DelJob(job_id, acked=False)] and duo.show(job_id) is None
        assert duo.core.out.effects == []  # no reply for a connection that is gone
    elif how == "ackjob":
        assert duo.s("ACKJOB", job_id) == 1 and duo.state(job_id) == "acked"
        duo.wait(2_000)
        assert producer.pending() == [Status(job_id)] and not producer.client.repl_jobs
    else:
        if how == "timeout":
            duo.wait(1_100)
            expected = errors.norepl_timeout()
        else:
            duo.s(*{"deljob": ("DELJOB", job_id), "flushall": ("DEBUG", "FLUSHALL")}[how])
            expected = errors.norepl_removed()
        assert producer.pending() == [expected] and m.DelJob(job_id, acked=False) in duo.sent()
        assert duo.show(job_id) is None
    duo.check()


# ---------------------------------------------------------------- stores


def test_transition_table_is_complete():
    events = (ENQUEUE, FETCH, DEQUEUE, ACK, ABORT, REPLICATED, AWAIT_REPL, ADOPT)
    for state, event in itertools.product(State, events):
        job = Job(b"x" * 48, b"q", b"", state=state)
        if event in TRANSITIONS[state]:
            job.move(event)
            assert job.state == TRANSITIONS[state][event]
        else:
            with pytest.raises(AssertionError, match="no transition"):
                job.move(event)
    job = Job(b"x" * 48, b"q", b"", nodes_delivered=("a",))
    job.add_delivered("a")
    job.add_delivered("b")
    assert job.nodes_delivered == ("a", "b") and not job.is_dummy_ack
    assert repr(job) == f"<Job {'x' * 48} active q=b'q'>"


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


ops = st.lists(
    st.tuples(st.sampled_from(["add", "pop", "scan"]), st.integers(0, 300), st.integers(1, 20), st.integers(1, 4)),
    max_size=200,
)


@settings(max_examples=100, deadline=None)
@given(ops)
def test_bucketed_dict_against_a_dict(ops):
    table, model = BucketedDict(), {}
    for op, n, want, max_buckets in ops:
        key = n if n % 2 else n * NBUCKETS // 4  # even keys share four buckets
        if op == "add":
            table.add(key, key)
            model[key] = key
        elif op == "pop":
            assert table.pop(key) == model.pop(key, None)
        else:
            seen, cursor = [], 0
            while True:
                cursor, got = table.scan(cursor, want, max_buckets)
                seen += got
                if not cursor:
                    break
            assert sorted(seen) == sorted(model)  # everything, once
            start = key % NBUCKETS
            assert sorted(table.values_from(start)) == sorted(model)
        assert len(table) == len(model) and sorted(table.values()) == sorted(model)
        assert all(key in table and table.get(key) == key for key in model)
    assert table.scan(NBUCKETS, 10, None) == (0, [])
    table.clear()
    assert len(table) == 0 and table.scan(0, 10, None) == (0, [])


def _ids_in_one_bucket(n):
    """`n` job IDs that share an index bucket, so that they collide in its table."""
    by_bucket = {}
    for i in itertools.count():
        job_id = b"DI%08x%032x0001SQ" % (1, i)
        same = by_bucket.setdefault(hash(job_id) % NBUCKETS, [])
        same.append(job_id)
        if len(same) == n:
            return same


CROWD = _ids_in_one_bucket(40)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "replace", "pop"]), st.integers(0, 59)), max_size=300))
def test_job_index_against_a_dict(ops):
    """IDs of one bucket (colliding runs, wrapping, growing and shrinking
    tables) and of others: every registered job is found after each step."""
    index, model = JobIndex(), {}
    others = [b"DI%08x%032x0001SQ" % (2, i) for i in range(20)]
    for op, n in ops:
        job_id = (CROWD + others)[n]
        if op == "pop":
            assert index.pop(job_id) is model.pop(job_id, None)
        else:
            job = Job(job_id, b"q", b"body")
            if op == "add" or job_id not in model:
                index.add(job)
                model[job_id] = job
        assert len(index) == len(model)
        assert all(index.get(job_id) is job for job_id, job in model.items())
        assert all(job_id not in index for job_id in CROWD + others if job_id not in model)
    assert sorted(j.id for j in index.values()) == sorted(model)
    table = index._tables[hash(CROWD[0]) % NBUCKETS]  # sized to its load: under 3/4 used, over 1/6 live unless minimal
    count = sum(job_id in model for job_id in CROWD)
    assert (table is None) == (count == 0)
    if table is not None:
        size = len(table.tags)
        assert table.live == count == sum(job is not None for job in table.jobs) and table.used == sum(map(bool, table.tags))
        assert 4 * table.used <= 3 * size and (size == MIN_SLOTS or 6 * count >= size)


@pytest.mark.parametrize("seed", range(5))
def test_job_index_fills_and_drains_one_bucket(seed):
    """Colliding IDs added, then popped in a random order: the backward
    shift keeps every other job reachable and the table shrinks back."""
    index, order = JobIndex(), list(CROWD)
    for job_id in order:
        index.add(Job(job_id, b"q", b"body"))
    random.Random(seed).shuffle(order)
    sizes = set()
    for n, job_id in enumerate(order):
        assert index.pop(job_id).id == job_id and index.pop(job_id) is None
        table = index._tables[hash(job_id) % NBUCKETS]
        sizes.add(len(table.tags) if table is not None else 0)
        assert all(index.get(other).id == other for other in order[n + 1 :])
    assert len(index) == 0 and not index.bucket(hash(CROWD[0]) % NBUCKETS) and index.scan(0, 10, None) == (0, [])
    assert {MIN_SLOTS, 0} < sizes  # it shrank step by step, then emptied


def test_values_from_survives_deleting_the_current_element():
    table, keys = BucketedDict(), list(range(40)) + [NBUCKETS * n for n in range(1, 10)]  # some share bucket 0
    for key in keys:
        table.add(key, key)
    seen = []
    for value in table.values_from(7):
        seen.append(value)
        table.pop(value)
    assert sorted(seen) == keys and len(table) == 0


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "error, text",
    [
        (DisqueError("ERR", "a\r\nb"), b"ERR a  b"),
        (DisqueError("CODE"), b"CODE"),
        (errors.wrong_arity("ping"), b"ERR wrong number of arguments for 'ping' command"),
        (errors.unknown_command("Nope"), b"ERR unknown command 'Nope'"),
        (errors.misconf("No space left on device"), b"MISCONF Errors writing to the AOF file: No space left on device"),
        (errors.noreply_reason("x"), b"NOREPL Not enough reachable nodes for the requested replication level, "
         b"since I'm unable to hold a copy of the message for the following reason: x"),
    ],
)  # fmt: skip
def test_error_wire_form(error, text):
    assert error.wire() == text and str(error) == text.decode().replace("a  b", "a\r\nb")


# ---------------------------------------------------------------- command layer

OK = Status(b"OK")
ERR = errors.err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (("NOPE", "x"), ERR("unknown command 'NOPE'")),
        (("qlen",), ERR("wrong number of arguments for 'qlen' command")),
        (("PING", "a", "b"), ERR("wrong number of arguments for 'ping' command")),
        (("PING", "hi"), b"hi"),
        (("ECHO", "hi"), b"hi"),
        (("SELECT", "0"), OK),
        (("SELECT", "1"), ERR("DB index is out of range")),
        (("TIME",), [b"%d" % (START_MS // 1000), b"0"]),
        (("LOADJOB", "x"), ERR("LOADJOB is a special command only processed from AOF")),
        (("AUTH", "x"), ERR("Client sent AUTH, but no password is set")),
        (("INFO", "a", "b"), errors.syntax()),
        (("INFO", "nope"), b""),
        (("INFO", "JOBS"), b"# Jobs\r\nregistered_jobs:0\r\n"),
        (("COMMAND", "INFO", "addjob", "nope"),
         [["addjob", -4, [Status(b"write"), Status(b"denyoom"), Status(b"fast")], 0, 0, 0], None]),
        (("COMMAND", "x"), ERR("Unknown subcommand or wrong number of arguments.")),
        (("SLOWLOG", "LEN"), 0),
        (("SLOWLOG", "RESET"), OK),
        (("SLOWLOG", "GET"), []),
        (("SLOWLOG", "GET", "x"), errors.not_integer()),
        (("SLOWLOG", "nope"), ERR("Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")),
        (("LATENCY", "LATEST"), []),
        (("LATENCY", "DOCTOR"), b"No latency spikes were observed (latency monitoring is not sampling events)."),
        (("LATENCY", "HISTORY", "e"), []),
        (("LATENCY", "GRAPH", "e"), ERR("No samples available for event 'e'")),
        (("LATENCY", "RESET", "e"), 0),
        (("LATENCY", "nope"), errors.syntax()),
        (("SHUTDOWN", "nosave"), errors.syntax()),
        (("SHUTDOWN", "a", "b"), errors.syntax()),
        (("SHUTDOWN", "REWRITE-AOF"), SILENT),
        (("BGREWRITEAOF",), Status(b"Background append only file rewriting started")),
        (("CLUSTER", "MYID"), NODE_ID.encode()),
        (("HELLO",), [1, NODE_ID, [NODE_ID, "", b"7711", b"1"]]),
        (("CLUSTER", "LEAVING"), Status(b"no")),
        (("CLUSTER", "LEAVING", "maybe"), ERR("Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")),
        (("ADDJOB", "q", "b", "0", "TTL", "0"), ERR("TTL must be a number > 0")),
        (("ADDJOB", "q", "b", "x", "TTL", "0"), ERR("TTL must be a number > 0")),
        (("ADDJOB", "q", "b", "x"), errors.timeout_not_int()),
        (("ADDJOB", "q", "b", "-1"), errors.timeout_negative()),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "0"), ERR("REPLICATE must be between 1 and 65535")),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "65536"), ERR("REPLICATE must be between 1 and 65535")),
        (("ADDJOB", "q", "b", "0", "RETRY", "-1"), ERR("RETRY time must be a non negative number")),
        (("ADDJOB", "q", "b", "0", "DELAY", "1x"), ERR("DELAY time must be a non negative number")),
        (("ADDJOB", "q", "b", "0", "MAXLEN", "0"), ERR("MAXLEN must be a positive number")),
        (("ADDJOB", "q", "b", "0", "TTL"), errors.syntax()),
        (("ADDJOB", "q", "b", "0", "TTL", "9223372036854775808"), ERR("TTL must be a number > 0")),
        (("ADDJOB", "q", "b", "0", "TTL", "1" * 25), ERR("TTL must be a number > 0")),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "-" + "0" * 25 + "1"), ERR("REPLICATE must be between 1 and 65535")),
        (("ADDJOB", "q", "b", "0", "NOPE", "1"), errors.syntax()),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "2", "RETRY", "0"),
         ERR("With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)")),
        (("ADDJOB", "q", "b", "0", "REPLICATE", "2"), errors.norepl_reach()),
        (("ADDJOB", "q", "b", "0", "DELAY", "10", "TTL", "10"),
         ERR("The specified DELAY is greater than TTL. Job refused since would never be delivered")),
        (("GETJOB", "NOHANG", "q"), errors.syntax()),
        (("GETJOB", "NOHANG"), errors.syntax()),
        (("GETJOB", "FROM"), errors.syntax()),
        (("GETJOB", "COUNT", "0", "FROM", "q"), ERR("COUNT must be a number greater than zero")),
        (("GETJOB", "COUNT", "x", "FROM", "q"), ERR("COUNT must be a number greater than zero")),
        (("GETJOB", "TIMEOUT", "-5", "FROM", "q"), errors.timeout_negative()),
        (("GETJOB", "TIMEOUT", "10", "NOHANG", "FROM", "q"), NIL_ARRAY),
        (("ACKJOB",), 0),
        (("DELJOB", "bad"), errors.badid()),
        (("DEQUEUE", ODD_ID, "bad"), errors.badid()),
        (("WORKING", ODD_ID), errors.nojob()),
        (("SHOW", ODD_ID), None),
        (("SHOW", "bad"), errors.badid()),
        (("QPEEK", "q", "1"), []),
        (("QSTAT", "q"), NIL_ARRAY),
        (("QSCAN", "x"), errors.bad_cursor()),
        (("QSCAN", "MINLEN", "x"), errors.not_integer()),
        (("QSCAN", "1", "2"), errors.syntax()),
        (("QSCAN", "-1"), [b"0", []]),
        (("QSCAN", "+1"), [b"0", []]),
        (("QSCAN", "18446744073709551616"), errors.bad_cursor()),
        (("JSCAN", "STATE"), errors.bad_cursor()),
        (("PAUSE", "q", "bogus"), errors.syntax()),
        (("PAUSE", "q", "in", "none"), Status(b"none")),
    ],
)  # fmt: skip
def test_command_replies(env, argv, expected):
    reply = env.s(*argv)
    if isinstance(expected, DisqueError):
        assert isinstance(reply, DisqueError) and (reply.code, reply.message) == (expected.code, expected.message)
    else:
        assert reply == expected and type(reply) is type(expected)


def test_huge_cursor_is_an_invalid_cursor(env):
    reply = env.s("QSCAN", "9" * 5000)
    assert (reply.code, reply.message) == ("ERR", errors.bad_cursor().message)


def test_command_count_counts_the_table(env):
    assert env.s("COMMAND", "COUNT") == len(COMMANDS) == 50  # the spec's 32 + ECHO, SELECT, SCANJOBS, WAITJOB, QSETTINGS, DEADLETTER, SCHEDULE + bananaq's 7, okq's 4


def test_command_table_lists_every_command(env):
    table = env.s("COMMAND")
    assert sorted(entry[0] for entry in table) == sorted(c.decode() for c in COMMANDS)
    assert env.s("COMMAND", "DOCS") == []


def test_quit_closes_after_reply(env):
    assert env.s("QUIT", "whatever") == OK
    assert env.core.out.effects[-1].client_id == env.s.client.id


@pytest.mark.parametrize(
    "setup, argv, code",
    [
        ("requirepass", ("QLEN", "q"), "NOAUTH"),
        ("oom", ("ADDJOB", "q", "x", "0"), "OOM"),
        ("misconf", ("PING",), "MISCONF"),
        ("misconf", ("ADDJOB", "q", "x", "0"), "MISCONF"),  # what adds data; ACKJOB and GETJOB go on
        ("loading", ("QLEN", "q"), "LOADING"),
    ],
)
def test_dispatch_checks(env, setup, argv, code):
    core = env.core
    if setup == "requirepass":
        core.config.requirepass = "secret"
        s = Session(core)
    else:
        s = env.s
        if setup == "oom":
            core.config.maxmemory_policy = "noeviction"
            core.config.maxmemory = level2_limit(core.memory.used)
        elif setup == "misconf":
            core.set_aof_error("No space left on device")
        else:
            core.begin_load()
    assert s(*argv).code == code
    assert s("AUTH", "secret") == OK if setup == "requirepass" else s("INFO", "jobs").startswith(b"# Jobs")


def test_auth(env):
    env.core.config.requirepass = "secret"
    s = Session(env.core)
    assert s("AUTH", "wrong").message == "invalid password"
    assert s("AUTH", "secret") == OK and s("QLEN", "q") == 0
    assert s("AUTH", "x" * 600).message == "invalid password" and s("QLEN", "q").code == "NOAUTH"
    env.core.config.requirepass = "y" * 600
    assert s("AUTH", "y" * 600).message == "invalid password"  # longer than 512: never matches


def test_repeated_wrong_passwords_are_answered_later_and_later_counted_and_logged(env, caplog):
    """Three wrong passwords answer at once; then each is answered after a
    delay that doubles from 100 ms up to 5 s, during which the connection
    runs nothing.  Other connections are not slowed; failures are counted
    in INFO and logged at most once per 10 s."""
    env.core.config.requirepass = "secret"
    s, other = Session(env.core), Session(env.core)
    assert other("AUTH", "secret") == OK
    for _ in range(3):
        assert s("AUTH", "wrong").message == "invalid password"
    delays = []
    for _ in range(8):
        assert s("AUTH", "wrong") is BLOCKED
        assert other("PING") == Status(b"PONG")
        waited = 0
        while not s.pending():
            env.wait(10)
            waited += 10
        delays.append(waited)
    wanted = [100, 200, 400, 800, 1600, 3200, 5000, 5000]
    assert all(want <= got <= want + BLOCKED_CRON_MS for want, got in zip(wanted, delays, strict=True)), delays
    assert s("HELLO", "3", "AUTH", "default", "wrong") is BLOCKED  # HELLO's AUTH is the same door
    env.wait(5_000 + BLOCKED_CRON_MS)
    assert [getattr(r, "code", None) for r in s.pending()] == ["WRONGPASS"]
    assert s("AUTH", "secret") == OK and s("QLEN", "q") == 0
    assert env.core.stats.auth_failures == 12 and figures.node_figures(env.core)["auth_failures"] == 12
    logged = [r for r in caplog.records if "Failed AUTH" in r.getMessage()]
    assert 2 <= len(logged) <= 3  # about 21 s of failures, one line per 10 s at most


def test_client_reply_modes(env):
    s = env.s
    assert s("CLIENT", "REPLY", "SKIP") is SILENT
    assert s("PING") is SILENT and s("PING") == Status(b"PONG")
    assert s("CLIENT", "REPLY", "OFF") is SILENT and s("PING") is SILENT
    assert s("CLIENT", "REPLY", "ON") == OK and s("PING") == Status(b"PONG")


def test_monitor_quotes_arguments(env):
    watcher = Session(env.core)
    assert watcher("MONITOR") == OK
    env.s("PING", b'a\r\n"b\\\x00\xff')
    watcher("PING")  # its own commands are not echoed
    (line,) = watcher.pending()
    addr = env.s.client.addr.encode()
    assert line == Status(b'%d.000000 [%s] "PING" "a\\r\\n\\"b\\\\\\x00\\xff"' % (START_MS // 1000, addr))
    env.core.disconnect(watcher.client.id)
    env.s("PING")
    assert watcher.pending() == []


def test_slowlog_records_slow_commands(env):
    ticks = itertools.count(0, 20_000)
    env.clock.now_us = lambda: next(ticks)  # every command takes 20 ms
    env.core.config.slowlog_max_len = 2
    for n in range(3):
        env.s("QLEN", f"q{n}")
    entries = env.s("SLOWLOG", "GET")
    assert entries == [[3, START_MS // 1000, 20_000, [b"QLEN", b"q2"]], [2, START_MS // 1000, 20_000, [b"QLEN", b"q1"]]]
    assert env.s("SLOWLOG", "LEN") == 2
    assert [e[3] for e in env.s("SLOWLOG", "GET", 1)] == [[b"SLOWLOG", b"LEN"]]
    env.core.config.slowlog_log_slower_than = -1
    env.s("SLOWLOG", "RESET")
    env.s("QLEN", "q")
    assert env.s("SLOWLOG", "LEN") == 0


def test_scan_filters(env):
    a, b = env.add("q1", "x"), env.add("q2", "y")
    env.add("q2", "z")
    env.s("GETJOB", "FROM", "q1")
    cursor, names = env.s("QSCAN", "BUSYLOOP", "MINLEN", 1, "MAXLEN", 5, "IMPORTRATE", 0)
    assert sorted(names) == [b"q2"]
    assert sorted(env.s("QSCAN", "COUNT", 1000)[1]) == [b"q1", b"q2"]
    assert env.s("JSCAN", "BUSYLOOP", "STATE", "active", "STATE", "queued", "QUEUE", "q1")[1] == [Status(a)]
    assert b in env.s("JSCAN", "BUSYLOOP", "QUEUE", "q2", "REPLY", "id")[1]


def test_redis_hello_switches_protocol(env):
    reply = env.s("HELLO", "3")
    assert dict(reply)[b"proto"] == 3 and env.s.client.proto == 3
    assert env.s.raw("QSTAT", "nope") == b"_\r\n"


def test_async_addjob_on_a_single_node_is_plain(env):
    job_id = bytes(env.s("ADDJOB", "q", "x", 0, "ASYNC"))
    assert env.state(job_id) == "queued"


def test_shutdown_failure_is_reported(env):
    env.host.shutdown_ok = False
    assert env.s("SHUTDOWN").message == "Errors trying to SHUTDOWN. Check logs."


def test_resetstat_zeroes_the_core_counters_and_the_shells(env):
    env.s("PING")
    assert env.core.stats.commands == 1
    assert env.s("CONFIG", "RESETSTAT") == Status(b"OK")
    assert env.core.stats.commands == 0 and list(env.core.stats.calls) == ["config"]  # RESETSTAT itself
    assert ("reset_stats",) in env.host.calls


def test_a_failing_handler_costs_one_reply(env, monkeypatch):
    from disque.protocols.resp import commands

    def broken(node, client, argv):
        raise RuntimeError("bug")

    monkeypatch.setitem(commands.COMMANDS, b"echo", commands.Command("echo", 2, "rF", broken))
    assert env.s("ECHO", "x").message == "internal error executing 'echo', check the server logs"
    assert env.s("PING") == Status(b"PONG")


def test_idle_clients_are_closed_per_timeout_directive(env):
    env.core.config.timeout = 2
    idle, blocked, watcher = Session(env.core), Session(env.core), Session(env.core)
    blocked("GETJOB", "FROM", "q")
    watcher("MONITOR")
    env.wait(1_500)
    env.s("PING")
    env.core.out.effects.clear()
    env.wait(600)
    closed = {e.client_id for e in env.core.out.effects if type(e).__name__ == "CloseClient"}
    assert closed == {idle.client.id}


def test_evict_is_a_no_op_below_95_percent(env):
    assert env.core.memory.level() == 0 and env.core.memory.evict()


# ---------------------------------------------------------------- bus entry points


@pytest.mark.parametrize("retry", [2, 0])
def test_replica_received_from_peer(duo, retry):
    """REPLJOB: the copy is active and unqueued.  An at-least-once copy is
    queued after delay + retry unless the owner announces it, and that
    re-queueing is announced; an at-most-once copy is never queued here."""
    from disque.store.records import job_to_wire

    origin = Job(b"DI" + PEER[:8].encode() + b"1" * 32 + b"05a1SQ", b"q", b"x", etime=duo.clock.ms // 1000 + 60,
                 ctime=duo.clock.ms * 1_000_000, retry=retry, nodes_delivered=(PEER, NODE_ID, "c" * 40))  # fmt: skip
    from_peer(duo, m.ReplJob(job_to_wire(origin, duo.clock.ms)))
    assert duo.sent() == [m.GotJob(origin.id)]
    shown = duo.show(origin.id)
    assert shown["state"] == "active" and shown["nodes-delivered"] == [PEER, NODE_ID]
    if retry:
        assert 2000 - 250 <= shown["next-requeue-within"] <= 2000 + 249
    else:
        assert shown["next-requeue-within"] is None
    duo.wait(2_250)
    assert duo.state(origin.id) == ("queued" if retry else "active")
    expected = [m.WillQueue(origin.id), m.Queued(origin.id, incr_nacks=False, incr_deliv=True)] if retry else []
    assert [x for x in duo.sent() if not isinstance(x, m.Ping)] == expected


def test_bus_message_serves_blocked_clients(duo):
    job_id = duo.add("q", "x", "REPLICATE", 1, "DELAY", 30)
    consumer = Session(duo.core)
    assert consumer("GETJOB", "FROM", "q") is BLOCKED
    from_peer(duo, m.Enqueue(job_id, 0))
    assert consumer.pending() == [[[b"q", job_id, b"x"]]]


def test_link_state_and_answers(duo):
    core = duo.core
    key = core.cluster.nodes[PEER].key
    assert core.header() == m.Header(NODE_ID, 7711, core.cluster.myself.flags)
    assert core.bus_links() == {key: ("127.0.0.1", 17712)}
    core.handle_bus(m.Header(PEER, 7712, 0), m.Ping(), conn=99)
    assert [type(e).__name__ for e in core.out.effects] == ["Answer"] and core.out.effects[0].conn == 99
    core.out.effects.clear()
    core.link_closed(key, connect_failed=False)
    from_peer(duo, m.SetAck(ODD_ID, 1))  # an answer to a peer without a link is dropped
    assert duo.sent() == []


def test_setack_for_an_acked_job(duo):
    duo.s("ACKJOB", ODD_ID)
    duo.sent()
    from_peer(duo, m.SetAck(ODD_ID, 0))
    assert duo.state(ODD_ID) == "acked" and m.GotAck(ODD_ID, True) in duo.sent()


@pytest.mark.parametrize("mode", ["OFF", "SKIP"])
def test_silenced_blocking_command_stays_silent_when_served(env, mode):
    consumer = Session(env.core)
    consumer("CLIENT", "REPLY", mode)
    assert consumer("GETJOB", "FROM", "q") is BLOCKED
    env.add("q", "x")
    assert consumer.pending() == [SILENT] and consumer.client.waiter is None  # no reply, but the session resumes
    assert consumer("PING") == (Status(b"PONG") if mode == "SKIP" else SILENT)
    producer = Session(env.core)
    producer("CLIENT", "REPLY", "OFF")
    producer("ADDJOB", "q", "y", 0)
    assert producer.client.mute_next is False  # it did not block: nothing to drop later


def test_late_repljob_does_not_revive_a_collected_job(duo):
    """Regression (jepsen-lite): a REPLJOB delayed in a stalled link arrived
    after the job was acknowledged and collected, and re-created it here."""
    from disque.store.records import job_to_wire

    origin = Job(b"DI" + PEER[:8].encode() + b"2" * 32 + b"05a1SQ", b"q", b"x", etime=duo.clock.ms // 1000 + 60,
                 ctime=duo.clock.ms * 1_000_000, retry=2, nodes_delivered=(PEER, NODE_ID))  # fmt: skip
    late = m.ReplJob(job_to_wire(origin, duo.clock.ms))
    from_peer(duo, late)
    from_peer(duo, m.DelJob(origin.id))  # the owner collected it after an ACK
    assert duo.show(origin.id) is None
    duo.sent()
    from_peer(duo, late)
    assert duo.show(origin.id) is None and duo.sent() == []
    duo.wait(301_000)  # remembered for five minutes, then forgotten
    assert origin.id not in duo.core.collected
