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

A job that never reached its replication level is never written to the AOF.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disque.cluster.membership import Membership, Peer

from disque.cluster import messages as m
from disque.store.records import job_to_wire
from disque.core import errors
from disque.core.types import BLOCKED, Connection, Status
from disque.store.job import AWAIT_REPL, REPLICATED, Job, State

if TYPE_CHECKING:
    from disque.core.lifecycle import Lifecycle
    from disque.core.outbox import Outbox

REPL_STEP_MS = 50


class Pending:  # a plain class: the compiled build keeps a dataclass's __init__ interpreted
    __slots__ = ("client", "deadline", "last_add", "external", "zones")

    def __init__(self, client: Connection, deadline: int, last_add: int, external: bool, zones: int) -> None:
        self.client = client
        self.deadline = deadline  # 0 = wait forever
        self.last_add = last_add
        self.external = external  # replicas only (this node leaving or short of memory): LEAVING does not end it
        self.zones = zones  # the zones the confirmed copies must span


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
        self.achieved_count = 0  # synchronous replications that reached their level
        self.aborted_count = 0  # ... and those given up (timeout, LEAVING, producer gone)

    def start(
        self, client: Connection, job: Job, additional: int, timeout: int, is_async: bool, extrepl: bool, zones: int = 1
    ) -> Any:  # fmt: skip
        life, out = self.life, self.out
        me = life.membership.my_id
        if is_async:
            if extrepl:  # not registered here: replicas only, one of them queues it
                self.replicate(job, additional, noreply=True)
                targets = [n for n in job.nodes_delivered if n != me]
                if targets:
                    out.send(self.queuer(targets), m.Enqueue(job.id, job.delay))
            else:
                life.register(job)
                life.queue_new_job(job)
                self.replicate(job, additional, noreply=True)
            return Status(job.id)
        job.move(AWAIT_REPL)
        job.nodes_confirmed = set() if extrepl else {me}
        life.register(job)
        self.replicate(job, additional, noreply=False)
        client.repl_jobs[job.id] = None
        out.repl_waiters[job.id] = client
        self.pending[job.id] = Pending(client, life.now + timeout if timeout else 0, life.now, extrepl, zones)
        return BLOCKED

    def replicate(self, job: Job, count: int, noreply: bool) -> int:
        """Add up to `count` new targets, then (re)send REPLJOB (§8.2 step 1)."""
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
        confirmed = job.nodes_confirmed or ()
        for node_id in job.nodes_delivered:
            if node_id == life.membership.my_id:
                continue
            done = node_id in confirmed
            if done and not added:
                continue
            out.send(node_id, m.ReplJob(wire, True) if done and not noreply else msg)
        return len(added)

    def on_got_job(self, sender: str, msg: m.GotJob) -> None:
        self.got(sender, msg.id)

    def on_got_jobs(self, sender: str, msg: m.GotJobs) -> None:
        for job_id in msg.ids:
            self.got(sender, job_id)

    def got(self, sender: str, job_id: bytes) -> None:
        """`sender` holds a copy of the job: count it toward the replication level."""
        job = self.life.jobs.get(job_id)
        if job is None or job.state != State.WAIT_REPL or job.nodes_confirmed is None:
            return
        confirmed = job.nodes_confirmed
        confirmed.add(sender)
        if len(confirmed) >= job.repl:
            zones = self.pending[job_id].zones  # `start` made both the confirmed set and the Pending
            if zones <= 1 or zones_of(self.life.membership, confirmed) >= zones:
                self.achieved(job)

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
        life.abort_replication(job)

    def forget(self, job_id: bytes) -> None:
        self.pending.pop(job_id, None)

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
            elif now - pending.last_add >= REPL_STEP_MS and self.replicate(job, 1, noreply=False):
                pending.last_add = now
