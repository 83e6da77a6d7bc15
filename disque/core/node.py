"""NodeCore: one Disque node's entry points and the composition of its concerns, with no I/O.

Theory of operation: the trio shell feeds the core three kinds of input:
client requests (`handle_command`, with the front end's command table),
bus messages (`handle_bus`/`handle_frames`: membership first, then the bus
table `on_bus`) and the passage of time (`tick`).  The core reads the time
from the injected `clock` and random numbers from the injected `rng` only,
and answers with a reply value plus effects (`take_effects`: replies to
other clients, bus sends, AOF records).  `next_deadline()` tells the shell
when to call `tick`.

This module decides nothing about jobs itself: it builds the concerns, each
of which owns its state and sees only the collaborators it is given, and
routes the inputs to them.

* core/outbox.py     the effects (replies, bus sends, AOF records)
* core/memory.py     the account, memory levels, eviction, queue GC
* core/lifecycle.py  jobs and queues: register, adopt, enqueue, fetch,
                     the scheduler, the producers' operations
* core/blocking.py   blocked clients, WAITJOB, serving ready queues
* core/gate.py       what every command passes (AUTH, memory, MISCONF,
                     LOADING, MONITOR, the slow log)
* core/replication.py, core/federation.py, core/acks.py, core/items.py,
  core/groups.py, core/handlers.py: the cluster's job messages and the
  other concerns, built on the lifecycle
* core/schedules.py  recurring jobs: the schedules, and who fires each tick
* core/limits.py     queues' rate and concurrency limits, budgets lent by homes
* core/dependencies.py  jobs that wait for jobs (ADDJOB ... AFTER)
* core/batches.py    batches and their callbacks (BATCH, ADDJOB ... BATCH)
* core/redrives.py   paced dead-letter moves (DEADLETTER ... RATE)
* core/read_behind.py  jobs on disk, behind the job store (`jobs.spilled`)

The front ends reach a concern through its attribute (`node.lifecycle.add_job`,
`node.blocking.get_jobs`, `node.gate.authenticate`, ...).  The node's
identity is `cluster.myself` alone (the membership, cluster/membership.py),
so a CLUSTER RESET HARD (`reset`) is followed by every structure at once.
Anything that needs the outside world synchronously (rewriting the config
file, process statistics, shutting down) goes through the `host` object the
shell provides.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from disque.cluster import messages as m
from disque.cluster.membership import Membership
from disque.core.acks import Acks
from disque.core.blocking import Blocking
from disque.core.federation import Federation
from disque.core.gate import Gate
from disque.core.groups import Groups
from disque.core.handlers import HANDLERS
from disque.core.items import Items
from disque.core.lifecycle import Lifecycle
from disque.core.limits import Limits
from disque.core.memory import Memory
from disque.core.outbox import Outbox
from disque.core import read_behind
from disque.core.read_behind import NoReadBehind, ReadBehind
from disque.core.snapshot import Snapshot, snapshot_jobs
from disque.core.replay import Replay
from disque.core.replication import Replication
from disque.core.redrives import Redrives
from disque.core.schedules import Schedules
from disque.core.keys import Keys
from disque.core.dependencies import Dependencies
from disque.core.batches import Batches
from disque.core.types import NIL_ARRAY, BodyStore, Clock, Command, Connection, Host, Stats
from disque.store.aof import AofStatus
from disque.store.collected import Collected
from disque.store.job import State

if TYPE_CHECKING:  # annotations only: the core draws from the injected rng
    import random

log = logging.getLogger("disque")

BLOCKED_CRON_MS: Final = 100
# Cluster state every node keeps whole, last writer wins (schedules, key holds, limits): taken
# from a peer whose handshake with us is still under way too, since a peer
# sends it when it learns what we read, which may be before we know its ID.
SHARED_STATE: Final = (m.SchedSet, m.Ticked, m.KeySet, m.QSet)


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
        now = clock.now_ms()
        self.stats = Stats()
        self.aof = AofStatus()
        self.start_ms = now
        self.run_id = "%040x" % rng.getrandbits(160)
        self.client_pause_until = 0
        self.clients: dict[int, Connection] = {}
        self._last_cron = 0
        self._header = m.Header("", 0, -1)  # the last header made: links send one only when it changes
        # The concerns, from the bottom up: each gets only what it works with.
        self.membership = membership or Membership(node_id, config.port or config.tls_port, rng=rng)
        self.membership.now = now
        self.membership.set_zone(config.zone or "")
        self.out = self.membership.wire = Outbox(self.membership, config, self.stats, self.aof)
        self.memory = Memory(config, rng)
        self.collected = Collected()
        self.lifecycle = life = Lifecycle(config, rng, self.membership, self.out, self.memory, self.stats, self.collected, now)
        self.jobs = life.jobs
        self.queues = life.queues
        self.federation = Federation(life, self.out)
        self.limits = Limits(life, self.out, now)
        self.federation.ordered = self.limits.ordered
        self.limits.hand_key = self.federation.hand_key
        self.federation.handed = self.limits.handed
        self.blocking = Blocking(life, self.out, self.federation, host, self.limits)
        self.replication = Replication(life, self.out)
        self.acks = Acks(life, self.out, self.replication, self.blocking)
        self.items = Items(life, self.out, self.acks, self.blocking, self.clients)
        self.groups = Groups(life, self.out, self.memory, self.blocking)
        self.schedules = Schedules(life, now, clock)
        self.keys = life.keys = Keys(life, self.blocking)
        self.redrives = Redrives(life)
        self.deps = Dependencies(life)
        self.batches = Batches(life, rng)
        life.bind(self.groups, self.acks, self.items, self.replication, self.blocking, self.federation, self.deps, self.batches)
        # Read-behind (core/read_behind.py) sits behind the job store; kept here for the shell and INFO.
        self.read_behind: ReadBehind | NoReadBehind = read_behind.install(life, bodies, config.read_behind)
        self.gate = Gate(config, clock, self.stats, life, self.out, self.memory, self.blocking, self.jobs.spilled)
        # The bus table: the handler of each job message, by type.
        self.on_bus: dict[type, Callable[[str, Any], None]] = {
            **{kind: partial(handler, life) for kind, handler in HANDLERS.items()},
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
            m.SchedSet: self.schedules.on_sched_set,
            m.Ticked: self.schedules.on_ticked,
            m.KeyClaim: self.keys.on_key_claim,
            m.KeyClaimed: self.keys.on_key_claimed,
            m.KeySet: self.keys.on_key_set,
            m.KeyDone: self.keys.on_key_done,
            m.QSet: self.limits.on_qset,
            m.LimitAsk: self.limits.on_ask,
            m.LimitGrant: self.limits.on_grant,
            m.Depend: self.deps.on_depend,
            m.Settled: self.deps.on_settled,
            m.BatchSet: self.batches.on_batch_set,
        }

    @property
    def now(self) -> int:
        """ms, the time of the current step."""
        return self.lifecycle.now

    @property
    def loading(self) -> bool:
        """The AOF replays (`begin_load` .. `end_load`)."""
        return self.gate.loading

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> int:
        """Absolute ms when `tick` must run next (the scheduler, jobs on
        disk, blocked clients' timeouts and the 100 ms client cron)."""
        at = self.lifecycle.now if self.blocking.sliced else self._last_cron + BLOCKED_CRON_MS  # (a long command's next slice)
        for awake in (
            self.jobs.next_awake(), self.jobs.spilled.next_awake(), self.blocking.timeouts.next(), self.limits.next_deadline(),
        ):  # fmt: skip
            if awake is not None:
                at = min(at, awake)
        self.blocking.promised = at
        return at

    def read_clock(self) -> int:
        """Take the time of this step from the clock (tick, every command,
        bus message and AOF replay batch)."""
        self.lifecycle.now = self.membership.now = now = self.clock.now_ms()
        return now

    def begin_load(self, trust_queued: bool = False) -> Replay:
        """The shell starts replaying the AOF into this node: until
        `end_load`, commands without the `l` flag answer -LOADING."""
        self.gate.loading = True
        self.read_clock()
        return Replay(
            self.lifecycle, self.groups, self.settle, self.read_clock, trust_queued=trust_queued,
            schedules=self.schedules, keys=self.keys, limits=self.limits, batches=self.batches,
        )  # fmt: skip

    def end_load(self) -> None:
        self.gate.loading = False

    def tick(self) -> None:
        now = self.read_clock()
        life = self.lifecycle
        self.jobs.spilled.tick()
        for job in self.jobs.due(now):
            life.process_job(job)
        self.blocking.time_out(now)
        self.blocking.step_slices()
        if self.limits.throttled:
            self.limits.tick()
        if now - self._last_cron >= BLOCKED_CRON_MS:
            self._last_cron = now
            self.membership.timeout = self.config.cluster_node_timeout
            self.membership.set_zone(self.config.zone or "")
            self.membership.cron()
            self.replication.cron()
            self._cron()
        self.blocking.serve_ready()
        self.settle()

    def settle(self) -> None:
        """The end of a step: read-behind moves what it may to disk, and
        peers hear of the queues whose blocked clients changed; consumers
        a limit held back are served once it allows."""
        if self.limits.throttled and self.limits.recheck():
            self.blocking.serve_ready()
        self.jobs.spilled.settle()
        if self.federation.changed:
            self.federation.announce()

    def _cron(self) -> None:
        self.blocking.cron()
        self.federation.cron()
        self.groups.cron()
        self.schedules.cron()
        self.keys.cron()
        self.limits.cron()
        self.deps.cron()
        self.batches.cron()
        self.redrives.cron()
        self.jobs.spilled.cron()
        self.memory.collect_idle_queues()
        self.collected.expire(self.lifecycle.now)
        self.lifecycle.results.expire(self.lifecycle.now)
        if self.config.timeout:
            self._close_idle_clients(self.config.timeout * 1000)

    def _close_idle_clients(self, limit_ms: int) -> None:
        """The `timeout` directive: blocked clients and monitors are exempt."""
        now, monitors = self.lifecycle.now, self.gate.monitors
        for client in self.clients.values():
            if client.waiter is None and not client.repl_jobs and client.id not in monitors:
                if now - client.last > limit_ms:
                    self.out.close_client(client)

    # ------------------------------------------------------------ clients

    def connect(self, client_id: int, addr: str = "", laddr: str = "", fd: int = -1) -> Connection:
        now = self.lifecycle.now
        client = Connection(client_id, fd, addr, laddr, ctime=now, last=now)  # unauthenticated
        self.clients[client_id] = client
        self.stats.connections += 1
        return client

    def disconnect(self, client_id: int) -> None:
        client = self.clients.pop(client_id, None)
        if client is None:
            return
        self.gate.monitors.pop(client_id, None)
        if client.waiter is not None:
            self.blocking.drop_waiter(client.waiter)
        if client.open_read is not None:
            self.items.abort(client)
        waiting, client.repl_jobs = client.repl_jobs, {}
        for job_id in waiting:
            job = self.jobs.get(job_id)
            self.out.repl_waiters.pop(job_id, None)  # gone: nobody to answer
            if job is not None and job.state == State.WAIT_REPL:  # pragma: no branch - repl_jobs end with wait-repl
                self.replication.abort(job, None)

    def handle_command(self, client: Connection, request: Any, run: Callable[[NodeCore, Connection, Any], Any]) -> Any:
        """One request from a client of the front end whose command table is
        `run` (request -> `execute` or an early answer); returns its result."""
        client.last = self.read_clock()
        reply = run(self, client, request)
        if self.blocking.ready:
            self.blocking.serve_ready()
        self.settle()
        return reply

    def execute(self, client: Connection, cmd: Command, argv: list[bytes]) -> Any:
        """What every front end's command goes through (core/gate.py)."""
        return self.gate.execute(self, client, cmd, argv)

    # ------------------------------------------------------------ shell entry points

    def take_effects(self) -> list[Any]:
        """The effects of the entry points called since the last take, in order."""
        return self.out.take()

    def pause_left(self, now_ms: int) -> int:
        """How many ms of CLIENT PAUSE remain at `now_ms` (0: clients run)."""
        return max(0, self.client_pause_until - now_ms)

    def set_aof_error(self, strerror: str | None) -> None:
        """The AOF's last write or fsync failed (MISCONF for writes), or works again."""
        self.gate.aof_error = strerror

    def account(self, delta: int) -> None:
        """Memory the shell holds for the core's clients (their input)."""
        self.memory.account(delta)

    def snapshot(self) -> Snapshot:
        """Everything an AOF rewrite must hold (core/snapshot.py): jobs in
        memory and on disk, consumer groups' progress, schedules, key holds,
        limits, results, batches."""
        return Snapshot(
            snapshot_jobs(self.jobs.values(), self.out.journaled),
            self.read_behind.snapshot(),
            [
                *self.groups.snapshot_records(), *self.schedules.snapshot_records(), *self.keys.snapshot_records(),
                *self.limits.snapshot_records(), *self.acks.snapshot_records(), *self.batches.snapshot_records(),
            ],
        )

    def conf_dirty(self) -> bool:
        """Whether nodes.conf no longer matches the cluster state."""
        return self.membership.dirty

    def cluster_conf(self) -> str:
        """nodes.conf's text; the shell saves it, so it is no longer dirty."""
        self.membership.dirty = False
        return self.membership.to_conf()

    # ------------------------------------------------------------ bus entry points

    def header(self) -> m.Header:
        me, h = self.membership.myself, self._header
        port = self.config.port or self.config.tls_port  # TLS-only: the tls-port
        if h.flags != me.flags or h.port != port or h.sender != me.id:
            h = self._header = m.Header(me.id, port, me.flags)
        return h

    def bus_links(self) -> dict[int, tuple[str, int]]:
        return self.membership.bus_links()

    def link_connected(self, key: int) -> None:
        self.read_clock()
        self.membership.link_connected(key)
        peer = self.membership.node_of_key(key)
        if peer is not None:  # a node it keeps: tell it every fanout child and the groups' progress it may have missed
            for msg in (*self.items.fanout_messages(), *self.groups.progress_for(peer.id)):
                self.out.send_key(key, msg)

    def link_closed(self, key: int, connect_failed: bool) -> None:
        self.read_clock()
        self.membership.link_closed(key, connect_failed)

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
        receive, on_bus, stats, gate = self.membership.receive, self.on_bus, self.stats, self.gate
        for header, msg in frames:
            stats.bus_received += 1
            known = receive(header, msg, key, conn, peer_ip, local_ip)
            handler = on_bus.get(type(msg))
            if handler is not None and (known or type(msg) in SHARED_STATE) and not gate.loading:
                try:
                    handler(header.sender, msg)
                except Exception:  # a bug must cost one message, not the node and its jobs
                    log.exception("Error handling %s from %s", type(msg).__name__, header.sender)
        if self.membership.new_features:
            self._new_features()
        if self.blocking.ready:
            self.blocking.serve_ready()
        self.settle()

    def _new_features(self) -> None:
        """Peers that just said what they read (on a link that came up, their
        PONG) get what was kept from them until then: the waiting consumers,
        every schedule and the ticks fired, the key holds, every queue's limits,
        every batch."""
        peers, self.membership.new_features = self.membership.new_features, []
        for peer in peers:
            if not peer.link:
                continue
            if peer.features & m.FEATURE_WAITING:
                for msg in self.federation.announcements():
                    self.out.send_key(peer.key, msg)
            if peer.features & m.FEATURE_SCHEDULES:
                for state in self.schedules.sync_messages():  # (another name: mypyc types `msg` by the loop above)
                    self.out.send_key(peer.key, state)
            if peer.features & m.FEATURE_KEYS:
                for hold in self.keys.sync_messages():
                    self.out.send_key(peer.key, hold)
            if peer.features & m.FEATURE_LIMITS:
                for record in self.limits.sync_messages():
                    self.out.send_key(peer.key, record)
            if peer.features & m.FEATURE_BATCHES:
                for batch in self.batches.sync_messages():  # (a name of its own: mypyc types a loop's name once)
                    self.out.send_key(peer.key, batch)

    # ------------------------------------------------------------ flushing

    def flush_all(self) -> None:
        """DEBUG FLUSHALL / CLUSTER RESET: every job, queue, result and batch goes."""
        life = self.lifecycle
        life.results.clear()
        self.batches.clear()
        for job in list(self.jobs.values()):
            life.delete_job(job)
        for job in self.jobs.spilled.every_job():
            life.delete_job(job)
        self.blocking.unblock_all(NIL_ARRAY)
        for queue in list(self.queues.values()):
            life.destroy_queue(queue)

    def reset(self, hard: bool) -> None:
        """CLUSTER RESET: no job, queue, peer or collected-ID memory is left,
        so nothing keyed by the old membership (or, HARD, the old ID) can act
        later.  Replication and federation state lives in the jobs and queues
        and goes with them."""
        self.flush_all()
        self.collected.clear()
        self.membership.reset(hard)
