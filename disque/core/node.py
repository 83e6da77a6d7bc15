"""NodeCore: one Disque node's entry point, its state and the job lifecycle, with no I/O.

Theory of operation: the trio shell feeds the core three kinds of input:
client requests (`handle_command`, with the front end's command table),
bus messages (`handle_bus`: membership first, then the bus table `on_bus`)
and the passage of time (`tick`).  The core reads the time from the injected
`clock` and random numbers from the injected `rng` only, and answers with a
reply value plus effects (`take_effects`: replies to other clients, bus
sends, AOF records).  `next_deadline()` tells the shell when to call `tick`.

This is the entry module: it owns the state and composes the concerns that
keep state of their own (cluster/replication.py, cluster/federation.py,
core/acks.py for ACK and GC, cluster/handlers.py for the other job messages)
and imports them; they see the node only through core/services.py, so no
concern imports this module back.

Invariants kept here:
* a job is in exactly one state (`store/job.py` transition table), and a
  queue holds only `queued` jobs;
* every registered job has one awake time in the `JobStore` timer, recomputed
  by `reschedule` after every change that matters (spec/cluster.md §8.3);
* a RETRY 0 job is queued at most once per node (`enqueue` refuses it once
  delivered, and `qtime = 0` afterwards);
* clients blocked in GETJOB are served after every command, one job each, in
  arrival order (`_serve_ready`);
* the node's identity is `cluster.myself` alone: the core reads
  `cluster.my_id` / `cluster.solo` when it needs them and keeps no copy, so
  a CLUSTER RESET HARD (`reset`) is followed by every structure at once.

Command parsing and validation live in the front ends (protocols/); this
module offers the operations they need.  Anything that needs the outside
world synchronously (rewriting the config file, process statistics, shutting
down) goes through the `host` object the shell provides.
"""
from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, Final

from disque.core import errors
from disque.core.acks import Acks
from disque.core.auth_throttle import REFUSED, AuthThrottle
from disque.core.errors import DisqueError
from disque.core.groups import EVENT_COPIES, Groups
from disque.core.items import Items
from disque.core.read_behind import ReadBehind
from disque.core.timeouts import Timeouts
from disque.cluster import messages as m
from disque.cluster.federation import CLIENTS_WAITING, REACHED_ZERO, Federation
from disque.cluster.handlers import HANDLERS
from disque.cluster.membership import Membership
from disque.cluster.replication import Replication
from disque.core.effects import Answer, AofAppend, CloseClient, DropLink, Reply, Send
from disque.core.ids import new_job_id
from disque.core.types import BLOCKED, NIL_ARRAY, SILENT, BodyStore, Clock, Client, Command, Host, Stats, Status, Waiter
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
from disque.store.aof import AofStatus, Replay, encode_deljob, encode_loadjob
from disque.store.jobs import JobStore
from disque.store.queue import PAUSE_IN, PAUSE_OUT, Queue
from disque.store.queue_config import DEFAULTS as NO_LIMITS, QueueSettings
from disque.store.collected import Collected
from disque.store.scan import NBUCKETS, BucketedDict

if TYPE_CHECKING:  # annotations only: the core draws from the injected rng
    import random

log = logging.getLogger("disque")

# Module-level aliases: attribute lookups on an IntEnum are slow in the hot path.
S_WAIT_REPL: Final = State.WAIT_REPL  # (Final: the compiled build reads these as C statics, not globals)
S_ACTIVE: Final = State.ACTIVE
S_QUEUED: Final = State.QUEUED
S_ACKED: Final = State.ACKED

# Memory estimate (spec/cluster.md §11): what the node's data takes, as Redis and
# Disque count their allocator's bytes, not the process RSS (the idle
# interpreter and its modules are a fixed cost the shell reports apart, INFO
# used_memory_startup).  What objects really cost in CPython, measured with
# tracemalloc (tests/core/test_memory_accounting.py keeps these honest), so
# that `maxmemory` bounds the data and RSS stays within it plus that fixed cost.
BASE_MEMORY: Final = 90_000  # the empty node's own tables (the job index's 1,024, the queue table, ...)
MEM_LEVELS: Final = ("ok", "warning", "oom")  # mem_level(): as upstream's getMemoryWarningLevel
JOB_OVERHEAD: Final = 380  # per job (record, index slot, timers, copies of its strings) on top of id + queue + body bytes;
# between the compiled build (about 280 in a large store, 300-320 in one of 5,000 jobs, where the index's
# 1,024 tables are small) and the pure one (330-410: its record keeps ints as objects)
QUEUE_OVERHEAD: Final = 1030  # per queue object and its index entries, on top of its name

WILLQUEUE_LEAD: Final = 500
EVENT_REPL_TIMEOUT = 5000  # ms a QADD waits for its replicas (then -NOREPL), as a Kestrel SET
OK = Status(b"OK")
GC_MAX_DELAY: Final = 180_000
QUEUE_IDLE_MS = (300_000, 10_000, 2_000)  # by memory level 0, 1, >= 2
BLOCKED_CRON_MS: Final = 100
AUTH_LOG_EVERY_MS = 10_000  # at most one log line about failed AUTHs per period
# Command latency histogram (Stats.calls): bucket i counts the calls that took
# 2**(i-1) µs or more and less than 2**i µs (bucket 0: under 1 µs); the last
# bucket also takes every longer call.
LATENCY_BUCKETS: Final = 22




_ESCAPES = {b"\\": b"\\\\", b'"': b'\\"', b"\n": b"\\n", b"\r": b"\\r", b"\t": b"\\t", b"\a": b"\\a", b"\b": b"\\b"}
_UNPRINTABLE = re.compile(rb'[^\x20\x21\x23-\x5b\x5d-\x7e]')


def quote_arg(arg: bytes) -> bytes:
    """An argument as MONITOR shows it (upstream sdscatrepr): quoted, with
    escapes for quotes, backslashes and control bytes, so that no CR or LF
    can break the status line."""
    return b'"%s"' % _UNPRINTABLE.sub(lambda m: _ESCAPES.get(m[0]) or b"\\x%02x" % m[0][0], arg)


