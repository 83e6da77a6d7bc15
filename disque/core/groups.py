"""Consumer groups: bananaq's events over the job store (docs/consumer-groups.md).

Theory of operation: an *event* is a job flagged EVENT.  QADD replicates it
as ADDJOB does (REPLICATE nodes, ASYNC for NOBLOCK); its TTL expires it, the
AOF keeps it, and it is never queued (no requeue time), so GETJOB never sees
it.  Its decimal ID is written in its job ID (`event_id`): the creation ms
and a per-node counter in the random part, the creator's 8-hex prefix in
the node part, so every holder derives the same ID and IDs sort by
creation time.  `Lifecycle.register` / `delete_job` tell this module
(`add_event` / `drop_event`); it keeps, per queue, the events held here in ID
order and, per group, the progress of each event the group touched: a
deadline in ms (held by a consumer until then, *redo* once passed) or DONE.
No entry means fresh.  One stored body serves every group.

One node serves each event, and only it hands the event to a group, so
within a group an event has one holder at a time: its creator, or while the
creator is flagged FAIL, the holder with the lowest node ID not flagged
(every holder computes the same answer from the same `nodes_delivered`).
QGET picks from this node's view the group's lowest redo event, else its
lowest fresh one, skipping events whose server has no link.  If this node
serves it, it is handed out at once; else CLAIM goes to the server and the
client waits (at most CLAIM_MS) for CLAIMED.  A denied claim means the view
was behind: the server's GROUPSET, sent first on the same link, has fixed
it, and QGET picks again.  Every change of progress goes to the event's
other holders (GROUPSET) and to the AOF (a GROUPSET record); a holder keeps
the most advanced state it heard (DONE beats a deadline, a later deadline an
earlier one), so messages may come late, twice or in any order.  QACK is
answered by any holder.  QNOTIFY waits for an event QGET would return: the
node that stores an event wakes its waiters, and the cron checks them for
redo every 100 ms.  During a partition both sides may serve an event, so a
group may get it twice: at-least-once per group wins over one holder.

Memory: what this module keeps beyond the events' job records (each event's
entry, each group, its progress entries, timers and redo entries) is counted
in the node's `used_memory` as it changes (`size` recomputes it, for the
tests), with costs measured with tracemalloc.  Over 95 % of `maxmemory` with
nothing to evict, a client's command may not create a group (-OOM, as Redis
refuses XGROUP CREATE), while the existing groups keep working; progress a
peer sends is always kept.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import chain, islice
from typing import TYPE_CHECKING, Any

from disque.cluster import messages as m
from disque.core import errors
from disque.core.lifecycle import OK, SLICE
from disque.core.types import BLOCKED, Connection, Waiter
from disque.store.aof import GROUPSET, encode_record
from disque.store.job import EVENT, Job, State

if TYPE_CHECKING:
    from disque.core.blocking import Blocking
    from disque.core.lifecycle import Lifecycle
    from disque.core.memory import Memory
    from disque.core.outbox import Outbox

DONE = 0  # progress of an event a group acknowledged (deadlines are > 0)
CLAIM_MS = 1000  # how long a QGET waits for a remote server's answer (then nil)
CLAIM_TRIES = 3  # denied claims a QGET retries with its refreshed view
EVENT_COPIES = 3  # nodes QADD stores an event on (fewer in a smaller cluster)
COUNTER_BITS = 20  # events per ms and node before the ms part runs ahead
# Memory (tests/inprocess/test_memory_accounting.py keeps these honest), bytes per
EVENT_QUEUE_OVERHEAD = 470  # event queue (its object, dicts and list, its table entry)
EVENT_ENTRY = 100  # ... event, on top of its job's estimate (its decimal ID's int, `events` and `ids` entries)
GROUP_OVERHEAD = 430  # ... group, on top of its name (its object, dict and lists, its table entry)
PROGRESS_ENTRY = 50  # ... (event, group) progress entry (a dict entry)
TIMER_ENTRY = 125  # ... deadline in a group's timer heap (a tuple, a slot, the deadline's int; compiled 178 B an event held)
REDO_ENTRY = 8  # ... event in a group's redo heap (a slot: the int is the event's)


def event_id(job_id: bytes) -> int:
    """The decimal ID clients see: (ms << 20 | counter) << 32 | node prefix."""
    return int(job_id[10:26], 16) << 32 | int(job_id[2:10], 16)


def advanced(old: int | None, new: int) -> bool:
    """Whether progress `new` is ahead of `old` (None: fresh)."""
    return old is None or (old != DONE and (new == DONE or new > old))


class Group:
    __slots__ = ("progress", "cursor", "timers", "redo")

    def __init__(self, cursor: int) -> None:
        self.progress: dict[int, int] = {}  # event -> deadline ms, or DONE
        self.cursor = cursor  # every event held here below it has progress in this group
        self.timers: list[tuple[int, int]] = []  # (deadline, event) heap: when in-progress events turn redo
        self.redo: list[int] = []  # heap of events whose deadline passed (checked against `progress` when used:
        # an entry acknowledged, handed out again or gone since is dropped when it reaches the top)


class EventQueue:
    __slots__ = ("name", "ids", "events", "groups")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.ids: list[int] = []  # sorted; may keep IDs of gone events until compacted
        self.events: dict[int, Job] = {}
        self.groups: dict[bytes, Group] = {}


def group_size(name: bytes, group: Group) -> int:
    """What a group costs (`used_memory`)."""
    return (
        GROUP_OVERHEAD + len(name) + PROGRESS_ENTRY * len(group.progress)
        + TIMER_ENTRY * len(group.timers) + REDO_ENTRY * len(group.redo)
    )  # fmt: skip


@dataclass(slots=True, eq=False)
class _Ask:
    """A QGET (`ex_ms` set) or a QACK (`ex_ms` None) waiting for the event's server."""

    client: Connection
    queue: bytes
    group: bytes
    job_id: bytes
    deadline: int  # a QGET's: the progress it asked for
    ex_ms: int | None
    tries: int  # a QGET's denied claims left
    waiter: Waiter | None = None
    peers: list[str] | None = None  # a QGET asking other nodes (NEEDEVENT): those not asked yet

    @property
    def failed(self) -> Any:
        """The reply when the server does not answer in time."""
        return None if self.ex_ms is not None else 0


