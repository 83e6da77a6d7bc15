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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disque.cluster import messages as m
from disque.cluster.codec import job_from_wire, job_to_wire
from disque.store.job import BCAST_QUEUED, State
from disque.store.queue import PAUSE_OUT, Queue

if TYPE_CHECKING:
    from disque.core.services import Node

RESPONDER_TTL_S = 5
YOURJOBS_MAX_BYTES = 32 << 20  # keep frames well under the codec's limit
# need_jobs reasons (spec/cluster.md §9.1)
CLIENTS_WAITING = 0
REACHED_ZERO = 1


@dataclass(slots=True)
class QueueFed:
    bcast_time: int = 0
    bcast_attempt: int = 0
    adhoc_time: int = 0
    adhoc_attempt: int = 0
    responders: dict[str, int] = field(default_factory=dict)  # node id -> unix s
    cur_start: int = 0
    cur_count: int = 0
    prev_start: int = 0
    prev_count: int = 0


def _fed(queue: Queue) -> QueueFed:
    if queue.federation is None:
        queue.federation = QueueFed()
    return queue.federation


class Federation:
    def __init__(self, node: Node) -> None:
        self.node = node
        # Counters (INFO-like figures, metrics): NEEDJOBS sent, jobs handed out
        # with YOURJOBS, jobs received and queued here.
        self.needjobs_sent = 0
        self.jobs_exported = 0
        self.jobs_imported = 0

    # ------------------------------------------------------------ import rate

    def import_rate(self, queue: Queue) -> int:
        fed = queue.federation
        now = self.node.now
        if fed is None or not fed.cur_start or now - fed.cur_start > 5000:
            return 0
        elapsed = max(50, now - (fed.prev_start or fed.cur_start))
        return math.ceil((fed.prev_count + fed.cur_count) * 1000 / elapsed)

    def import_from(self, queue: Queue) -> list[str]:
        fed = queue.federation
        return [] if fed is None else self._responders(fed)

    def _responders(self, fed: QueueFed) -> list[str]:
        horizon = self.node.now // 1000 - RESPONDER_TTL_S
        for node_id in [n for n, t in fed.responders.items() if t < horizon]:
            del fed.responders[node_id]
        return list(fed.responders)

    # ------------------------------------------------------------ asking

    def need_jobs(self, queue: Queue, reason: int) -> None:
        node = self.node
        if node.cluster.leaving or node.cluster.size() == 1:
            return
        rate = self.import_rate(queue)
        if reason == REACHED_ZERO and rate == 0:
            return
        fed = _fed(queue)
        responders = self._responders(fed)
        to_fetch = min(100, max(5, rate // len(responders) if responders else 5))
        now = node.now
        if now - fed.bcast_time > min(2000 * 2**fed.bcast_attempt, 30_000):
            fed.bcast_time = now
            fed.bcast_attempt += 1
            for node_id in node.cluster.linked_ids():
                node.send(node_id, m.NeedJobs(queue.name, 1))
                self.needjobs_sent += 1
        if responders and (reason == REACHED_ZERO or now - fed.adhoc_time > min(25 * 2**fed.adhoc_attempt, 2000)):
            fed.adhoc_time = now
            fed.adhoc_attempt += 1
            for node_id in responders:
                node.send(node_id, m.NeedJobs(queue.name, to_fetch))
                self.needjobs_sent += 1

    # ------------------------------------------------------------ answering

    def on_need_jobs(self, sender: str, msg: m.NeedJobs) -> None:
        node = self.node
        queue = node.queues.get(msg.queue)
        if queue is None or not len(queue) or self.import_rate(queue) > 0 or queue.pause & PAUSE_OUT:
            return
        if not node.cluster.has_link(sender):
            return  # checked first: a RETRY 0 job handed to nobody would be lost
        n = msg.count
        if len(queue) < 2 * n:
            n = len(queue) // 2
        n = max(n, 1)
        batch, size = [], 0
        for _ in range(n):
            job = node.fetch(queue)
            if job is None:  # pragma: no cover - n <= len(queue): the queue cannot run dry here
                break
            job.add_delivered(sender)  # it may hold a copy now: GC and QUEUED must reach it
            batch.append(job_to_wire(job, node.now))
            self.jobs_exported += 1
            size += len(job.body or b"")
            if job.retry == 0:
                node.delete_job(job)
            if size >= YOURJOBS_MAX_BYTES:
                node.send(sender, m.YourJobs(tuple(batch)))
                batch, size = [], 0
        if batch:
            node.send(sender, m.YourJobs(tuple(batch)))

    # ------------------------------------------------------------ importing

    def on_your_jobs(self, sender: str, msg: m.YourJobs) -> None:
        node = self.node
        now = node.now
        for wire in msg.jobs:
            received = job_from_wire(wire, now)
            job = node.jobs.get(received.id)
            if job is None:
                job = node.adopt(received)
            job.flags &= ~BCAST_QUEUED  # moving between queues is not a requeue
            if job.retry == 0:
                job.qtime = now
            if job.state == State.ACKED or not node.enqueue(job):
                continue
            self.jobs_imported += 1
            queue = node.queues.get(job.queue)  # type: ignore[arg-type]
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

