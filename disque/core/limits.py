"""Limits the cluster enforces: a queue's rate and concurrency, with no single counter (docs/limits.md).

Theory of operation: a queue's limits (store/limits.py) are cluster state
as schedules are: QCONFIG SET and DEL make a whole new record, stamped with
the time and this node; it goes to every linked node (QSET) and to the AOF
(QLIMITS), a node that links up is sent every record, tombstones included,
and of two records of a queue the newer wins.

Enforcement.  Each limited queue has a home (core/homes.py: the lowest
score among the nodes this one sees up), which owns its budget and lends
shares of it; every node hands jobs of the queue to its own consumers only
within the share it holds (`Budget`):
* concurrency: a lease of `slots` jobs out at once.  A node asks its home
  (LIMITASK: what it wants, the jobs it has out, the lease it holds) when a
  consumer waits and no slot is free, and again every RENEW_MS while it
  holds a lease or has consumers waiting; the home answers (LIMITGRANT)
  with the whole lease, at most the limit less the other nodes' live
  leases, and, when several nodes want slots, no more than a fair share
  beyond the jobs the asker has out.  A lease lasts LEASE_MS from the ask
  that got it on the asker's clock, and LEASE_MS + LEASE_SLACK from the
  answer on the home's, so the home lends a lapsed lease again only once
  its holder stopped using it.
* rate: tokens, one per job handed out.  The home fills a bucket at the
  limit's rate, holding at most a twentieth of a period's (BURST), and
  answers an ask with what it has (at most what was asked), or with when
  the next token comes (`retry`): the asker asks again then.  Tokens lapse
  TOKEN_MS after the ask that got them, so none are saved for a burst.
Per-key limits work the same way, one budget per (queue, key) with the
key's own home, created when a job of the key is wanted and forgotten once
it has nothing out, held or asked for: a queue with them serves, of its
first KEY_SCAN keys in their turns, the oldest job of the first whose key
has a share left (`Lifecycle.take`), or holds its consumers back.  A job
without a key is held back by the queue's limits only.  An `ordered` queue
is concurrency-per-key 1 served that way: one job per key out at a time,
cluster-wide, and each key's oldest queued here first (docs/keys.md).
Across nodes, an ordered key's home lets out the oldest job of the key
wherever it is queued: every node holding queued jobs of the key tells
the home its oldest (LIMITASK's `first`, within a cron of a change and
every REPORT_MS, consumers or not; a queue whose jobs did not change is
not looked at again: `_ordered_keys`, `_renew`; and at once the oldest of
those federation hands to another node: `handed`); the home holds
back a node whose oldest is younger than another's, or than a job that
just left a node unserved, or younger than SETTLE_MS while other nodes are
up (LIMITGRANT's `behind`: `_order`), for ORDER_WAIT_MS at most; a node
hands out a key's job only once the home let out that very job
(`_cleared`); and the holder of the oldest, with no consumer wanting it,
is told where consumers wait (`hand_to`): its jobs of the key go there
together (core/federation.py `hand_key`).
The home asks itself without a message.  A home grants nothing new while it
sees no majority of the nodes it knows (the other side's home may lend the
whole budget), nor in its first LEASE_MS + LEASE_SLACK after it started or
its view of the nodes up changed (leases the previous home made may still
run): then it renews at most the lease an asker says it holds.  So while
the nodes agree on who is up, the leases live at once never sum above the
limit; what a fault does is in docs/limits.md.

What a node counts as out (`Budget.out`): the jobs it handed to consumers
of a limited queue that are still active here, neither acknowledged, NACKed
nor queued again by their RETRY (WORKING keeps them out).  It is checked
lazily, when a slot is wanted, so ACK, NACK and requeue need no hook; the
end of every step (`recheck`, only while a consumer waits on a limit)
serves the waiters again once a slot or a token is there.

Called by NodeCore and core/blocking.py: `fetch` (GETJOB, in place of
the lifecycle's for a limited queue), `recheck` (end of a step), `tick` and
`next_deadline` (asks due), `cron` (renewals), `on_qset` / `on_ask` /
`on_grant` (the bus), `sync_messages` (a link comes up), `replay` (AOF
records), `snapshot_records` (an AOF rewrite); QCONFIG's handlers call
`set`, `delete`, `show`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import islice
from typing import TYPE_CHECKING, Any

from disque.cluster import messages as m
from disque.core.homes import home
from disque.core.types import Map
from disque.store import limits as records
from disque.store.aof import QLIMITS, encode_record
from disque.store.job import NACKED, State
from disque.store.limits import QueueLimits, apply_options
from disque.store.records import decode_alone

if TYPE_CHECKING:
    from collections.abc import Callable

    from disque.core.lifecycle import Lifecycle
    from disque.core.outbox import Outbox
    from disque.store.job import Job
    from disque.store.queue import Queue

LEASE_MS = 2000  # a concurrency lease lasts this long from the ask that got it
LEASE_SLACK = 500  # ... and this much longer at the home, which reissues it only then
RENEW_MS = 500  # a holder asks again this often (unused slots go back to the home)
REPORT_MS = 2000  # a node holding an ordered key's jobs, and no lease of it, tells the home its oldest this often
REPORT_TTL_MS = 2 * REPORT_MS + LEASE_SLACK  # ... and the home forgets it this long after (one report may be lost)
TOKEN_MS = 250  # tokens lapse this long after the ask that got them
ASK_TIMEOUT_MS = 200  # an ask unanswered this long is made again
ASK_GAP_MS = 100  # an answer that lends nothing more is asked again this much later
BURST = 20  # a home's bucket holds at most rate / BURST tokens (at least one)
KEY_SCAN = 64  # with per-key limits, the keys looked at for one that has room
ORDER_WAIT_MS = 5000  # an ordered key's older job elsewhere holds a node's consumers back this long at most
SETTLE_MS = 200  # an ordered key's job goes this long after its creation at the soonest: older ones elsewhere are told by then
NO_FIRST = (0, b"")  # (creation time, ID) of no job
S_ACTIVE = State.ACTIVE


@dataclass(slots=True)
class Budget:
    """This node's share of a queue's budget, and what it used of it."""

    slots: int = 0  # the concurrency lease
    slots_until: int = 0  # ... valid until (ms)
    tokens: int = 0  # rate tokens left
    tokens_until: int = 0
    out: dict[bytes, tuple[Job, int]] = field(default_factory=dict)  # job ID -> (the job, its deliveries then)
    asked: int = 0  # ms of the ask awaiting its answer (0: none)
    ask_at: int = 0  # ms the next ask is due (0: when needed)
    since: int = 0  # ms a consumer began waiting on the limit (0: none waits)
    waited: int = 0  # ms consumers waited on the limit, in all
    waits: int = 0  # ... that many times
    handed: int = 0  # jobs handed out within the limit
    first: tuple[int, bytes] = NO_FIRST  # an ordered key: its oldest job here when last asked
    cleared: bytes = b""  # ... the one the home's last answer let out (the oldest it knew of)
    wanting: bool = False  # the ask awaiting its answer is for a consumer here


@dataclass(slots=True)
class Lender:
    """A queue's budget at its home: the leases lent, the bucket of tokens."""

    leases: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (slots, until)
    wants: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (slots it wanted, until)
    units: int = 0  # the bucket, in 1/period tokens (a token is `period` units; each ms adds `rate`)
    filled: int = 0  # ms of the last fill
    used: int = 0  # ms of the last ask
    firsts: dict[str, tuple[int, bytes, int]] = field(default_factory=dict)  # an ordered key: node -> (its oldest, until)
    held_back: dict[str, int] = field(default_factory=dict)  # ... node -> since when an older job elsewhere holds it back
    moving: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # ... job ID -> (its creation time, until)
    let_out: bytes = b""  # ... the job last let out