class NodeCore:
    def __init__(
        self,
        config: Any,
        node_id: str,
        *,
        clock: Clock,
        rng: random.Random,
        host: Host,
        membership: Membership | None = None,
        bodies: BodyStore | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.rng = rng
        self.host = host
        self.now = clock.now_ms()
        self.cluster = membership or Membership(node_id, config.port or config.tls_port, rng=rng, wire=self)
        self.cluster.wire = self
        self.cluster.now = self.now
        self.jobs = JobStore()
        self.queues: BucketedDict[bytes, Queue] = BucketedDict()
        self.clients: dict[int, Client] = {}
        self.blocked: dict[int, Waiter] = {}
        self.repl_waiters: dict[bytes, Client] = {}
        self._header = m.Header("", 0, -1)  # the last header made: links send one only when it changes
        self.job_waits: dict[bytes, list[Waiter]] = {}  # job ID -> WAITJOB clients waiting for it
        self.ready: dict[bytes, None] = {}
        self.effects: list[Any] = []
        self.stats = Stats()
        self.last_ctime = 0
        self.base_memory = BASE_MEMORY
        self.used_memory = BASE_MEMORY
        self.peak_memory = BASE_MEMORY
        self.loading = False
        self.aof = AofStatus()
        self.aof_error: str | None = None  # strerror of the last failed AOF write (MISCONF)
        self.body_error: str | None = None  # ... or of read-behind's body store
        self.start_ms = self.now
        self.run_id = "%040x" % rng.getrandbits(160)
        self.client_pause_until = 0
        self._last_cron = 0
        self.timeouts = Timeouts()  # blocked clients' deadlines
        self._promised = 0  # the last next_deadline() the shell was given (it sleeps until then)
        self._auth_logged = -AUTH_LOG_EVERY_MS  # when a failed AUTH was last logged
        self.auth_throttle = AuthThrottle()  # wrong passwords by source address
        self._gc_cursor = 0
        self.collected = Collected()
        self.federation = Federation(self)
        self.replication = Replication(self)
        self.acks = Acks(self, self.replication)
        self.items = Items(self, self.acks)
        self.groups = Groups(self)
        # Read-behind, when the shell gives a body store (core/read_behind.py):
        # the job store keeps jobs on disk through it; the shell and INFO report it.
        self.read_behind: ReadBehind | None = None
        if bodies is not None and config.read_behind != "no":
            self.read_behind = ReadBehind(self, bodies, config.read_behind == "force")
            self.jobs.spill_to(self.read_behind)
        # The bus table: the handler of each job message, by type.
        self.on_bus: dict[type, Callable[[str, Any], None]] = {
            **{kind: partial(handler, self) for kind, handler in HANDLERS.items()},
            m.GotJob: self.replication.on_got_job,
            m.GotJobs: self.replication.on_got_jobs,
            m.SetAck: self.acks.on_set_ack,
            m.GotAck: self.acks.on_got_ack,
            m.DelJob: self.acks.on_del_job,
            m.NeedJobs: self.federation.on_need_jobs,
            m.YourJobs: self.federation.on_your_jobs,
            m.Waiting: self.federation.on_waiting,
            m.Fanout: self.items.on_fanout,
            m.GroupSet: self.groups.on_group_set,
            m.Claim: self.groups.on_claim,
            m.GroupAck: self.groups.on_group_ack,
            m.Claimed: self.groups.on_claimed,
            m.NeedEvent: self.groups.on_need_event,
            m.NewEvent: self.groups.on_new_event,
            m.YourEvent: self.groups.on_your_event,
            m.GroupFlush: self.groups.on_group_flush,
        }
        self.monitors: dict[int, Client] = {}
        self.slowlog: deque[tuple[int, int, int, list[bytes]]] = deque()
        self.slowlog_id = 0
        self._expiry = (0, 1000)  # (etime, its expiry awake time) of the last job scheduled

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> int:
        """Absolute ms when `tick` must run next (the scheduler, blocked
        clients' timeouts and the 100 ms client cron)."""
        at = self._last_cron + BLOCKED_CRON_MS
        awake = self.jobs.next_awake()
        if awake is not None:
            at = min(at, awake)
        if (awake := self.jobs.spilled.next_awake()) is not None:
            at = min(at, awake)
        if (awake := self.timeouts.next()) is not None:
            at = min(at, awake)
        self._promised = at
        return at

    def read_clock(self) -> int:
        """Take the time of this step from the clock (tick, every command,
        bus message and AOF replay batch)."""
        self.now = self.cluster.now = now = self.clock.now_ms()
        return now

    def begin_load(self, trust_queued: bool = False) -> Replay:
        """The shell starts replaying the AOF into this node: until
        `end_load`, commands without the `l` flag answer -LOADING."""
        self.loading = True
        self.read_clock()
        return Replay(self, trust_queued=trust_queued)

    def end_load(self) -> None:
        self.loading = False

    def tick(self) -> None:
        now = self.read_clock()
        self.jobs.spilled.tick()
        for job in self.jobs.due(now):
            self.process_job(job)
        for waiter in self.timeouts.due(now):
            self.unblock(waiter.client, waiter.timeout_reply() if waiter.take is None else waiter.take(None))
        if now - self._last_cron >= BLOCKED_CRON_MS:
            self._last_cron = now
            self.cluster.timeout = self.config.cluster_node_timeout
            self.cluster.cron()
            self.replication.cron()
            self._cron()
        self._serve_ready()
        self.settle()

    def settle(self) -> None:
        """The end of a step: read-behind moves what it may to disk, and
        peers hear of the queues whose blocked clients changed."""
        self.jobs.spilled.settle()
        if self.federation.changed:
            self.federation.announce()

    def _cron(self) -> None:
        now = self.now
        for waiter in list(self.blocked.values()):
            if not waiter.queues:  # WAITJOB, or a late AUTH answer
                continue
            if self.cluster.leaving:
                self.unblock(waiter.client, errors.leaving())
            else:
                for name in waiter.queues:
                    self.federation.need_jobs(self._queue(name), CLIENTS_WAITING)
        self.federation.cron()
        self.groups.cron()
        self.jobs.spilled.cron()
        self._collect_idle_queues()
        self.collected.expire(now)
        if self.config.timeout:
            self._close_idle_clients(self.config.timeout * 1000)

    def _close_idle_clients(self, limit_ms: int) -> None:
        """The `timeout` directive: blocked clients and monitors are exempt."""
        for client in self.clients.values():
            if client.waiter is None and not client.repl_jobs and client.id not in self.monitors:
                if self.now - client.last > limit_ms:
                    self.close_client(client)

    # ------------------------------------------------------------ clients

    def connect(self, client_id: int, addr: str = "", laddr: str = "", fd: int = -1) -> Client:
        client = Client(client_id, fd, addr, laddr, ctime=self.now, last=self.now)  # unauthenticated
        self.clients[client_id] = client
        self.stats.connections += 1
        return client

    def disconnect(self, client_id: int) -> None:
        client = self.clients.pop(client_id, None)
        if client is None:
            return
        self.monitors.pop(client_id, None)
        if client.waiter is not None:
            self.drop_waiter(client.waiter)
        if client.open_read is not None:
            self.items.abort(client)
        waiting, client.repl_jobs = client.repl_jobs, {}
        for job_id in waiting:
            job = self.jobs.get(job_id)
            self.repl_waiters.pop(job_id, None)  # gone: nobody to answer
            if job is not None and job.state == State.WAIT_REPL:  # pragma: no branch - repl_jobs end with wait-repl
                self.replication.abort(job, None)

    def reply_to(self, client: Client, value: Any, slot: bytes | None = None) -> None:
        if client.mute_next:  # silenced, but the session must still learn that the client waits no more
            client.mute_next = False
            value = SILENT
        self.effects.append(Reply(client.id, value, slot))

    def answer_producer(self, job_id: bytes, value: Any) -> None:
        """The ADDJOB of `job_id` stops waiting for its replicas: its client
        (if still there) gets `value` in that ADDJOB's place."""
        client = self.repl_waiters.pop(job_id, None)
        if client is not None:
            client.repl_jobs.pop(job_id, None)
            self.reply_to(client, value, job_id)

    def close_client(self, client: Client) -> None:
        client.closing = True
        self.effects.append(CloseClient(client.id))

    # ------------------------------------------------------------ commands

    def handle_command(self, client: Client, request: Any, run: Callable[[NodeCore, Client, Any], Any]) -> Any:
        """One request from a client of the front end whose command table is
        `run` (request -> `execute` or an early answer); returns its result."""
        client.last = self.read_clock()
        reply = run(self, client, request)
        if self.ready:
            self._serve_ready()
        self.settle()
        return reply

    def execute(self, client: Client, cmd: Command, argv: list[bytes]) -> Any:
        """The checks of spec/commands.md §1.3 every front end shares (AUTH, memory,
        MISCONF, LOADING), then the handler, with statistics, MONITOR and the
        slow log.  A `DisqueError` becomes the result; any other exception is
        logged and costs this one request, not the node."""
        if self.config.requirepass and not client.authenticated:
            if cmd.name != "auth" and not (cmd.name == "hello" and len(argv) > 1):
                return errors.noauth()
        flags = cmd.flags
        limit = self.config.maxmemory
        if limit and self.used_memory > limit // 100 * 95 and not self.evict() and "m" in flags:
            return errors.oom()
        # A disk that fails (the AOF's or read-behind's: by default the same one)
        # refuses what adds data (the `m` flag, as -OOM does) and PING, not the
        # consumers: GETJOB and ACKJOB drain the backlog that filled it.
        if (self.aof_error is not None or self.body_error is not None) and ("m" in flags or cmd.name == "ping"):
            if self.aof_error is not None:
                return errors.misconf(self.aof_error)
            return errors.misconf(self.body_error, "reading or writing the read-behind segments")  # type: ignore[arg-type]
        if self.loading and "l" not in flags:
            return errors.loading()
        client.last_cmd = cmd.name
        stats = self.stats
        stats.commands += 1
        if self.monitors:
            self.feed_monitors(client, argv)
        start = self.clock.now_us()
        try:
            reply = cmd.handler(self, client, argv)
        except DisqueError as e:
            reply = e.detach()
        except Exception:  # a bug must cost one reply, not the node and every job in it
            log.exception("Error executing %r", [a[:64] for a in argv[:8]])
            reply = errors.err(f"internal error executing '{cmd.name}', check the server logs")
        elapsed = self.clock.now_us() - start
        calls = stats.calls.get(cmd.name)
        if calls is None:
            calls = stats.calls[cmd.name] = [0] * (2 + LATENCY_BUCKETS)
        calls[0] += 1
        calls[1] += elapsed
        calls[2 + min(elapsed.bit_length(), LATENCY_BUCKETS - 1)] += 1
        if elapsed >= self.config.slowlog_log_slower_than >= 0:  # as Redis: 0 logs every command
            self.slowlog_add(argv, elapsed)
        if client.reply_mode:
            return client.silence(reply)
        return reply

    # ------------------------------------------------------------ shell entry points

    def take_effects(self) -> list[Any]:
        """The effects of the entry points called since the last take, in order."""
        effects, self.effects = self.effects, []
        return effects

    def pause_left(self, now_ms: int) -> int:
        """How many ms of CLIENT PAUSE remain at `now_ms` (0: clients run)."""
        return max(0, self.client_pause_until - now_ms)

    def set_aof_error(self, strerror: str | None) -> None:
        """The AOF's last write or fsync failed (MISCONF for writes), or works again."""
        self.aof_error = strerror

    def conf_dirty(self) -> bool:
        """Whether nodes.conf no longer matches the cluster state."""
        return self.cluster.dirty

    def cluster_conf(self) -> str:
        """nodes.conf's text; the shell saves it, so it is no longer dirty."""
        self.cluster.dirty = False
        return self.cluster.to_conf()

    # ------------------------------------------------------------ memory

    def mem_level(self) -> int:
        """0 (`ok`); 1 (`warning`, over 75 % of maxmemory: new jobs keep no
        copy here, `add_job`); 2 (`oom`, over 95 %: `evict`, and commands
        flagged `m` are refused when nothing can be evicted)."""
        limit = self.config.maxmemory
        used = self.used_memory
        if used > limit // 100 * 95:
            return 2
        return 1 if used > limit // 100 * 75 else 0

    def account(self, delta: int) -> None:
        self.used_memory += delta
        if self.used_memory > self.peak_memory:
            self.peak_memory = self.used_memory

    @staticmethod
    def job_size(job: Job) -> int:
        return JOB_OVERHEAD + len(job.id) + len(job.body or b"") + len(job.queue or b"") + job.extra_size()

    def evict(self) -> bool:
        """Free memory at level >= 2 (spec/cluster.md §11).  True when back under
        the 95 % threshold (or nothing needed)."""
        if self.mem_level() < 2:
            return True
        if self.config.maxmemory == 0:
            return True  # upstream quirk kept: maxmemory 0 never answers OOM
        if self.config.maxmemory_policy == "noeviction":
            return False
        if len(self.jobs) == 0:
            self._collect_idle_queues(everything=True)
        else:
            fruitless = 0
            # A walk from a random bucket: no O(jobs) copy on every command.
            for job in self.jobs.values_from(self.rng.randrange(NBUCKETS)):
                if fruitless >= 10 or self.mem_level() < 2:
                    break
                if job.state == S_ACKED or (job.retry == 0 and job.flags & DELIVERED):
                    self.delete_job(job)
                    fruitless = 0
                else:
                    fruitless += 1
        return self.mem_level() < 2

    # ------------------------------------------------------------ queues

    def _queue(self, name: bytes) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            queue = Queue(name, self.now)
            self.queues.add(name, queue)
            self.account(QUEUE_OVERHEAD + len(name))
        return queue

    def destroy_queue(self, queue: Queue) -> None:
        self.jobs.spilled.forget_queue(queue)
        for job in queue.drain():  # only when flushing: GC never drops live jobs
            job.move(DEQUEUE)
        self.queues.pop(queue.name)
        self.ready.pop(queue.name, None)
        self.account(-(QUEUE_OVERHEAD + len(queue.name)))

    def _queue_collectable(self, queue: Queue, idle_ms: int) -> bool:
        return not len(queue) and not queue.waiters and not queue.pause and self.now - queue.atime >= idle_ms

    def _collect_idle_queues(self, everything: bool = False) -> None:
        """Destroy empty idle queues: a slice of the table per cron tick (a
        rolling scan cursor), or the whole table when evicting."""
        idle = QUEUE_IDLE_MS[min(self.mem_level(), 2)]
        if everything:
            candidates = list(self.queues.values())
        else:
            self._gc_cursor, candidates = self.queues.scan(self._gc_cursor, 100, 16)
        for queue in candidates:
            if self._queue_collectable(queue, idle):
                self.destroy_queue(queue)

    # ------------------------------------------------------------ jobs

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

    def register(self, job: Job) -> None:
        """Add a job to the registry and the timer."""
        if job.queue is not None:
            queue = self.queues.get(job.queue)
            if queue is not None:
                job.queue = queue.name  # share the name bytes between jobs
        self.jobs.add(job)
        self.account(self.job_size(job))
        self.reschedule(job)
        if job.flags & EVENT:
            self.groups.add_event(job)

    def delete_job(self, job: Job, log: bool = True) -> None:
        """Unregister a job, whatever the cause (spec/cluster.md §8.7): the one
        way out, so the AOF, a waiting producer and the queue hear of it once."""
        if job.state == S_QUEUED:
            self._queue(job.queue).discard(job)  # type: ignore[arg-type]
            job.move(DEQUEUE)
        if log and job.state == S_ACTIVE:
            self.aof_deljob(job)
        if job.state == S_WAIT_REPL:
            self.replication.forget(job.id)
            self.answer_producer(job.id, errors.norepl_removed())
            self.broadcast(job.nodes_delivered, m.DelJob(job.id, acked=False))
        if job.state == S_ACKED:
            self.collected.remember(job.id, self.now)
        if self.job_waits:
            self.settle_waits(job.id, job.state == S_ACKED)
        self.jobs.remove(job)
        self.account(-self.job_size(job))
        if job.flags & EVENT:
            self.groups.drop_event(job)

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
                self._queue(job.queue).expired += 1  # type: ignore[arg-type]
                self.items.expired(job)
            self.delete_job(job)
            return
        state = job.state
        if state in (S_ACTIVE, S_QUEUED) and job.qtime:
            # Just before queueing it again, tell the other holders (WILLQUEUE):
            # one that has it queued answers QUEUED, one that has it acked SETACK,
            # so the job is not queued twice or revived; the next visit is at qtime.
            if job.flags & BCAST_WILLQUEUE and job.qtime - WILLQUEUE_LEAD <= now:
                if state == S_ACTIVE:
                    self.broadcast(job.nodes_delivered, m.WillQueue(job.id))
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
            self.acks.try_gc(job)
        if job.id in self.jobs:
            self.reschedule(job)

    def enqueue(self, job: Job, nack: bool = False, queue: Queue | None = None) -> bool:
        """Queue a job (spec/cluster.md §8.3).  False when refused: already
        queued, never to be queued again (qtime 0), or an at-most-once job
        already handed out once, which queueing again would deliver twice."""
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
        if queue is None:
            queue = self._queue(job.queue)  # type: ignore[arg-type]
            job.queue = queue.name
        if job.flags & NACKED:  # the delayed requeue of a NACK ... DELAY, counted then
            job.flags = (job.flags & ~NACKED) | BCAST_QUEUED
            self.broadcast(job.nodes_delivered, m.Queued(job.id))
        elif job.flags & BCAST_QUEUED or nack:
            self.broadcast(job.nodes_delivered, m.Queued(job.id, incr_nacks=nack, incr_deliv=not nack))
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
        if not queue.pause & PAUSE_OUT and (queue.waiters or queue.name in self.federation.wanted):
            self.ready[queue.name] = None  # served at the end of the step, here or by a peer's consumer
        self.reschedule(job)
        return True

    def dequeue(self, job: Job) -> bool:
        if job.state != S_QUEUED:
            return False
        self._queue(job.queue).discard(job)  # type: ignore[arg-type]
        job.move(DEQUEUE)
        return True

    def fetch(self, queue: Queue) -> Job | None:
        """Take the oldest job for delivery (GETJOB, or YOURJOBS)."""
        if queue.tail is not None:  # its newest jobs are on disk: the oldest must be in memory
            self.jobs.spilled.ready(queue)
        job = queue.pop()
        if job is None:
            return None
        job.move(FETCH)
        job.flags |= DELIVERED
        queue.atime = now = self.now
        queue.jobs_out += 1
        queue.last_wait = now - job.ctime // 1_000_000
        return job

    def abort_replication(self, job: Job) -> None:
        """A job that never reached its replication level: delete every copy."""
        job.move(ABORT)
        self.broadcast(job.nodes_delivered, m.DelJob(job.id, acked=False))
        self.delete_job(job, log=False)

    def adopt(self, job: Job) -> Job:
        """Register a job received from a peer (spec/cluster.md §8.1 receive
        rules): a copy starts active with timers of its own, whatever the
        sender's, so it is queued here only if nobody queues it in time (a
        RETRY 0 copy only when ENQUEUE or YOURJOBS hands it over)."""
        job.move(ADOPT)
        job.gc_retry = 0
        job.flags &= EVENT
        if job.retry:
            job.flags = BCAST_WILLQUEUE
            job.qtime = self.now + (job.delay + job.retry) * 1000 + self.jitter()
        else:
            job.qtime = 0
        known = self.cluster.nodes
        job.nodes_delivered = tuple(n for n in job.nodes_delivered if n in known)
        self.register(job)
        self.jobs.spilled.note_arrival(job)
        return job

    # ------------------------------------------------------------ client operations

    def add_job(
        self, client: Client, queue: bytes, body: bytes, timeout: int, repl: int | None, ttl: int | None,
        retry: int | None, delay: int | None, maxlen: int | None, is_async: bool,
        max_attempts: int = 0, dead_letter: bytes | None = None,
    ) -> Any:  # fmt: skip
        """ADDJOB after option parsing (spec/commands.md §4.1 steps 3-8, creation);
        None stands for an option not given.  `max_attempts` (0: none) and
        `dead_letter` (default `<queue>-dead`) are the MAXATTEMPTS/DEADLETTER
        extension (`dead_letter_job`)."""
        cluster = self.cluster
        if repl is None:
            repl = min(3, cluster.size())
        if ttl is None:
            ttl = 86400
        limits = self.config.queue_config.settings(queue)
        if limits is not NO_LIMITS:  # `queue-defaults` / `queue` lines (Kestrel's options)
            ttl = self.items.make_room(limits, queue, body, ttl)
        if delay is None:
            delay = 0
        if repl > 1 and retry == 0:
            raise errors.err(
                "With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)"
            )
        if delay >= ttl:
            raise errors.err(
                "The specified DELAY is greater than TTL. Job refused since would never be delivered"
            )
        if retry is None:
            retry = min(ttl // 10, 300) or 1
        additional, extrepl = self._replicas(repl, self.cluster.leaving or self.mem_level() >= 1)
        existing = self.queues.get(queue)
        if existing is not None:
            queue = existing.name  # share the name bytes between jobs
            if maxlen is not None and len(existing) >= maxlen:
                raise errors.maxlen()
            if existing.pause & PAUSE_IN:
                raise errors.paused()
        job_id = new_job_id(cluster.my_id, self.rng, ttl, retry)
        jobs = self.jobs
        if job_id in jobs:
            raise errors.err("Internal error creating the job, check server logs")
        now = self.now
        job = Job(  # positional, cheaper than keywords: state, flags, repl, etime, ctime, delay, retry, nacks, deliv
            job_id, queue, body, S_ACTIVE, 0, repl, now // 1000 + ttl, self.new_ctime(), delay, retry, 0, 0,
            () if extrepl else cluster.solo,
        )  # fmt: skip
        job.qtime = now + (delay or retry) * 1000
        if max_attempts:
            job.set_attempts(max_attempts, queue + b"-dead" if dead_letter is None else dead_letter)
        if additional:
            return self.replication.start(client, job, additional, timeout, is_async, extrepl)
        jobs.add(job)
        self.account(self.job_size(job))
        if delay == 0:
            self.enqueue(job, queue=existing)
        else:
            self.reschedule(job)
        self.aof_loadjob(job)
        return Status(job_id)

    def _replicas(self, repl: int, extrepl: bool) -> tuple[int, bool]:
        """How many other nodes a new job of level `repl` goes to; with
        external replication (`extrepl`: leaving, or short of memory) all
        `repl` copies are elsewhere.  -NOREPL when too few are reachable."""
        cluster = self.cluster
        additional = repl if extrepl else repl - 1
        if additional and additional > (reachable := len(cluster.reachable())):  # none: no peer to count
            if extrepl and additional - 1 == reachable:
                raise errors.noreply_reason("I'm leaving the cluster" if cluster.leaving else "I'm out of memory")
            raise errors.norepl_reach()
        return additional, extrepl

    def add_event(self, client: Client, queue: bytes, body: bytes, ttl: int, is_async: bool) -> Any:
        """QADD (core/groups.py): a new event on min(3, cluster size) nodes,
        this one included; the reply is its ID, or OK when `is_async`."""
        if self.cluster.leaving:
            raise errors.leaving()
        job = self.groups.new_event(queue, body, ttl, min(EVENT_COPIES, self.cluster.size()))
        additional, _ = self._replicas(job.repl, False)
        if additional:
            reply = self.replication.start(client, job, additional, EVENT_REPL_TIMEOUT, is_async, False)
        else:
            self.register(job)
            self.queue_new_job(job)
            reply = self.stored_reply(job)
        return OK if is_async else reply

    def stored_reply(self, job: Job) -> Any:
        """What the producer of a new job gets once it is stored: its ID (an event's, decimal)."""
        return self.groups.reply(job) if job.flags & EVENT else Status(job.id)

    def queue_new_job(self, job: Job) -> None:
        """A new job with a local copy becomes queued (or scheduled; an
        event, readable) and logged."""
        if job.flags & EVENT:
            self.groups.created(job)
        elif job.delay == 0:
            self.enqueue(job)
        else:
            self.reschedule(job)
        self.aof_loadjob(job)

    def get_jobs(
        self, client: Client, names: list[bytes], count: int, nohang: bool, withcounters: bool, timeout: int
    ) -> Any:
        """GETJOB after option parsing: rounds over the queues (spec/commands.md §4.2)."""
        out: list[Any] = []
        federation = self.federation
        while True:
            took = False
            for name in names:
                queue = self.queues.get(name)
                if queue is None or queue.pause & PAUSE_OUT or (job := self.fetch(queue)) is None:
                    federation.need_jobs(queue or self._queue(name), CLIENTS_WAITING)
                    continue
                took = True
                out.append(self.job_entry(job, withcounters))
                if not len(queue):
                    federation.need_jobs(queue, REACHED_ZERO)
                if len(out) == count:
                    return out
            if not took:
                break
        if out:
            return out
        if nohang:
            return NIL_ARRAY
        if self.cluster.leaving:
            raise errors.leaving()
        self.block(client, tuple(dict.fromkeys(names)), withcounters, timeout)
        return BLOCKED

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
        self._queue(job.queue).nacks += 1  # type: ignore[arg-type]  # (the job goes back to it)
        job.flags |= NACKED | BCAST_WILLQUEUE  # the others are told 500 ms before, as for a RETRY requeue
        job.qtime = self.now + delay * 1000
        self.broadcast(job.nodes_delivered, m.Queued(job.id, incr_nacks=True, delay=delay))
        self.reschedule(job)
        self.aof_loadjob(job)  # the delay survives a restart (a later record with `not_before` updates the first)
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
        as a new job (`move_job`) with the same counters and `origin` the old
        ID.  The copy keeps, for DEADLETTER REQUEUE, the job's MAXATTEMPTS
        and the queue it came from (as `dead_letter`: a copy is never
        dead-lettered again, `_last_attempt`)."""
        self._queue(job.queue).dead_lettered += 1  # type: ignore[arg-type]
        self.stats.dead_lettered += 1
        self.move_job(job, job.dead_letter, job.nacks, job.deliv, job.max_attempts, job.queue, job.id)  # type: ignore[arg-type]

    def requeue_dead_letters(self, name: bytes, count: int) -> int:
        """DEADLETTER REQUEUE (an extension, docs/commands.md): at most
        `count` of the dead-lettered copies queued here in `name`, oldest
        first, go back to the queue they came from as new jobs with fresh
        attempt counts, their MAXATTEMPTS, and `name` as their dead-letter
        queue.  Copies that do not say where they came from (made by an
        older version) stay.  Returns how many went."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        ids = [job.id for job in islice((j for j in queue.oldest() if j.origin and j.dead_letter), count)]
        for done, job_id in enumerate(ids):
            job = self.jobs.get(job_id)  # read-behind loads a copy it keeps on disk
            if job is None:  # a disk that fails to read (MISCONF): the rest stay for another call
                return done
            self.move_job(job, job.dead_letter, 0, 0, job.max_attempts, name, b"")
        return len(ids)

    def move_job(
        self, job: Job, queue: bytes, nacks: int, deliv: int, max_attempts: int, dead_letter: bytes, origin: bytes
    ) -> None:  # fmt: skip
        """Put `job` in `queue` as a new job (same body, expiry, RETRY and
        replication level), replicated asynchronously as an ADDJOB ... ASYNC
        is; the old job is deleted on every node that holds it, as FASTACK
        does.  Queued before the old one goes: at least once."""
        cluster = self.cluster
        ttl = max(1, job.etime - self.now // 1000)
        copy = Job(
            new_job_id(cluster.my_id, self.rng, ttl, job.retry), queue, job.body, S_ACTIVE, 0, job.repl,
            job.etime, self.new_ctime(), 0, job.retry, nacks, deliv, cluster.solo, max_attempts, dead_letter, origin,
        )  # fmt: skip
        copy.qtime = self.now  # due: queue_new_job queues it (and enqueue sets its RETRY timer)
        self.broadcast(job.nodes_delivered, m.DelJob(job.id, acked=False))
        self.delete_job(job)
        self.register(copy)
        self.queue_new_job(copy)
        if copy.repl > 1:
            self.replication.replicate(copy, copy.repl - 1, noreply=True)

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
        self.broadcast(job.nodes_delivered, m.Working(job.id))
        self.reschedule(job)
        if job.awake <= self.now:  # a delayed job whose WILLQUEUE is due now: send it now, as a tick would
            self.process_job(job)
        return job.retry

    def set_pause(self, name: bytes, flags: int) -> None:
        queue = self.queues.get(name)
        if queue is None:
            if not flags:
                return
            queue = self._queue(name)
        queue.pause = flags
        if not flags & PAUSE_OUT and queue.waiters and len(queue):
            self.ready[name] = None

    def import_rate(self, queue: Queue) -> int:
        return self.federation.import_rate(queue)

    def import_from(self, queue: Queue) -> list[str]:
        return self.federation.import_from(queue)

    def authenticate(self, client: Client, password: bytes | None, failure: DisqueError, success: Any = OK) -> Any:
        """AUTH (`password` None: a user other than `default`): None when it
        is right and may be answered at once; else `failure` raised, or
        BLOCKED when the answer (`failure`, or `success`) must wait
        (`check_password`)."""
        delay = self.check_password(client, password)
        if client.authenticated and not delay:
            return None
        return self.answer_late(client, delay, success if client.authenticated else failure)

    def check_password(self, client: Client, password: bytes | None) -> int:
        """Check a password a client sent (setting `client.authenticated`);
        the ms its answer must wait, so that guessing costs time
        (core/auth_throttle.py: counted per source address, across
        connections and ports).  Raises when the address has too many
        attempts waiting already (the password is not looked at then).
        Failures are counted in INFO and logged, rate-limited."""
        required = self.config.requirepass
        assert required
        ok = password is not None and len(password) <= 512 and password == required.encode()
        delay = self.auth_throttle.attempt(client.addr, self.now, ok)
        if delay == REFUSED:
            client.authenticated = False
            raise errors.auth_refused()
        client.authenticated = ok
        if not ok:
            self.stats.auth_failures += 1
            if self.now - self._auth_logged >= AUTH_LOG_EVERY_MS:
                self._auth_logged = self.now
                log.warning("Failed AUTH from %s (%d failures since start)", client.addr, self.stats.auth_failures)
        return delay

    def answer_late(self, client: Client, delay: int, reply: Any) -> Any:
        """`reply` (raised if it is an error) now, or BLOCKED when `delay`
        ms must pass first: the client runs nothing meanwhile, then gets it."""
        if not delay:
            if isinstance(reply, DisqueError):
                raise reply
            return reply
        self.block(client, (), False, delay, reply)
        return BLOCKED

    def feed_monitors(self, client: Client, argv: list[bytes]) -> None:
        now_us = self.clock.wall_us()
        args = b" ".join(quote_arg(a) for a in argv)
        line = Status(b"%d.%06d [%s] %s" % (now_us // 1_000_000, now_us % 1_000_000, client.addr.encode(), args))
        for monitor in self.monitors.values():
            if monitor is not client:
                self.reply_to(monitor, line)

    def slowlog_add(self, argv: list[bytes], elapsed_us: int) -> None:
        self.slowlog_id += 1
        self.slowlog.appendleft((self.slowlog_id, self.now // 1000, elapsed_us, argv[:32]))
        while len(self.slowlog) > self.config.slowlog_max_len:
            self.slowlog.pop()

    # ------------------------------------------------------------ blocking

    def block(self, client: Client, queues: tuple[bytes, ...], withcounters: bool, timeout: int, expiry: Any = None) -> Waiter:
        waiter = Waiter(client, queues, withcounters, self.now + timeout if timeout else 0, expiry)
        client.waiter = waiter
        self.blocked[client.id] = waiter
        changed = self.federation.changed  # peers hear of it at the end of the step
        for name in queues:
            self._queue(name).waiters[client.id] = waiter
            changed[name] = None
        if waiter.deadline:
            self.timeouts.add(waiter)
            if waiter.deadline < self._promised:  # the shell sleeps past it: it must ask next_deadline() again
                self._promised = waiter.deadline
                self.host.wake(waiter.deadline)
        return waiter

    def wait_jobs(self, client: Client, ids: list[bytes], timeout: int) -> Any:
        """WAITJOB (an extension, docs/commands.md): the number of `ids`
        acknowledged (acked here, or collected after an ACK, a FASTACK or a
        peer's DELJOB), once none is pending any more or `timeout` ms (0:
        none) have passed.  A job that goes without an acknowledgement
        (expired, deleted, dead-lettered) stops being waited for and is not
        counted.  An ID this node does not know is -NOJOB: ask a node that
        holds the jobs."""
        acked, pending = 0, set()
        for job_id in dict.fromkeys(ids):
            job = self.jobs.get(job_id)
            if job is None:
                if job_id not in self.collected:
                    raise errors.nojob()
                acked += self.collected.acked(job_id)
            elif job.state == S_ACKED:
                acked += 1
            else:
                pending.add(job_id)
        if not pending:
            return acked
        waiter = self.block(client, (), False, timeout)
        waiter.jobs, waiter.acked = pending, acked
        for job_id in pending:
            self.job_waits.setdefault(job_id, []).append(waiter)
        return BLOCKED

    def settle_waits(self, job_id: bytes, acked: bool) -> None:
        """A job is acknowledged, or gone without it: tell WAITJOB clients."""
        for waiter in self.job_waits.pop(job_id, ()):
            assert waiter.jobs is not None
            waiter.jobs.discard(job_id)
            waiter.acked += acked
            if not waiter.jobs:
                self.unblock(waiter.client, waiter.acked)

    def drop_waiter(self, waiter: Waiter) -> None:
        waiter.client.waiter = None
        self.blocked.pop(waiter.client.id, None)
        if waiter.deadline:
            self.timeouts.dropped()
        for job_id in waiter.jobs or ():
            waits = self.job_waits[job_id]
            waits.remove(waiter)
            if not waits:
                del self.job_waits[job_id]
        for name in waiter.queues:
            queue = self.queues.get(name)
            if queue is not None:  # pragma: no branch - a queue with blocked clients is never destroyed
                queue.waiters.pop(waiter.client.id, None)
                self.federation.changed[name] = None

    def unblock(self, client: Client, value: Any) -> None:
        if client.waiter is not None:  # pragma: no branch - callers pass the client of a live waiter
            self.drop_waiter(client.waiter)
        self.reply_to(client, value)

    def unblock_all(self, value: Any) -> None:
        for waiter in list(self.blocked.values()):
            self.unblock(waiter.client, value)

    def _serve_ready(self) -> None:
        while self.ready:
            name = next(iter(self.ready))
            del self.ready[name]
            queue = self.queues.get(name)
            if queue is None or queue.pause & PAUSE_OUT:
                continue
            while queue.waiters and len(queue):
                waiter = next(iter(queue.waiters.values()))
                job = self.fetch(queue)
                if job is None:  # its job is on a disk that failed to read (MISCONF)
                    break
                take = waiter.take
                self.unblock(waiter.client, [self.job_entry(job, waiter.withcounters)] if take is None else take(job))
                if not len(queue):
                    self.federation.need_jobs(queue, REACHED_ZERO)
            if len(queue) and not queue.waiters:
                self.federation.hand_out(queue)

    @staticmethod
    def job_entry(job: Job, withcounters: bool) -> list[Any]:
        if withcounters:
            return [job.queue, job.id, job.body, b"nacks", job.nacks, b"additional-deliveries", job.deliv]
        return [job.queue, job.id, job.body]

    # ------------------------------------------------------------ cluster hooks

    def broadcast(self, node_ids: Any, msg: Any) -> None:
        me = self.cluster.my_id
        for node_id in node_ids:
            if node_id != me and self.cluster.has_link(node_id):
                self.send(node_id, msg)

    def send(self, node_id: str, msg: Any) -> None:
        key = self.cluster.key_of(node_id)
        if key is not None:
            self.send_key(key, msg)

    def send_key(self, key: int, msg: Any) -> None:
        self.stats.bus_sent += 1
        self.effects.append(Send(key, msg))

    def answer(self, conn: int, msg: Any) -> None:
        self.stats.bus_sent += 1
        self.effects.append(Answer(conn, msg))

    def drop_link(self, key: int) -> None:
        self.effects.append(DropLink(key))

    # ------------------------------------------------------------ bus entry points

    def header(self) -> m.Header:
        me, h = self.cluster.myself, self._header
        port = self.config.port or self.config.tls_port  # TLS-only: the tls-port
        if h.flags != me.flags or h.port != port or h.sender != me.id:
            h = self._header = m.Header(me.id, port, me.flags)
        return h

    def bus_links(self) -> dict[int, tuple[str, int]]:
        return self.cluster.bus_links()

    def link_connected(self, key: int) -> None:
        self.read_clock()
        self.cluster.link_connected(key)
        peer = self.cluster.node_of_key(key)
        if peer is not None:  # a node it keeps: tell it every fanout child, and the groups' progress it may have missed
            for msg in (*self.items.fanout_messages(), *self.groups.progress_for(peer.id),
                        *self.federation.announcements()):  # fmt: skip
                self.send_key(key, msg)

    def link_closed(self, key: int, connect_failed: bool) -> None:
        self.read_clock()
        self.cluster.link_closed(key, connect_failed)

    def handle_bus(
        self, header: m.Header, msg: Any, *, key: int | None = None, conn: int | None = None,
        peer_ip: str = "", local_ip: str = "",
    ) -> None:  # fmt: skip
        """One frame from a peer (`handle_frames`)."""
        self.handle_frames(((header, msg),), key=key, conn=conn, peer_ip=peer_ip, local_ip=local_ip)

    def handle_frames(
        self, frames: Iterable[tuple[m.Header, Any]], *, key: int | None = None, conn: int | None = None,
        peer_ip: str = "", local_ip: str = "",
    ) -> None:  # fmt: skip
        """The frames one read brought from a peer, in order, as one step:
        for each, membership first, then job messages from known senders
        only (spec/cluster.md §1)."""
        self.read_clock()
        receive, on_bus, stats = self.cluster.receive, self.on_bus, self.stats
        for header, msg in frames:
            stats.bus_received += 1
            known = receive(header, msg, key, conn, peer_ip, local_ip)
            handler = on_bus.get(type(msg))
            if handler is not None and known and not self.loading:
                try:
                    handler(header.sender, msg)
                except Exception:  # a bug must cost one message, not the node and its jobs
                    log.exception("Error handling %s from %s", type(msg).__name__, header.sender)
        if self.ready:
            self._serve_ready()
        self.settle()

    # ------------------------------------------------------------ AOF hooks

    def aof_loadjob(self, job: Job) -> None:
        if self.aof.state != "off":
            self.aof_record(job.queue, encode_loadjob(job))

    def aof_deljob(self, job: Job) -> None:
        if self.aof.state != "off":
            self.aof_record(job.queue, encode_deljob(job.id))

    def journaled(self, job: Job) -> bool:
        """Whether the job's queue is in the AOF (Kestrel's `journal` setting)."""
        return self._limits(job.queue).journal

    def _limits(self, queue: bytes | None) -> QueueSettings:
        """A queue's settings; a job with no queue (an ACK placeholder) has none."""
        return NO_LIMITS if queue is None else self.config.queue_config.settings(queue)

    def aof_record(self, queue: bytes | None, record: bytes) -> None:
        limits = self._limits(queue)
        if limits.journal:
            self.effects.append(AofAppend(record, limits.sync_journal))

    # ------------------------------------------------------------ flushing

    def flush_all(self) -> None:
        """DEBUG FLUSHALL / CLUSTER RESET: every job and queue goes."""
        for job in list(self.jobs.values()):
            self.delete_job(job)
        for job in self.jobs.spilled.every_job():
            self.delete_job(job)
        self.unblock_all(NIL_ARRAY)
        for queue in list(self.queues.values()):
            self.destroy_queue(queue)

    def reset(self, hard: bool) -> None:
        """CLUSTER RESET: no job, queue, peer or collected-ID memory is left,
        so nothing keyed by the old membership (or, HARD, the old ID) can act
        later.  Replication and federation state lives in the jobs and queues
        and goes with them."""
        self.flush_all()
        self.collected.clear()
        self.cluster.reset(hard)
