"""The job lifecycle: the registry, the queues and the scheduler (Disque's job.c and queue.c).

Theory of operation: `Lifecycle` owns the node's jobs (`jobs`, a `JobStore`
that may keep some on disk) and queues, and is the one place their rules
live: a job enters through `register` (created here), `adopt` (a copy from a
peer or a record replayed from the AOF: one rule for both), and leaves
through `delete_job`; it is queued by `enqueue`, taken by `fetch`, and its
one timer is set by `reschedule` and served by `process_job` (spec/cluster.md
§8.3, Disque's processJob).  The producer's operations (`add_job`,
`add_event`, NACK ... DELAY, WORKING, dead letters) are built on those.

Invariants kept here:
* a job is in exactly one state (`store/job.py` transition table), and a
  queue holds only `queued` jobs;
* every registered job has one awake time in the `JobStore` timer,
  recomputed by `reschedule` after every change that matters;
* a RETRY 0 job is queued at most once per node (`enqueue` refuses it once
  delivered, and `qtime = 0` afterwards);
* the node's identity is `membership.myself` alone: its ID and `solo` tuple
  are read when needed, never copied, so CLUSTER RESET HARD changes them
  everywhere at once.

Collaborators: it emits through the `Outbox` and accounts in `Memory`
(both concrete: they are below it).  The concerns built on it (consumer
groups, ACK GC, Kestrel's items, replication, federation, blocked clients)
are above it, so it sees each through the small protocol below of the hooks
it calls, bound once they exist (`bind`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, Final, Protocol

from disque.cluster import messages as m
from disque.core import errors
from disque.core.settings import Settings
from disque.core.types import Connection, Stats, Status
from disque.store.failure import NO_FAILURE, Failure
from disque.store.ids import new_job_id
from disque.store.job import (
    ABORT,
    ADOPT,
    BCAST_QUEUED,
    BCAST_WILLQUEUE,
    DELIVERED,
    DEQUEUE,
    ENQUEUE,
    EVENT,
    FETCH,
    NACKED,
    Job,
    State,
)
from disque.store.job_options import JobOptions
from disque.store.jobs import JobStore
from disque.store.queue import PAUSE_IN, PAUSE_OUT, Queue
from disque.store.queue_config import DEFAULTS as NO_LIMITS, QueueSettings
from disque.store.results import Results
from disque.store.scan import BucketedDict

if TYPE_CHECKING:
    import random

    from disque.cluster.membership import Membership
    from disque.core.memory import Memory
    from disque.core.outbox import Outbox
    from disque.store.collected import Collected

# Module-level aliases: attribute lookups on an IntEnum are slow in the hot path.
S_WAIT_REPL: Final = State.WAIT_REPL  # (Final: the compiled build reads these as C statics, not globals)
S_ACTIVE: Final = State.ACTIVE
S_QUEUED: Final = State.QUEUED
S_ACKED: Final = State.ACKED

WILLQUEUE_LEAD: Final = 500
GC_MAX_DELAY: Final = 180_000
EVENT_REPL_TIMEOUT = 5000  # ms a QADD waits for its replicas (then -NOREPL), as a Kestrel SET
SLICE: Final = 64  # jobs a long command (DEADLETTER REQUEUE, QFLUSH) handles before other clients run
EVENT_COPIES: Final = 3  # an event lives on min(3, cluster size) nodes
DEFAULT_TTL: Final = 86400  # s: ADDJOB's TTL when none is given
OK = Status(b"OK")


def default_minrepl(repl: int) -> int:
    """The copies a job added without REPLICATE settles for when a target is
    out of good standing (docs/replication.md): a majority of its level."""
    return repl // 2 + 1


def replication_level(repl: int | None, minrepl: int | None, size: int) -> tuple[int, int]:
    """REPLICATE and MINREPL as given (None: not given) -> the level and the
    minimum: without REPLICATE min(3, cluster size) and a majority of it,
    an explicit REPLICATE alone its exact level, as in Disque."""
    if repl is None:
        repl = min(3, size)
        if minrepl is None:
            return repl, default_minrepl(repl)
    if minrepl is None:
        return repl, repl
    if minrepl > repl:
        raise errors.err("MINREPL can't be greater than the replication level")
    return repl, minrepl


def default_retry(ttl: int) -> int:
    """ADDJOB's RETRY (s) when none is given: a tenth of the TTL, 1 to 300."""
    return min(ttl // 10, 300) or 1


def check_size(body: bytes, settings: Settings) -> None:
    """`max-job-size`: every front end's new job (ADDJOB, SET, QADD, a
    schedule's tick) is refused above it, with an error that names it."""
    if len(body) > settings.max_job_size:
        raise errors.job_too_large(len(body), settings.max_job_size)


def check_job_options(repl: int, retry: int | None, delay: int, ttl: int) -> None:
    """ADDJOB's checks of its options together (spec/commands.md §4.1 step 4),
    also made when a schedule is added, so its ticks are never refused for them.
    (Here, not in errors.py: every ADDJOB calls it, natively in the compiled build.)"""
    if repl > 1 and retry == 0:
        raise errors.err("With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)")
    if delay >= ttl:
        raise errors.err("The specified DELAY is greater than TTL. Job refused since would never be delivered")


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters DEADLETTER LIST, REQUEUE and DELETE take: those
    that came from queue `origin`, whose last failure is of `error_type`,
    moved to the dead-letter queue (their copy made) at `since` or later
    and before `until` (unix ms); None and 0 take any."""

    origin: bytes | None = None
    error_type: bytes | None = None
    since: int = 0
    until: int = 0

    def takes(self, job: Job) -> bool:
        failure = job.failure
        moved = job.ctime // 1_000_000
        return (
            (self.origin is None or job.dead_letter == self.origin)
            and (self.error_type is None or (isinstance(failure, Failure) and failure.type == self.error_type))
            and moved >= self.since
            and (not self.until or moved < self.until)
        )


# ------------------------------------------------------------------ the hooks it calls above it


class Events(Protocol):  # consumer groups (core/groups.py)
    def add_event(self, job: Job) -> None: ...
    def drop_event(self, job: Job) -> None: ...
    def created(self, job: Job) -> None: ...
    def reply(self, job: Job) -> Any: ...
    def new_event(self, queue: bytes, body: bytes, ttl: int, repl: int) -> Job: ...


class Collector(Protocol):  # ACK garbage collection and results (core/acks.py)
    def try_gc(self, job: Job) -> None: ...
    def keep_result(self, job_id: bytes, queue: bytes | None, result: bytes) -> None: ...


class Batcher(Protocol):  # batches (core/batches.py)
    def add(self, batch_id: bytes, job_id: bytes) -> None: ...
    def finished(self, job: Job, acked: bool) -> None: ...


class Dependents(Protocol):  # jobs that wait for jobs (core/dependencies.py)
    watchers: dict[bytes, set[str]]
    held: dict[bytes, set[bytes]]

    def hold(self, job: Job) -> None: ...
    def settled(self, job_id: bytes, acked: bool) -> None: ...


class Kestrel(Protocol):  # Kestrel's queue limits (core/items.py)
    def make_room(self, limits: QueueSettings, queue: bytes, body: bytes, ttl: int) -> int: ...
    def expired(self, job: Job) -> None: ...


class Replicas(Protocol):  # replication (core/replication.py)
    def start(
        self, client: Connection, job: Job, additional: int, timeout: int, is_async: bool, extrepl: bool,
        zones: int = 1, minrepl: int = 0,
    ) -> Any: ...
    def replicate(self, job: Job, count: int, noreply: bool) -> int: ...
    def forget(self, job_id: bytes) -> None: ...


class Consumers(Protocol):  # who waits for jobs: blocked clients here (core/blocking.py), peers' (federation)
    ready: dict[bytes, None]  # queues with jobs and someone to serve, served at the end of the step
    job_waits: dict[bytes, Any]

    def settle_waits(self, job_id: bytes, acked: bool) -> None: ...


class KeyHolds(Protocol):  # keyed jobs' holds at their homes (core/keys.py)
    def done(self, job: Job, aborted: bool) -> None: ...


class Wanted(Protocol):
    wanted: dict[bytes, Any]  # queues that consumers on other nodes wait for (core/federation.py)


class Lifecycle:
    # The concerns above it, bound by `bind` once they exist.
    events: Events
    collector: Collector
    kestrel: Kestrel
    deps: Dependents
    batches: Batcher
    replicas: Replicas
    consumers: Consumers
    wanted: Wanted
    keys: KeyHolds  # (set by NodeCore once it exists)

    def __init__(
        self, config: Any, rng: random.Random, membership: Membership, out: Outbox, memory: Memory,
        stats: Stats, collected: Collected, now: int,
    ) -> None:  # fmt: skip
        self.config, self.rng, self.membership, self.stats = config, rng, membership, stats
        self.settings: Settings = config.settings  # what every job reads, typed
        self.out, self.memory, self.collected = out, memory, collected  # below it: emitted to, accounted in, remembered
        self.now = now  # ms, the time of the current step (NodeCore.read_clock)
        self.jobs = JobStore()
        self.results = Results()  # acknowledged jobs' results (store/results.py)
        self.queues: BucketedDict[bytes, Queue] = BucketedDict()
        self.last_ctime = 0
        self._expiry = (0, 1000)  # (etime, its expiry awake time) of the last job scheduled
        memory.hold(self)

    def bind(
        self, events: Events, collector: Collector, kestrel: Kestrel, replicas: Replicas, consumers: Consumers,
        wanted: Wanted, deps: Dependents, batches: Batcher,
    ) -> None:  # fmt: skip
        self.events, self.collector, self.kestrel, self.deps, self.batches = events, collector, kestrel, deps, batches
        self.replicas, self.consumers, self.wanted = replicas, consumers, wanted

    # ------------------------------------------------------------ draws

    def jitter(self) -> int:
        """randrange(-250, 250), the same draws inlined (it costs three calls)."""
        bits = self.rng.getrandbits
        r = bits(9)
        while r >= 500:
            r = bits(9)
        return r - 250

    def new_ctime(self) -> int:
        ctime = self.now * 1_000_000
        if ctime <= self.last_ctime:
            ctime = self.last_ctime + 1
        self.last_ctime = ctime
        return ctime

    # ------------------------------------------------------------ queues

    def queue(self, name: bytes) -> Queue:
        """The queue `name`, made if it does not exist."""
        queue = self.queues.get(name)
        if queue is None:
            queue = Queue(name, self.now)
            self.queues.add(name, queue)
            self.memory.account(self.memory.queue_size(name))
        return queue

    def destroy_queue(self, queue: Queue) -> None:
        self.jobs.spilled.forget_queue(queue)
        for job in queue.drain():  # only when flushing: GC never drops live jobs
            job.move(DEQUEUE)
        self.queues.pop(queue.name)
        self.consumers.ready.pop(queue.name, None)
        self.memory.account(-self.memory.queue_size(queue.name))

    def set_pause(self, name: bytes, flags: int) -> None:
        queue = self.queues.get(name)
        if queue is None:
            if not flags:
                return
            queue = self.queue(name)
        queue.pause = flags
        if not flags & PAUSE_OUT and queue.waiters and len(queue):
            self.consumers.ready[name] = None

    # ------------------------------------------------------------ in and out of the registry

    def register(self, job: Job, timer: bool = True) -> None:
        """Add a job to the registry and the timer (not `timer`: a new job
        that `queue_new_job` puts on the timer next, once)."""
        if job.queue is not None:
            queue = self.queues.get(job.queue)
            if queue is not None:
                job.queue = queue.name  # share the name bytes between jobs
        self.jobs.add(job)
        self.memory.add_job(job)
        if timer:
            self.reschedule(job)
        if job.flags & EVENT:
            self.events.add_event(job)

    def adopt(self, job: Job, not_before: int = 0, keep_flags: int = EVENT) -> Job:
        """Register a job this node did not create (spec/cluster.md §8.1
        receive rules; spec/persistence.md §7 for the AOF): a copy starts
        active with timers of its own, whatever its holder's were, so it is
        queued here only if nobody queues it in time (a RETRY 0 copy only
        when ENQUEUE or YOURJOBS hands it over), and never before
        `not_before` (a NACK ... DELAY the AOF logged).  A peer's copy keeps
        of its flags only EVENT, a replayed record (`keep_flags` all) its
        own; nodes this one does not know leave `nodes_delivered`."""
        job.move(ADOPT)
        job.gc_retry = 0
        job.flags &= keep_flags
        if job.retry:
            job.flags |= BCAST_WILLQUEUE
            job.qtime = max(self.now + (job.delay + job.retry) * 1000 + self.jitter(), not_before)
        else:
            job.qtime = 0
        solo = self.membership.solo
        if job.nodes_delivered == solo:
            job.nodes_delivered = solo  # shared, as the jobs made here share it
        else:
            known = self.membership.nodes
            job.nodes_delivered = tuple(n for n in job.nodes_delivered if n in known)
        self.register(job)
        if job.rare is not None and job.rare.parents:
            self.deps.hold(job)
        return job

    def receive(self, job: Job) -> Job:
        """A copy from a peer (REPLJOB, YOURJOBS): adopted, and noted for
        read-behind, which may move it to disk at the end of the step."""
        self.adopt(job)
        self.jobs.spilled.note_arrival(job)
        return job

    def delete_job(self, job: Job, log: bool = True) -> None:
        """Unregister a job, whatever the cause (spec/cluster.md §8.7): the one
        way out, so the AOF, a waiting producer and the queue hear of it once."""
        out = self.out
        if job.state == S_QUEUED:
            self.queue(job.queue).discard(job)  # type: ignore[arg-type]
            job.move(DEQUEUE)
        if log and job.state == S_ACTIVE:
            out.aof_deljob(job)
        if job.state == S_WAIT_REPL:
            self.replicas.forget(job.id)
            out.answer_producer(job.id, errors.norepl_removed())
            out.broadcast(job.nodes_delivered, m.DelJob(job.id, acked=False))
        if job.state == S_ACKED:
            self.collected.remember(job.id, self.now)
        if self.consumers.job_waits:
            self.consumers.settle_waits(job.id, job.state == S_ACKED)
        self.jobs.remove(job)
        self.memory.account(-self.memory.job_size(job))
        if job.flags & EVENT:
            self.events.drop_event(job)

    def finished(self, job: Job, acked: bool) -> None:
        """`job` was acknowledged here (or heard so), or went without that
        (expired, dead-lettered, deleted everywhere): the jobs that wait for
        it and its batch hear of it."""
        deps = self.deps
        if deps.watchers or deps.held:
            deps.settled(job.id, acked)
        if job.rare is not None and job.rare.batch:
            self.batches.finished(job, acked)

    def abort_replication(self, job: Job) -> None:
        """A job that never reached its replication level: delete every copy."""
        job.move(ABORT)
        self.out.broadcast(job.nodes_delivered, m.DelJob(job.id, acked=False))
        self.delete_job(job, log=False)

    # ------------------------------------------------------------ the scheduler

    def reschedule(self, job: Job) -> None:
        etime, at = self._expiry
        if job.etime == etime:  # jobs created in the same second share these int objects (memory)
            job.etime = etime
        else:
            at = job.etime * 1000 + 1000
            self._expiry = (job.etime, at)
        state = job.state
        if state == S_ACKED:
            gc_at = self.now + min(1000 << job.gc_retry, GC_MAX_DELAY) + self.jitter()
            at = min(at, gc_at)
        elif state != S_WAIT_REPL and job.qtime:
            at = min(at, job.qtime - (WILLQUEUE_LEAD if job.flags & BCAST_WILLQUEUE else 0))
        self.jobs.schedule(job, at)

    def process_job(self, job: Job) -> None:
        """One scheduler visit (spec/cluster.md §8.3, Disque's processJob): do
        what is due for this job (expire, announce, queue, push its timer, GC),
        then book the next visit."""
        now = self.now
        # Expired: every holder drops its copy on its own, with no message.
        if job.etime * 1000 <= now:
            if job.state == S_QUEUED:
                self.queue(job.queue).expired += 1  # type: ignore[arg-type]
                self.kestrel.expired(job)
            if job.state != S_ACKED:
                self.finished(job, False)
            self.delete_job(job)
            return
        state = job.state
        if state in (S_ACTIVE, S_QUEUED) and job.qtime:
            # Just before queueing it again, tell the other holders (WILLQUEUE):
            # one that has it queued answers QUEUED, one that has it acked SETACK,
            # so the job is not queued twice or revived; the next visit is at qtime.
            if job.flags & BCAST_WILLQUEUE and job.qtime - WILLQUEUE_LEAD <= now:
                if state == S_ACTIVE:
                    self.out.broadcast(job.nodes_delivered, m.WillQueue(job.id))
                job.flags &= ~BCAST_WILLQUEUE
            elif job.qtime <= now:
                # Due: queue it (a delayed job's first queueing, or the retry of an
                # undelivered or unacknowledged one).  A queue paused for input only
                # postpones an at-least-once job by a retry period; an at-most-once
                # job is queued anyway, since nothing would ever queue it again.
                if state == S_ACTIVE:
                    queue = self.queues.get(job.queue)  # type: ignore[arg-type]
                    if job.retry and queue is not None and queue.pause & PAUSE_IN:
                        job.qtime = now + job.retry * 1000 + self.jitter()
                    else:
                        self.enqueue(job)
                # Still waiting in this node's queue: only push the timer on, so a job
                # nobody fetched grows no duplicate elsewhere.
                elif job.retry:  # pragma: no branch - a queued RETRY 0 job has no qtime (enqueue clears it)
                    job.qtime = now + job.retry * 1000 + self.jitter()
                    job.flags |= BCAST_WILLQUEUE
        # Acknowledged: one more garbage-collection attempt (SETACK to the
        # holders that have not confirmed), backing off up to 3 minutes.
        elif state == S_ACKED:
            self.collector.try_gc(job)
        if job.id in self.jobs:
            self.reschedule(job)

    # ------------------------------------------------------------ queueing

    def enqueue(self, job: Job, nack: bool = False) -> bool:
        """Queue a job (spec/cluster.md §8.3).  False when refused: already
        queued, never to be queued again (qtime 0), an at-most-once job
        already handed out once, which queueing again would deliver twice,
        or a job that waits for others (core/dependencies.py)."""
        if job.rare is not None and job.rare.parents:
            job.qtime = 0
            return False
        if job.state == S_QUEUED or not job.qtime or (job.retry == 0 and job.flags & DELIVERED):
            if job.retry == 0:
                # Callers set qtime for the one enqueue of an at-most-once job; once
                # refused it would stay in the past, due at every tick, forever.
                job.qtime = 0
            return False
        if (nack or job.flags & BCAST_QUEUED) and not job.flags & NACKED and self._last_attempt(job):
            self.dead_letter_job(job)  # a redelivery (NACK, RETRY, ENQUEUE) past MAXATTEMPTS
            return True
        job.move(ENQUEUE)
        if job.retry:
            job.flags |= BCAST_WILLQUEUE
            job.qtime = self.now + job.retry * 1000 + self.jitter()
        else:
            job.qtime = 0
        queue = self.queue(job.queue)  # type: ignore[arg-type]
        job.queue = queue.name
        if job.flags & NACKED:  # the delayed requeue of a NACK ... DELAY, counted then
            job.flags = (job.flags & ~NACKED) | BCAST_QUEUED
            self.out.broadcast(job.nodes_delivered, m.Queued(job.id))
        elif job.flags & BCAST_QUEUED or nack:
            self.out.broadcast(job.nodes_delivered, m.Queued(job.id, nack, not nack, 0, job.failure if nack else NO_FAILURE))
            if nack:
                job.nacks = min(job.nacks + 1, 0xFFFF)
                queue.nacks += 1
            else:
                job.deliv = min(job.deliv + 1, 0xFFFF)
                queue.redeliveries += 1
        else:
            job.flags |= BCAST_QUEUED
        queue.push(job)
        self.jobs.spilled.grew(queue.name)
        queue.atime = self.now
        queue.jobs_in += 1
        if not queue.pause & PAUSE_OUT and (queue.waiters or queue.name in self.wanted.wanted):
            self.consumers.ready[queue.name] = None  # served at the end of the step, here or by a peer's consumer
        self.reschedule(job)
        return True

    def dequeue(self, job: Job) -> bool:
        if job.state != S_QUEUED:
            return False
        self.queue(job.queue).discard(job)  # type: ignore[arg-type]
        job.move(DEQUEUE)
        return True

    def fetch(self, queue: Queue) -> Job | None:
        """Take the job to serve first for delivery (GETJOB, or YOURJOBS):
        the highest priority once aged, the oldest of it."""
        if queue.has_tail():  # its newest jobs are on disk: each level's oldest must be in memory
            self.jobs.spilled.ready(queue)
        job = queue.pop(self.now, self.settings.priority_aging)
        if job is None:
            return None
        return self.deliver(queue, job)

    def take(self, queue: Queue, job: Job) -> Job:
        """`fetch` of a chosen job queued in memory in `queue` (a per-key
        limit held back the jobs served before it: core/limits.py)."""
        queue.discard(job)
        return self.deliver(queue, job)

    def deliver(self, queue: Queue, job: Job) -> Job:
        """A job just taken out of `queue` goes out for delivery."""
        job.move(FETCH)
        job.flags |= DELIVERED
        queue.atime = queue.fetched = now = self.now
        queue.jobs_out += 1
        queue.last_wait = now - job.ctime // 1_000_000
        return job

    # ------------------------------------------------------------ producers

    def add_job(self, client: Connection, queue: bytes, body: bytes, opts: JobOptions) -> Any:
        """ADDJOB after option parsing (spec/commands.md §4.1 steps 3-8,
        creation), with the options of store/job_options.py: `max_attempts`
        and `dead_letter` are the MAXATTEMPTS/DEADLETTER extension
        (`dead_letter_job`); `zones` is ZONES (docs/zones.md: the zones the
        copies must span, `min-zones` by default, at most REPLICATE);
        `priority` (0-9) defaults to the queue's (its `priority` setting, 5
        unless configured); a schedule's tick brings its `job_id`
        (core/schedules.py); `minrepl` is MINREPL (`replication_level`);
        `key` is KEY (docs/keys.md); `workflow` AFTER, ON-PARENT-FAIL and
        BATCH (docs/workflows.md)."""
        ttl, delay, retry, zones = opts.ttl, opts.delay, opts.retry, opts.zones
        settings = self.settings
        check_size(body, settings)
        membership = self.membership
        repl, minrepl = replication_level(opts.repl, opts.minrepl, membership.size())
        if ttl is None:
            ttl = DEFAULT_TTL
        limits = settings.queue_config.settings(queue)
        if limits is not NO_LIMITS:  # `queue-defaults` / `queue` lines (Kestrel's options)
            ttl = self.kestrel.make_room(limits, queue, body, ttl)
        if delay is None:
            delay = 0
        check_job_options(repl, retry, delay, ttl)
        if retry is None:
            retry = default_retry(ttl)
        if zones is None:
            zones = min(settings.min_zones, repl)
        elif zones > repl:
            raise errors.err("ZONES can't be greater than the replication level")
        additional, extrepl = self._replicas(repl, minrepl, membership.leaving or self.memory.level() >= 1)
        if zones > 1 and len(membership.reachable_zones(include_me=not extrepl)) < zones:
            raise errors.norepl_zones()
        existing = self.queues.get(queue)
        if existing is not None:
            if opts.maxlen is not None and len(existing) >= opts.maxlen:
                raise errors.maxlen()
            if existing.pause & PAUSE_IN:
                raise errors.paused()
        job_id = opts.job_id
        if job_id is None:
            job_id = new_job_id(membership.my_id, self.rng, ttl, retry)
        if job_id in self.jobs:
            raise errors.err("Internal error creating the job, check server logs")
        now = self.now
        job = Job(  # positional, cheaper than keywords: state, flags, repl, etime, ctime, delay, retry, nacks, deliv
            job_id, queue, body, S_ACTIVE, 0, repl, now // 1000 + ttl, self.new_ctime(), delay, retry, 0, 0,
            () if extrepl else membership.solo,
        )  # fmt: skip
        job.priority = limits.priority if opts.priority is None else opts.priority
        job.qtime = now + (delay or retry) * 1000
        if opts.max_attempts:
            job.set_attempts(opts.max_attempts, queue + b"-dead" if opts.dead_letter is None else opts.dead_letter)
        if opts.key:
            job.key = opts.key
            if opts.debounce:  # queued `debounce` ms from now here; the copies wait its DELAY, whole seconds (core/keys.py)
                job.qtime = now + opts.debounce
        workflow = opts.workflow
        if workflow is not None:
            if workflow.after:
                job.hold(workflow.after, workflow.on_parent_fail)
            if workflow.batch:
                self.batches.add(workflow.batch, job_id)  # counted before any copy can end
                job.join(workflow.batch)
        if additional:
            reply = self.replicas.start(client, job, additional, opts.timeout, opts.is_async, extrepl, zones, minrepl)
        else:
            self.register(job, timer=False)
            self.queue_new_job(job)
            reply = Status(job_id)
        if job.rare is not None and job.rare.parents and job_id in self.jobs:  # (not with external replication)
            self.deps.hold(job)
        return reply

    def _replicas(self, repl: int, minrepl: int, extrepl: bool) -> tuple[int, bool]:
        """How many other nodes a new job of level `repl` goes to; with
        external replication (`extrepl`: leaving, or short of memory) all
        `repl` copies are elsewhere.  -NOREPL when too few are reachable
        for `minrepl` copies."""
        membership = self.membership
        additional = repl if extrepl else repl - 1
        needed = minrepl if extrepl else minrepl - 1
        if needed and needed > (reachable := len(membership.reachable())):  # none: no peer to count
            if extrepl and needed - 1 == reachable:
                raise errors.noreply_reason("I'm leaving the cluster" if membership.leaving else "I'm out of memory")
            raise errors.norepl_reach()
        return additional, extrepl

    def add_event(self, client: Connection, queue: bytes, body: bytes, ttl: int, is_async: bool) -> Any:
        """QADD (core/groups.py): a new event on min(3, cluster size) nodes,
        this one included; the reply is its ID, or OK when `is_async`."""
        if self.membership.leaving:
            raise errors.leaving()
        check_size(body, self.settings)
        job = self.events.new_event(queue, body, ttl, min(EVENT_COPIES, self.membership.size()))
        minrepl = default_minrepl(job.repl)
        additional, _ = self._replicas(job.repl, minrepl, False)
        if additional:
            reply = self.replicas.start(client, job, additional, EVENT_REPL_TIMEOUT, is_async, False, 1, minrepl)
        else:
            self.register(job)
            self.queue_new_job(job)
            reply = self.stored_reply(job)
        return OK if is_async else reply

    def stored_reply(self, job: Job) -> Any:
        """What the producer of a new job gets once it is stored: its ID (an event's, decimal)."""
        return self.events.reply(job) if job.flags & EVENT else Status(job.id)

    def queue_new_job(self, job: Job) -> None:
        """A new job with a local copy, registered, becomes queued (or stays
        scheduled; an event, readable) and logged.  A job is on the timer
        afterwards, whether `register` put it there or not (ADDJOB's does
        not: its awake time would change at once)."""
        if job.flags & EVENT:
            self.events.created(job)
        elif job.delay or not self.enqueue(job):  # `enqueue` reschedules the job it queues
            self.reschedule(job)  # its state changed since `register` (a replication just reached its level)
        self.out.aof_loadjob(job)

    # ------------------------------------------------------------ consumers' answers

    def working(self, job: Job) -> int:
        """WORKING (spec/commands.md §5.2): postpone the next requeue."""
        created_ms = job.ctime // 1_000_000
        ttl_ms = job.etime * 1000 - created_ms
        if ttl_ms > 0 and self.now - created_ms > ttl_ms / 2:
            raise errors.toolate()
        self.dequeue(job)
        job.flags |= BCAST_WILLQUEUE
        if job.retry and job.qtime:
            job.qtime = self.now + job.retry * 1000 + self.jitter()
        self.out.broadcast(job.nodes_delivered, m.Working(job.id))
        self.reschedule(job)
        if job.awake <= self.now:  # a delayed job whose WILLQUEUE is due now: send it now, as a tick would
            self.process_job(job)
        return job.retry

    def nack(self, job: Job, delay: int, failure: Failure | None) -> bool:
        """NACK (spec/commands.md §5.5) with its extensions: DELAY
        (`nack_later`) and ERROR, the `failure` the consumer reports, kept
        with the job (stamped with this node's time), logged, and sent with
        the QUEUED that tells the other holders (store/failure.py).  Only an
        active job is NACKed."""
        if job.state != S_ACTIVE:
            return False
        if failure is not None:
            self.set_failure(job, failure._replace(at=self.now))
        if delay:
            return self.nack_later(job, delay)  # (it logs the job itself)
        done = self.enqueue(job, nack=True)
        if failure is not None and job.id in self.jobs:  # (not when dead-lettered: its copy is logged)
            self.out.aof_loadjob(job)
        return done

    def set_failure(self, job: Job, failure: Failure) -> None:
        """Keep `failure` as the job's last, its bytes counted in memory."""
        before = job.extra_size()
        job.failure = failure
        self.memory.account(job.extra_size() - before)

    def nack_later(self, job: Job, delay: int) -> bool:
        """NACK ... DELAY (an extension, docs/commands.md): count the failed
        delivery now, and queue the job again only once `delay` seconds have
        passed: here at that time, on the other nodes that hold it no sooner
        than their RETRY after it (the delay travels in QUEUED).  Refused as
        NACK is: only active jobs, never an at-most-once job delivered once."""
        if job.state != S_ACTIVE or not job.qtime or (job.retry == 0 and job.flags & DELIVERED):
            return False
        if self._last_attempt(job):
            self.dead_letter_job(job)
            return True
        job.nacks = min(job.nacks + 1, 0xFFFF)
        self.queue(job.queue).nacks += 1  # type: ignore[arg-type]  # (the job goes back to it)
        job.flags |= NACKED | BCAST_WILLQUEUE  # the others are told 500 ms before, as for a RETRY requeue
        job.qtime = self.now + delay * 1000
        self.out.broadcast(job.nodes_delivered, m.Queued(job.id, True, False, delay, job.failure))
        self.reschedule(job)
        self.out.aof_loadjob(job)  # the delay survives a restart (a later record with `not_before` updates the first)
        return True

    @staticmethod
    def _last_attempt(job: Job) -> bool:
        """MAXATTEMPTS: the delivery that just failed was the job's last
        (deliveries counted as Disque counts them: nacks + additional + 1);
        never for a dead-lettered copy, whose MAXATTEMPTS is its origin's."""
        return 0 < job.max_attempts <= job.nacks + job.deliv + 1 and not job.origin

    def dead_letter_job(self, job: Job) -> None:
        """MAXATTEMPTS (an extension, docs/commands.md): the job's last
        delivery failed.  It moves, here and once, to its dead-letter queue
        as a new job (`move_job`) with the same counters, its last failure
        (NACK ... ERROR) and `origin` the old ID.  The copy keeps, for
        DEADLETTER REQUEUE, the job's MAXATTEMPTS and the queue it came from
        (as `dead_letter`: a copy is never dead-lettered again,
        `_last_attempt`).  A job without MAXATTEMPTS (one whose parent
        failed: core/dependencies.py) goes to `<queue>-dead`."""
        self.queue(job.queue).dead_lettered += 1  # type: ignore[arg-type]
        self.stats.dead_lettered += 1
        to = job.dead_letter or job.queue + b"-dead"  # type: ignore[operator]
        self.move_job(job, to, job.nacks, job.deliv, job.max_attempts, job.queue, job.id, job.failure)  # type: ignore[arg-type]

    def dead_letters(self, name: bytes, count: int, selection: DeadLetterFilter) -> list[Job]:
        """DEADLETTER LIST (an extension, docs/commands.md): at most `count`
        of the dead-lettered copies queued here in `name` that `selection`
        takes, oldest first.  Copies that do not say where they came from
        (made by an older version) are never taken."""
        queue = self.queues.get(name)
        if queue is None:
            return []
        return list(islice((j for j in queue.oldest() if j.origin and j.dead_letter and selection.takes(j)), count))

    def requeue_dead_letters(self, name: bytes, count: int, selection: DeadLetterFilter) -> int:
        """DEADLETTER REQUEUE (an extension, docs/commands.md): the
        `dead_letters` go back to the queue they came from as new jobs with
        fresh attempt counts and no failure, their MAXATTEMPTS, and `name`
        as their dead-letter queue.  Returns how many went."""
        return self._each_dead_letter(
            name, count, selection, lambda job: self.move_job(job, job.dead_letter, 0, 0, job.max_attempts, name, b"", NO_FAILURE)
        )

    def delete_dead_letters(self, name: bytes, count: int, selection: DeadLetterFilter) -> int:
        """DEADLETTER DELETE (an extension): the `dead_letters` are deleted
        on every node that holds them, as FASTACK does.  Returns how many."""
        return self._each_dead_letter(name, count, selection, self.delete_everywhere)

    def _each_dead_letter(self, name: bytes, count: int, selection: DeadLetterFilter, act: Callable[[Job], None]) -> int:
        ids = [job.id for job in self.dead_letters(name, count, selection)]
        for done, job_id in enumerate(ids):
            job = self.jobs.get(job_id)  # read-behind loads a copy it keeps on disk
            if job is None:  # a disk that fails to read (MISCONF): the rest stay for another call
                return done
            act(job)
        return len(ids)

    def delete_everywhere(self, job: Job) -> None:
        """Delete `job` here and on every node that holds it (no ACK: nobody waiting for it counts it)."""
        self.out.broadcast(job.nodes_delivered, m.DelJob(job.id, acked=False))
        self.finished(job, False)
        self.delete_job(job)

    def move_job(
        self, job: Job, queue: bytes, nacks: int, deliv: int, max_attempts: int, dead_letter: bytes, origin: bytes,
        failure: Failure | tuple[()],
    ) -> None:  # fmt: skip
        """Put `job` in `queue` as a new job (same body, key, expiry, RETRY and
        replication level), replicated asynchronously as an ADDJOB ... ASYNC
        is; the old job is deleted on every node that holds it, as FASTACK
        does.  Queued before the old one goes: at least once."""
        membership = self.membership
        ttl = max(1, job.etime - self.now // 1000)
        copy = Job(
            new_job_id(membership.my_id, self.rng, ttl, job.retry), queue, job.body, S_ACTIVE, 0, job.repl,
            job.etime, self.new_ctime(), 0, job.retry, nacks, deliv, membership.solo, max_attempts, dead_letter,
            origin, job.priority, failure, job.key,
        )  # fmt: skip
        copy.qtime = self.now  # due: queue_new_job queues it (and enqueue sets its RETRY timer)
        self.delete_everywhere(job)
        self.register(copy, timer=False)
        self.queue_new_job(copy)
        if copy.repl > 1:
            self.replicas.replicate(copy, copy.repl - 1, noreply=True)
