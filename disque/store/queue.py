"""Queues: jobs ordered by priority and creation time, pause flags, counters, blocked clients.

Theory of operation: a queue holds the jobs in state `queued` whose `queue`
field names it, in one `Level` per job priority present (most queues: one),
highest first.  A level is ordered by `(ctime, id)` (spec/cluster.md §8.3).
`pop` serves the level whose front job ranks first: the highest *effective*
priority, a job's own raised by one for each `aging` period it has waited
since its creation (at most to MAX_PRIORITY), then the oldest.  Within a
level the front job is the oldest, so it has aged the most: comparing the
fronts is enough, and no job ever moves between levels (spec/commands.md
§4.1.1).  A queue of one level skips the comparison.

Within a level: new local jobs
arrive in ctime order, so the common insert is an append to a deque; an older
job (a requeue, an import) is placed with a bisect.  Removing a job from the
middle (DEQUEUE, an ACK, a QUEUED message) does not touch the deque: the entry
becomes a tombstone, recognised because its job is no longer `queued`, and is
dropped when it reaches the front or when tombstones outnumber live entries.
A job re-queued while its tombstone is still in the deque revives that entry,
which is already in the right place; the `IN_LIST` job flag tells the two
cases apart.  `len(queue)` counts live entries only.

With read-behind (core/read_behind.py) the newest jobs of a long level may
live on disk: its `tail` (store/spill.py) lists them, in order, after the
jobs in memory (the *head*, `items`).  `len(queue)` and `nbytes` count both;
`pop` takes from the heads only, so whoever pops first makes sure each head
holds its level's oldest job (`first` against the tail's front).  `oldest`
and `newest` merge the two, reading tail jobs through `tail.read` without
loading them, and the levels in serving order.

Keyed jobs (ADDJOB ... KEY) are kept apart, in `fair` (a `Fair`, made with
the queue's first keyed job): one level per key (its priority unused: keys
take turns), and `turns`, the keys in the order they are served next, the
queue's plain jobs (its levels) taking one turn among them as if they were
one key (`PLAIN`).  `pop` serves the key whose turn it is and moves it to
the end: a key with 100,000 jobs queued and one with 10 take turns, one job
each (docs/keys.md, "Fair GETJOB").  A key's level with no live job is
dropped when its turn comes.  Keyed jobs stay in memory (read-behind spills
the plain levels' tails only); `oldest` and `newest` list them with the
plain ones by creation time; `fronts` lists each key's oldest, in turns,
for a queue whose keys are limited (ordered, concurrency-per-key).

Blocked GETJOB clients wait in `waiters`, an insertion-ordered dict, so they
are served in arrival order.  `Federation` state (NEEDJOBS/YOURJOBS policy)
is attached lazily by the cluster layer.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any, Final

from disque.store.job import IN_LIST, MAX_PRIORITY, Job, State
from disque.store.spill import Tail

S_WAIT_REPL, S_ACTIVE, S_QUEUED, S_ACKED = State.WAIT_REPL, State.ACTIVE, State.QUEUED, State.ACKED

PAUSE_IN: Final = 1
PAUSE_OUT: Final = 2
PAUSE_NAMES = {0: "none", PAUSE_IN: "in", PAUSE_OUT: "out", PAUSE_IN | PAUSE_OUT: "all"}

_COMPACT_MIN = 64  # below this many tombstones compaction is not worth it
_key = Job.sort_key  # queue order: creation time, then ID


class Level:
    """The queued jobs of one priority: the head in memory, the tail on disk."""

    __slots__ = ("priority", "items", "live", "tail")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.items: deque[Job] = deque()
        self.live = 0  # live entries, head and tail
        self.tail: Tail | None = None

    def head_live(self) -> int:
        return self.live - (self.tail.live if self.tail is not None else 0)

    def push(self, job: Job) -> None:
        self.live += 1
        if job.flags & IN_LIST:
            return  # its tombstone is revived in place
        self.promote(job)

    def pop(self) -> Job | None:
        items = self.items
        while items:
            job = items.popleft()
            job.flags &= ~IN_LIST
            if job.state == S_QUEUED:
                self.live -= 1
                return job
        return None

    def discard(self) -> None:
        """One of its jobs left the `queued` state (lazily)."""
        self.live -= 1
        live = self.head_live()
        if len(self.items) - live > max(_COMPACT_MIN, live):
            self._compact()

    def first(self) -> Job | None:
        """The oldest queued job of the head (tombstones in front go)."""
        items = self.items
        while items:
            job = items[0]
            if job.state == S_QUEUED:
                return job
            items.popleft().flags &= ~IN_LIST
        return None

    def pop_newest(self) -> Job:
        """Take out the job `newest_in_head` just returned, to move it to
        the tail: it stays counted (the caller lists it there)."""
        job = self.items.pop()
        job.flags &= ~IN_LIST
        return job

    def newest_in_head(self) -> Job | None:
        items = self.items
        while items and items[-1].state != S_QUEUED:
            items.pop().flags &= ~IN_LIST
        return items[-1] if items else None

    def promote(self, job: Job) -> None:
        """Place a job in the head by creation time (a new one is the
        newest: an append; a job of the tail loaded back, a requeue: a bisect)."""
        job.flags |= IN_LIST
        items = self.items
        last = items[-1] if items else None
        # _key(last) < _key(job), spelt out: native comparisons, no tuples
        if last is None or last.ctime < job.ctime or (last.ctime == job.ctime and last.id < job.id):
            items.append(job)
        else:
            items.insert(bisect_right(items, _key(job), key=_key), job)

    def _compact(self) -> None:
        kept: deque[Job] = deque()
        for job in self.items:
            if job.state == S_QUEUED:
                kept.append(job)
            else:
                job.flags &= ~IN_LIST
        self.items = kept

    def oldest(self) -> Iterator[Job]:
        head = (j for j in self.items if j.state == S_QUEUED)
        tail = self.tail
        if tail is None or not tail.live:
            return head
        return heapq.merge(head, tail.jobs(tail.oldest()), key=_key)

    def newest(self) -> Iterator[Job]:
        head = (j for j in reversed(self.items) if j.state == S_QUEUED)
        tail = self.tail
        if tail is None or not tail.live:
            return head
        return heapq.merge(head, tail.jobs(tail.newest()), key=_key, reverse=True)

    def drain(self) -> list[Job]:
        live = [j for j in self.items if j.state == S_QUEUED]
        for job in self.items:
            job.flags &= ~IN_LIST
        self.items.clear()
        self.live = 0
        return live


PLAIN: Final = b""  # the turn of a queue's plain jobs among its keys (no key is empty: b"" is no key)


class Fair:
    """A queue's keyed jobs: one level per key, the keys served in turn."""

    __slots__ = ("lanes", "turns", "live")

    def __init__(self) -> None:
        self.lanes: dict[bytes, Level] = {}
        self.turns: dict[bytes, None] = {PLAIN: None}  # an ordered set: the first key is served next
        self.live = 0

    def push(self, job: Job) -> None:
        key = job.key
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Level(0)
            self.turns[key] = None
        lane.push(job)
        self.live += 1

    def next_turn(self) -> bytes:
        """The key whose turn it is, moved to the end of the turns."""
        turns = self.turns
        key = next(iter(turns))
        del turns[key]
        turns[key] = None
        return key

    def pop(self, key: bytes) -> Job | None:
        """The oldest job of `key` (None: it had none left, and is dropped)."""
        lane = self.lanes[key]
        job = lane.pop()
        if job is None:
            lane.drain()  # its tombstones must not be revived in a level no longer listed
            del self.lanes[key]
            del self.turns[key]
            return None
        self.live -= 1
        return job

    def discard(self, job: Job) -> None:
        self.live -= 1
        self.lanes[job.key].discard()

    def busiest(self, count: int) -> tuple[int, list[tuple[bytes, int]]]:
        """How many keys have jobs queued, and the `count` of them with the
        most (ties: by key), each with its count: one pass over the keys,
        none over the jobs (QKEYS, docs/keys.md "Watching keys")."""
        waiting = [(-lane.live, key) for key, lane in self.lanes.items() if lane.live]  # sorted as they are: no key function
        return len(waiting), [(key, -minus) for minus, key in heapq.nsmallest(count, waiting)]

    def oldest(self) -> Iterator[Job]:
        return heapq.merge(*(lane.oldest() for lane in self.lanes.values()), key=_key)

    def newest(self) -> Iterator[Job]:
        return heapq.merge(*(lane.newest() for lane in self.lanes.values()), key=_key, reverse=True)

    def drain(self) -> list[Job]:
        live = [job for lane in self.lanes.values() for job in lane.drain()]
        self.lanes.clear()
        self.turns = {PLAIN: None}
        self.live = 0
        return live


