"""Keyed jobs' deduplication with no single store (docs/keys.md).

Theory of operation: ADDJOB ... KEY k DEDUP <ms> | DEDUP ACTIVE asks for
(queue, k) to be held by the new job: for <ms>, or (ACTIVE) until the job
is acknowledged, at most its TTL.  A second ADDJOB of the key while it is
held answers the holder's ID and adds nothing.  Who decides is the home of
(queue, k) (core/homes.py: rendezvous hashing over the nodes this node sees
up, linked or not, so that a link dropped and made again does not move a
home for a moment), so whichever node receives each ADDJOB, one node
decides, in the order the claims reach it.  A claim waits for a link to
the home that reads KEYCLAIM (its PONG said FEATURE_KEYS).

The job's ID is drawn first (`claim`).  At the home the decision is local
(`_claim`); elsewhere KEYCLAIM goes to the home and the producer waits, as
for replication (BLOCKED, a waiter), for KEYCLAIMED: the holder's ID,
which is a duplicate's answer unless it is the ID drawn.  A granted claim
then adds the job as ADDJOB does (`Lifecycle.add_job`, with the ID
drawn); an ADDJOB that fails then, or whose replication gives up, or whose
producer went away before the answer (`abandoned`), sends KEYDONE (`done`,
aborted) and the hold goes: a producer retrying does not get the ID of a
job never made.  (An answer that comes twice, or after the job was added
without the hold, names a job that may exist: it ends nothing.)  The ACK
of a keyed job (ACKJOB, FASTACK here) sends KEYDONE too, which ends a
DEDUP ACTIVE hold.

DEBOUNCE <ms> is a claim too, with no second mechanism: its job is added
with a DELAY (queued <ms> after its ADDJOB on the node that makes it,
core/lifecycle.py; its copies wait whole seconds more) and its hold is
the key's *pending* job until it is due.  A DEBOUNCE claim that finds a
pending job of the key (`_claim`) is granted all the same and supersedes
it: the pending job is deleted on every node that may hold it, as FASTACK
deletes (`_supersede`: DELJOB, not acknowledged; a producer still waiting
for its copies gets its ID), so the key's last body runs, <ms> after its
last ADDJOB.  A pending job already due has left the hold: the next claim
starts a new burst.  The home remembers the jobs it superseded (in
`collected`, as collected jobs are), so a copy of an old claim the bus
delivers late supersedes nothing; a node that kept the record of a
pending job and hears (KEYSET) that it was superseded while it could not
hear of it (down, cut off) drops its own copy (`_drop_superseded`).  A
DEBOUNCE claim waits for a home that reads it (FEATURE_DEBOUNCE); a DEDUP
claim and a DEBOUNCE one do not supersede each other (the one holding the
key answers).

A home that does not answer within ASK_MS (gone, cut off, not linked, of
an older version, or the claim lost) does not hold the producer longer:
the job is added without the hold (`_unanswered`): at least once, never
lost; a duplicate is possible and counted (`dedup_unconfirmed`).

Every hold is a record (store/keyed.py), newest wins: the home writes it to
the AOF (KEYHOLD) and sends it (KEYSET) to its standbys, the next two
nodes in the key's order, which take the home's place when it goes away;
a node that links up is sent every live hold.  Holds are kept until they
end (`expiries`: the holds ending in each 100 ms tick, and a heap of those
ticks), counted in the node's memory.

Called by NodeCore: `cron` (100 ms), the bus (`on_key_claim`,
`on_key_claimed`, `on_key_set`, `on_key_done`), `sync_messages`,
`replay`, `snapshot_records`; by the ADDJOB command (`claim`); by acks and
replication through `Lifecycle.keys` (`done`).
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from disque.cluster import messages as m
from disque.core import errors
from disque.core.homes import home as home_of, ranked
from disque.core.lifecycle import DEFAULT_TTL, check_job_options, default_retry
from disque.core.types import BLOCKED, Connection, Status, Waiter
from disque.store import keyed
from disque.store.aof import KEYHOLD, encode_record
from disque.store.ids import new_job_id
from disque.store.job import DELIVERED, State
from disque.store.job_options import DEDUP_ACTIVE, debounce_problem
from disque.store.keyed import KeyHold
from disque.store.records import decode_alone

if TYPE_CHECKING:
    from disque.core.blocking import Blocking
    from disque.core.lifecycle import Lifecycle
    from disque.store.job import Job
    from disque.store.job_options import JobOptions

ASK_MS = 1000  # how long a producer waits for the key's home before its job is added without the hold
FORGET_MS = 10 * ASK_MS  # how long the claim of a producer gone is remembered, to end its hold if granted late
STANDBYS = 2  # the nodes after the home in a key's order that keep its holds
HOLD_OVERHEAD = 300  # bytes per hold kept (record, dict and expiry entries) on top of its strings
TICK_MS = 100  # the holds ending within one tick share an entry of `expiries`, dropped once it is past


@dataclass(slots=True)
class _Ask:
    """An ADDJOB waiting for the key's home."""

    client: Connection
    waiter: Waiter
    queue: bytes
    body: bytes
    opts: JobOptions
    deadline: int
    hold: int  # ms (KEYCLAIM's)
    active: bool
    debounce: bool
    sent: bool = False  # KEYCLAIM went to the home (else: it waits for a link to it)


