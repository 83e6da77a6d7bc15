"""Synchronous and asynchronous replication of new jobs (spec/cluster.md §8.2).

Theory of operation: ADDJOB with REPLICATE > 1 (or external replication,
when this node is leaving or short of memory) hands the new job to
`Replication.start`.  Synchronous jobs stay `wait-repl`, registered locally,
while REPLJOB goes to `additional` random reachable nodes; each GOTJOB adds
the sender to `nodes_confirmed`, and when REPLICATE nodes confirmed, the
producer gets its ID and the job is queued (or, with external replication,
ENQUEUE goes to one confirmed node and the local record is forgotten).

The retry rule (spec/cluster.md §8.2 step 3, as upstream): until the level is
reached, on every cron visit at least 50 ms after a target was last added,
`replicate(job, 1)` adds one more reachable node with a link, if any, and
re-sends REPLJOB to every target that has not confirmed.  A target stays a
target whatever happens to it, so one that dies and comes back (same ID)
gets the job again as soon as it has a link, flagged failing or not.  Short
of the level, the wait ends only with the ADDJOB timeout (`NOREPL Timeout
reached`), the job's removal (TTL, DELJOB, flush), the producer leaving or
this node turning LEAVING (a job it replicates externally, as a node already
leaving does, waits on: its replicas are the point); each deletes the job
everywhere (DELJOB to `nodes_delivered`).  The up-front `NOREPL Not enough reachable nodes` is
ADDJOB's (lifecycle.py): it counts the nodes reachable at that moment, failing
ones excluded, as upstream does.

Zones (docs/zones.md): in a cluster whose nodes have zones, `place` picks
the new targets of a job so that its copies spread over the zones, the
zones with the fewest copies first (the producer's copy covers its own
zone); a job with `zones` > 1 (ADDJOB ZONES, or `min-zones`) reaches its
level only once its confirmed copies span that many zones, and the node
that queues a job replicated externally is one in this node's zone if
any confirmed.  A cluster without zones draws its targets as before.

MINREPL (docs/replication.md; Kafka's `min.insync.replicas` rule): a job
may settle for `minrepl` < REPLICATE synchronous copies, but only once no
target in good standing (a link up, not flagged PFAIL/FAIL) is still to
answer and no other such node is left to ask (`stranded`): while every
node answers, the producer still gets all its copies.  A job that settles
moves to `background`, as does an ASYNC job short of targets: every
`BACKGROUND_MS` REPLJOB goes again, answer asked, to its unconfirmed
targets in good standing, and to new nodes while its targets that are
confirmed or in good standing are fewer than REPLICATE, until REPLICATE
nodes confirmed or the job is acknowledged or gone.  The holders that
confirmed get no copy again (a new target's copy names them all): one may
have deleted the job since (FASTACK, an ACK collected), and a copy would
bring it back.

Resending: a target that has not confirmed gets the copy again only on a
new link (it may have restarted) or once `resend_ms` passed since the last
send on the same link: the 50 ms step for a small job, the time its copy
takes at 10 MB/s for a big one (a frame of tens of MB sent again on every
step used to fill the link's queue until the bus closed it, again and again).

A job that never reached its replication level is never written to the AOF.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disque.cluster.membership import UNREACHABLE, Membership, Peer

from disque.cluster import messages as m
from disque.store.records import job_to_wire
from disque.core import errors
from disque.core.types import BLOCKED, Connection, Status
from disque.store.job import AWAIT_REPL, REPLICATED, Job, State

if TYPE_CHECKING:
    from disque.core.lifecycle import Lifecycle
    from disque.core.outbox import Outbox

REPL_STEP_MS = 50
RESEND_BYTES_PER_MS = 10_000  # a big job's copy goes again on the same link once it had time to arrive at 10 MB/s
BACKGROUND_MS = 1000  # the pass over the jobs that still lack copies after their producer got its answer


def resend_ms(job: Job) -> int:
    return max(REPL_STEP_MS, len(job.body or b"") // RESEND_BYTES_PER_MS)


class Pending:  # a plain class: the compiled build keeps a dataclass's __init__ interpreted
    """A job still making copies: its producer waits (`client`), or got its
    answer and the rest are made in the background (`client` None)."""

    __slots__ = ("client", "deadline", "last_add", "external", "zones", "minrepl", "sent", "confirmed")

    def __init__(
        self, client: Connection | None, deadline: int, last_add: int, external: bool, zones: int, minrepl: int
    ) -> None:  # fmt: skip
        self.client = client
        self.deadline = deadline  # 0 = wait forever
        self.last_add = last_add
        self.external = external  # replicas only (this node leaving or short of memory): LEAVING does not end it
        self.zones = zones  # the zones the confirmed copies must span
        self.minrepl = minrepl  # the copies the producer settles for when a target is out of good standing
        self.sent: dict[str, tuple[int, int]] = {}  # target -> (its link's time, when) of the last REPLJOB
        self.confirmed: set[str] = set()  # in the background: the holders that confirmed


def place(membership: Membership, candidates: list[Peer], holders: tuple[str, ...], count: int) -> list[str]:
    """`count` of `candidates` (fewer than there are) spread over zones:
    each pick is a random node of a random zone among those with the fewest
    copies so far (`holders` counting), so the zones no copy covers come
    first, then the copies go round the zones."""
    rng = membership.rng
    copies: dict[str, int] = {}
    for node_id in holders:
        zone = membership.zone_of(node_id)
        if zone is not None:
            copies[zone] = copies.get(zone, 0) + 1
    by_zone: dict[str, list[Peer]] = {}
    for node in candidates:
        by_zone.setdefault(node.zone, []).append(node)
    chosen: list[str] = []
    while len(chosen) < count:
        fewest = min(copies.get(zone, 0) for zone in by_zone)
        zone = rng.choice([z for z in by_zone if copies.get(z, 0) == fewest])
        nodes = by_zone[zone]
        chosen.append(nodes.pop(rng.randrange(len(nodes))).id)
        if not nodes:
            del by_zone[zone]
        copies[zone] = fewest + 1
    return chosen


def zones_of(membership: Membership, node_ids: Any) -> int:
    """How many zones `node_ids` span (unknown nodes left out)."""
    return len({zone for node_id in node_ids if (zone := membership.zone_of(node_id)) is not None})


class Replication:
    def __init__(self, life: Lifecycle, out: Outbox) -> None:
        self.life = life
        self.out = out
        self.pending: dict[bytes, Pending] = {}
        self.background: dict[bytes, Pending] = {}  # jobs whose producer has its answer, still short of copies
        self.next_background = 0
        self.achieved_count = 0  # synchronous replications that reached their level
        self.aborted_count = 0  # ... and those given up (timeout, LEAVING, producer gone)
        self.settled_count = 0  # ... and those that settled for MINREPL copies

    def start(
        self, client: Connection, job: Job, additional: int, timeout: int, is_async: bool, extrepl: bool,
        zones: int = 1, minrepl: int = 0,
    ) -> Any:  # fmt: skip
        """Replicate a new job to `additional` other nodes; `minrepl` (0: the
        job's REPLICATE) is MINREPL."""
        life, out = self.life, self.out
        me = life.membership.my_id
        pending = Pending(client, life.now + timeout if timeout else 0, life.now, extrepl, zones, minrepl or job.repl)
        if is_async:
            if extrepl:  # not registered here: replicas only, one of them queues it
                self.replicate(job, additional, noreply=True)
                targets = [n for n in job.nodes_delivered if n != me]
                if targets:
                    out.send(self.queuer(targets), m.Enqueue(job.id, job.delay))
            else:
                life.register(job)
                life.queue_new_job(job)
                self.replicate(job, additional, noreply=True, pending=pending)
                if len(job.nodes_delivered) < job.repl:  # fewer nodes reachable than REPLICATE: MINREPL allowed it
                    self.to_background(job, pending, {me})
            return Status(job.id)
        job.move(AWAIT_REPL)
        job.nodes_confirmed = set() if extrepl else {me}
        life.register(job)
        self.replicate(job, additional, noreply=False, pending=pending)
        client.repl_jobs[job.id] = None
        out.repl_waiters[job.id] = client
        self.pending[job.id] = pending
        return BLOCKED

    def replicate(self, job: Job, count: int, noreply: bool, pending: Pending | None = None) -> int:
        """Add up to `count` new targets, then (re)send REPLJOB (§8.2 step 1):
        to the new ones, and to those that have not confirmed when it is due
        (`pending` keeps when each got it last; without it, to all)."""
        life, out = self.life, self.out
        delivered = job.nodes_delivered
        membership = life.membership
        candidates = [n for n in membership.reachable() if n.link and n.id not in delivered]
        if count >= len(candidates):
            added = [n.id for n in candidates]
        elif membership.zoned:
            added = place(membership, candidates, delivered, count)
        else:
            added = [n.id for n in life.rng.sample(candidates, count)]
        if added:
            job.nodes_delivered = delivered + tuple(added)
        wire = job_to_wire(job, life.now)
        msg = m.ReplJob(wire, noreply)  # one message for every target: the bus encodes it once
        confirmed: Any = job.nodes_confirmed or ()
        background = False  # the producer has its answer: `pending` keeps the confirmations
        if pending is not None and pending.client is None:
            background, confirmed = True, pending.confirmed
        now, nodes, every = life.now, membership.nodes, resend_ms(job)
        for node_id in job.nodes_delivered:
            if node_id == membership.my_id:
                continue
            done = node_id in confirmed
            if done and (not added or background):
                continue  # (in the background a holder may have deleted the job since: a copy would bring it back)
            if pending is not None and not done:
                node = nodes.get(node_id)
                if node is None or not node.link:
                    continue  # a send would be dropped: the next link gets it
                last = pending.sent.get(node_id)
                if last is not None and last[0] == node.link_time and now - last[1] < every and node_id not in added:
                    continue  # still on its way on the same link
                pending.sent[node_id] = (node.link_time, now)
            out.send(node_id, m.ReplJob(wire, True) if done and not noreply else msg)
        return len(added)

    def in_good_standing(self, node_id: str) -> bool:
        """A target expected to answer: known, linked, not flagged PFAIL/FAIL."""
        node = self.life.membership.nodes.get(node_id)
        return node is not None and node.link and not node.flags & UNREACHABLE

    def stranded(self, job: Job, pending: Pending) -> bool:
        """MINREPL's rule: the job holds `minrepl` confirmed copies (spanning
        its zones) and no target in good standing is still to answer.  A
        node in good standing not asked yet is asked at once instead."""
        confirmed = job.nodes_confirmed or set()
        if len(confirmed) < pending.minrepl:
            return False
        if pending.zones > 1 and zones_of(self.life.membership, confirmed) < pending.zones:
            return False
        if any(self.in_good_standing(n) for n in job.nodes_delivered if n not in confirmed):
            return False
        if self.replicate(job, 1, noreply=False, pending=pending):
            pending.last_add = self.life.now
            return False
        return True

    def settle(self, job: Job, pending: Pending) -> None:
        """Answer the producer with the MINREPL copies held; the rest are
        made in the background."""
        confirmed = set(job.nodes_confirmed or ())
        self.settled_count += 1
        if self.achieved(job):
            self.to_background(job, pending, confirmed)

    def to_background(self, job: Job, pending: Pending, confirmed: set[str]) -> None:
        pending.client = None
        pending.confirmed = confirmed
        self.background[job.id] = pending

    def minrepl_of(self, job_id: bytes) -> int | None:
        """The MINREPL of a job this node still makes copies of (SHOW)."""
        pending = self.pending.get(job_id) or self.background.get(job_id)
        return None if pending is None else pending.minrepl

    def on_got_job(self, sender: str, msg: m.GotJob) -> None:
        self.got(sender, msg.id)

    def on_got_jobs(self, sender: str, msg: m.GotJobs) -> None:
        for job_id in msg.ids:
            self.got(sender, job_id)

    def got(self, sender: str, job_id: bytes) -> None:
        """`sender` holds a copy of the job: count it toward the replication level."""
        job = self.life.jobs.get(job_id)
        if job is None:
            return
        if job.state != State.WAIT_REPL or job.nodes_confirmed is None:
            late = self.background.get(job_id)
            if late is not None:
                late.confirmed.add(sender)
                if len(late.confirmed) >= job.repl:
                    del self.background[job_id]
            return
        confirmed = job.nodes_confirmed
        confirmed.add(sender)
        pending = self.pending[job_id]  # `start` made both the confirmed set and the Pending
        if len(confirmed) >= job.repl:
            zones = pending.zones
            if zones <= 1 or zones_of(self.life.membership, confirmed) >= zones:
                self.achieved(job)
                return
        if pending.minrepl < job.repl and self.stranded(job, pending):
            self.settle(job, pending)

    def achieved(self, job: Job) -> bool:
        """Replication level reached: answer the producer.  Returns False when
        the job was handed to a replica and forgotten here (external)."""
        life, out = self.life, self.out
        self.pending.pop(job.id, None)
        self.achieved_count += 1
        job.move(REPLICATED)
        out.answer_producer(job.id, life.stored_reply(job))
        if life.membership.my_id not in job.nodes_delivered:
            confirmed = sorted(job.nodes_confirmed or ())
            if confirmed:
                out.send(self.queuer(confirmed), m.Enqueue(job.id, job.delay))
            life.delete_job(job, log=False)
            return False
        job.nodes_confirmed = None
        life.queue_new_job(job)
        return True

    def queuer(self, holders: list[str]) -> str:
        """The holder that queues a job this node does not keep: one in this
        node's zone if any (its consumers are likely near), else any."""
        life = self.life
        return life.rng.choice(life.membership.near(holders) or holders)

    def abort(self, job: Job, reply: Any) -> None:
        """Give up: the producer gets `reply`, every copy is deleted."""
        life, out = self.life, self.out
        self.pending.pop(job.id, None)
        self.aborted_count += 1
        out.answer_producer(job.id, reply)
        if job.rare is not None and job.rare.key:  # never made: its key's home ends any hold of it (core/keys.py)
            life.keys.done(job, True)
        life.abort_replication(job)

    def forget(self, job_id: bytes) -> None:
        self.pending.pop(job_id, None)
        self.background.pop(job_id, None)

    def cron(self) -> None:
        life = self.life
        now = life.now
        for job_id, pending in list(self.pending.items()):
            job = life.jobs.get(job_id)
            if job is None or job.state != State.WAIT_REPL:
                self.pending.pop(job_id, None)
            elif pending.deadline and now >= pending.deadline:
                self.abort(job, errors.norepl_timeout())
            elif life.membership.leaving and not pending.external:
                self.abort(job, errors.leaving())
            elif now - pending.last_add >= REPL_STEP_MS and self.replicate(job, 1, noreply=False, pending=pending):
                pending.last_add = now
            elif pending.minrepl < job.repl and self.stranded(job, pending):
                self.settle(job, pending)
        if self.background and now >= self.next_background:
            self.next_background = now + BACKGROUND_MS
            self.make_the_rest()

    def make_the_rest(self) -> None:
        """The background pass: each job short of copies asks its targets in
        good standing again (when due) and new nodes while those and the
        confirmed ones are fewer than REPLICATE."""
        life = self.life
        for job_id, pending in list(self.background.items()):
            job = life.jobs.get(job_id)
            if job is None or job.state == State.ACKED:
                del self.background[job_id]
                continue
            confirmed = pending.confirmed
            held = sum(1 for n in job.nodes_delivered if n in confirmed or self.in_good_standing(n))
            self.replicate(job, max(0, job.repl - held), noreply=False, pending=pending)