def effective(job: Job, now_ms: int, aging: int) -> int:
    """A job's priority once aged: one level up per `aging` ms it has waited since its creation."""
    if not aging or job.priority >= MAX_PRIORITY:
        return job.priority
    return min(MAX_PRIORITY, job.priority + max(0, now_ms - job.ctime // 1_000_000) // aging)


def rank(now_ms: int, aging: int) -> Callable[[Job], tuple[int, int, bytes]]:
    """The serving order at `now_ms`: effective priority, then creation."""
    return lambda job: (-effective(job, now_ms, aging), job.ctime, job.id)


class Queue:
    __slots__ = (
        "name", "levels", "_live", "ctime", "atime", "pause", "waiters",
        "jobs_in", "jobs_out", "nacks", "redeliveries", "dead_lettered", "federation",
        "nbytes", "expired", "discarded", "last_wait", "fetched", "fair",
    )  # fmt: skip

    def __init__(self, name: bytes, now_ms: int) -> None:
        self.name = name
        self.levels: list[Level] = []  # highest priority first
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
        self.fetched = 0  # ms when a job was last taken out here for delivery (GETJOB, YOURJOBS): 0, never
        self.fair: Fair | None = None  # its keyed jobs, once it has had one

    def __len__(self) -> int:
        return self._live

    def level(self, priority: int) -> Level:
        """The level of `priority`, made (at its place) if the queue has none."""
        levels = self.levels
        for level in levels:
            if level.priority == priority:
                return level
        made = Level(priority)
        i = 0
        while i < len(levels) and levels[i].priority > priority:
            i += 1
        levels.insert(i, made)
        return made

    def push(self, job: Job) -> None:
        """Insert a job already moved to `queued`."""
        self._live += 1
        self.nbytes += len(job.body or b"")
        rare = job.rare
        if rare is not None and rare.key:
            if self.fair is None:
                self.fair = Fair()
            self.fair.push(job)
            return
        levels = self.levels
        if levels and levels[0].priority == job.priority:  # most queues: their one level
            levels[0].push(job)
        else:
            self.level(job.priority).push(job)

    def pop(self, now_ms: int = 0, aging: int = 0) -> Job | None:
        """Remove and return the job to serve first (caller moves its state)."""
        fair = self.fair
        if fair is not None and fair.live:
            return self._pop_fair(fair, now_ms, aging)
        return self._pop_plain(now_ms, aging)

    def _pop_fair(self, fair: Fair, now_ms: int, aging: int) -> Job | None:
        """The job of the key whose turn it is (the plain jobs' turn: theirs)."""
        while True:
            key = fair.next_turn()
            if key == PLAIN:
                job = self._pop_plain(now_ms, aging) if self._live > fair.live else None
            else:
                job = fair.pop(key)
                if job is not None:
                    self._live -= 1
                    self.nbytes -= len(job.body or b"")
            if job is not None:
                return job

    def _pop_plain(self, now_ms: int, aging: int) -> Job | None:
        levels = self.levels
        if not levels:
            return None
        level = levels[0] if len(levels) == 1 else self._best(now_ms, aging)
        job = level.pop()
        if job is None:
            return None
        self._live -= 1
        self.nbytes -= len(job.body or b"")
        if not level.live and level.tail is None and len(levels) > 1:
            level.drain()  # its tombstones must not be revived in a level the queue no longer lists
            levels.remove(level)
        return job

    def _best(self, now_ms: int, aging: int) -> Level:
        """The level whose head front ranks first (the first level if no head has a job)."""
        best = self.levels[0]
        best_key: tuple[int, int, bytes] | None = None
        key = rank(now_ms, aging)
        for level in self.levels:
            job = level.first()
            if job is not None and (best_key is None or key(job) < best_key):
                best, best_key = level, key(job)
        return best

    def discard(self, job: Job) -> None:
        """Forget a job that is leaving the `queued` state (lazily)."""
        self._live -= 1
        self.nbytes -= len(job.body or b"")
        rare = job.rare
        if rare is not None and rare.key:
            self.fair.discard(job)  # type: ignore[union-attr]
        else:
            self.level(job.priority).discard()

    def lose(self, level: Level, nbytes: int) -> None:
        """A job of a tail is gone without coming back (a damaged record)."""
        level.live -= 1
        self._live -= 1
        self.nbytes -= nbytes

    def has_tail(self) -> bool:
        for level in self.levels:
            if level.tail is not None:
                return True
        return False

    def on_disk(self) -> tuple[int, int]:
        """(jobs, body bytes) its tails list."""
        jobs = nbytes = 0
        for level in self.levels:
            if level.tail is not None:
                jobs += level.tail.live
                nbytes += level.tail.nbytes
        return jobs, nbytes

    def head_live(self) -> int:
        return sum(level.head_live() for level in self.levels)

    def oldest(self, now_ms: int = 0, aging: int = 0) -> Iterator[Job]:
        """The queued jobs in serving order at `now_ms` (aged by `aging`;
        0: by their own priority), the tails' read without loading them;
        with keyed jobs, by creation time."""
        fair = self.fair
        if fair is not None and fair.live:
            return heapq.merge(self._oldest_plain(now_ms, aging), fair.oldest(), key=_key)
        return self._oldest_plain(now_ms, aging)

    def _oldest_plain(self, now_ms: int, aging: int) -> Iterator[Job]:
        levels = self.levels
        if len(levels) == 1:
            return levels[0].oldest()
        if not aging:
            return chain.from_iterable(level.oldest() for level in levels)
        return heapq.merge(*(level.oldest() for level in levels), key=rank(now_ms, aging))

    def newest(self, now_ms: int = 0, aging: int = 0) -> Iterator[Job]:
        """`oldest` backwards."""
        fair = self.fair
        if fair is not None and fair.live:
            return heapq.merge(self._newest_plain(now_ms, aging), fair.newest(), key=_key, reverse=True)
        return self._newest_plain(now_ms, aging)

    def _newest_plain(self, now_ms: int, aging: int) -> Iterator[Job]:
        levels = self.levels
        if len(levels) == 1:
            return levels[0].newest()
        if not aging:
            return chain.from_iterable(level.newest() for level in reversed(levels))
        return heapq.merge(*(level.newest() for level in reversed(levels)), key=rank(now_ms, aging), reverse=True)

    def fronts(self, now_ms: int = 0, aging: int = 0) -> Iterator[Job]:
        """The jobs a per-key limit chooses among (core/limits.py): with
        keyed jobs, each key's oldest in the order of the turns (the plain
        jobs' first in serving order at theirs), so a key held back holds
        back no other; without, the queue in serving order."""
        fair = self.fair
        if fair is None or not fair.live:
            return self._oldest_plain(now_ms, aging)
        return self._fronts(fair, now_ms, aging)

    def _fronts(self, fair: Fair, now_ms: int, aging: int) -> Iterator[Job]:
        for key in list(fair.turns):
            job = next(self._oldest_plain(now_ms, aging) if key == PLAIN else fair.lanes[key].oldest(), None)
            if job is not None:
                yield job

    def key_jobs(self, key: bytes) -> list[Job]:
        """The queued jobs of `key`, oldest first (a key one of whose jobs was just taken)."""
        return list(self.fair.lanes[key].oldest())  # type: ignore[union-attr]

    def served(self, job: Job) -> None:
        """`job`, one of `fronts`, was taken: its key's turn goes to the end."""
        fair = self.fair
        if fair is not None:
            del fair.turns[job.key]
            fair.turns[job.key] = None

    def eldest(self) -> Job | None:
        """The queued job created first, whatever its priority or key."""
        lanes = [*self.levels, *(self.fair.lanes.values() if self.fair is not None else ())]
        fronts = [job for job in (next(level.oldest(), None) for level in lanes) if job is not None]
        return min(fronts, key=_key, default=None)

    def drain(self) -> list[Job]:
        """Remove every entry of the heads; returns their live jobs (for
        flushes: the tails were emptied before)."""
        live = [job for level in self.levels for job in level.drain()]
        self.levels.clear()
        if self.fair is not None:
            live += self.fair.drain()
        self._live = self.nbytes = 0
        return live