class Keys:
    def __init__(self, life: Lifecycle, waits: Blocking) -> None:
        self.life = life
        self.out = life.out
        self.waits = waits
        self.holds: dict[bytes, KeyHold] = {}  # KeyHold.name -> the newest record known
        self.expiries: dict[int, list[bytes]] = {}  # tick (until // TICK_MS) -> the holds ending in it (stale ones skipped)
        self.ticks: list[int] = []  # the ticks of `expiries`: a heap
        self.asks: dict[int, _Ask] = {}  # ticket -> the ADDJOB waiting for the home's answer
        self.abandoned: dict[int, tuple[bytes, int]] = {}  # ticket -> (the job never made, when to forget it)
        self.tickets = 0
        self.hits = self.granted = self.unconfirmed = self.released = self.dropped = self.superseded = 0

    # ------------------------------------------------------------ ADDJOB

    def claim(self, client: Connection, queue: bytes, body: bytes, opts: JobOptions) -> Any:
        """ADDJOB ... KEY DEDUP|DEBOUNCE: the holder's ID (a duplicate), or the new
        job's reply, or BLOCKED while the key's home is asked."""
        life = self.life
        ttl = DEFAULT_TTL if opts.ttl is None else opts.ttl
        retry = default_retry(ttl) if opts.retry is None else opts.retry
        job_id = new_job_id(life.membership.my_id, life.rng, ttl, retry)
        opts = opts.with_job_id(job_id)
        active = opts.dedup == DEDUP_ACTIVE
        debounce = opts.debounce > 0
        if debounce:  # refused before it supersedes anything
            check_job_options(1, retry, opts.delay, ttl)  # type: ignore[arg-type]
        hold = ttl * 1000 if active else opts.dedup or opts.debounce
        if self._home(queue, opts.key) == life.membership.my_id:
            return self._answer(client, queue, body, opts, self._claim(queue, opts.key, job_id, hold, active, debounce))
        self.tickets += 1
        waiter = self.waits.block(client, (), False, 0)  # its deadline is the ask's (`cron`)
        ask = self.asks[self.tickets] = _Ask(client, waiter, queue, body, opts, life.now + ASK_MS, hold, active, debounce)
        self._send(self.tickets, ask)
        return BLOCKED

    def _home(self, queue: bytes, key: bytes) -> str:
        """The home of (queue, key) (core/homes.py) among the nodes this one
        sees up, linked or not: a link dropped and made again (a PING
        answered late) must not move a key's home for a moment."""
        membership = self.life.membership
        if len(membership.nodes) == 1:  # a node alone: no name to make, no list
            return membership.my_id
        return home_of(queue + b"\0" + key, membership.up_ids())

    def _send(self, ticket: int, ask: _Ask) -> None:
        """KEYCLAIM to the key's home once there is a link to it that reads
        it (or decide here, if this node became the home meanwhile)."""
        life = self.life
        home = self._home(ask.queue, ask.opts.key)
        if home == life.membership.my_id:
            del self.asks[ticket]
            self.waits.drop_waiter(ask.waiter)
            holder = self._claim(ask.queue, ask.opts.key, ask.opts.job_id, ask.hold, ask.active, ask.debounce)  # type: ignore[arg-type]
            self._reply(ask, lambda: self._answer(ask.client, ask.queue, ask.body, ask.opts, holder))
        elif home in life.membership.linked_ids(features=m.FEATURE_KEYS | (m.FEATURE_DEBOUNCE if ask.debounce else 0)):
            ask.sent = True
            msg = m.KeyClaim(ticket, ask.queue, ask.opts.key, ask.opts.job_id, ask.hold, ask.active, ask.debounce)  # type: ignore[arg-type]
            self.out.send(home, msg)

    def _answer(self, client: Connection, queue: bytes, body: bytes, opts: JobOptions, holder: bytes) -> Any:
        """The ADDJOB's reply once the home said who holds the key."""
        if holder != opts.job_id:
            self.hits += 1
            return Status(holder)
        self.granted += 1
        return self._add(client, queue, body, opts)

    def _add(self, client: Connection, queue: bytes, body: bytes, opts: JobOptions) -> Any:
        try:
            return self.life.add_job(client, queue, body, opts)
        except errors.DisqueError:
            self._send_done(queue, opts.key, opts.job_id, True)  # type: ignore[arg-type]
            raise

    def on_key_claimed(self, sender: str, msg: m.KeyClaimed) -> None:
        ask = self.asks.pop(msg.ticket, None)
        if ask is not None and ask.client.waiter is not ask.waiter:  # the client went away
            self.abandoned[msg.ticket] = (ask.opts.job_id, 0)  # type: ignore[assignment]
            ask = None
        if ask is None:  # too late (its job made without the hold), a copy of an answer, or abandoned
            gone = self.abandoned.pop(msg.ticket, None)
            if gone is not None and gone[0] == msg.job:  # granted a job never made: not held
                self._send_done(msg.queue, msg.key, msg.job, True)
            return
        self.waits.drop_waiter(ask.waiter)
        self._reply(ask, lambda: self._answer(ask.client, ask.queue, ask.body, ask.opts, msg.job))

    def _reply(self, ask: _Ask, make: Any) -> None:
        try:
            reply = make()
        except errors.DisqueError as e:
            reply = e
        if reply is not BLOCKED:  # (else replication answers it)
            self.out.reply_to(ask.client, reply)

    def _unanswered(self, ask: _Ask) -> None:
        """The home did not answer in time: the job is added without the hold."""
        self.unconfirmed += 1
        self.waits.drop_waiter(ask.waiter)
        self._reply(ask, lambda: self.life.add_job(ask.client, ask.queue, ask.body, ask.opts))

    def cron(self) -> None:
        """Every 100 ms: unanswered asks, asks of clients gone, holds ended."""
        now = self.life.now
        for ticket, ask in list(self.asks.items()):
            if ask.client.waiter is not ask.waiter:
                del self.asks[ticket]
                self.abandoned[ticket] = (ask.opts.job_id, now + FORGET_MS)  # type: ignore[assignment]
            elif now >= ask.deadline:
                del self.asks[ticket]
                self._unanswered(ask)
            elif not ask.sent:
                self._send(ticket, ask)
        for ticket in [t for t, (_, until) in self.abandoned.items() if until <= now]:
            del self.abandoned[ticket]
        ticks = self.ticks
        while ticks and ticks[0] < now // TICK_MS:  # a tick wholly past
            for name in self.expiries.pop(heappop(ticks)):
                h = self.holds.get(name)
                if h is not None and h.until <= now:
                    del self.holds[name]
                    self.life.memory.account(-_size(h))

    # ------------------------------------------------------------ at the home

    def _claim(self, queue: bytes, key: bytes, job: bytes, hold: int, active: bool, debounce: bool) -> bytes:
        """Decide a claim: the job that holds (queue, key) now (DEBOUNCE's
        `job`, superseding the key's pending one)."""
        now = self.life.now
        if debounce and job in self.life.collected:  # a copy of the claim of a job superseded since: it changes nothing
            return job
        known = self.holds.get(queue + b"\0" + key)
        if known is not None and known.holds(now):
            if not (debounce and known.debounce) or known.job == job:  # (the same claim twice: the bus may copy one)
                return known.job
            self._supersede(known.job)
        self._change(queue, key, known, job, now + hold, active, debounce)
        return job

    def _supersede(self, job_id: bytes) -> None:
        """Delete a pending DEBOUNCE job, a later one of its key granted: on
        its holders if it is known here, else on every node linked (as
        FASTACK does), not acknowledged; its producer, if it still waits for
        the copies, gets its ID (core/acks.py does the same on a DELJOB)."""
        life = self.life
        self.superseded += 1
        job = life.jobs.get(job_id)
        life.collected.remember(job_id, life.now, False)  # a copy still on its way here is not kept, nor a claim's copy granted
        if job is None:
            self.out.broadcast(life.membership.linked_ids(), m.DelJob(job_id, acked=False))
        else:
            self.out.answer_producer(job_id, Status(job_id))
            life.delete_everywhere(job)

    def on_key_claim(self, sender: str, msg: m.KeyClaim) -> None:
        if msg.debounce and debounce_problem(True, msg.active, False) is not None:
            self.dropped += 1  # (its producer's node adds the job without the hold once ASK_MS passed)
            return
        holder = self._claim(msg.queue, msg.key, msg.job, msg.hold, msg.active, msg.debounce)
        self.out.send(sender, m.KeyClaimed(msg.ticket, msg.queue, msg.key, holder))

    def done(self, job: Job, aborted: bool) -> None:
        """Keyed `job` was acknowledged here, or (`aborted`) never made:
        its home ends the hold it may have (DEDUP ACTIVE's, or any hold of
        a job never made)."""
        self._send_done(job.queue, job.key, job.id, aborted)  # type: ignore[arg-type]

    def _send_done(self, queue: bytes, key: bytes, job: bytes, aborted: bool) -> None:
        """KEYDONE to the key's home (when it cannot be told now, its hold
        runs to its end)."""
        membership = self.life.membership
        home = self._home(queue, key)
        if home == membership.my_id:
            self._release(queue, key, job, aborted)
        elif home in membership.linked_ids(features=m.FEATURE_KEYS):
            self.out.send(home, m.KeyDone(queue, key, job, aborted))

    def on_key_done(self, sender: str, msg: m.KeyDone) -> None:
        self._release(msg.queue, msg.key, msg.job, msg.aborted)

    def _release(self, queue: bytes, key: bytes, job: bytes, aborted: bool) -> None:
        known = self.holds.get(queue + b"\0" + key)
        if known is not None and known.job == job and known.holds(self.life.now) and (known.active or aborted):
            self.released += 1
            self._change(queue, key, known, b"", known.until, False, False)  # kept as long as the hold would have been

    def _change(
        self, queue: bytes, key: bytes, known: KeyHold | None, job: bytes, until: int, active: bool, debounce: bool
    ) -> None:
        """A change made here (`job` holds the key until `until`; b"": none):
        stamped newer than the record it replaces (`known`), kept, and sent
        to the key's standbys."""
        life = self.life
        membership = life.membership
        version = life.now if known is None else max(life.now, known.version + 1)
        h = KeyHold(queue, key, version, membership.my_id, job, until, active, debounce)
        self._keep(h)
        alone = len(membership.nodes) == 1
        readers = [] if alone else membership.linked_ids(features=m.FEATURE_KEYS)  # (the others get it when they link up)
        if readers:
            me = membership.my_id
            standbys = [n for n in ranked(h.name, membership.up_ids()) if n != me][:STANDBYS]
            self.out.broadcast([n for n in standbys if n in readers], m.KeySet(keyed.encode(h)))

    def _keep(self, h: KeyHold) -> None:
        """Hold a record known to be newer, logged and counted in memory."""
        self._store(h)
        if self.out.aof.state != "off":
            self.out.aof_record(None, encode_record(KEYHOLD, keyed.encode(h)))

    def _store(self, h: KeyHold) -> None:
        name = h.name
        self.life.memory.account(_size(h) - _size(self.holds.get(name)))
        self.holds[name] = h
        tick = h.until // TICK_MS
        names = self.expiries.get(tick)
        if names is None:
            names = self.expiries[tick] = []
            heappush(self.ticks, tick)
        names.append(name)

    # ------------------------------------------------------------ standbys, links and the AOF

    def on_key_set(self, sender: str, msg: m.KeySet) -> None:
        h = self._checked(msg.record, f"from {sender}")
        if h is not None and h.newer(known := self.holds.get(h.name)):
            if known is not None and known.debounce and known.job != h.job and h.version < known.until:
                self._drop_superseded(known.job)
            self._keep(h)

    def _drop_superseded(self, job_id: bytes) -> None:
        """A pending DEBOUNCE job this node held the record of was superseded
        while it could not hear of it (it was down, or cut off): its copy
        here goes too, unless it was queued or handed out here meanwhile
        (then it was due: the homes' clocks may disagree, and a run is not
        taken back).  The other copies were the home's to delete."""
        life = self.life
        job = life.jobs.get(job_id)
        if job is not None and job.state == State.ACTIVE and not job.flags & DELIVERED:
            life.finished(job, False)
            life.delete_job(job)

    def _checked(self, record: bytes, source: str) -> KeyHold | None:
        """The record decoded; None for a bad one, dropped alone (logged and counted)."""
        h = decode_alone(keyed.decode, record, "Key", source)
        self.dropped += h is None
        return h

    def sync_messages(self) -> list[m.KeySet]:
        """Every record not ended (holds, and releases of holds not ended),
        for a node that just linked up."""
        now = self.life.now
        return [m.KeySet(keyed.encode(h)) for h in self.holds.values() if h.until > now]

    def replay(self, record: bytes) -> None:
        """A KEYHOLD record (framing and arity checked by the loader)."""
        h = self._checked(record, "in the AOF")
        if h is not None and h.newer(self.holds.get(h.name)):
            self._store(h)

    def snapshot_records(self) -> list[bytes]:
        """The records not ended, for an AOF rewrite."""
        now = self.life.now
        return [encode_record(KEYHOLD, keyed.encode(h)) for h in self.holds.values() if h.until > now]

    # ------------------------------------------------------------ reading

    def size(self) -> int:
        """What the records held cost (in the node's memory account)."""
        return sum(map(_size, self.holds.values()))

    def info_fields(self) -> list[tuple[str, int]]:
        now = self.life.now
        return [
            ("keys_held", sum(h.holds(now) for h in self.holds.values())), ("keys_waiting", len(self.asks)),
            ("dedup_hits", self.hits), ("dedup_granted", self.granted), ("dedup_unconfirmed", self.unconfirmed),
            ("dedup_released", self.released), ("debounce_superseded", self.superseded),
            ("key_records_dropped", self.dropped),
        ]  # fmt: skip


def _size(h: KeyHold | None) -> int:
    """What a hold costs in memory (0: none)."""
    return 0 if h is None else HOLD_OVERHEAD + 2 * len(h.queue) + 2 * len(h.key) + len(h.job)
