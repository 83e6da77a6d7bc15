"""Federation: feeding consumers from other nodes' queues (spec/cluster.md §9).

Theory of operation: a consumer blocked on a queue that is empty here makes
the node ask for jobs with NEEDJOBS.  Nodes that answered recently (the
queue's "responders", valid for 5 s) are asked aggressively (ad-hoc backoff
25 ms doubling to 2 s, and at once when the queue just ran dry); everyone is
asked with a broadcast whose backoff doubles from 2 s to 30 s.  A node that
receives NEEDJOBS hands over up to half of its queue with YOURJOBS.  At-least-
once jobs stay `active` on the source (its retry timer still covers them);
at-most-once jobs move for good.  The importer queues what it receives and
keeps an import rate (two one-second buckets) that sizes later requests.

Per-queue state lives in a `QueueFed` attached lazily to the queue object,
so queues that never federate pay nothing.

This project adds a push path (spec/cluster.md §9.5), since asking alone
leaves a consumer on an idle cluster waiting for the next broadcast
(seconds): a node whose consumers block on a queue that is empty here tells
every peer at once (WAITING: the queue and how many wait), and repeats it
every WAIT_REFRESH_MS while they wait; it says 0 when none waits any more.
Only peers that said they read WAITING (FEATURE_WAITING in their PING or
PONG: a node of an older version drops the link on a message it does not
know) hear it, a peer that just said so gets every current entry at once.
A peer keeps each entry for WAIT_TTL_MS (`wanted`), and a job queued there
with no consumer of its own goes at once to a node that waits for it, up to
the count it announced, with the YOURJOBS mechanics of a NEEDJOBS answer:
at-least-once jobs stay `active` on the sender (its retry timer covers them),
at-most-once jobs move for good, and only over a link to a node not flagged
failing or leaving.  Announcements are batched per step (one frame per peer
for every queue whose count changed), and bounded: at most WAIT_MAX_QUEUES
queues announced by a node and kept per peer (the others wait for NEEDJOBS
as before), WAIT_BATCH entries a frame, and an increase, a drop to 0 or the
refresh are sent, never a decrease, which the pushers' own count follows.

Zones (docs/zones.md): a node with a zone asks its own zone first.  A due
broadcast goes to the peers of its zone, and to the others NEAR_FIRST_MS
later if its consumers still wait; the responders of its zone are asked
without the others while there are any; and a node hands its jobs to the
waiting peers of its zone before the others.

An ordered queue (QCONFIG ... ordered yes, core/limits.py) hands over a
key's queued jobs together: the key's jobs queued here move as one, so no
node holds a key's newer jobs while another holds its older ones
(docs/keys.md, "Ordered keys"), and the key's home hears of the oldest of
them at once (`handed`, core/limits.py); and a key's home may ask the node holding
its oldest job to send the key's queued jobs to a node whose consumers
wait for them (`hand_key`, core/limits.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disque.cluster import messages as m
from disque.store.records import job_from_wire, job_to_wire
from disque.store.job import BCAST_QUEUED, State
from disque.store.queue import PAUSE_OUT, Queue

if TYPE_CHECKING:
    from collections.abc import Callable

    from disque.core.lifecycle import Lifecycle
    from disque.core.outbox import Outbox
    from disque.store.job import Job

RESPONDER_TTL_S = 5
WAIT_REFRESH_MS = 1000  # a node repeats its WAITING entries this often
WAIT_TTL_MS = 3000  # ... and a peer drops one not repeated within this (two refreshes may be lost)
WAIT_MAX_QUEUES = 1024  # queues a node announces, and keeps per peer
WAIT_BATCH = 256  # entries per WAITING frame
_SKIP_PEER = m.MYSELF | m.HANDSHAKE | m.PFAIL | m.FAIL | m.LEAVING  # never pushed to
NEAR_FIRST_MS = 200  # a broadcast reaches the other zones this long after this node's own
YOURJOBS_MAX_BYTES = 32 << 20  # keep frames well under the codec's limit
# need_jobs reasons (spec/cluster.md §9.1)
CLIENTS_WAITING = 0
REACHED_ZERO = 1


@dataclass(slots=True)
class QueueFed:
    bcast_time: int = 0
    bcast_attempt: int = 0
    near_time: int = 0  # when this round's broadcast went to this node's zone (docs/zones.md)
    adhoc_time: int = 0
    adhoc_attempt: int = 0
    responders: dict[str, int] = field(default_factory=dict)  # node id -> unix s
    cur_start: int = 0
    cur_count: int = 0
    prev_start: int = 0
    prev_count: int = 0


@dataclass(slots=True)
class Want:
    """A peer's announced consumers for one queue."""

    count: int
    until: int  # ms: forgotten then unless announced again


