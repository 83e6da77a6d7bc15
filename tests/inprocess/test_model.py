"""A hypothesis state machine drives one NodeCore through client commands and
the passage of time, against a simple model: a dict of jobs (state, queue,
counters, requeue window) and a dict of queues (pause flags, counters,
blocked clients in FIFO order).  Queue contents are derived from the jobs,
ordered by creation.

Commands are deterministic, so the model predicts their replies exactly,
including what blocked consumers receive.  Timers are not: requeue times
carry a random jitter, so for each job the model keeps the window
[lo, hi] in which its next timer-driven queueing must happen, and after
every scheduler tick it checks what the core did against those windows
(nothing early, nothing late), then applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import permutations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from disque.core.effects import Reply
from disque.core.errors import DisqueError
from disque.core.types import BLOCKED, NIL_ARRAY, Status
from disque.store.job import State
from invariants import advance, check_core, quick_and_slow
from support import NODE_ID, Session, all_jobs, make_core

QUEUES = (b"q1", b"q2", b"q3")
IN, OUT = 1, 2
PAUSE_WORDS = {b"none": None, b"in": IN, b"out": OUT, b"all": IN | OUT}
PAUSE_NAMES = {0: b"none", IN: b"in", OUT: b"out", IN | OUT: b"all"}
JITTER_LO, JITTER_HI = -250, 249
QUEUE_IDLE_MS = 300_000
CRON_MS = 100
UNKNOWN_ID = b"DI" + NODE_ID[:8].encode() + b"0" * 32 + b"05a1SQ"
MAX_BLOCKED = 4


@dataclass
class MJob:
    id: bytes
    queue: bytes
    body: bytes
    seq: int  # creation order == (ctime, id) order on one node
    retry: int
    created_ms: int
    etime: int  # unix seconds
    lo: int  # window of the next timer-driven queueing (ms), while it has one
    hi: int
    state: str = "active"  # or "queued"
    ever_queued: bool = False  # RETRY 0: qtime becomes 0 at the first queueing
    announced: bool = False  # later queueings count as additional deliveries
    nacks: int = 0
    deliv: int = 0
    deliveries: int = 0

    @property
    def has_timer(self) -> bool:
        return self.retry > 0 or not self.ever_queued


@dataclass
class MQueue:
    atime: int
    pause: int = 0
    jobs_in: int = 0
    jobs_out: int = 0
    waiters: list[int] = field(default_factory=list)  # client ids, FIFO
    collectable_since: int | None = None


@dataclass
class MWaiter:
    session: Session
    queues: tuple[bytes, ...]
    withcounters: bool
    deadline: int  # 0 = none


def entry(job: MJob, withcounters: bool) -> list:
    out = [job.queue, job.id, job.body]
    return out + [b"nacks", job.nacks, b"additional-deliveries", job.deliv] if withcounters else out


queue_lists = st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3)


class CoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core, self.clock, _ = make_core()
        self.s = Session(self.core)
        self.jobs: dict[bytes, MJob] = {}
        self.queues: dict[bytes, MQueue] = {}
        self.waiters: dict[int, MWaiter] = {}
        self.gone: list[bytes] = []  # deleted or expired IDs, for SHOW
        self.ready: dict[bytes, None] = {}
        self.expected: dict[int, list] = {}  # replies due to other clients
        self.seq = 0

    # ------------------------------------------------------------ model ops

    @property
    def now(self) -> int:
        return self.clock.ms

    def queued(self, name: bytes) -> list[MJob]:
        return sorted((j for j in self.jobs.values() if j.state == "queued" and j.queue == name), key=lambda j: j.seq)

    def queue(self, name: bytes) -> MQueue:
        if name not in self.queues:
            self.queues[name] = MQueue(atime=self.now)
        return self.queues[name]

    def paused_in(self, job: MJob) -> bool:
        q = self.queues.get(job.queue)
        return q is not None and bool(q.pause & IN)

    def timer_blocked(self, job: MJob) -> bool:
        """The job's qtime keeps being pushed instead of queueing it."""
        return job.state == "queued" or (job.retry > 0 and self.paused_in(job))

    def release(self, job: MJob) -> None:
        """The job stops being timer-blocked: if its qtime may have been
        pushed already, the window widens."""
        if job.has_timer and self.now >= job.lo:
            job.hi = max(job.hi, self.now + job.retry * 1000 + JITTER_HI)

    def enqueueable(self, job: MJob) -> bool:
        return job.state == "active" and job.has_timer

    def enqueue(self, job: MJob, nack: bool = False) -> None:
        assert self.enqueueable(job)
        job.state = "queued"
        job.ever_queued = True
        if job.announced or nack:
            if nack:
                job.nacks += 1
            else:
                job.deliv += 1
        else:
            job.announced = True
        job.lo = self.now + job.retry * 1000 + JITTER_LO
        job.hi = self.now + job.retry * 1000 + JITTER_HI
        q = self.queue(job.queue)
        q.atime = self.now
        q.jobs_in += 1
        if not q.pause & OUT and q.waiters:
            self.ready[job.queue] = None

    def fetch(self, name: bytes) -> MJob:
        job = self.queued(name)[0]
        job.state = "active"
        job.deliveries += 1
        assert job.retry > 0 or job.deliveries == 1, f"RETRY 0 job {job.id!r} delivered twice"
        self.release(job)
        q = self.queues[name]
        q.atime = self.now
        q.jobs_out += 1
        return job

    def delete(self, job: MJob) -> None:
        del self.jobs[job.id]
        self.gone = [job.id] + self.gone[:19]

    def drop_waiter(self, client_id: int) -> MWaiter:
        waiter = self.waiters.pop(client_id)
        for name in waiter.queues:
            if name in self.queues:
                self.queues[name].waiters.remove(client_id)
        return waiter

    def plan_serving(self, order: list[bytes]) -> list[tuple[int, MJob]]:
        """Who gets which job when the ready queues are served in `order`."""
        served: set[int] = set()
        plan = []
        for name in order:
            q = self.queues.get(name)
            if q is None or q.pause & OUT:
                continue
            waiting = [c for c in q.waiters if c not in served]
            jobs = self.queued(name)
            for client_id, job in zip(waiting, jobs):
                served.add(client_id)
                plan.append((client_id, job))
        return plan

    def serve(self, plan: list[tuple[int, MJob]]) -> None:
        for client_id, job in plan:
            waiter = self.drop_waiter(client_id)
            assert self.fetch(job.queue) is job
            self.expected.setdefault(client_id, []).append([entry(job, waiter.withcounters)])

    def get_rounds(self, names: list[bytes], count: int, withcounters: bool) -> list:
        """GETJOB's fetch rounds (spec/commands.md §4.2) against the model."""
        out: list = []
        while True:
            took = False
            for name in names:
                q = self.queues.get(name)
                if q is None or q.pause & OUT or not self.queued(name):
                    self.queue(name)
                    continue
                took = True
                out.append(entry(self.fetch(name), withcounters))
                if len(out) == count:
                    return out
            if not took:
                return out

    def drain_replies(self) -> dict[int, list]:
        got: dict[int, list] = {}
        for effect in self.core.out.effects:
            if isinstance(effect, Reply):
                got.setdefault(effect.client_id, []).append(effect.value)
        self.core.out.effects.clear()
        return got

    def settle(self) -> None:
        """After a command: serve ready queues and compare replies to others."""
        ready, self.ready = list(self.ready), {}
        self.serve(self.plan_serving(ready))
        assert self.drain_replies() == self.expected
        self.expected = {}

    # ------------------------------------------------------------ timers

    def on_tick(self) -> None:
        now = self.now
        got = self.drain_replies()
        delivered: dict[int, list] = {}
        for client_id, values in got.items():
            for value in values:
                if value is NIL_ARRAY:
                    waiter = self.waiters.get(client_id)
                    assert waiter is not None and waiter.deadline and now >= waiter.deadline, "early timeout"
                    self.drop_waiter(client_id)
                else:
                    assert client_id not in delivered and client_id in self.waiters, "unexpected reply"
                    delivered[client_id] = value
        delivered_ids = {value[0][1] for value in delivered.values()}

        for job in list(self.jobs.values()):
            if job.id not in self.core.jobs:
                assert now >= job.etime * 1000, f"{job.id!r} gone before its TTL"
                assert job.id not in delivered_ids
                self.delete(job)

        for job in sorted(self.jobs.values(), key=lambda j: j.seq):
            core_job = self.core.jobs.get(job.id)
            fresh = job.state == "active" and (core_job.state == State.QUEUED or job.id in delivered_ids)
            if fresh:
                assert job.has_timer and not self.timer_blocked(job), f"{job.id!r} queued while it may not be"
                assert now >= job.lo, f"{job.id!r} requeued {job.lo - now} ms early"
                self.enqueue(job)
            elif self.timer_blocked(job):
                while job.has_timer and now >= job.hi:  # the qtime was pushed
                    job.lo += job.retry * 1000 + JITTER_LO
                    job.hi += job.retry * 1000 + JITTER_HI
            elif job.state == "active" and job.has_timer and job.hi < job.etime * 1000:
                assert now < job.hi, f"{job.id!r} not requeued {now - job.hi} ms after its window"

        # The order in which queues that got jobs in this tick are served
        # follows the (jittered) timer: any order is fine, but one must match.
        ready, self.ready = sorted(self.ready), {}
        for order in permutations(ready):
            plan = self.plan_serving(list(order))
            if {c: [entry(j, self.waiters[c].withcounters)] for c, j in plan} == delivered:
                self.serve(plan)
                self.expected = {}  # already seen: they are the replies of this tick
                break
        else:
            raise AssertionError(f"blocked clients served wrongly: {delivered}")

        for waiter in self.waiters.values():
            assert not waiter.deadline or now < waiter.deadline + CRON_MS, "blocked client not timed out"

        for name, q in list(self.queues.items()):
            collectable = not q.waiters and not q.pause and not self.queued(name) and now - q.atime >= QUEUE_IDLE_MS
            if self.core.queues.get(name) is None:
                assert collectable, f"queue {name!r} collected too early"
                del self.queues[name]
            elif not collectable:
                q.collectable_since = None
            else:
                since = q.collectable_since = q.collectable_since or now
                assert now - max(since, q.atime + QUEUE_IDLE_MS) < CRON_MS, f"idle queue {name!r} not collected"

    # ------------------------------------------------------------ rules

    @initialize(jobs=st.lists(st.tuples(st.sampled_from(QUEUES), st.sampled_from([0, 1, 2])), min_size=1, max_size=4))
    def some_jobs(self, jobs):
        """Start with queued jobs, so that short runs have something to work on."""
        for name, retry in jobs:
            self.addjob(name, retry, None, None, None)

    @rule(
        name=st.sampled_from(QUEUES),
        retry=st.sampled_from([None, 0, 1, 2, 5]),
        delay=st.sampled_from([None, 0, 1, 3]),
        ttl=st.sampled_from([None, 2, 5, 20]),
        maxlen=st.sampled_from([None, 1, 3]),
    )
    def addjob(self, name, retry, delay, ttl, maxlen):
        argv = [b"ADDJOB", name, b"body%d" % self.seq, b"0"]
        for opt, value in ((b"RETRY", retry), (b"DELAY", delay), (b"TTL", ttl), (b"MAXLEN", maxlen)):
            if value is not None:
                argv += [opt, str(value).encode()]
        reply = self.s(*argv)
        ttl, delay = ttl or 86400, delay or 0
        q = self.queues.get(name)
        if delay >= ttl:
            assert reply.message.startswith("The specified DELAY is greater than TTL"), reply
        elif maxlen is not None and len(self.queued(name)) >= maxlen:
            assert reply.code == "MAXLEN", reply
        elif q is not None and q.pause & IN:
            assert reply.code == "PAUSED", reply
        else:
            assert isinstance(reply, Status) and len(reply) == 48, reply
            retry = (min(ttl // 10, 300) or 1) if retry is None else retry
            minutes = int(reply[42:46], 16)
            assert minutes & 1 == (retry > 0) and minutes >> 1 == min(ttl // 60, 65535) >> 1
            start = self.now + delay * 1000
            job = MJob(bytes(reply), name, argv[2], self.seq, retry, self.now, self.now // 1000 + ttl, start, start)
            self.seq += 1
            self.jobs[job.id] = job
            if delay == 0:
                self.enqueue(job)
        self.settle()

    @rule(names=queue_lists, count=st.sampled_from([None, 1, 2, 5]), withcounters=st.booleans())
    def getjob_nohang(self, names, count, withcounters):
        argv = [b"GETJOB", b"NOHANG"] + ([b"COUNT", b"%d" % count] if count else [])
        argv += [b"WITHCOUNTERS"] if withcounters else []
        reply = self.s(*argv, b"FROM", *names)
        assert reply == (self.get_rounds(names, count or 1, withcounters) or NIL_ARRAY)
        self.settle()

    @precondition(lambda self: len(self.waiters) < MAX_BLOCKED)
    @rule(
        data=st.data(),
        timeout=st.sampled_from([0, 100, 250, 1000, 5000]),
        count=st.sampled_from([1, 3]),
        withcounters=st.booleans(),
    )
    def getjob_blocking(self, data, timeout, count, withcounters):
        empty = [name for name in QUEUES if not self.queued(name)]  # mostly ask where it blocks
        names = data.draw(st.lists(st.sampled_from(empty or QUEUES), min_size=1, max_size=2) | queue_lists)
        consumer = Session(self.core)
        argv = [b"GETJOB", b"TIMEOUT", b"%d" % timeout, b"COUNT", b"%d" % count]
        reply = consumer(*argv, *([b"WITHCOUNTERS"] if withcounters else []), b"FROM", *names)
        out = self.get_rounds(names, count, withcounters)
        if out:
            assert reply == out
        else:
            assert reply is BLOCKED
            unique = tuple(dict.fromkeys(names))
            client_id = consumer.client.id
            self.waiters[client_id] = MWaiter(consumer, unique, withcounters, self.now + timeout if timeout else 0)
            for name in unique:
                self.queue(name).waiters.append(client_id)
        self.settle()

    @precondition(lambda self: self.waiters)
    @rule(data=st.data())
    def disconnect(self, data):
        client_id = data.draw(st.sampled_from(sorted(self.waiters)))
        self.core.disconnect(client_id)
        self.drop_waiter(client_id)
        self.settle()

    def pick_ids(self, data, max_size: int = 3) -> list[bytes]:
        pool = sorted(self.jobs) + self.gone[:2] + [UNKNOWN_ID]
        return data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=max_size))

    @rule(data=st.data(), command=st.sampled_from([b"ACKJOB", b"FASTACK", b"DELJOB"]))
    def remove(self, data, command):
        ids = self.pick_ids(data)
        reply = self.s(command, *ids)
        count = 0
        for job_id in ids:
            if job_id in self.jobs:
                self.delete(self.jobs[job_id])
                count += 1
        assert reply == count
        self.settle()

    @rule(data=st.data(), command=st.sampled_from([b"ENQUEUE", b"NACK"]))
    def requeue(self, data, command):
        ids = self.pick_ids(data)
        reply = self.s(command, *ids)
        count = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is not None and self.enqueueable(job):
                self.enqueue(job, nack=command == b"NACK")
                count += 1
        assert reply == count
        self.settle()

    @rule(data=st.data())
    def dequeue(self, data):
        ids = self.pick_ids(data)
        reply = self.s("DEQUEUE", *ids)
        count = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is not None and job.state == "queued":
                job.state = "active"
                self.release(job)
                count += 1
        assert reply == count
        self.settle()

    @rule(data=st.data())
    def working(self, data):
        (job_id,) = self.pick_ids(data, max_size=1)
        reply = self.s("WORKING", job_id)
        job = self.jobs.get(job_id)
        if job is None:
            assert isinstance(reply, DisqueError) and reply.code == "NOJOB"
        elif self.now - job.created_ms > (job.etime * 1000 - job.created_ms) / 2:
            assert isinstance(reply, DisqueError) and reply.code == "TOOLATE"
        else:
            assert reply == job.retry
            job.state = "active"
            if job.retry:
                job.lo = self.now + job.retry * 1000 + JITTER_LO
                job.hi = self.now + job.retry * 1000 + JITTER_HI
        self.settle()

    @rule(
        data=st.data(),
        words=st.sampled_from([[b"in"], [b"none"]])
        | st.lists(st.sampled_from([*PAUSE_WORDS, b"state"]), min_size=1, max_size=3),
    )
    def pause(self, data, words):
        waiting = sorted({j.queue for j in self.jobs.values() if j.state == "active"})  # where the timer matters
        name = data.draw(st.sampled_from(waiting or QUEUES) | st.sampled_from(QUEUES))
        reply = self.s("PAUSE", name, *words)
        flags, change = 0, False
        for word in words:
            if word in PAUSE_WORDS:
                bit = PAUSE_WORDS[word]
                flags = 0 if bit is None else flags | bit
                change = True
        q = self.queues.get(name)
        if change and (q is not None or flags):
            q = self.queue(name)
            was_in = q.pause & IN
            q.pause = flags
            if was_in and not flags & IN:
                for job in self.jobs.values():
                    if job.queue == name and job.state == "active":
                        self.release(job)
            if not flags & OUT and q.waiters and self.queued(name):
                self.ready[name] = None
        assert reply == Status(PAUSE_NAMES[q.pause if q is not None else 0])
        self.settle()

    @rule(ms=st.sampled_from([1, 99, 100, 250, 499, 500, 1000, 2500, 10_000, QUEUE_IDLE_MS + 500]))
    def wait(self, ms):
        advance(self.core, self.clock, ms, self.on_tick)

    # ------------------------------------------------------------ invariants

    @invariant()
    def consistent(self):
        check_core(self.core)
        s, now = self.s, self.now
        assert {job.id for job in all_jobs(self.core)} == set(self.jobs)
        assert set(self.core.blocking.blocked) == set(self.waiters)
        for job in self.jobs.values():
            shown = dict(s("SHOW", job.id))
            assert shown[b"state"] == job.state and shown[b"queue"] == job.queue and shown[b"body"] == job.body
            assert shown[b"retry"] == job.retry and shown[b"ttl"] == max(0, job.etime - now // 1000)
            assert (shown[b"nacks"], shown[b"additional-deliveries"]) == (job.nacks, job.deliv)
        for job_id in self.gone:
            assert s("SHOW", job_id) is None
        for name in QUEUES:
            ids = [j.id for j in self.queued(name)]
            assert s("QLEN", name) == len(ids)
            assert [e[1] for e in s("QPEEK", name, 100)] == ids
            assert [e[1] for e in s("QPEEK", name, -100)] == ids[::-1]
            q = self.queues.get(name)
            stat = s("QSTAT", name)
            if q is None:
                assert stat is NIL_ARRAY
                continue
            stat = dict(stat)
            assert stat[b"blocked"] == len(q.waiters) and stat[b"pause"] == PAUSE_NAMES[q.pause].decode()
            assert (stat[b"jobs-in"], stat[b"jobs-out"]) == (q.jobs_in, q.jobs_out)
            assert stat[b"idle"] == (now - q.atime) // 1000
        info = s("INFO", "jobs")
        assert info == b"# Jobs\r\nregistered_jobs:%d\r\n" % len(self.jobs)
        assert not self.core.out.effects


TestCoreModel, TestCoreModelLong = quick_and_slow(CoreModel, quick=(60, 35), slow=(600, 80))
