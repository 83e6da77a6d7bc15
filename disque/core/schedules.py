"""Recurring jobs with no single scheduler (docs/schedules.md, spec/commands.md §12).

Theory of operation: a schedule (store/schedule.py) is cluster state.  Every
change (SCHEDULE ADD, DEL, PAUSE, RESUME) is a whole new record stamped with
its time and node; it goes to every linked node (SCHEDSET) and to the AOF
(SCHEDULE), and a node that links up is sent every record, tombstones
included.  Of two records of a name the newer wins, so all nodes converge
on one definition whatever the order the records arrive in.

Each tick (a time the EVERY period or the CRON expression names, in ms)
becomes one job whose ID is made from (schedule, tick) alone
(`ids.tick_job_id`): two nodes firing the same tick make the same job, and
the copies collapse where they meet as any two copies of a job do.  Who
fires tick t: the nodes this one sees up (itself, and the peers not
flagged failing or leaving, linked or not) ordered by a hash of
(schedule, t, node ID), rendezvous-style; the node of rank r fires once
`grace * r` ms passed since it first saw the tick due, unless it heard
meanwhile (TICKED, sent to every linked node by the firer) that the tick
fired.  In a connected cluster every node computes the same order, so rank
0 fires and the others hear it well within the grace; a node that is down
or cut off is flagged by those that cannot see it, and out of their order,
so the next one fires at once, and both sides of a partition fire (the same
job).  A link alone does not count: on a slow machine a PING answered late
drops a link (after half the node timeout) that is made again at once, and
a node that left a peer out of the order then would fire that peer's turn.
When
a node hears that another made a tick it made too (TICKED, also sent for
the last MINE_MAX ticks it fired to a node that links up), it sends its
copy there as a replica: the copies learn each other's holders, so one is
queued and one ACK reaches both.

What a node knows fired, per schedule: `last` (the latest tick, with the
node that fired it: persisted as SCHEDTICK, and sent to a node that links
up) and the ticks fired in the recent window.  Ticks are due from the
window's start, `max(now - grace * size, start of this node, since)`, to
now, and so is a tick this node first saw due late (it was quiet, below):
its turns run from when it was seen, so the window sliding past it drops it
only once every turn has passed.  A tick older than the window and later
than `last` was missed (no node fired it in its window: the whole cluster
was down, or this node was): of those,
`schedule-catch-up` fires the latest only (`last`, Kubernetes CronJob's
rule), every one of them (`all`: at most 100) or none.  A node fires nothing in
its first `grace` ms (the grace in force, which CONFIG SET may have changed
since), so its links come up and tell it what fired first.
Nor for `grace / 2` after a stall (the cron did not run for half the node
timeout or half the grace, and for at least three of its periods): its
peers may have flagged it, or seen its turn pass, and fired its ticks,
while its own view is stale (links dropped by its own cron, flags set on
peers whose answers it has not read yet).  Its links
are made again and the peers' TICKED (sent again on link-up) reach it first.
A tick due before it woke may still be in the hands of the next node in
line, whose turn may come at any moment: it waits for that turn to pass,
and `grace / 2` more to hear of it, before firing the tick itself.

Ticks follow the time the nodes agree on, not this node's clock alone:
each pass takes `offset`, the lower median of the clock offsets its peers'
PING and PONG said and its own (how far its wall clock is behind its node
clock, which leans back only 1 % a second after a step), and the ticks,
the window, the turns and the heap run on `now + offset`; so a node whose
clock is ahead fires no tick early (docs/schedules.md, "A clock far from
the others'").

What a schedule costs: the cron looks at a schedule only when it is due
(`due`, a heap of when each needs a look next: its next tick, or the turn
of a tick still waiting; a change wakes it at once), at most PASS_MAX a
pass, so a pass over ten thousand schedules touches the few due and a CRON
expression is read per tick, not per pass.  Every record held is counted
in the node's memory (`_size`), so SCHEDULE ADD (flag `m`) is refused at
maxmemory as ADDJOB is; a tombstone is forgotten TOMBSTONE_MS after the
deletion.

Called by NodeCore: `cron` every 100 ms, `on_sched_set` / `on_ticked` (the
bus), `sync_messages` (a link comes up), `replay` (AOF records),
`snapshot_records` (an AOF rewrite); the SCHEDULE command's handlers call
`add`, `delete`, `pause`, `show`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from disque.cluster import messages as m
from disque.core import errors
from disque.core.homes import score
from disque.core.types import Clock, Connection, Map
from disque.store import schedule as records
from disque.store.aof import SCHEDTICK, SCHEDULE, encode_record
from disque.store.ids import tick_job_id
from disque.store.job import State
from disque.store.job_options import JobOptions
from disque.store.records import decoded
from disque.store.schedule import Schedule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from disque.core.lifecycle import Lifecycle

log = logging.getLogger("disque")

MIN_EVERY = 100  # ms: the cron's period, below which ticks could not be told apart
STALL_MIN_MS = 300  # the cron runs every 100 ms: three periods without it is a stall, one late run is not
CATCH_UP = {"last": 1, "all": 100, "none": 0}  # `schedule-catch-up`: how many missed ticks fire
MINE_MAX = 512  # ticks a node remembers firing, to merge with a copy made across a partition
PASS_MAX = 256  # schedules one cron pass looks at, at most: the others due wait for the next pass
TOMBSTONE_MS = 86_400_000  # a deletion is forgotten a day after it was made
HORIZON_MS = 366 * 86_400_000  # how far ahead a next tick is looked for
SCHEDULE_OVERHEAD = 1500  # bytes per schedule known (record, run, heap entry) on top of its strings


@dataclass(slots=True)
class Run:
    """What this node knows of a schedule's ticks."""

    last: int = 0  # the latest tick known fired (0: none)
    last_by: str = ""  # ... and the node that fired it
    fired: dict[int, str] = field(default_factory=dict)  # ticks fired in the window -> by whom
    seen: dict[int, int] = field(default_factory=dict)  # tick -> when this node first saw it due
    mine: dict[int, None] = field(default_factory=dict)  # the last MINE_MAX ticks this node fired, oldest first


