"""Queues: jobs ordered by creation time, pause flags, counters, blocked clients.

Theory of operation: a queue holds the jobs in state `queued` whose `queue`
field names it, ordered by `(ctime, id)` (spec/cluster.md §8.3).  New local jobs
arrive in ctime order, so the common insert is an append to a deque; an older
job (a requeue, an import) is placed with a bisect.  Removing a job from the
middle (DEQUEUE, an ACK, a QUEUED message) does not touch the deque: the entry
becomes a tombstone, recognised because its job is no longer `queued`, and is
dropped when it reaches the front or when tombstones outnumber live entries.
A job re-queued while its tombstone is still in the deque revives that entry,
which is already in the right place; the `IN_LIST` job flag tells the two
cases apart.  `len(queue)` counts live entries only.

With read-behind (core/read_behind.py) the newest jobs of a long queue may
live on disk: `tail` (store/spill.py) lists them, in order, after the jobs
in memory (the *head*, `_items`).  `len(queue)` and `nbytes` count both;
`pop` takes from the head only, so whoever pops first makes sure the head
holds the oldest job (`first` against the tail's front).  `oldest` and
`newest` merge the two, reading tail jobs through `tail.read` without
loading them.

Blocked GETJOB clients wait in `waiters`, an insertion-ordered dict, so they
are served in arrival order.  `Federation` state (NEEDJOBS/YOURJOBS policy)
is attached lazily by the cluster layer.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

from disque.store.job import IN_LIST, Job, State
from disque.store.spill import Tail

S_WAIT_REPL, S_ACTIVE, S_QUEUED, S_ACKED = State.WAIT_REPL, State.ACTIVE, State.QUEUED, State.ACKED

PAUSE_IN: Final = 1
PAUSE_OUT: Final = 2
PAUSE_NAMES = {0: "none", PAUSE_IN: "in", PAUSE_OUT: "out", PAUSE_IN | PAUSE_OUT: "all"}

_COMPACT_MIN = 64  # below this many tombstones compaction is not worth it
_key = Job.sort_key  # queue order: creation time, then ID


class Queue:
    __slots__ = (
        "name", "_items", "_live", "ctime", "atime", "pause", "waiters",
        "jobs_in", "jobs_out", "nacks", "redeliveries", "dead_lettered", "federation",
        "nbytes", "expired", "discarded", "last_wait", "tail",
    )  # fmt: skip

    def __init__(self, name: bytes, now_ms: int) -> None:
        self.name = name
        self._items: deque[Job] = deque()
        self._live = 0
        self.ctime = now_ms
        self.atime = now_ms
        self.pause = 0
        self.waiters: dict[int, Any] = {}
        self.jobs_in = 0
        self.jobs_out = 0
        self.nacks = 0  # jobs queued again here by NACK
        self.redeliveries = 0  # ... and by their retry timer (additional deliveries)
        self.dead_lettered = 0  # jobs moved out of it to their dead-letter queue (MAXATTEMPTS)
        self.federation: Any = None
        # Kestrel's figures (memcache STATS): body bytes queued, jobs that
        # expired while queued, dropped by discard_old_when_full,
        # and how long the last job taken had waited (ms).
        self.nbytes = 0
        self.expired = 0
        self.discarded = 0
        self.last_wait = 0
        self.tail: Tail | None = None

    def __len__(self) -> int:
        return self._live

    def head_live(self) -> int:
        return self._live - (self.tail.live if self.tail is not None else 0)

    def push(self, job: Job) -> None:
        """Insert a job already moved to `queued`."""
        self._live += 1
        self.nbytes += len(job.body or b"")
        if job.flags & IN_LIST:
            return  # its tombstone is revived in place
        job.flags |= IN_LIST
        items = self._items
        last = items[-1] if items else None
        if last is None or _key(last) < _key(job):
            items.append(job)
        else:
            items.insert(bisect_right(items, _key(job), key=_key), job)

    def pop(self) -> Job | None:
        """Remove and return the oldest queued job (caller moves its state)."""
        items = self._items
        while items:
            job = items.popleft()
            job.flags &= ~IN_LIST
            if job.state == S_QUEUED:
                self._live -= 1
                self.nbytes -= len(job.body or b"")
                return job
        return None

    def discard(self, job: Job) -> None:
        """Forget a job that is leaving the `queued` state (lazily)."""
        self._live -= 1
        self.nbytes -= len(job.body or b"")
        live = self.head_live()
        if len(self._items) - live > max(_COMPACT_MIN, live):
            self._compact()

    def first(self) -> Job | None:
        """The oldest queued job of the head (tombstones in front go)."""
        items = self._items
        while items:
            job = items[0]
            if job.state == S_QUEUED:
                return job
            items.popleft().flags &= ~IN_LIST
        return None

    def pop_newest(self) -> Job:
        """Take out the job `newest_in_head` just returned, to move it to
        the tail: it stays counted (the caller lists it there)."""
        job = self._items.pop()
        job.flags &= ~IN_LIST
        return job

    def newest_in_head(self) -> Job | None:
        items = self._items
        while items and items[-1].state != S_QUEUED:
            items.pop().flags &= ~IN_LIST
        return items[-1] if items else None

    def lose(self, nbytes: int) -> None:
        """A job of the tail is gone without coming back (a damaged record)."""
        self._live -= 1
        self.nbytes -= nbytes

    def promote(self, job: Job) -> None:
        """A job of the tail, loaded back, joins the head at its place."""
        job.flags |= IN_LIST
        items = self._items
        if not items or _key(items[-1]) < _key(job):
            items.append(job)
        else:
            items.insert(bisect_right(items, _key(job), key=_key), job)

    def _compact(self) -> None:
        kept: deque[Job] = deque()
        for job in self._items:
            if job.state == S_QUEUED:
                kept.append(job)
            else:
                job.flags &= ~IN_LIST
        self._items = kept

    def oldest(self) -> Iterator[Job]:
        head = (j for j in self._items if j.state == S_QUEUED)
        tail = self.tail
        if tail is None or not tail.live:
            return head
        return heapq.merge(head, tail.jobs(tail.oldest()), key=_key)

    def newest(self) -> Iterator[Job]:
        head = (j for j in reversed(self._items) if j.state == S_QUEUED)
        tail = self.tail
        if tail is None or not tail.live:
            return head
        return heapq.merge(head, tail.jobs(tail.newest()), key=_key, reverse=True)

    def drain(self) -> list[Job]:
        """Remove every entry of the head; returns its live jobs (for
        flushes: the tail was emptied before)."""
        live = [j for j in self._items if j.state == S_QUEUED]
        for job in self._items:
            job.flags &= ~IN_LIST
        self._items.clear()
        self._live = self.nbytes = 0
        return live

