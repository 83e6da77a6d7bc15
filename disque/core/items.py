"""Kestrel's queue semantics over the job store (spec/kestrel.md §3-§4).

Theory of operation: an item is a job, so every front end sees the same
queues.  SET is an ADDJOB with the queue's settings (`queue-defaults` /
`queue` lines, store/queue_config.py), which bind every ADDJOB: before a job
is added, `make_room` refuses a body over `max_item_size`, and while the
queue holds `max_items` jobs or `max_size` body bytes it either refuses the
job (-MAXLEN) or, with `discard_old_when_full`, drops the oldest queued job
everywhere (as FASTACK does) and counts it as discarded; `max_age` caps the
TTL.  A queued job that expires in a queue with `move_expired_to` is added
again to that queue, with ITEM_TTL (that queue's `max_age` applies),
replicated asynchronously; only the node where it was queued does it.

Taking an item (`take`) is GETJOB for one job on one queue, then:
* a plain GET acknowledges it at once, cluster-wide, as FASTACK does: the
  item is gone for good, at most once, as in Kestrel;
* a reliable read (`/open`) leaves it active and remembers it as the
  client's open read (one per client).  `close` acknowledges it as ACKJOB
  does (the cluster-wide ACK and garbage collection); `abort`, or the
  client going away, queues it again on this node at its place by creation
  time, which is the head, since it was the oldest (counted as a NACK).  The
  job's RETRY timer keeps running meanwhile: a read held longer than RETRY,
  or a node that dies with it, gets it queued again elsewhere by Disque's
  ordinary requeue (at-least-once wins over the open read).
A waiting GET (`/t=`) blocks as GETJOB TIMEOUT does; the job it is served
later goes through the same step (`Waiter.take`).  A peek copies the oldest
queued job and takes nothing.

Fanout (spec §5): a queue named `parent+child` joins its parent's set when a
command first names it (`refer`), on any node; the node tells every node it
has a link to (FANOUT), and tells each node that links up later the whole
set, so every node knows every child.  A SET to the parent first adds a copy
to each child (ADDJOB ... ASYNC, each under the child's limits; a refused
copy is skipped), then the item itself.  DELETE of a child takes it out of
the set everywhere.  The sets live in memory: after the whole cluster
restarts, a child joins again when it is next named.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

from disque.cluster import messages as m
from disque.core import errors
from disque.core.types import BLOCKED, NIL_ARRAY, Connection
from disque.store.job import State
from disque.store.job_options import JobOptions
from disque.store.queue_config import QueueSettings, fanout_parent

if TYPE_CHECKING:
    from disque.core.acks import Acks
    from disque.core.blocking import Blocking
    from disque.core.lifecycle import Lifecycle
    from disque.core.outbox import Outbox
    from disque.store.job import Job

ITEM_TTL = 30 * 86400  # seconds: the TTL of an item SET without an expiry (a job needs one)
Answer = Callable[[Any], Any]  # a front end's reply for a GET's entry [queue, id, body], or None


class OpenReadMismatch(Exception):
    """/close or /abort names another queue than the client's open read."""