def _handed(job: Job) -> int:
    """What changes when a job is handed out again (its deliveries)."""
    return job.nacks + job.deliv


class Limits:
    def __init__(self, life: Lifecycle, out: Outbox, now: int) -> None:
        self.life, self.out = life, out
        self.defs: dict[bytes, QueueLimits] = {}  # queue -> its record (tombstones too)
        self.budgets: dict[bytes, Budget] = {}  # limited queues -> this node's share
        self.keyed: dict[tuple[bytes, bytes], Budget] = {}  # (queue, key) -> this node's share of the key's
        self.lenders: dict[tuple[bytes, bytes], Lender] = {}  # (queue, key or b"") this node lent for as its home
        self.throttled: dict[bytes, None] = {}  # queues whose consumers wait on a limit
        self.view = tuple(life.membership.up_ids())  # the nodes up when this node last lent
        self.quiet_until = now + LEASE_MS + LEASE_SLACK  # a node that starts lends no new slots first
        self.dropped = 0  # records that broke a rule, from the bus or the AOF
        self.order_waits = 0  # as an ordered key's home: nodes held back for an older job elsewhere
        self.order_breaks = 0  # ... and let out after ORDER_WAIT_MS though an older one was still elsewhere
        self.hand_key: Callable[[bytes, bytes, str], None] = lambda queue, key, to: None  # federation's (set by NodeCore)
        self.marks: dict[bytes, tuple[int, int]] = {}  # ordered queue -> (its length, jobs queued) when its keys were looked at
        self.quiet: set[bytes] = set()  # ordered queues whose jobs did not change since (nor did their keys' oldest)

    # ------------------------------------------------------------ changes

    def set(self, queue: bytes, words: list[bytes]) -> None:
        """QCONFIG SET (OptionError, store/limits.py, for a bad option)."""
        known = self.defs.get(queue) or QueueLimits(queue, 0, "", deleted=True)
        limits = apply_options(known, words)
        if limits != known:
            self._change(limits)

    def delete(self, queue: bytes) -> int:
        known = self.defs.get(queue)
        if known is None or known.deleted:
            return 0
        self._change(QueueLimits(queue, 0, "", deleted=True))
        return 1

    def _change(self, limits: QueueLimits) -> None:
        """A change made here, stamped newer than the record in force, kept and told."""
        known = self.defs.get(limits.queue)
        now = self.life.now
        limits = replace(limits, version=now if known is None else max(now, known.version + 1), origin=self.life.membership.my_id)
        self._keep(limits)
        self.out.broadcast(self.life.membership.linked_ids(features=m.FEATURE_LIMITS), m.QSet(records.encode(limits)))

    def _keep(self, limits: QueueLimits) -> None:
        self._store(limits)
        if self.out.aof.state != "off":
            self.out.aof_record(None, encode_record(QLIMITS, records.encode(limits)))

    def _store(self, limits: QueueLimits) -> None:
        name = limits.queue
        self.defs[name] = limits
        if not limits.keyed():  # the keys' shares go, and what they lent
            for at in [at for at in (*self.keyed, *self.lenders) if at[0] == name and at[1]]:
                self.keyed.pop(at, None)
                self.lenders.pop(at, None)
        if limits.any():
            self.budgets.setdefault(name, Budget())
        else:  # nothing left to hold back
            self.budgets.pop(name, None)
            self.lenders.pop((name, b""), None)
        if self.throttled.pop(name, False) is None:  # its waiters are served, or held again, now
            self.life.consumers.ready[name] = None

    # ------------------------------------------------------------ the bus and the AOF

    def on_qset(self, sender: str, msg: m.QSet) -> None:
        limits = self._checked(msg.record, f"from {sender}")
        if limits is not None and limits.newer(self.defs.get(limits.queue)):
            self._keep(limits)

    def _checked(self, record: bytes, source: str) -> QueueLimits | None:
        """The record decoded; None for a bad one, dropped alone (logged and counted)."""
        limits = decode_alone(records.decode, record, "Limits", source)
        self.dropped += limits is None
        return limits

    def sync_messages(self) -> list[m.QSet]:
        """Every record, for a node that just linked up."""
        return [m.QSet(records.encode(limits)) for limits in self.defs.values()]

    def replay(self, record: bytes) -> None:
        limits = self._checked(record, "in the AOF")
        if limits is not None and limits.newer(self.defs.get(limits.queue)):
            self._store(limits)

    def snapshot_records(self) -> list[bytes]:
        return [encode_record(QLIMITS, records.encode(limits)) for limits in self.defs.values()]

    # ------------------------------------------------------------ handing jobs out

    def fetch(self, queue: Queue) -> Job | None:
        """The lifecycle's `fetch` for a limited queue: a job only within
        this node's share of the queue's budget and of its key's; None (and
        an ask to the home) when none is left."""
        name = queue.name
        if not len(queue):
            return None
        budget = self.budgets[name]
        if not self._admit(name, b"", budget):
            self._hold(name, budget)
            return None
        if self.defs[name].keyed():
            job = self._keyed_job(queue)
            if job is None:
                self._hold(name, budget)
                return None
            job = self.life.take(queue, job)
            queue.served(job)
            if job.key:
                self._count(self.keyed[name, job.key], job)
        else:
            job = self.life.fetch(queue)
            if job is None:  # pragma: no cover - a job on a disk that fails to read
                return None
        self._count(budget, job)
        return job

    def _hold(self, name: bytes, budget: Budget) -> None:
        """A consumer here waits on `name`'s limits (since now, if it is the first)."""
        if name not in self.throttled:
            self.throttled[name] = None
            budget.since = self.life.now

    @staticmethod
    def _count(budget: Budget, job: Job) -> None:
        budget.out[job.id] = (job, _handed(job))
        budget.tokens -= 1
        budget.handed += 1

    def _keyed_job(self, queue: Queue) -> Job | None:
        """The first of the first KEY_SCAN keys' oldest jobs queued in memory,
        in their turns (store/queue.py `fronts`), whose key's share allows
        it (a job without a key always does); the homes of the keys that
        have none left are asked.  A key's oldest job first keeps an
        ordered queue's keys in creation order."""
        name, life = queue.name, self.life
        peek = life.jobs.peek
        for job in islice(queue.fronts(life.now, life.settings.priority_aging), KEY_SCAN):
            if peek(job.id) is not job:
                continue  # on disk (read-behind): it waits until it is read back
            key = job.key
            if not key:
                return job
            budget = self.keyed.get((name, key))
            if budget is None:
                budget = self.keyed[name, key] = Budget()
            if self._admit(name, key, budget):
                return job
        return None

    def _admit(self, name: bytes, key: bytes, budget: Budget) -> bool:
        """Whether the share of `name`'s budget (its `key`'s) lets one more
        job out now; if not, the home is asked, and its answer may come at
        once (this node is the home)."""
        rule = self._rule(name, key)
        if self._room(rule, budget) and self._cleared(name, key, budget):
            return True
        now = self.life.now
        if budget.asked and now - budget.asked < ASK_TIMEOUT_MS or budget.ask_at > now:
            return False  # an ask is on its way, or the home said when to ask again
        self._ask(name, key, budget, True)
        return self._room(rule, budget) and self._cleared(name, key, budget)

    def _cleared(self, name: bytes, key: bytes, budget: Budget) -> bool:
        """Whether the home let out the oldest job of the key queued here
        (an ordered key: one of its older jobs may be queued elsewhere)."""
        return not key or budget.cleared == self._first(name, key)[1]

    def _first(self, name: bytes, key: bytes) -> tuple[int, bytes]:
        """An ordered queue's key: (creation time, ID) of its oldest job
        queued here (NO_FIRST: none, or the queue is not ordered)."""
        queue = self.life.queues.get(name)
        fair = None if queue is None else queue.fair
        lane = None if fair is None or not self.ordered(name) else fair.lanes.get(key)
        job = None if lane is None else next(lane.oldest(), None)
        return NO_FIRST if job is None else (job.ctime, job.id)

    def _rule(self, name: bytes, key: bytes) -> tuple[int, int, int]:
        """(rate, period, concurrency) of `name`'s budget, or of its keys'."""
        limits = self.defs[name]
        if key:
            return limits.key_rate, limits.key_period, limits.per_key()
        return limits.rate, limits.period, limits.concurrency

    def _room(self, rule: tuple[int, int, int], budget: Budget) -> bool:
        """Whether a share lets one more job out now."""
        now = self.life.now
        rate, _, concurrency = rule
        if rate and (budget.tokens_until <= now or budget.tokens <= 0):
            return False
        return not concurrency or self._out(budget) < (budget.slots if budget.slots_until > now else 0)

    def _out(self, budget: Budget) -> int:
        """The jobs still out (those acknowledged, NACKed or queued again are forgotten)."""
        peek = self.life.jobs.peek
        out = budget.out
        for job_id, (job, handed) in list(out.items()):
            if peek(job_id) is not job or job.state != S_ACTIVE or job.flags & NACKED or _handed(job) != handed:
                del out[job_id]
        return len(out)

    def recheck(self) -> bool:
        """The end of a step: the queues whose waiters a limit held back and
        that have room now are marked ready.  Whether any was."""
        life, woke = self.life, False
        for name in list(self.throttled):
            queue = life.queues.get(name)
            if queue is None or not queue.waiters or not len(queue):
                del self.throttled[name]  # nobody, or nothing, waits on it any more
            elif self._room(self._rule(name, b""), self.budgets[name]) and (
                not self.defs[name].keyed() or self._keyed_job(queue)
            ):
                self._stop_waiting(name)
                life.consumers.ready[name] = None
                woke = True
        return woke

    def _stop_waiting(self, name: bytes) -> None:
        """The limit lets `name`'s waiters be served: how long they waited is counted."""
        del self.throttled[name]
        budget = self.budgets[name]
        budget.waited += self.life.now - budget.since
        budget.waits += 1

    # ------------------------------------------------------------ asking the home

    def handed(self, name: bytes, job: Job) -> None:
        """Federation hands `job`, the oldest of its ordered key here, to
        another node: the key's home hears of it as this node's, and holds
        the younger jobs back until that node tells it (`_order`'s `moving`)."""
        budget = self.keyed.get((name, job.key))
        if budget is None:
            budget = self.keyed[name, job.key] = Budget()
        self._ask(name, job.key, budget, False, (job.ctime, job.id))

    def _ask(self, name: bytes, key: bytes, budget: Budget, wanting: bool, first: tuple[int, bytes] | None = None) -> None:
        """Ask the home of `name` (of its `key`) for a lease of the jobs out
        here and one per consumer waiting with a job queued for it (one at
        least when `wanting`: a consumer wants a job now), and a token for
        each; an ordered key's oldest job here is told (or `first`)."""
        life = self.life
        now = life.now
        rate, _, concurrency = self._rule(name, key)
        queue = life.queues.get(name)
        waiting = 0 if key or queue is None else min(len(queue.waiters), len(queue))  # (no job here: no slot wanted)
        if wanting:
            waiting = max(1, waiting)
        out = self._out(budget)
        held = budget.slots if budget.slots_until > now else 0
        want = min(out + waiting, concurrency) if concurrency else 0
        tokens = min(waiting, _burst(rate)) if rate else 0
        if first is None:
            first = self._first(name, key) if key else NO_FIRST
        budget.asked, budget.ask_at, budget.first, budget.wanting = now, 0, first, wanting
        ask = m.LimitAsk(name, want, out, held, tokens, now, key, *first)
        owner = home(name + b"\0" + key if key else name, life.membership.up_ids())
        if owner == life.membership.my_id:
            self.on_grant(owner, self._lend(owner, ask))
        elif wanting or out or held or self._reads_order(owner):  # (else only the oldest is told: a home that reads it)
            self.out.send(owner, ask)

    def _reads_order(self, node: str) -> bool:
        peer = self.life.membership.nodes.get(node)
        return peer is not None and bool(peer.features & m.FEATURE_KEY_ORDER)

    def on_ask(self, sender: str, msg: m.LimitAsk) -> None:
        if msg.queue in self.budgets:
            self.out.send(sender, self._lend(sender, msg))

    def _lend(self, node: str, ask: m.LimitAsk) -> m.LimitGrant:
        """The home's answer to `node`'s ask."""
        life = self.life
        now = life.now
        rate, period, concurrency = self._rule(ask.queue, ask.key)
        lender = self.lenders.get((ask.queue, ask.key))
        if lender is None:
            lender = self.lenders[ask.queue, ask.key] = Lender(filled=now)
        lender.used = now
        up = self._look()
        majority = 2 * len(up) > life.membership.size()
        slots = tokens = retry = 0
        behind, hand_to = False, ""
        if concurrency:
            slots = self._slots(concurrency, lender, node, ask, now)
            if ask.key and self.ordered(ask.queue):
                behind, hand_to = self._order(lender, node, ask, up, now)
                if behind:
                    slots = min(slots, ask.out)
            if not majority or now < self.quiet_until:
                slots = min(slots, ask.held)  # renew at most what it holds
            lender.leases[node] = (slots, now + LEASE_MS + LEASE_SLACK)
        if rate and majority and now >= self.quiet_until:
            tokens, retry = self._tokens(rate, period, lender, ask.tokens, now)
        elif rate:  # asked again once the quiet time is over, or the partition maybe healed
            retry = max(1, self.quiet_until - now) if majority else RENEW_MS
        return m.LimitGrant(ask.queue, slots, tokens, retry, ask.at, ask.key, hand_to, behind)

    def _order(self, lender: Lender, node: str, ask: m.LimitAsk, up: tuple[str, ...], now: int) -> tuple[bool, str]:
        """An ordered key at its home, from the oldest job of it each node
        said it holds (`firsts`), and those that left a node without being
        let out there for SETTLE_MS (`moving`: on their way to another node,
        which may not have told it yet): whether an older job holds `node`'s
        back (a node that wants a slot: for ORDER_WAIT_MS at most, then its
        own goes, out of order), or its oldest is younger than SETTLE_MS on
        its clock and other nodes are up (they tell a new oldest within
        100 ms: one queued there just before may not be known yet); and,
        when `node` holds the oldest and no consumer there wants it, the
        node held back longest, to which `node` hands the key's jobs."""
        firsts, held_back, wants, moving = lender.firsts, lender.held_back, lender.wants, lender.moving
        for other, (_, _, until) in list(firsts.items()):
            if until <= now or other not in up:
                del firsts[other]  # lapsed (a node gone), or flagged failing
        for other in list(held_back):
            want, until = wants.get(other, (0, 0))
            if not want or until <= now:
                del held_back[other]  # its consumers went
        for job_id, (_, until) in list(moving.items()):
            if until <= now:
                del moving[job_id]
        mine = (ask.first, ask.first_id)
        was = firsts.pop(node, None)
        if was is not None and was[1] != ask.first_id and was[1] != lender.let_out:
            moving[was[1]] = (was[0], now + SETTLE_MS)
        if not ask.first_id:
            return False, ""
        moving.pop(ask.first_id, None)
        firsts[node] = (ask.first, ask.first_id, now + REPORT_TTL_MS)
        others = [(ctime, job_id) for other, (ctime, job_id, _) in firsts.items() if other != node]
        others += [(ctime, job_id) for job_id, (ctime, _) in moving.items()]
        if any(first < mine for first in others):
            if ask.want <= ask.out:
                return True, ""
            if node not in held_back:
                held_back[node] = now
                self.order_waits += 1
            if now - held_back[node] < ORDER_WAIT_MS:
                return True, ""
            self.order_breaks += 1
        elif ask.want > ask.out and 0 <= ask.at - ask.first // 1_000_000 < SETTLE_MS and len(up) > 1:
            return True, ""
        held_back.pop(node, None)
        if ask.want > ask.out:
            lender.let_out = ask.first_id
            return False, ""
        return False, min(held_back, key=held_back.__getitem__) if held_back else ""

    @staticmethod
    def _slots(concurrency: int, lender: Lender, node: str, ask: m.LimitAsk, now: int) -> int:
        """The lease `node` gets: what it wants within what the others' live
        leases leave, and no more than a fair share (or its jobs out) while others want slots too."""
        for other, (_, until) in list(lender.leases.items()):
            if until <= now:
                del lender.leases[other]
        wants = lender.wants
        wants[node] = (ask.want, now + LEASE_MS)
        wanting = [n for n, (want, until) in list(wants.items()) if want and until > now]
        lent = sum(slots for other, (slots, _) in lender.leases.items() if other != node)
        fair = -(-concurrency // max(1, len(wanting)))
        return max(0, min(ask.want, concurrency - lent, max(fair, ask.out)))

    @staticmethod
    def _tokens(rate: int, period: int, lender: Lender, wanted: int, now: int) -> tuple[int, int]:
        """Tokens from the bucket (at most `wanted`), and when the next comes if it is empty."""
        lender.units = min(lender.units + (now - lender.filled) * rate, _burst(rate) * period)
        lender.filled = now
        given = min(wanted, lender.units // period)
        lender.units -= given * period
        if given:
            return given, 0
        return 0, max(1, -(-(period - lender.units) // rate))

    def on_grant(self, sender: str, msg: m.LimitGrant) -> None:
        budget = self.keyed.get((msg.queue, msg.key)) if msg.key else self.budgets.get(msg.queue)
        if budget is None or msg.at != budget.asked:
            return  # an answer to an ask made before the last, or to a limit gone
        budget.asked = 0
        budget.cleared = b"" if msg.behind else budget.first[1]
        budget.slots, budget.slots_until = msg.slots, msg.at + LEASE_MS
        budget.tokens, budget.tokens_until = msg.tokens, msg.at + TOKEN_MS
        if msg.retry:
            budget.ask_at = self.life.now + msg.retry
        elif budget.wanting and not msg.tokens and msg.slots <= len(budget.out):  # nothing more: not asked again at once
            budget.ask_at = self.life.now + ASK_GAP_MS
        if msg.hand_to:
            self.hand_key(msg.queue, msg.key, msg.hand_to)

    # ------------------------------------------------------------ time

    def next_deadline(self) -> int | None:
        """When an ask is due for a queue whose consumers wait on it (None: none)."""
        due = [b.ask_at for name in self.throttled for b in self._waited_on(name) if b.ask_at]
        return min(due) if due else None

    def _waited_on(self, name: bytes) -> list[Budget]:
        """The budgets a queue's waiters may wait on: the queue's, its keys'."""
        return [self.budgets[name], *(b for (queue, _), b in self.keyed.items() if queue == name)]

    def tick(self) -> None:
        """Asks that came due for queues whose consumers wait."""
        now = self.life.now
        for name in self.throttled:
            if (budget := self.budgets[name]).ask_at and budget.ask_at <= now:
                self._ask(name, b"", budget, True)
            for (queue, key), budget in self.keyed.items():
                if queue == name and budget.ask_at and budget.ask_at <= now:
                    self._ask(name, key, budget, True)

    def _look(self) -> tuple[str, ...]:
        """The nodes up; if they changed, this node lends nothing new for a
        lease time (the previous home's leases may still run)."""
        up = tuple(self.life.membership.up_ids())
        if up != self.view:
            self.view, self.quiet_until = up, max(self.quiet_until, self.life.now + LEASE_MS + LEASE_SLACK)
        return up

    def cron(self) -> None:
        """Every 100 ms: the nodes up are looked at, a lease is renewed (or
        given back) every RENEW_MS, an unanswered ask is made again."""
        now = self.life.now
        if self.budgets:
            self._look()
            self._ordered_keys()
        for name, budget in self.budgets.items():
            self._renew(name, b"", budget, name in self.throttled, now)
        for (name, key), budget in list(self.keyed.items()):
            if not self._renew(name, key, budget, False, now) and max(budget.asked, budget.ask_at, budget.tokens_until) <= now - RENEW_MS:
                del self.keyed[name, key]  # a key with nothing out, held, asked for or given of late: forgotten
        for at, lender in list(self.lenders.items()):
            if now - lender.used > LEASE_MS + LEASE_SLACK + TOKEN_MS and at[1]:
                del self.lenders[at]  # a key no node asked for since its leases lapsed

    def _ordered_keys(self) -> None:
        """The keys of ordered queues with jobs queued here get a budget:
        their homes hear of their oldest; the queues whose jobs did not
        change since the last look are `quiet`."""
        queues, marks, quiet = self.life.queues, self.marks, self.quiet
        quiet.clear()
        if len(self.view) < 2:
            marks.clear()
            return  # alone: no other node's jobs to go before
        for name in self.budgets:
            queue = queues.get(name)
            if queue is None or queue.fair is None or not self.ordered(name):
                continue
            mark = (len(queue), queue.jobs_in)
            if marks.get(name) == mark:
                quiet.add(name)
                continue
            marks[name] = mark
            for key in queue.fair.lanes:
                if (name, key) not in self.keyed and self._first(name, key)[1]:
                    self.keyed[name, key] = Budget()

    def _renew(self, name: bytes, key: bytes, budget: Budget, wanting: bool, now: int) -> bool:
        """Ask again every RENEW_MS while a lease is held or consumers want
        one (unused slots go back to the home), every REPORT_MS while an
        ordered key has jobs queued here and other nodes are up, and at once
        when its oldest here changed; whether the budget is in use."""
        held = budget.slots and budget.slots_until > now or wanting or self._out(budget)
        since = now - max(budget.asked, budget.slots_until - LEASE_MS)
        if not held and name in self.quiet and since < REPORT_MS:
            return bool(budget.first[1])  # its queue did not change: nor did its oldest, told already
        first = self._first(name, key) if key else NO_FIRST
        if held:
            every = RENEW_MS
        elif (first[1] or budget.first[1]) and len(self.view) > 1:
            every = REPORT_MS  # only its oldest to tell
        else:
            return False
        moved = first != budget.first
        if since >= every or moved and now - budget.asked >= ASK_TIMEOUT_MS:
            self._ask(name, key, budget, wanting)
        elif moved:
            self.marks.pop(name, None)  # told once the ask on its way is answered or lost: looked at again
        return True

    # ------------------------------------------------------------ reading

    def show(self, queue: bytes) -> Map:
        """QCONFIG GET: the limits in force and this node's use of them."""
        limits = self.defs.get(queue)
        if limits is None or limits.deleted:
            limits = QueueLimits(queue, 0, "")
        budget = self.budgets.get(queue) or Budget()
        now = self.life.now
        return Map([
            *limits.options(),
            (b"out", self._out(budget)), (b"lease", budget.slots if budget.slots_until > now else 0),
            (b"tokens", budget.tokens if budget.tokens_until > now else 0), (b"handed", budget.handed),
            (b"waiting", int(queue in self.throttled)), (b"waits", budget.waits), (b"waited-ms", budget.waited),
        ])  # fmt: skip

    def figures(self) -> list[dict[str, Any]]:
        """Each limited queue's limits and this node's use of them (/metrics, the dashboard)."""
        now = self.life.now
        return [
            {
                "queue": name.decode("utf-8", "backslashreplace"), "concurrency": self.defs[name].concurrency,
                "rate_per_second": self.defs[name].rate * 1000 / self.defs[name].period if self.defs[name].rate else 0,
                "out": self._out(budget), "lease": budget.slots if budget.slots_until > now else 0,
                "handed": budget.handed, "waiting": int(name in self.throttled),
                "waited_seconds": (budget.waited + (now - budget.since if name in self.throttled else 0)) / 1000,
            }
            for name, budget in sorted(self.budgets.items())
        ]  # fmt: skip

    def ordered(self, queue: bytes) -> bool:
        """Whether `queue` hands out one job per key at a time (federation moves its keys whole)."""
        limits = self.defs.get(queue)
        return limits is not None and limits.ordered and not limits.deleted

    def names(self) -> list[bytes]:
        return sorted(name for name, limits in self.defs.items() if limits.any())

    def info_fields(self) -> list[tuple[str, int]]:
        budgets = self.budgets.values()
        return [
            ("limited_queues", len(self.budgets)), ("limited_queues_waiting", len(self.throttled)),
            ("limited_jobs_out", sum(len(b.out) for b in budgets)), ("limited_jobs_handed", sum(b.handed for b in budgets)),
            ("limit_waits", sum(b.waits for b in budgets)), ("limit_waited_ms", sum(b.waited for b in budgets)),
            ("limited_keys", len(self.keyed)), ("limit_budgets_lent", len(self.lenders)),
            ("limit_records_dropped", self.dropped), ("ordered_key_waits", self.order_waits),
            ("ordered_key_breaks", self.order_breaks),
        ]  # fmt: skip


def _burst(rate: int) -> int:
    """The most tokens a home's bucket holds, or one ask gets."""
    return max(1, rate // BURST)