def _fed(queue: Queue) -> QueueFed:
    if queue.federation is None:
        queue.federation = QueueFed()
    return queue.federation


class Federation:
    def __init__(self, life: Lifecycle, out: Outbox) -> None:
        self.life = life
        self.out = out
        self.ordered: Callable[[bytes], bool] = lambda queue: False  # whose keys move whole (set by NodeCore)
        self.handed: Callable[[bytes, Job], None] = lambda queue, job: None  # a key's oldest moves: its home hears (ditto)
        # Counters (INFO federation, metrics): NEEDJOBS sent and received, jobs
        # handed out with YOURJOBS, jobs received and queued here, those of
        # them pushed (to a node that announced waiting consumers, or here),
        # WAITING entries sent and received.
        self.needjobs_sent = 0
        self.needjobs_received = 0
        self.jobs_exported = 0
        self.jobs_imported = 0
        self.jobs_pushed_out = 0
        self.jobs_pushed_in = 0
        self.waiting_sent = 0
        self.waiting_received = 0
        # Our side: queue -> the count last announced (> 0); the queues whose
        # blocked clients changed in this step, announced at its end.
        self.announced: dict[bytes, int] = {}
        self.changed: dict[bytes, None] = {}
        self._refreshed = 0
        # The peers' side: queue -> peer -> its waiting consumers, and how
        # many queues each peer has there (WAIT_MAX_QUEUES).
        self.wanted: dict[bytes, dict[str, Want]] = {}
        self._wanted_per_peer: dict[str, int] = {}

    # ------------------------------------------------------------ import rate

    def import_rate(self, queue: Queue) -> int:
        fed = queue.federation
        now = self.life.now
        if fed is None or not fed.cur_start or now - fed.cur_start > 5000:
            return 0
        elapsed = max(50, now - (fed.prev_start or fed.cur_start))
        return math.ceil((fed.prev_count + fed.cur_count) * 1000 / elapsed)

    def import_from(self, queue: Queue) -> list[str]:
        fed = queue.federation
        return [] if fed is None else self._responders(fed)

    def _responders(self, fed: QueueFed) -> list[str]:
        horizon = self.life.now // 1000 - RESPONDER_TTL_S
        for node_id in [n for n, t in fed.responders.items() if t < horizon]:
            del fed.responders[node_id]
        return list(fed.responders)

    # ------------------------------------------------------------ asking

    def need_jobs(self, queue: Queue, reason: int) -> None:
        life = self.life
        if life.membership.leaving or life.membership.size() == 1:
            return
        rate = self.import_rate(queue)
        if reason == REACHED_ZERO and rate == 0:
            return
        fed = _fed(queue)
        responders = self._responders(fed)
        to_fetch = min(100, max(5, rate // len(responders) if responders else 5))
        now = life.now
        membership = life.membership
        if now - fed.bcast_time > min(2000 * 2**fed.bcast_attempt, 30_000):
            peers = membership.linked_ids()
            near = membership.near(peers)
            if near and fed.near_time <= fed.bcast_time:  # this round's first ask: the own zone
                fed.near_time = now
                self._ask(queue.name, near, 1)
            elif not near or now - fed.near_time >= NEAR_FIRST_MS:
                fed.bcast_time = now
                fed.bcast_attempt += 1
                self._ask(queue.name, [p for p in peers if p not in near], 1)
        if responders and (reason == REACHED_ZERO or now - fed.adhoc_time > min(25 * 2**fed.adhoc_attempt, 2000)):
            fed.adhoc_time = now
            fed.adhoc_attempt += 1
            self._ask(queue.name, membership.near(responders) or responders, to_fetch)

    def _ask(self, name: bytes, peers: list[str], count: int) -> None:
        for node_id in peers:
            self.out.send(node_id, m.NeedJobs(name, count))
            self.needjobs_sent += 1

    # ------------------------------------------------------------ answering

    def on_need_jobs(self, sender: str, msg: m.NeedJobs) -> None:
        life = self.life
        self.needjobs_received += 1
        queue = life.queues.get(msg.queue)
        if queue is None or not len(queue) or self.import_rate(queue) > 0 or queue.pause & PAUSE_OUT:
            return
        if not life.membership.has_link(sender):
            return  # checked first: a RETRY 0 job handed to nobody would be lost
        n = msg.count
        if len(queue) < 2 * n:
            n = len(queue) // 2
        self._hand_over(queue, sender, max(n, 1), False)

    def _hand_over(self, queue: Queue, to: str, n: int, pushed: bool) -> None:
        """Send the `n` oldest jobs of `queue` (n <= its length) to `to`,
        whose link the caller checked, in frames of bounded size."""
        life = self.life
        whole = self.ordered(queue.name)
        taken: list[Job] = []
        while len(taken) < n:
            job = life.fetch(queue)
            if job is None:  # pragma: no cover - n <= len(queue): the queue cannot run dry here
                break
            taken.append(job)
            if whole and job.key:  # the rest of its key's jobs go with it
                self.handed(queue.name, job)
                taken += [life.take(queue, rest) for rest in queue.key_jobs(job.key)]
        self._send_jobs(to, taken, pushed)

    def hand_key(self, name: bytes, key: bytes, to: str) -> None:
        """An ordered key's home asks: the jobs of `key` queued here go to
        `to`, whose consumers wait for the key's oldest, which is here
        (core/limits.py)."""
        life = self.life
        queue = life.queues.get(name)
        if queue is None or queue.fair is None or key not in queue.fair.lanes or queue.pause & PAUSE_OUT:
            return
        if not life.membership.has_link(to):
            return  # a RETRY 0 job handed to nobody would be lost
        taken = [life.take(queue, job) for job in queue.key_jobs(key)]
        if taken:
            self.handed(name, taken[0])
        self._send_jobs(to, taken, True)

    def _send_jobs(self, to: str, taken: list[Job], pushed: bool) -> None:
        """YOURJOBS of `taken` (out of their queue) to `to`, in frames of bounded size."""
        life = self.life
        batch, size = [], 0
        for job in taken:
            job.add_delivered(to)  # it may hold a copy now: GC and QUEUED must reach it
            batch.append(job_to_wire(job, life.now))
            self.jobs_exported += 1
            size += len(job.body or b"")
            if job.retry == 0:
                life.delete_job(job)
            if size >= YOURJOBS_MAX_BYTES:
                self.out.send(to, m.YourJobs(tuple(batch), pushed))
                batch, size = [], 0
        if batch:
            self.out.send(to, m.YourJobs(tuple(batch), pushed))

    # ------------------------------------------------------------ waiting consumers: pushing

    def on_waiting(self, sender: str, msg: m.Waiting) -> None:
        """A peer's consumers wait for these queues: remember them, and hand
        them what is queued here for no consumer of ours."""
        life = self.life
        until = life.now + WAIT_TTL_MS
        per_peer = self._wanted_per_peer
        self.waiting_received += len(msg.entries)
        for entry in msg.entries:
            wants = self.wanted.get(entry.queue)
            want = None if wants is None else wants.get(sender)
            if not entry.count:
                if want is not None:
                    self._forget(entry.queue, sender)
                continue
            if want is not None:
                want.count, want.until = entry.count, until
            elif per_peer.get(sender, 0) < WAIT_MAX_QUEUES:
                if wants is None:
                    wants = self.wanted[entry.queue] = {}
                wants[sender] = Want(entry.count, until)
                per_peer[sender] = per_peer.get(sender, 0) + 1
            else:
                continue  # over the cap: that queue is fed by NEEDJOBS
            queue = life.queues.get(entry.queue)
            if queue is not None and len(queue) and not queue.waiters:
                self.hand_out(queue)

    def _forget(self, name: bytes, peer: str) -> None:
        wants = self.wanted[name]
        del wants[peer]
        if not wants:
            del self.wanted[name]
        left = self._wanted_per_peer[peer] - 1
        if left:
            self._wanted_per_peer[peer] = left
        else:
            del self._wanted_per_peer[peer]

    def hand_out(self, queue: Queue) -> None:
        """Jobs queued here that no consumer here waits for go at once to the
        peers whose consumers wait for them, oldest announcement first, each
        up to its count (which this node lowers as it hands jobs out)."""
        wants = self.wanted.get(queue.name)
        if wants is None or queue.pause & PAUSE_OUT:
            return
        life = self.life
        nodes = life.membership.nodes
        peers = list(wants)
        near = life.membership.near(peers)
        if near:  # the peers of this node's zone first
            peers = near + [p for p in peers if p not in near]
        for peer in peers:
            want = wants[peer]
            if not len(queue):
                return
            if want.until <= life.now:
                self._forget(queue.name, peer)
                continue
            info = nodes.get(peer)
            if info is None or not info.link or info.flags & _SKIP_PEER:
                continue  # a RETRY 0 job handed to a node that may not get it would be lost
            n = min(want.count, len(queue))
            self._hand_over(queue, peer, n, True)
            self.jobs_pushed_out += n
            want.count -= n
            if not want.count:
                self._forget(queue.name, peer)

    # ------------------------------------------------------------ waiting consumers: announcing

    def _waiting(self, name: bytes) -> int:
        """The consumers blocked here that jobs from elsewhere would serve."""
        queue = self.life.queues.get(name)
        if queue is None or len(queue) or queue.pause & PAUSE_OUT:
            return 0
        return len(queue.waiters)

    def announce(self) -> None:
        """The end of a step: tell every peer about the queues whose waiting
        consumers grew in number, or went to none."""
        changed, self.changed = self.changed, {}
        announced = self.announced
        entries = []
        for name in changed:
            count = self._waiting(name)
            last = announced.get(name, 0)
            if count > last:
                if not last and len(announced) >= WAIT_MAX_QUEUES:
                    continue  # over the cap: that queue is fed by NEEDJOBS
                entries.append(m.WaitEntry(name, count))
            elif not count and last:
                entries.append(m.WaitEntry(name, 0))
            if count:
                announced[name] = count
            else:
                announced.pop(name, None)
        if entries:
            self._send_waiting(self.life.membership.linked_ids(features=m.FEATURE_WAITING), entries)

    def _send_waiting(self, peers: list[str], entries: list[m.WaitEntry]) -> None:
        for start in range(0, len(entries), WAIT_BATCH):
            msg = m.Waiting(tuple(entries[start : start + WAIT_BATCH]))
            for peer in peers:
                self.out.send(peer, msg)
                self.waiting_sent += len(msg.entries)

    def announcements(self) -> list[m.Waiting]:
        """Every queue announced now, for a peer that just said it reads them."""
        entries = [m.WaitEntry(name, count) for name, count in self.announced.items()]
        return [m.Waiting(tuple(entries[i : i + WAIT_BATCH])) for i in range(0, len(entries), WAIT_BATCH)]

    def cron(self) -> None:
        """Every WAIT_REFRESH_MS: announce again what still waits (so that
        a lost frame or a peer's expiry costs one period at most), and drop
        the peers' entries that were not repeated in time."""
        life = self.life
        now = life.now
        if now - self._refreshed < WAIT_REFRESH_MS:
            return
        self._refreshed = now
        for name, wants in list(self.wanted.items()):
            for peer in [p for p, want in wants.items() if want.until <= now]:
                self._forget(name, peer)
        announced = self.announced
        if announced:
            entries = []
            for name in list(announced):
                count = self._waiting(name)
                entries.append(m.WaitEntry(name, count))
                if count:
                    announced[name] = count
                else:
                    del announced[name]
            self._send_waiting(life.membership.linked_ids(features=m.FEATURE_WAITING), entries)

    # ------------------------------------------------------------ figures

    def info_fields(self) -> list[tuple[str, int]]:
        """INFO federation, and the metrics' figures."""
        members = self.life.membership
        return [
            ("needjobs_sent", self.needjobs_sent), ("needjobs_received", self.needjobs_received),
            ("jobs_exported", self.jobs_exported), ("jobs_imported", self.jobs_imported),
            ("jobs_pushed_out", self.jobs_pushed_out), ("jobs_pushed_in", self.jobs_pushed_in),
            ("waiting_sent", self.waiting_sent), ("waiting_received", self.waiting_received),
            ("waiting_queues", len(self.announced)), ("waiting_peer_queues", sum(map(len, self.wanted.values()))),
            ("peers_without_waiting", len(members.linked_ids()) - len(members.linked_ids(features=m.FEATURE_WAITING))),
        ]  # fmt: skip

    # ------------------------------------------------------------ importing

    def on_your_jobs(self, sender: str, msg: m.YourJobs) -> None:
        life = self.life
        now = life.now
        for wire in msg.jobs:
            received = job_from_wire(wire, now)
            if received.id in life.collected:  # acknowledged here and collected: the sender's copy is stale
                life.out.send(sender, m.DelJob(received.id, life.collected.acked(received.id)))
                continue
            job = life.jobs.get(received.id)
            if job is None:
                job = life.receive(received)
            job.flags &= ~BCAST_QUEUED  # moving between queues is not a requeue
            if job.retry == 0:
                job.qtime = now
            if job.state == State.ACKED or not life.enqueue(job):
                continue
            self.jobs_imported += 1
            if msg.pushed:
                self.jobs_pushed_in += 1
            queue = life.queues.get(job.queue)  # type: ignore[arg-type]
            if queue is None:  # pragma: no cover - enqueue() just created the queue
                continue
            fed = _fed(queue)
            if sender not in fed.responders:
                fed.bcast_attempt = 0
            fed.responders[sender] = now // 1000
            if now - fed.cur_start > 1000:
                fed.prev_start, fed.prev_count = fed.cur_start, fed.cur_count
                fed.cur_start, fed.cur_count = now, 0
            fed.cur_count += 1
            fed.adhoc_attempt = 0