class Items:
    def __init__(self, life: Lifecycle, out: Outbox, acks: Acks, waits: Blocking, clients: dict[int, Connection]) -> None:
        self.life = life
        self.out = out
        self.acks = acks
        self.waits = waits
        self.clients = clients  # the node's, by ID (open reads)
        # Kestrel's global counters (memcache STATS)
        self.cmd_get = self.cmd_set = self.cmd_peek = self.get_hits = self.get_misses = 0
        self.children: dict[bytes, dict[bytes, None]] = {}  # fanout: parent -> its children, in joining order
        self.mover = Connection(0, addr="move_expired_to")  # adds expired jobs to their new queue (never waits)

    # ------------------------------------------------------------ fanout

    def refer(self, queue: bytes) -> None:
        """`queue` is named by a command that creates queues: a fanout child
        joins its parent's set, cluster-wide."""
        parent = fanout_parent(queue)
        if parent is not None and queue not in self.children.get(parent, ()):
            self.children.setdefault(parent, {})[queue] = None
            self.out.broadcast(self.life.membership.linked_ids(), m.Fanout(queue, True))

    def forget(self, queue: bytes) -> None:
        """DELETE: a child leaves its parent's set, cluster-wide."""
        parent = fanout_parent(queue)
        if parent is not None and self.children.get(parent, {}).pop(queue, 0) is None:
            self.out.broadcast(self.life.membership.linked_ids(), m.Fanout(queue, False))

    def on_fanout(self, sender: str, msg: m.Fanout) -> None:
        parent = fanout_parent(msg.child)
        assert parent is not None  # the codec checks the name
        if msg.joined:
            self.children.setdefault(parent, {})[msg.child] = None
        elif parent in self.children:
            self.children[parent].pop(msg.child, None)

    def fanout_messages(self) -> list[m.Fanout]:
        """Every child, for a node that just linked up."""
        return [m.Fanout(child) for children in self.children.values() for child in children]

    def copy_to_children(self, client: Connection, queue: bytes, body: bytes, ttl: int) -> None:
        """A SET to `queue`: a copy of the item to each of its children."""
        for child in self.children.get(queue, ()):
            self._add_copy(client, child, body, ttl)

    def _add_copy(self, client: Connection, queue: bytes, body: bytes, ttl: int) -> None:
        """Add `body` to `queue` as ADDJOB ... ASYNC does; a copy refused (a
        full queue, no reachable replicas now) is dropped."""
        try:
            self.life.add_job(client, queue, body, JobOptions(ttl=ttl, is_async=True))
        except errors.DisqueError:
            pass

    # ------------------------------------------------------------ limits

    def make_room(self, limits: QueueSettings, queue: bytes, body: bytes, ttl: int) -> int:
        """Apply `limits` to a job about to be added to `queue`; returns its
        TTL capped by `max_age`.  Raises -TOOLARGE or -MAXLEN."""
        if len(body) > limits.max_item_size:
            raise errors.too_large()
        existing = self.life.queues.get(queue)
        while existing is not None and limits.full(len(existing), existing.nbytes):
            if not limits.discard_old_when_full or not len(existing):
                raise errors.queue_full()
            oldest = next(existing.oldest())
            self.acks.fast_ack(oldest.id)
            existing.discarded += 1
        if limits.max_age:
            ttl = min(ttl, max(1, -(-limits.max_age // 1000)))
        return ttl

    def expired(self, job: Job) -> None:
        """A job queued here expired: `move_expired_to` of its queue."""
        target = self.life.config.queue_config.settings(job.queue).move_expired_to  # type: ignore[arg-type]
        if target is not None and job.body is not None:
            self._add_copy(self.mover, target, job.body, ITEM_TTL)

    # ------------------------------------------------------------ reads

    def take(self, client: Connection, queue: bytes, timeout_ms: int, reliable: bool, answer: Answer) -> Any:
        """GET: takes the oldest job of `queue`, waiting up to `timeout_ms`
        (0: no wait) if there is none; the reply is `answer(entry)` with the
        job's GETJOB entry [queue, id, body], or `answer(None)` when none came
        (BLOCKED meanwhile)."""
        reply = self.waits.get_jobs(client, [queue], 1, timeout_ms == 0, False, timeout_ms)
        if reply is BLOCKED:
            assert client.waiter is not None
            client.waiter.take = lambda job: self._taken(client, job, reliable, answer)
            return BLOCKED
        job = None if reply is NIL_ARRAY else self.life.jobs.get(reply[0][1])
        return self._taken(client, job, reliable, answer)

    def _taken(self, client: Connection, job: Job | None, reliable: bool, answer: Answer) -> Any:
        """What a GET does with the job it got (None: none came)."""
        if job is None:
            self.get_misses += 1
            return answer(None)
        self.get_hits += 1
        entry = self.waits.job_entry(job, False)
        if reliable:
            client.open_read = (job.queue, job.id)  # type: ignore[assignment]
        else:
            self.acks.fast_ack(job.id)
        return answer(entry)

    def open_reads(self, queue: bytes) -> int:
        """Clients holding an open read on `queue` (STATS open_transactions)."""
        return sum(1 for c in self.clients.values() if c.open_read is not None and c.open_read[0] == queue)

    def flush(self, queue: bytes) -> None:
        """FLUSH and DELETE: every job queued in `queue` here is taken away
        everywhere, as FASTACK does (open reads are left alone)."""
        found = self.life.queues.get(queue)
        while found is not None and (batch := list(islice(found.oldest(), 1000))):  # a tail on disk: not all at once
            if not sum(self.acks.fast_ack(job.id) for job in batch):
                break  # what is left cannot be read now (read-behind's disk failing)

    def peek(self, queue: bytes, answer: Answer) -> Any:
        """`answer` with the entry of the job a GET of `queue` would take now (None: none)."""
        found = self.life.queues.get(queue)
        life = self.life
        job = next(found.oldest(life.now, life.config.priority_aging), None) if found is not None else None  # GET's next
        return answer(None if job is None else self.waits.job_entry(job, False))

    def close(self, client: Connection, queue: bytes) -> None:
        """/close: acknowledge the client's open read on `queue` (none: nothing)."""
        job_id = self._open_read(client, queue)
        if job_id is not None:
            self.acks.ack_job(job_id)

    def abort(self, client: Connection, queue: bytes | None = None) -> None:
        """/abort (or the client going away, `queue` None): the open read
        goes back to its queue here, at the head (an at-most-once job that
        was delivered stays out, as NACK leaves it)."""
        job_id = self._open_read(client, queue)
        job = self.life.jobs.get(job_id) if job_id is not None else None
        if job is not None and job.state == State.ACTIVE:
            self.life.enqueue(job, nack=True)

    @staticmethod
    def _open_read(client: Connection, queue: bytes | None) -> bytes | None:
        """End the client's open read, if it is on `queue` (None: any)."""
        if client.open_read is None:
            return None
        name, job_id = client.open_read
        if queue is not None and name != queue:
            raise OpenReadMismatch
        client.open_read = None
        return job_id

    # ------------------------------------------------------------ figures

    def info_fields(self) -> list[tuple[str, int]]:
        """INFO kestrel."""
        return [
            ("cmd_get", self.cmd_get), ("cmd_set", self.cmd_set), ("cmd_peek", self.cmd_peek),
            ("get_hits", self.get_hits), ("get_misses", self.get_misses),
            ("open_reads", sum(1 for c in self.clients.values() if c.open_read is not None)),
            ("fanout_children", sum(map(len, self.children.values()))),
        ]  # fmt: skip

    def queue_names(self) -> list[bytes]:
        """The queues this node knows, by name (STATS, DUMP_STATS, DUMP_CONFIG)."""
        return sorted(q.name for q in self.life.queues.values())

    def queue_stats(self) -> list[tuple[bytes, dict[str, Any]]]:
        """Kestrel's per-queue figures; `mem_*` leave out the jobs read-behind keeps on disk."""
        out = []
        for name in self.queue_names():
            q = self.life.queues.get(name)
            assert q is not None
            items, nbytes = len(q), q.nbytes
            disk_items, disk_bytes = q.on_disk()
            out.append((name, {
                "items": items, "bytes": nbytes, "total_items": q.jobs_in, "logsize": 0,
                "expired_items": q.expired, "mem_items": items - disk_items,
                "mem_bytes": nbytes - disk_bytes,
                "age": q.last_wait if nbytes else 0, "discarded": q.discarded, "waiters": len(q.waiters),
                "open_transactions": self.open_reads(name),
            } | ({"children": list(self.children[name])} if name in self.children else {})))  # fmt: skip
        return out

    def global_stats(self, version: str, start_ms: int, net_in: int, net_out: int) -> dict[str, Any]:
        life = self.life
        queues = self.queue_stats()
        return {
            "uptime": (life.now - start_ms) // 1000, "time": life.now // 1000, "version": version,
            "curr_items": sum(q["items"] for _, q in queues), "total_items": sum(q["total_items"] for _, q in queues),
            "bytes": sum(q["bytes"] for _, q in queues), "curr_connections": len(self.clients),
            "total_connections": self.life.stats.connections, "cmd_get": self.cmd_get, "cmd_set": self.cmd_set,
            "cmd_peek": self.cmd_peek, "get_hits": self.get_hits, "get_misses": self.get_misses,
            "bytes_read": net_in, "bytes_written": net_out,
        }  # fmt: skip