def _zone(tz: bytes) -> Any:
    """The CRON expression's zone; -ERR for a name zoneinfo does not know."""
    if not tz:
        return timezone.utc
    try:
        return ZoneInfo(tz.decode())
    except (KeyError, ValueError, OSError):  # not found (a KeyError), a path, not text, not a zone file
        raise errors.err("TZ must be a zone name such as Europe/Paris") from None


def _cron(s: Schedule, start_ms: int, reverse: bool = False) -> Iterator[int]:
    """The ticks of a CRON schedule after (before, `reverse`) `start_ms`, in ms.
    cronsim is imported here only: nodes without a CRON schedule never load it."""
    from cronsim import CronSim

    start = datetime.fromtimestamp(start_ms / 1000, _zone(s.tz))
    if not reverse:  # cronsim counts in whole seconds: a tick at start's second must not come back
        start = start.replace(microsecond=0)
    for when in CronSim(s.cron.decode(), start, reverse=reverse):  # pragma: no branch - endless (CronSim refuses a day that never comes)
        yield int(when.timestamp() * 1000)


CRON_FIELDS = "5 fields: minute hour day month weekday"
CRON_RANGES = {  # cronsim's name of a field -> its place, our name for it, what it takes
    "minute": (0, "minute", "0-59"),
    "hour": (1, "hour", "0-23"),
    "day-of-month": (2, "day", "1-31, a day the month has"),
    "month": (3, "month", "1-12 or JAN-DEC"),
    "day-of-week": (4, "weekday", "0-7 or SUN-SAT"),
}