class Groups:
    def __init__(self, life: Lifecycle, out: Outbox, memory: Memory, waits: Blocking) -> None:
        self.life = life
        self.out = out
        self.memory = memory
        self.waits = waits
        self.queues: dict[bytes, EventQueue] = {}
        self.last_stamp = 0  # (ms << 20 | counter) of the last event created here
        self.asks: dict[int, _Ask] = {}  # ticket -> the QGET or QACK waiting for the event's server
        self.waiting: dict[bytes, dict[int, tuple[bytes, Waiter]]] = {}  # queue -> client id -> its QNOTIFY (group, waiter)
        self.notified: dict[int, tuple[Waiter, list[bytes]]] = {}  # client id -> its QNOTIFY waiter and queues
        self.lent: dict[tuple[int, bytes], tuple[bytes, str, int]] = {}  # (event, group) handed out here by
        # another node (NEEDEVENT), not held here -> (its job ID, that node, the deadline)
        self.tickets = 0
        self.added = self.handed = self.acked = 0  # INFO figures

    # ------------------------------------------------------------ the store's hooks

    def add_event(self, job: Job) -> None:
        """A job flagged EVENT is registered here (created, received, loaded)."""
        name = job.queue
        assert name is not None
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = EventQueue(name)
            self.memory.account(EVENT_QUEUE_OVERHEAD)
        e = event_id(job.id)
        q.events[e] = job
        self.memory.account(EVENT_ENTRY)
        ids = q.ids
        if not ids or ids[-1] < e:
            ids.append(e)
        else:
            insort(ids, e)
            for group in q.groups.values():  # an older event arrived late: fresh searches must see it
                if e < group.cursor and e not in group.progress:
                    group.cursor = e
        if job.state == State.ACTIVE:
            self.stored(job)

    def stored(self, job: Job) -> None:
        """An event is readable here (replicated, or received): wake the
        QNOTIFY waiters of its queue."""
        waiting = self.waiting.get(job.queue)  # type: ignore[arg-type]
        for client_id, (group_name, waiter) in list(waiting.items()) if waiting else ():
            self._wake(job.queue, client_id, group_name, waiter)  # type: ignore[arg-type]

    def created(self, job: Job) -> None:
        """A new event is stored here and on its replicas (NOBLOCK: on its
        way there).  In a cluster larger than its copies, the other nodes
        hear of it (NEWEVENT), so their QNOTIFY waiters wake too."""
        self.stored(job)
        cluster = self.life.membership
        if cluster.size() > EVENT_COPIES:
            others = [n for n in cluster.linked_ids() if n not in job.nodes_delivered]
            self.out.broadcast(others, m.NewEvent(job.queue))  # type: ignore[arg-type]

    def on_new_event(self, sender: str, msg: m.NewEvent) -> None:
        """An event was added on another node, which this one may not hold:
        its queue's waiters may go and QGET it (QGET asks the other nodes)."""
        for client_id, (_, waiter) in list(self.waiting.get(msg.queue, {}).items()):
            if waiter.client.waiter is waiter:
                self.waits.unblock(waiter.client, msg.queue)
                self._forget_waiter(client_id)

    def drop_event(self, job: Job) -> None:
        q = self.queues[job.queue]  # type: ignore[index]
        e = event_id(job.id)
        del q.events[e]
        dropped = sum(group.progress.pop(e, None) is not None for group in q.groups.values())
        self.memory.account(-EVENT_ENTRY - PROGRESS_ENTRY * dropped)
        if len(q.ids) > 2 * len(q.events) + 64:
            q.ids = [e for e in q.ids if e in q.events]
        self._maybe_forget(q)

    def _maybe_forget(self, q: EventQueue) -> None:
        if not q.events:
            del self.queues[q.name]
            self._drop_groups(q)
            self.memory.account(-EVENT_QUEUE_OVERHEAD)

    def _drop_groups(self, q: EventQueue) -> None:
        self.memory.account(-sum(group_size(name, group) for name, group in q.groups.items()))
        q.groups.clear()

    def _group(self, q: EventQueue, name: bytes) -> Group:
        """The queue's group `name`, made on first use."""
        group = q.groups.get(name)
        if group is None:
            group = q.groups[name] = Group(q.ids[0] if q.ids else 0)
            self.memory.account(GROUP_OVERHEAD + len(name))
        return group

    def _admit(self, names: list[bytes], group_name: bytes) -> None:
        """A client's command that would make a new group: -OOM at the
        refusal level (over 95 % of maxmemory with nothing to evict)."""
        for name in names:
            q = self.queues.get(name)
            if q is not None and group_name not in q.groups and not self.memory.evict():
                raise errors.oom()

    def size(self) -> int:
        """What this module keeps, recomputed (it is counted as it changes)."""
        return sum(
            EVENT_QUEUE_OVERHEAD + EVENT_ENTRY * len(q.events)
            + sum(group_size(name, group) for name, group in q.groups.items())
            for q in self.queues.values()
        )  # fmt: skip

    # ------------------------------------------------------------ QADD

    def _stamp(self) -> int:
        """The (ms << 20 | counter) part of the next event ID made here."""
        self.last_stamp = max(self.life.now << COUNTER_BITS, self.last_stamp + 1)
        return self.last_stamp

    def expired_id(self) -> bytes:
        """The ID of an event created already expired (QADD's expiry <= 0):
        nothing is stored, nobody will ever see it."""
        return b"%d" % (self._stamp() << 32 | int(self.life.membership.my_id[:8], 16))

    def new_event(self, queue: bytes, body: bytes, ttl: int, repl: int) -> Job:
        """The job record of a new event (`ttl` in whole seconds, > 0)."""
        life = self.life
        now = life.now
        minutes = min(ttl // 60, 65535) & ~1  # the ID's TTL field, even: never requeued
        job_id = b"DI%s%016x%016x%04xSQ" % (life.membership.my_id[:8].encode(), self._stamp(), life.rng.getrandbits(64), minutes)
        self.added += 1
        # positional: state, flags, repl, etime, ctime, delay, retry, nacks, deliv, nodes_delivered
        return Job(job_id, queue, body, State.ACTIVE, EVENT, repl, now // 1000 + ttl, life.new_ctime(), 0, 0, 0, 0, life.membership.solo)

    @staticmethod
    def reply(job: Job) -> bytes:
        """QADD's answer once the event is stored: its ID, a bulk string."""
        return b"%d" % event_id(job.id)

    # ------------------------------------------------------------ QGET

    def _server(self, job: Job) -> str | None:
        """The node that hands this event out: its creator, or while the
        creator is flagged FAIL, the lowest holder not flagged."""
        cluster = self.life.membership
        me, nodes = cluster.my_id, cluster.nodes

        def alive(node_id: str) -> bool:
            peer = nodes.get(node_id)
            return node_id == me or (peer is not None and not peer.flags & m.FAIL)

        prefix = job.id[2:10].decode()
        holders = job.nodes_delivered
        origin = next((n for n in holders if n.startswith(prefix)), None)
        if origin is not None and alive(origin):
            return origin
        return min((n for n in holders if alive(n)), default=None)

    def _redo(self, q: EventQueue, group: Group, now: int) -> Iterator[int]:
        """The group's redo events, lowest first (deadlines passed by now
        moved in); the first costs O(log n), the others a sort, needed only
        when the first one's server is out of reach."""
        timers, progress, redo = group.timers, group.progress, group.redo
        before = TIMER_ENTRY * len(timers) + REDO_ENTRY * len(redo)
        while timers and timers[0][0] < now:
            deadline, e = heapq.heappop(timers)
            if progress.get(e) == deadline:
                heapq.heappush(redo, e)

        def valid(e: int) -> bool:
            return 0 < progress.get(e, 0) < now and e in q.events

        while redo and not valid(redo[0]):
            heapq.heappop(redo)
        self.memory.account(TIMER_ENTRY * len(timers) + REDO_ENTRY * len(redo) - before)
        if redo:
            yield redo[0]
            yield from (e for e in sorted(set(redo[1:])) if e != redo[0] and valid(e))

    @staticmethod
    def _fresh(q: EventQueue, group: Group) -> Iterator[int]:
        """The group's fresh events held here, lowest first; the cursor
        moves past the leading events that have progress or are gone."""
        ids, events, progress = q.ids, q.events, group.progress
        moving = True
        for i in range(bisect_left(ids, group.cursor), len(ids)):
            e = ids[i]
            job = events.get(e)
            if job is None or e in progress:
                if moving:
                    group.cursor = e + 1
                continue
            moving = False
            if job.state == State.ACTIVE:
                yield e

    def _pick(self, q: EventQueue, group: Group, mine: bool = False) -> tuple[int, Job, str] | None:
        """What QGET would hand `group` now: (event, job, its server); with
        `mine`, among the events this node serves only."""
        now = self.life.now
        cluster = self.life.membership
        me = cluster.my_id
        for e in chain(self._redo(q, group, now), self._fresh(q, group)):
            job = q.events[e]
            if job.etime * 1000 <= now:
                continue
            server = self._server(job)
            if server == me or (server is not None and not mine and cluster.has_link(server)):
                return e, job, server  # type: ignore[return-value]
        return None

    def qget(self, client: Connection, name: bytes, group_name: bytes, ex_ms: int) -> Any:
        """QGET: [id, body] of the next event for the group, None (nil) when
        there is none, or BLOCKED while the event's server is asked."""
        self._admit([name], group_name)
        return self._get(client, name, group_name, ex_ms, CLAIM_TRIES)

    def _get(self, client: Connection, name: bytes, group_name: bytes, ex_ms: int, tries: int) -> Any:
        q = self.queues.get(name)
        picked = self._pick(q, self._group(q, group_name)) if q is not None else None
        if q is None or picked is None:
            return self._need(client, name, group_name, ex_ms, None)
        e, job, server = picked
        life = self.life
        deadline = life.now + ex_ms if ex_ms else DONE
        if server == life.membership.my_id:
            self._set(q, group_name, job, e, deadline)
            self.handed += 1
            return [b"%d" % e, job.body]
        ask = _Ask(client, name, group_name, job.id, deadline, ex_ms, tries)
        return self._ask(server, ask, m.Claim(job.id, group_name, deadline, 0))

    def _need(self, client: Connection, name: bytes, group_name: bytes, ex_ms: int, peers: list[str] | None) -> Any:
        """Nothing here for the group: ask the other nodes one at a time (in
        a random order) for an event they serve; nil once none has one.  In
        a cluster of EVENT_COPIES nodes or fewer every node holds every event:
        nobody to ask."""
        life = self.life
        if peers is None:
            if life.membership.size() <= EVENT_COPIES:
                return None
            peers = [n.id for n in life.membership.reachable() if n.link]
            life.rng.shuffle(peers)
        if not peers:
            return None
        deadline = life.now + ex_ms if ex_ms else DONE
        ask = _Ask(client, name, group_name, b"", deadline, ex_ms, 0, peers=peers)
        return self._ask(peers.pop(), ask, m.NeedEvent(name, group_name, deadline, 0))

    def on_need_event(self, sender: str, msg: m.NeedEvent) -> None:
        """Another node found nothing for the group: hand it an event this node serves."""
        life = self.life
        q = self.queues.get(msg.queue)
        picked = self._pick(q, self._group(q, msg.group), mine=True) if q is not None else None
        if picked is None:
            self.out.send(sender, m.Claimed(msg.ticket))
            return
        e, job, _ = picked
        self._set(q, msg.group, job, e, msg.deadline and max(msg.deadline, life.now + 1))  # type: ignore[arg-type]
        self.handed += 1
        self.out.send(sender, m.YourEvent(msg.ticket, job.id, job.body))  # type: ignore[arg-type]

    def on_your_event(self, sender: str, msg: m.YourEvent) -> None:
        ask = self.asks.pop(msg.ticket, None)
        if ask is None or ask.client.waiter is not ask.waiter:
            return  # answered too late, or the client went away: the event turns redo at its deadline
        self.waits.drop_waiter(ask.waiter)  # type: ignore[arg-type]
        e = event_id(msg.id)
        if ask.deadline:  # its QACK goes to the node that handed it out
            self.lent[e, ask.group] = (msg.id, sender, ask.deadline)
        self.out.reply_to(ask.client, [b"%d" % e, msg.body])

    def _ask(self, server: str, ask: _Ask, msg: m.Claim | m.GroupAck | m.NeedEvent) -> Any:
        """Send a claim or an acknowledgement to the event's server; the
        client waits for the answer at most CLAIM_MS (then nil, or 0)."""
        self.tickets += 1
        ticket = self.tickets
        self.out.send(server, replace(msg, ticket=ticket))
        ask.waiter = self.waits.block(ask.client, (), False, CLAIM_MS)
        ask.waiter.take = lambda _: self._unanswered(ticket)
        self.asks[ticket] = ask
        return BLOCKED

    def _unanswered(self, ticket: int) -> Any:
        """The server did not answer in time: nil, or 0 (a claim it granted
        meanwhile turns redo at its deadline)."""
        return self.asks.pop(ticket).failed

    def on_claim(self, sender: str, msg: m.Claim) -> None:
        """A holder asks this node, the event's server, for it.  Taken
        already (the asker's view is behind), the next event this node
        serves for the group is granted instead, if any."""
        life = self.life
        found = self._event(msg.id)
        if found is None:
            self.out.send(sender, m.Claimed(msg.ticket, False, msg.id not in life.jobs))
            return
        q, job, e = found
        group = self._group(q, msg.group)
        old = group.progress.get(e)
        if old is not None and not 0 < old < life.now:
            self.out.send(sender, m.GroupSet(msg.id, msg.group, old))  # fixes its view: comes first on the same link
            picked = self._pick(q, group, mine=True)
            if picked is None or sender not in picked[1].nodes_delivered:
                self.out.send(sender, m.Claimed(msg.ticket))
                return
            e, job, _ = picked
        # a clock behind this one must not hand out a deadline already passed here
        self._set(q, msg.group, job, e, msg.deadline and max(msg.deadline, life.now + 1))
        self.handed += 1
        self.out.send(sender, m.Claimed(msg.ticket, True, id=job.id))

    def on_group_ack(self, sender: str, msg: m.GroupAck) -> None:
        """A holder passes on a QACK to this node, the event's server."""
        found = self._event(msg.id)
        granted = False
        if found is not None:
            q, job, e = found
            granted = self._ack(q, msg.group, job, e)
            if not granted and e in self._group(q, msg.group).progress:
                self.out.send(sender, m.GroupSet(msg.id, msg.group, q.groups[msg.group].progress[e]))
        self.out.send(sender, m.Claimed(msg.ticket, granted, msg.id not in self.life.jobs))

    def _event(self, job_id: bytes) -> tuple[EventQueue, Job, int] | None:
        """A live event held here: its queue, job and ID."""
        job = self.life.jobs.get(job_id)
        if job is None or not job.flags & EVENT or job.state != State.ACTIVE or job.etime * 1000 <= self.life.now:
            return None
        return self.queues[job.queue], job, event_id(job_id)  # type: ignore[index]

    def on_claimed(self, sender: str, msg: m.Claimed) -> None:
        ask = self.asks.pop(msg.ticket, None)
        if ask is None:
            return  # answered too late: the client was told nil (or 0)
        client = ask.client
        if client.waiter is not ask.waiter:  # the client went away meanwhile
            return
        self.waits.drop_waiter(ask.waiter)  # type: ignore[arg-type]
        if ask.peers is not None:  # a NEEDEVENT the peer had nothing for: the next one
            reply = self._need(client, ask.queue, ask.group, ask.ex_ms, ask.peers)  # type: ignore[arg-type]
            if reply is not BLOCKED:
                self.out.reply_to(client, reply)
            return
        found = self._event(msg.id or ask.job_id)  # granted: perhaps another event than the one asked for
        if msg.unknown and found is not None:  # it lost its copy (a restart without the AOF): not a holder any more
            found[1].nodes_delivered = tuple(n for n in found[1].nodes_delivered if n != sender)
        if msg.granted and found is not None:  # told to the holders here too: the server may die before its GROUPSETs land
            self._set(found[0], ask.group, found[1], found[2], DONE if ask.ex_ms is None else ask.deadline)
        if ask.ex_ms is None:  # a QACK: the server's word, or asked again of the next server
            reply = self.qack(client, ask.queue, ask.group, found[2]) if msg.unknown and found is not None else int(msg.granted)
            if reply is not BLOCKED:
                self.out.reply_to(client, reply)
        elif msg.granted and found is not None:
            self.out.reply_to(client, [b"%d" % found[2], found[1].body])
        else:
            tries = ask.tries if msg.unknown else ask.tries - 1  # a holder less is progress
            reply = self._get(client, ask.queue, ask.group, ask.ex_ms, tries) if tries else None
            if reply is not BLOCKED:
                self.out.reply_to(client, reply)

    def peek(self, name: bytes, group_name: bytes, newest: bool) -> Any:
        """[id, body] of the event the group would get next (`newest`: of
        the newest live event), taking nothing; None when there is none."""
        q = self.queues.get(name)
        if q is None:
            return None
        self._admit([name], group_name)
        if newest:
            live = (e for e in reversed(q.ids) if (job := q.events.get(e)) is not None and job.state == State.ACTIVE and job.etime * 1000 > self.life.now)
            e = next(live, None)
        else:
            picked = self._pick(q, self._group(q, group_name))
            e = picked[0] if picked is not None else None
        return None if e is None else [b"%d" % e, q.events[e].body]

    # ------------------------------------------------------------ progress

    def _apply(self, q: EventQueue, group_name: bytes, job: Job, e: int, deadline: int, log: bool = True) -> bool:
        """Record progress if it is ahead of what is known (in the AOF too, with `log`)."""
        group = self._group(q, group_name)
        progress = group.progress
        if not advanced(old := progress.get(e), deadline):
            return False
        progress[e] = deadline
        grown = 0 if old is not None else PROGRESS_ENTRY
        if deadline != DONE:
            heapq.heappush(group.timers, (deadline, e))
            grown += TIMER_ENTRY
        self.memory.account(grown)
        if log:
            self.out.aof_record(job.queue, encode_record(GROUPSET, job.id, group_name, b"%d" % deadline))
        return True

    def _set(self, q: EventQueue, group_name: bytes, job: Job, e: int, deadline: int) -> None:
        """Progress decided here (always ahead): recorded and told to the other holders."""
        self._apply(q, group_name, job, e, deadline)
        self.out.broadcast(job.nodes_delivered, m.GroupSet(job.id, group_name, deadline))

    def progress_for(self, node_id: str) -> list[m.GroupSet]:
        """Every group's progress on the events `node_id` holds, for it when
        its link comes up: what it missed while it was out of reach."""
        return [
            m.GroupSet(q.events[e].id, group_name, deadline)
            for q in self.queues.values() for group_name, group in q.groups.items()
            for e, deadline in group.progress.items() if node_id in q.events[e].nodes_delivered
        ]  # fmt: skip

    def on_group_set(self, sender: str, msg: m.GroupSet) -> None:
        job = self.life.jobs.get(msg.id)
        if job is not None and job.flags & EVENT:
            self._apply(self.queues[job.queue], msg.group, job, event_id(job.id), msg.deadline)  # type: ignore[index]

    def replay(self, job_id: bytes, group_name: bytes, deadline: int) -> None:
        """A GROUPSET record of the AOF (an event not loaded is gone)."""
        job = self.life.jobs.get(job_id)
        if job is not None and job.flags & EVENT:
            self._apply(self.queues[job.queue], group_name, job, event_id(job_id), deadline, log=False)  # type: ignore[index]

    def snapshot_records(self) -> list[bytes]:
        """Every group's progress as GROUPSET records (an AOF rewrite)."""
        out = []
        for q in self.queues.values():
            if not self.life.config.queue_config.settings(q.name).journal:
                continue
            for group_name, group in q.groups.items():
                for e, deadline in group.progress.items():  # progress leaves with its event (`drop_event`)
                    out.append(encode_record(GROUPSET, q.events[e].id, group_name, b"%d" % deadline))
        return out

    # ------------------------------------------------------------ QACK, QFLUSH

    def qack(self, client: Connection, name: bytes, group_name: bytes, e: int) -> Any:
        """1 when the group held the event and its deadline has not passed,
        as the event's server sees it (BLOCKED while it is asked; 0 when it
        does not answer in time).  A server out of reach leaves this node
        to decide, as a holder, and tell the others."""
        life = self.life
        q = self.queues.get(name)
        job = q.events.get(e) if q is not None else None
        if q is None or job is None:  # perhaps handed out here by the node that serves it (NEEDEVENT)
            lent = self.lent.get((e, group_name))
            if lent is None or lent[2] < life.now or not life.membership.has_link(lent[1]):
                return 0
            return self._ask(lent[1], _Ask(client, name, group_name, lent[0], 0, None, 0), m.GroupAck(lent[0], group_name, 0))
        if job.etime * 1000 <= life.now:
            return 0
        server = self._server(job)
        if server is None or server == life.membership.my_id or not life.membership.has_link(server):
            return int(self._ack(q, group_name, job, e))
        deadline = q.groups[group_name].progress.get(e) if group_name in q.groups else None
        if not deadline or deadline < life.now:  # this view cannot be ahead of the server's
            return 0
        return self._ask(server, _Ask(client, name, group_name, job.id, 0, None, 0), m.GroupAck(job.id, group_name, 0))

    def _ack(self, q: EventQueue, group_name: bytes, job: Job, e: int) -> bool:
        group = q.groups.get(group_name)
        deadline = group.progress.get(e) if group is not None else None
        if not deadline or deadline < self.life.now:
            return False
        self._set(q, group_name, job, e, DONE)
        self.acked += 1
        return True

    def qflush(self, name: bytes) -> Generator[None, None, Any]:
        """Every event of the queue and all progress go, cluster-wide; here
        SLICE events at a time (Blocking.in_slices: other clients run in
        between)."""
        self.out.broadcast(self.life.membership.linked_ids(), m.GroupFlush(name))
        return self._flush(name)

    def flush(self, name: bytes) -> None:
        """GROUPFLUSH from a peer: the whole queue at once."""
        deque(self._flush(name), maxlen=0)  # (every slice)

    def _flush(self, name: bytes) -> Generator[None, None, Any]:
        q = self.queues.get(name)
        if q is None:
            return OK
        self._drop_groups(q)
        while True:
            for job in list(islice(q.events.values(), SLICE)):  # the last one forgets the queue (`drop_event`)
                self.life.delete_job(job)
            if not q.events:
                return OK
            yield

    def on_group_flush(self, sender: str, msg: m.GroupFlush) -> None:
        self.flush(msg.queue)

    # ------------------------------------------------------------ QNOTIFY

    def qnotify(self, client: Connection, group_name: bytes, timeout_ms: int, names: list[bytes]) -> Any:
        """The name of a queue with an event QGET would hand the group now;
        else wait for one up to `timeout_ms` (0: no wait): None at the end.
        A waiter costs an entry per queue it names, in `waiting` only: the
        cron looks at those whose queues hold events, and at each waiting
        client once, however long its list."""
        names = list(dict.fromkeys(names))
        self._admit(names, group_name)
        for name in names:
            q = self.queues.get(name)
            if q is not None and self._pick(q, self._group(q, group_name)) is not None:
                return name
        if not timeout_ms:
            return None
        if client.id in self.notified:  # its last QNOTIFY ended since the last cron
            self._forget_waiter(client.id)
        waiter = self.waits.block(client, (), False, timeout_ms)
        waiter.take = lambda _: None
        for name in names:
            self.waiting.setdefault(name, {})[client.id] = (group_name, waiter)
        self.notified[client.id] = (waiter, names)
        return BLOCKED

    def _wake(self, name: bytes, client_id: int, group_name: bytes, waiter: Waiter) -> None:
        """Answer a QNOTIFY waiter with the queue's name if an event is there for it."""
        q = self.queues.get(name)
        if waiter.client.waiter is waiter and q is not None and self._pick(q, self._group(q, group_name)) is not None:
            self.waits.unblock(waiter.client, name)
            self._forget_waiter(client_id)

    def _forget_waiter(self, client_id: int) -> None:
        _, names = self.notified.pop(client_id)
        for name in names:
            entries = self.waiting[name]
            del entries[client_id]
            if not entries:
                del self.waiting[name]

    def cron(self) -> None:
        """Redo by the clock wakes QNOTIFY waiters; waiters and claims of
        clients that went away are dropped."""
        for ticket, ask in list(self.asks.items()):
            if ask.client.waiter is not ask.waiter:
                del self.asks[ticket]
        if self.lent:
            now = self.life.now
            self.lent = {key: lent for key, lent in self.lent.items() if lent[2] >= now}
        for client_id, (waiter, _) in list(self.notified.items()):
            if waiter.client.waiter is not waiter:  # answered by a timeout, or gone
                self._forget_waiter(client_id)
        small: Mapping[bytes, object] = self.waiting
        big: Mapping[bytes, object] = self.queues
        if len(big) < len(small):
            small, big = big, small
        for name in [name for name in small if name in big]:
            for client_id, (group_name, waiter) in list(self.waiting.get(name, {}).items()):
                self._wake(name, client_id, group_name, waiter)

    # ------------------------------------------------------------ QSTATUS, QINFO

    def status(self, names: list[bytes], group_names: list[bytes] | None) -> list[tuple[bytes, int, list[Any]]]:
        """Per queue (all known, sorted, when `names` is empty): its live
        events, and per group (all known, sorted, when None) bananaq's six
        figures as (name, value) pairs."""
        now = self.life.now
        out = []
        for name in names or sorted(self.queues):
            q = self.queues.get(name)
            live = {e for e, job in q.events.items() if job.state == State.ACTIVE and job.etime * 1000 > now} if q else set()
            groups = []
            for group_name in sorted(q.groups) if group_names is None and q else group_names or ():
                group = q.groups.get(group_name) if q else None
                inprogress = redo = done = 0
                for e, deadline in group.progress.items() if group else ():
                    if e in live:
                        if deadline == DONE:
                            done += 1
                        elif deadline >= now:
                            inprogress += 1
                        else:
                            redo += 1
                consumers = sum(1 for g, w in self.waiting.get(name, {}).values() if g == group_name and w.client.waiter is w)
                groups.append((group_name, [
                    (b"total", len(live)), (b"inprogress", inprogress), (b"redo", redo), (b"done", done),
                    (b"available", len(live) - inprogress - redo - done), (b"consumers", consumers),
                ]))  # fmt: skip
            out.append((name, len(live), groups))
        return out

    def info_fields(self) -> list[tuple[str, int]]:
        return [
            ("event_queues", len(self.queues)),
            ("events", sum(len(q.events) for q in self.queues.values())),
            ("consumer_groups", sum(len(q.groups) for q in self.queues.values())),
            ("group_progress_entries", sum(len(g.progress) for q in self.queues.values() for g in q.groups.values())),
            ("events_added", self.added), ("events_handed_out", self.handed), ("events_acked", self.acked),
        ]  # fmt: skip