def check_cron(expr: bytes, tz: bytes) -> None:
    """-ERR unless `expr` is a 5-field cron expression cronsim accepts."""
    _zone(tz)
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:  # pragma: no cover - cronsim is a dependency; a broken install says so
        raise errors.err("CRON schedules need the cronsim package") from None
    fields = expr.split()
    if len(fields) != 5:  # cronsim also takes a sixth (seconds) field: not ours
        raise errors.err(f"invalid CRON expression: {len(fields)} fields, {CRON_FIELDS}")
    try:
        CronSim(expr.decode(), datetime(2000, 1, 1, tzinfo=timezone.utc))
    except UnicodeDecodeError:
        raise errors.err(f"invalid CRON expression: not text; {CRON_FIELDS}") from None
    except CronSimError as e:  # "Bad minute", "Bad day-of-month", ...: which field, and what it takes
        index, name, accepted = CRON_RANGES[str(e).removeprefix("Bad ")]
        bad = fields[index].decode()
        raise errors.err(f'invalid CRON expression: the {name} field "{bad}" must be {accepted}; {CRON_FIELDS}') from None


def ticks_after(s: Schedule, lo: int, hi: int) -> Iterator[int]:
    """The ticks t with lo < t <= hi, in order."""
    if s.every:
        yield from range((lo // s.every + 1) * s.every, hi + 1, s.every)
        return
    for t in _cron(s, lo):  # pragma: no branch - endless: the loop ends past `hi`
        if t > hi:
            return
        yield t


def next_tick(s: Schedule, after: int) -> int | None:
    """The first tick after `after` (None: none within a year and a day)."""
    return next(ticks_after(s, after, after + HORIZON_MS), None)


def ticks_back(s: Schedule, at: int) -> Iterator[int]:
    """The ticks t <= at, latest first."""
    if s.every:
        return iter(range(at // s.every * s.every, 0, -s.every))
    return _cron(s, at + 1, reverse=True)


class Schedules:
    def __init__(self, life: Lifecycle, started: int, clock: Clock) -> None:
        self.life = life
        self.clock = clock  # (its wall clock: a node clock still leaning back from a step must not run ticks early)
        self.offset = 0  # the agreed time minus this node's clock, as the last pass found it
        self.out = life.out
        self.config = life.config
        self.started = started  # ms this node started
        self.quiet_until = 0  # after a stall, no tick fires before (see `cron`)
        self.last_cron = started
        self.woke = 0  # when the cron ran after its latest stall
        self.defs: dict[bytes, Schedule] = {}  # every schedule known, tombstones included
        self.runs: dict[bytes, Run] = {}
        self.due: list[tuple[int, bytes]] = []  # (when a schedule needs a look, its name): a heap
        self.due_at: dict[bytes, int] = {}  # the heap's entry in force per name (the others are stale)
        self.client = Connection(0, addr="schedule")  # adds the ticks' jobs (ASYNC: never waits)
        self.fired = self.late = self.collapsed = self.refused = 0
        self.dropped = 0  # records that broke a rule, from the bus or the AOF

    @property
    def grace(self) -> int:
        return int(self.config.schedule_grace)

    # ------------------------------------------------------------ changes

    def add(self, s: Schedule) -> None:
        """SCHEDULE ADD: a new definition, or none if it is the one in force."""
        s = replace(s, since=s.since + self.offset)  # (the ticks after the ADD by the agreed time)
        known = self.defs.get(s.name)
        if known is not None and not known.deleted:
            if replace(known, version=0, origin="", since=0, paused=False) == replace(s, version=0, origin="", since=0):
                return  # a worker registering its schedules again at start
            s = replace(s, paused=known.paused)
        self._change(s)

    def delete(self, name: bytes) -> int:
        known = self.live(name)
        if known is None:
            return 0
        self._change(Schedule(name, 0, "", deleted=True))
        return 1

    def pause(self, name: bytes, paused: bool) -> None:
        known = self.live(name)
        if known is None:
            raise errors.err("no such schedule")
        if known.paused != paused:
            self._change(replace(known, paused=paused))

    def live(self, name: bytes) -> Schedule | None:
        s = self.defs.get(name)
        return None if s is None or s.deleted else s

    def _change(self, s: Schedule) -> None:
        """A change made here: stamped newer than the record in force (even
        if this node's clock is behind its author's), kept, and told."""
        known = self.defs.get(s.name)
        version = self.life.now if known is None else max(self.life.now, known.version + 1)
        s = replace(s, version=version, origin=self.life.membership.my_id)
        self._keep(s)
        self.out.broadcast(self.life.membership.linked_ids(features=m.FEATURE_SCHEDULES), m.SchedSet(records.encode(s)))

    def _keep(self, s: Schedule) -> None:
        """Apply a record known to be newer; it is logged."""
        self._store(s)
        self._log(encode_record(SCHEDULE, records.encode(s)))

    def _store(self, s: Schedule) -> None:
        """Hold a record known to be newer, counted in the node's memory, and
        look at it in the next pass (a tombstone: once it expires)."""
        self.life.memory.account(_size(s) - _size(self.defs.get(s.name)))
        self.defs[s.name] = s
        if s.deleted:
            self.runs.pop(s.name, None)
            self._wake(s.name, s.version + TOMBSTONE_MS)
        else:
            self.runs.setdefault(s.name, Run())
            self._wake(s.name, 0)

    def _wake(self, name: bytes, at: int) -> None:
        """Look at `name` no later than `at`."""
        if self.due_at.get(name, at + 1) > at:
            self.due_at[name] = at
            heappush(self.due, (at, name))

    def _log(self, record: bytes) -> None:
        if self.out.aof.state != "off":
            self.out.aof_record(None, record)

    # ------------------------------------------------------------ the bus and the AOF

    def on_sched_set(self, sender: str, msg: m.SchedSet) -> None:
        s = self._checked(msg.record, f"from {sender}")
        if s is not None and s.newer(self.defs.get(s.name)):
            self._keep(s)

    def _checked(self, record: bytes, source: str) -> Schedule | None:
        """The record decoded; None for a bad one, dropped alone (logged and counted)."""
        s = decoded(records.decode, record, "Schedule", source)
        self.dropped += s is None
        return s

    def on_ticked(self, sender: str, msg: m.Ticked) -> None:
        run = self.runs.get(msg.name)
        if run is None:
            return
        if msg.tick in run.mine and msg.node != self.life.membership.my_id:
            self._merge(self.defs[msg.name], msg.tick, msg.node)
        run.fired.setdefault(msg.tick, msg.node)
        self._advance(msg.name, run, msg.tick, msg.node)

    def _merge(self, s: Schedule, tick: int, node: str) -> None:
        """`node` made the job of a tick this node made too (a partition, a
        lost notice): the same ID, so this copy goes to it as a replica, and
        each copy then knows the other's holders, which dequeue the
        duplicates and take an ACK to both (as for any two copies of a job)."""
        self.collapsed += 1
        job = self.life.jobs.get(tick_job_id(s.name, tick, s.ttl or 86400, s.retry))
        if job is not None and job.state in (State.ACTIVE, State.QUEUED) and node in self.life.membership.nodes:
            job.add_delivered(node)
            self.life.replicas.replicate(job, 0, noreply=True)

    def _advance(self, name: bytes, run: Run, tick: int, node: str) -> None:
        if tick > run.last:
            run.last, run.last_by = tick, node
            self._log(encode_record(SCHEDTICK, name, b"%d" % tick, node.encode()))

    def sync_messages(self) -> list[Any]:
        """Every record and the latest tick of each schedule, for a node that just linked up."""
        me = self.life.membership.my_id
        msgs: list[Any] = [m.SchedSet(records.encode(s)) for s in self.defs.values()]
        for name, run in self.runs.items():
            msgs += [m.Ticked(name, t, me) for t in run.mine if t != run.last]
            if run.last:
                msgs.append(m.Ticked(name, run.last, run.last_by))
        return msgs

    def replay(self, args: list[bytes]) -> None:
        """A SCHEDULE or SCHEDTICK record (framing and arity checked by the loader)."""
        if args[0].upper() == SCHEDULE:
            s = self._checked(args[1], "in the AOF")
            if s is not None and s.newer(self.defs.get(s.name)):
                self._store(s)
            return
        run = self.runs.get(args[1])
        tick = int(args[2])
        if run is not None and tick > run.last:
            run.last, run.last_by = tick, args[3].decode("ascii", "replace")

    def snapshot_records(self) -> list[bytes]:
        """The state as records, for an AOF rewrite."""
        out = [encode_record(SCHEDULE, records.encode(s)) for s in self.defs.values()]
        return out + [
            encode_record(SCHEDTICK, name, b"%d" % run.last, run.last_by.encode())
            for name, run in self.runs.items() if run.last
        ]  # fmt: skip

    # ------------------------------------------------------------ firing

    def cron(self) -> None:
        now = self.life.now
        if now - self.last_cron > max(min(self.config.cluster_node_timeout, self.grace) // 2, STALL_MIN_MS):
            self.woke = now  # stalled: see the module's doc
            self.quiet_until = max(self.quiet_until, now + self.grace // 2)
        self.last_cron = now
        self.offset = self.life.membership.agreed_offset(min(0, self.clock.wall_us() // 1000 - now))
        due = self.due
        if now < max(self.quiet_until, self.started + self.grace) or self.life.membership.leaving or not due:
            return
        now += self.offset  # the time the nodes agree on, from here on
        order: list[str] = []
        for _ in range(PASS_MAX):
            if not due or due[0][0] > now:
                return
            at, name = heappop(due)
            if self.due_at.get(name) != at:
                continue  # a stale entry: the name was woken sooner, or forgotten
            del self.due_at[name]
            s = self.defs[name]
            if s.deleted:
                if s.version + TOMBSTONE_MS > now:  # (its clock is ahead of this node's)
                    self._wake(name, s.version + TOMBSTONE_MS)
                else:  # every node that was up has had it for a day: forgotten
                    del self.defs[name]
                    self.life.memory.account(-_size(s))
            elif not s.paused:  # (RESUME is a new record, which wakes it)
                order = order or self.life.membership.up_ids()
                self._wake(name, self._due(s, self.runs[name], now, order))

    def _due(self, s: Schedule, run: Run, now: int, order: list[str]) -> int:
        """Fire what is due of `s`; when it needs a look again (its next
        tick, or the next turn of a tick still waiting for one)."""
        start = max(now - self.grace * len(self.life.membership.nodes), self.started + self.offset, s.since)
        for t in [t for t, at in run.seen.items() if at <= start]:  # every turn since it was seen has passed
            del run.seen[t]
        for t in [t for t in run.fired if t <= start and t not in run.seen]:
            del run.fired[t]
        late = [t for t in run.seen if t <= start]  # seen due late (after a quiet start or a stall): its turns still run
        wake = next_tick(s, now) or now + HORIZON_MS
        for t in dict.fromkeys([*self._missed(s, run, start), *late, *ticks_after(s, start, now)]):
            if t not in run.fired:
                wake = min(wake, self._consider(s, run, t, now, order))
        return wake

    def _missed(self, s: Schedule, run: Run, start: int) -> list[int]:
        """The ticks before the window, later than any known fired, that the
        catch-up rule fires (oldest first)."""
        limit = CATCH_UP[self.config.schedule_catch_up]
        floor = max(run.last, s.since)
        missed: list[int] = []
        for t in ticks_back(s, start):  # pragma: no branch - ends at `floor` (>= `since`, past every EVERY's first tick)
            if t <= floor or len(missed) == limit:
                break
            missed.append(t)
        return missed[::-1]

    def _consider(self, s: Schedule, run: Run, t: int, now: int, order: list[str]) -> int:
        """Fire tick `t` if this node's turn came; when to look again if not."""
        seen = run.seen.setdefault(t, now)
        me = order[0]
        mine = _turn(s.name, t, me)
        rank = sum(1 for node in order[1:] if _turn(s.name, t, node) < mine)
        at = seen + self.grace * rank
        woke = self.woke + self.offset
        if t <= woke:  # due before a stall ended: the next in line may be firing it, let its turn pass first
            at = max(woke, t + self.grace * min(rank + 1, len(order) - 1)) + self.grace // 2
        if now < at:
            return at
        self._fire(s, run, t, now - t >= self.grace)
        return now + HORIZON_MS

    def _fire(self, s: Schedule, run: Run, t: int, late: bool) -> None:
        life = self.life
        ttl = s.ttl or 86400
        job_id = tick_job_id(s.name, t, ttl, s.retry)  # (-1, ADDJOB's default RETRY, is > 0 too)
        me = life.membership.my_id
        run.fired[t] = me
        if job_id in life.jobs or job_id in life.collected:
            return  # a copy from the node that fired it came before its notice
        # The level asked (ADDJOB's default without one), made as far as nodes are reachable now
        # (MINREPL 1: a tick is never refused for its copies), the rest in the background.
        repl = s.repl or min(3, life.membership.size())
        try:
            life.add_job(self.client, s.queue, s.body, JobOptions(
                0, repl, ttl, None if s.retry < 0 else s.retry, s.delay or None, s.maxlen or None, True,
                s.max_attempts, s.dead_letter or None, min(s.zones, repl) or None,
                None if s.priority < 0 else s.priority, minrepl=1, job_id=job_id,
            ))  # fmt: skip
        except errors.DisqueError as e:  # (a full or paused queue, memory): the tick is done with, not retried
            self.refused += 1
            log.warning("Schedule %r: tick %d not added: %s", s.name, t, e)
            self._advance(s.name, run, t, me)
            return
        self.fired += 1
        self.late += late
        run.mine[t] = None
        if len(run.mine) > MINE_MAX:
            del run.mine[next(iter(run.mine))]
        self.out.broadcast(life.membership.linked_ids(features=m.FEATURE_SCHEDULES), m.Ticked(s.name, t, me))
        self._advance(s.name, run, t, me)

    # ------------------------------------------------------------ reading

    def show(self, name: bytes) -> Map | None:
        s = self.live(name)
        if s is None:
            return None
        run = self.runs[name]
        now = self.life.now
        return Map([
            (b"name", s.name), (b"queue", s.queue), (b"body", s.body),
            (b"every", s.every or None), (b"cron", s.cron or None), (b"tz", s.tz or None),
            (b"options", s.options()), (b"paused", int(s.paused)),
            (b"last-tick", run.last or None), (b"last-node", run.last_by or None),
            (b"next-tick", next_tick(s, now)),
            *self._consumers(s.queue),
        ])  # fmt: skip

    def _consumers(self, name: bytes) -> list[tuple[bytes, int | None]]:
        """Whether anyone takes the jobs of a schedule's queue here: its
        length, the consumers waiting, when a job was last taken and when
        the oldest still queued was made (unix ms; None: never, none).  A
        queue that keeps two jobs or more with nobody waiting and nothing
        taken since its oldest was made has lost its consumer."""
        queue = self.life.queues.get(name)
        if queue is None:
            return [(b"queue-len", 0), (b"queue-waiting", 0), (b"queue-fetched", None), (b"queue-oldest", None)]
        oldest = queue.eldest()
        return [
            (b"queue-len", len(queue)), (b"queue-waiting", len(queue.waiters)), (b"queue-fetched", queue.fetched or None),
            (b"queue-oldest", None if oldest is None else oldest.ctime // 1_000_000),
        ]  # fmt: skip

    def size(self) -> int:
        """What the records held cost (in the node's memory account)."""
        return sum(map(_size, self.defs.values()))

    def names(self) -> list[bytes]:
        return sorted(name for name, s in self.defs.items() if not s.deleted)

    def info_fields(self) -> list[tuple[str, int]]:
        return [
            ("schedules", len(self.runs)), ("schedules_paused", sum(self.defs[n].paused for n in self.runs)),
            ("schedule_ticks_fired", self.fired), ("schedule_ticks_late", self.late),
            ("schedule_ticks_collapsed", self.collapsed), ("schedule_ticks_refused", self.refused),
            ("schedule_records_dropped", self.dropped),
        ]  # fmt: skip


def _size(s: Schedule | None) -> int:
    """What a record costs in memory (0: none)."""
    if s is None:
        return 0
    return SCHEDULE_OVERHEAD + len(s.name) + len(s.queue) + len(s.body) + len(s.cron) + len(s.tz) + len(s.dead_letter)


def _turn(name: bytes, tick: int, node_id: str) -> bytes:
    """A node's place in the order of tick `tick` of `name` (the lowest fires first)."""
    return score(b"%s\0%d" % (name, tick), node_id)
