"""Read-behind: queues larger than memory.

Theory of operation: past a memory budget, whole job records leave memory
for the body segments (shell/segments.py, injected as `bodies`), and only a
compact slot per job stays (store/spill.py, about 88 bytes).  The memory
account counts the index as allocated (`SpillIndex.nbytes`, `held`), and a
job's small objects stay counted after it moved (`Memory.to_disk`: the
allocator keeps them for the jobs that come after).  Two kinds of jobs
move:

* the newest *queued* jobs of a queue, into its `Tail`, once the queue's
  jobs in memory pass its `max_memory_size` (Kestrel's setting) or the node
  passes `job-memory-limit` (default half of `maxmemory`).  While a queue
  has a tail, new jobs newer than the tail join it, as Kestrel's journal
  takes new items in read-behind, and while the node is over its budget
  the head's newest jobs go into the tail at their place by creation time
  (the slots of a large backlog count too): jobs queued again by a
  requeue fall among the tail's jobs, not only before them; the head
  keeps the oldest jobs;
* *active copies* received from peers (replicas) and replayed from the AOF,
  while the node is over its budget.

Nothing is moved in the middle of an operation: the core only notes the
queues that grew and the copies that arrived, and `settle()` moves jobs at
the end of each step (command, bus message, tick), so no caller ever holds
a job object that left the registry.  The way back is `load`: any lookup by
ID (`JobStore.get`, so ACKJOB, SHOW, every bus message about the job) loads
the job back into memory as it was, a queued one into its place in the
head; an active copy loaded back goes to disk again at the end of the step
if it still may (its timers bring it back once per requeue period).  A
WILLQUEUE about a queued job on disk only reads it (`JobStore.peek`):
replicas ask about every job once per retry period, and a backlog must not
come back into memory for that.  `fetch` first makes the head's front the queue's oldest job, and
after a step that took jobs the head is refilled to `prefetch` jobs from the
tail, so a GETJOB finds its job in memory (a *hit*) unless a burst emptied
the head (a *miss*: that GETJOB reads the disk itself).

Time goes on for jobs on disk: each slot has a second in the index's wheel
(a queued job's expiry; an active copy's next timer, its requeue or its
expiry) when it is loaded back and the scheduler handles it as usual.

Budget hysteresis: the node spills from the moment it passes its limit
until a tenth of the room for jobs (the limit less the idle process) is
free again; a queue without a tail starts one only
when over its own limit or the node's, and keeps `prefetch` jobs in memory.
Past a high mark a queue moves what it must at once; what the hysteresis
adds below it goes at most SPILL_STEP jobs per SPILL_STEP_MS, the rest in
later steps (a tick is one): a node passing its budget under a pipelined
load must not stop for the time a tenth of its memory takes to write.
`read-behind force` spills as if always over budget (the test suite's
switch): every queue keeps only `prefetch` jobs in memory, every replica
goes to disk.

Failures: a body store that cannot write keeps the records in memory and
reports why (`error`): no more jobs are spilled and writes answer -MISCONF
until a write succeeds.  A read that fails (I/O error) leaves the job on
disk and answers as if it were not here for this step (-MISCONF meanwhile);
a record that fails its checksum is a lost local copy, logged and counted,
as a damaged AOF record would be.
"""

from __future__ import annotations

import heapq
import logging
from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from disque.store.records import DecodeError, decode_storage, encode_storage
from disque.store.job import BCAST_WILLQUEUE, DEQUEUE, EVENT, IN_LIST, Job, State
from disque.store.spill import IN_TAIL, LIVE, REPLAYED_QUEUED, SLOT_BYTES, UNJOURNALED, SpillCorrupt, SpillIndex, Tail

if TYPE_CHECKING:
    from disque.core.lifecycle import Lifecycle
    from disque.core.types import BodyStore
    from disque.store.queue import Level, Queue

log = logging.getLogger("disque.read_behind")

S_ACTIVE, S_QUEUED = State.ACTIVE, State.QUEUED
MAX_LOADS_PER_TICK = 10_000
# Below the budget's high marks, what the hysteresis adds goes to disk at
# most SPILL_STEP jobs per SPILL_STEP_MS, the rest in later steps.
SPILL_STEP, SPILL_STEP_MS = 1_024, 50
COMPACT_SLOTS_PER_TICK = 20_000


SORT_RUN = 1 << 16  # slots sorted at once by `by_ctime`


def by_ctime(slots: array[int], ctime: array[int]) -> array[int]:
    """`slots` by creation time, without a Python int per slot (sorting a
    4-million-job backlog at once took 450 MB): sorted runs, then merged."""
    runs = [array("I", sorted(slots[i : i + SORT_RUN], key=ctime.__getitem__)) for i in range(0, len(slots), SORT_RUN)]
    return array("I", heapq.merge(*runs, key=ctime.__getitem__))


def install(life: Lifecycle, bodies: BodyStore | None, mode: str) -> ReadBehind | NoReadBehind:
    """Read-behind for a node whose shell gives a body store, unless the
    config says `no` (then its do-nothing form): its job store keeps jobs
    on disk through it from now on."""
    if bodies is None or mode == "no":
        return NoReadBehind()
    spill = ReadBehind(life, bodies, mode == "force")
    life.jobs.spill_to(spill)
    return spill


class SpilledJobs:
    """The jobs on disk a snapshot (core/snapshot.py) holds: their storage
    forms, read from the body store, whose segments are kept until `release`
    (compaction must not move them meanwhile)."""

    def __init__(self, bodies: BodyStore | None = None, locs: Sequence[int] = (), sizes: Sequence[int] = ()) -> None:
        self.bodies = bodies
        self.locs, self.sizes = locs, sizes
        if bodies is not None:
            bodies.hold()

    def __len__(self) -> int:
        return len(self.locs)

    def payloads(self) -> Iterator[bytes]:
        """Their storage forms, in slot order.  Raises SpillCorrupt (a
        snapshot must not be written without a job) or OSError."""
        for loc, size in zip(self.locs, self.sizes):
            assert self.bodies is not None  # (locations come with their store)
            yield self.bodies.read(loc, size)[1]

    def release(self) -> None:
        if self.bodies is not None:
            self.bodies.unhold()
            self.bodies = None


class NoReadBehind:
    """Read-behind of a node that keeps every job in memory: nothing on
    disk, nothing to snapshot, one INFO line."""

    spilled = 0

    def counts(self) -> tuple[int, int]:
        return 0, 0

    def snapshot(self) -> SpilledJobs:
        return SpilledJobs()

    def info_fields(self) -> list[tuple[str, Any]]:
        return [("read_behind", "no")]


class ReadBehind:
    def __init__(self, life: Lifecycle, bodies: BodyStore, force: bool) -> None:
        self.life = life
        self.memory = life.memory
        self.out = life.out
        self.bodies = bodies
        self.force = force
        self.index = SpillIndex()
        self.grown: dict[bytes, None] = {}  # queues that got jobs in this step
        self.arrived: list[Job] = []  # active copies received in this step
        self.replay_kept: list[Job] = []  # active jobs an AOF replay kept in memory so far
        self.drained: dict[bytes, None] = {}  # queues that gave jobs in this step
        self.draining: dict[bytes, None] = {}  # queues whose move to disk goes on in a later step
        self._room, self._room_at = SPILL_STEP, 0  # jobs the hysteresis may still move, since when
        self.spilling = False  # over the node's budget (see the hysteresis above)
        self.read_error: str | None = None  # the last read failed (until one succeeds)
        self.spilled = self.loaded = self.hits = self.misses = self.lost = self.compacted = 0
        self._compact_cursor = 0
        self._reads_then = (0, 0)  # (ms, disk reads) at the last rate sample
        self.reads_per_sec = 0
        self._empty = self.index.nbytes()  # the empty index, in the node's base memory
        self.held = 0  # what the index holds beyond that, in the memory account

    # ------------------------------------------------------------ budget

    def limit(self) -> int:
        settings = self.life.settings
        return settings.job_memory_limit or settings.maxmemory // 2

    def _above(self, freed: int) -> bool:
        """Whether the node is past its limit itself, once `freed` more bytes are gone."""
        limit = self.limit()
        return self.force or bool(limit) and self.memory.data() - freed > limit

    def _over(self, freed: int = 0) -> bool:
        """Whether the node is over its budget, once `freed` more bytes are gone."""
        if self.force:
            return True
        limit = self.limit()
        used = self.memory.data() - freed
        if limit and used > limit:
            self.spilling = True
        elif used < limit - max(0, limit - self.memory.base) // 10:  # 10 % of the room for jobs
            self.spilling = False
        return self.spilling

    def _spillable(self, job: Job) -> bool:
        """Not an event, nor a keyed job (their queues serve keys in turns from memory: store/queue.py)."""
        return (
            job.nodes_confirmed is None and not job.flags & EVENT and job.id not in self.out.repl_waiters
            and (job.rare is None or not job.rare.key)
        )

    # ------------------------------------------------------------ the end of a step

    def settle(self) -> None:
        """Move what the step made movable to disk, refill drained heads."""
        life = self.life
        if self.bodies.error is not None:
            self.bodies.flush()  # retry: the disk may have room again
        writable = self.bodies.error is None
        if self.arrived:
            arrived, self.arrived = self.arrived, []
            if writable and self._over():
                now_s = life.now // 1000
                for job in arrived:
                    if life.jobs.resident(job) and job.state == S_ACTIVE and self._spillable(job):
                        if self._second(job.awake) > now_s:
                            self._spill(job, False)
                        else:  # due in the second the wheel would load it back in
                            self.arrived.append(job)
        if self.grown:
            grown, self.grown = self.grown, {}
            if writable:
                for name in grown:
                    queue = life.queues.get(name)
                    if queue is not None:
                        self._settle_queue(queue)
                    else:
                        self.draining.pop(name, None)
        if self.drained:
            drained, self.drained = self.drained, {}
            for name in drained:
                queue = life.queues.get(name)
                if queue is not None and queue.has_tail():
                    self._refill(queue)
        if self.index.flags or self.held:  # else the index never had a slot since it started: nothing to count
            self.index.restart_if_idle()
            self._sync()

    def _sync(self) -> None:
        """Bring the memory account to what the index holds now."""
        held = self.index.nbytes() - self._empty
        self.memory.account(held - self.held)
        self.held = held

    def _settle_queue(self, queue: Queue) -> None:
        for level in queue.levels:
            tail = level.tail
            if tail is not None and tail.live:
                # read-behind in progress: what arrived after the tail joins it
                arrived: list[Job] = []
                while (job := level.newest_in_head()) is not None and job.ctime > tail.last_ctime and self._spillable(job):
                    arrived.append(level.pop_newest())
                for job in reversed(arrived):
                    tail.append(self._spill(job, True), job.ctime, len(job.body or b""))
        # While over budget the head's newest jobs go to the tail, each at its
        # place: jobs queued again (a requeue, the RETRY of jobs a restart
        # replayed) fall among the tail's, not only before or after them.
        for level, moving in self._overflow(queue):
            tail = level.tail
            if tail is None:
                tail = level.tail = Tail(self.index, self.peek)
            tail.insert([self._spill(job, True) for job in reversed(moving)], sum(len(j.body or b"") for j in moving))

    def _overflow(self, queue: Queue) -> list[tuple[Level, list[Job]]]:
        """Take the heads' newest jobs out while the queue or the node is
        over its budget, keeping `prefetch` jobs: the lowest priority
        first, each level's newest first."""
        life = self.life
        limit = life.settings.queue_config.settings(queue.name).max_memory_size
        if life.now - self._room_at >= SPILL_STEP_MS:
            self._room, self._room_at = SPILL_STEP, life.now
        if queue.nbytes <= limit and queue.name not in self.draining and not self._over():
            return []  # the common case, made cheap: nothing over a budget
        keep = life.config.read_behind_prefetch
        head = queue.head_live()
        mem = queue.nbytes - queue.on_disk()[1]
        low = limit // 10 * 9
        over = self._over() or mem > (low if queue.name in self.draining else limit)
        freed = taken = 0
        out: list[tuple[Level, list[Job]]] = []
        self.draining.pop(queue.name, None)
        for level in reversed(queue.levels):
            moving: list[Job] = []
            while over and head - taken > keep:
                job = level.newest_in_head()
                if job is None:
                    break  # the next level
                if not self._spillable(job):
                    over = False
                    break
                if taken >= self._room and mem <= limit and not self._above(freed):
                    self.draining[queue.name] = self.grown[queue.name] = None  # a later step goes on
                    over = False
                    break
                moving.append(level.pop_newest())
                taken += 1
                mem -= len(job.body or b"")
                freed += self.memory.job_size(job) - SLOT_BYTES
                over = self._over(freed) or mem > low
            if moving:
                out.append((level, moving))
        self._room = max(0, self._room - taken)
        return out

    def _spill(self, job: Job, queued: bool, marks: int = 0) -> int:
        """Move a job's record to disk; its slot (the caller lists a queued
        one in its queue's tail)."""
        life = self.life
        loc, size = self.bodies.append(job.qtime, encode_storage(job))
        if queued:
            marks |= IN_TAIL
        if not self.out.journaled(job):
            marks |= UNJOURNALED
        index = self.index
        slot = index.add(job.id, job.queue or b"", loc, size, len(job.body or b""), job.ctime, marks, job.priority)
        index.wake_at(slot, job.etime + 1 if queued else self._second(job.awake))  # (expiry: as life.reschedule)
        life.jobs.remove(job)
        self.memory.to_disk(job)
        self._sync()
        self.spilled += 1
        return slot

    def _second(self, ms: int) -> int:
        """The wheel's second for a timer due at `ms`: the one it is due in
        under `force` (the timers of jobs on disk keep their time, to the
        millisecond, as in memory), else the end of it (up to a second late,
        but a job loaded back is due: none waits in memory for its time,
        which, for a second's worth of a backlog's RETRY timers, would be
        all of them at once)."""
        return ms // 1000 if self.force else -(-ms // 1000)

    def grew(self, queue: bytes) -> None:
        self.grown[queue] = None

    def note_arrival(self, job: Job) -> None:
        self.arrived.append(job)

    def replayed(self, job: Job, was_queued: bool) -> bool:
        """A job the AOF replay just registered (active): spilled at once
        when over budget (True), with its `queued` mark for the replay's
        end; else an active one is kept in memory for now (`make_room`)."""
        if self.bodies.error is not None or not self._over() or not self._spillable(job):
            if not was_queued:
                self.replay_kept.append(job)
            return False
        self._spill(job, False, REPLAYED_QUEUED if was_queued else 0)
        return True

    def needs_room(self) -> bool:
        """Whether a replay must move the jobs it kept in memory (forced on,
        none was kept that could go)."""
        return not self.force and self._over()

    def make_room(self, queued: list[Job]) -> None:
        """A replay's jobs kept in memory (newest last: the active ones,
        then `queued`, those stored queued) go to disk while the node is
        over its budget: the slots of the jobs replayed after them grow
        past it (a 4-million-job restart reached 577 MB under maxmemory
        512 MB that way)."""
        self._make_room(self.replay_kept, False)
        self._make_room(queued, True)

    def _make_room(self, jobs: list[Job], queued: bool) -> None:
        """A job that may not go (an event) leaves the list all the same,
        and so does one no longer active: a later record deleted it, or its
        RETRY queued it while the replay ran (the ticks go on between its
        steps), and a queued job goes to disk through its queue, if it goes."""
        life = self.life
        while jobs and self._over():
            job = jobs.pop()
            if life.jobs.resident(job) and job.state == S_ACTIVE and self._spillable(job):
                self._spill(job, False, REPLAYED_QUEUED if queued else 0)

    def replay_queued(self, trusted: bool) -> array[int]:
        """The end of a replay: the slots marked queued, oldest first
        (none unless `trusted`); the marks go.  An array: a backlog's
        slots as Python ints would take several times its memory."""
        self.replay_kept.clear()
        flags, ctime = self.index.flags, self.index.ctime
        marked = array("I", (slot for slot in range(len(flags)) if flags[slot] & REPLAYED_QUEUED))
        for slot in marked:
            flags[slot] &= ~REPLAYED_QUEUED
        if not trusted:
            return array("I")
        live = array("I", (slot for slot in marked if flags[slot] & LIVE))
        if any(ctime[a] > ctime[b] for a, b in zip(live, live[1:])):  # the file's order is not queue order
            live = by_ctime(live, ctime)
        return live

    # ------------------------------------------------------------ loading back

    def _read(self, slot: int) -> tuple[int, Job] | None:
        index = self.index
        try:
            qtime, payload = self.bodies.read(index.loc[slot], index.size[slot])
            job = decode_storage(payload)
            self.read_error = None
            return qtime, job
        except OSError as e:
            self.read_error = e.strerror or str(e)
            log.warning("Read-behind: cannot read a job record: %s", self.read_error)
        except (SpillCorrupt, DecodeError) as e:
            queue = index.names[index.qid[slot]].decode("utf-8", "replace")
            log.warning("Read-behind: the record of a job of queue %s is damaged (%s): this node's copy is lost", queue, e)
            self.lost += 1
            self._forget(slot, lost=True)
        return None

    def error(self) -> str | None:
        """Why the disk fails, writing or reading (MISCONF), or None."""
        return self.bodies.error or self.read_error

    def load_live(self, slot: int) -> Job | None:
        """`load`, for a slot that may have gone since it was listed."""
        return self.load(slot) if self.index.is_live(slot) else None

    def slot_ctime(self, slot: int) -> int:
        return self.index.ctime[slot]

    def peek(self, slot: int) -> Job | None:
        """A spilled job, read but left on disk (QPEEK, JSCAN)."""
        found = self._read(slot)
        return None if found is None else found[1]

    def load(self, slot: int) -> Job | None:
        """Bring a spilled job back into memory as it was."""
        found = self._read(slot)
        if found is None:
            return None
        qtime, job = found
        self._bring_back(slot, qtime, job)
        return job

    def _forget(self, slot: int, lost: bool = False) -> None:
        """The slot's job is no longer on disk (loaded back, or `lost`)."""
        index = self.index
        if index.flags[slot] & IN_TAIL:
            queue = self.life.queues.get(index.queue_of(slot))
            assert queue is not None  # a queue with jobs is never collected
            level = queue.level(index.priority[slot])
            assert level.tail is not None  # a level with a job listed keeps its tail
            level.tail.take(slot)
            if lost:
                queue.lose(level, index.blen[slot])
        self.bodies.release(index.loc[slot], index.size[slot])
        index.kill(slot)
        self._sync()

    def _bring_back(self, slot: int, qtime: int, job: Job) -> None:
        in_tail = bool(self.index.flags[slot] & IN_TAIL)
        self._forget(slot)
        self._register(job, qtime, in_tail)
        if not in_tail:
            self.arrived.append(job)  # an active copy: back to disk at the end of the step if it may

    def _register(self, job: Job, qtime: int, in_tail: bool) -> None:
        life = self.life
        job.qtime = qtime
        job.flags &= ~IN_LIST
        life.jobs.add(job)
        self.memory.add_job(job)
        self.loaded += 1
        if job.state == S_QUEUED and not in_tail:
            job.move(DEQUEUE)  # its queue went while it could not be read: it left it, as the others did
        if job.state == S_QUEUED:
            queue = life.queues.get(job.queue)  # type: ignore[arg-type]
            assert queue is not None  # a queue with jobs is never collected
            job.queue = queue.name
            queue.level(job.priority).promote(job)
        elif job.queue is not None and (queue := life.queues.get(job.queue)) is not None:
            job.queue = queue.name
        if job.state == S_QUEUED and job.retry and job.qtime and job.qtime <= life.now:
            # The requeue timer visits it missed on disk, at their own times: every
            # RETRY since its qtime, so it keeps the phase it had in memory.
            period = job.retry * 1000
            job.qtime += ((life.now - job.qtime) // period + 1) * period + life.jitter()
            job.flags |= BCAST_WILLQUEUE
        life.reschedule(job)
        while job.awake <= life.now and job.etime * 1000 > life.now and life.jobs.resident(job):
            life.process_job(job)  # the other visits it missed on disk

    def load_id(self, job_id: bytes) -> Job | None:
        """JobStore.get's way to disk: the spilled job with this ID, loaded."""
        for slot in self.index.find(job_id):
            found = self._read(slot)
            if found is not None and found[1].id == job_id:
                self._bring_back(slot, *found)
                return found[1]
        return None

    def peek_id(self, job_id: bytes) -> Job | None:
        """A copy of the spilled job with this ID, left on disk."""
        for slot in self.index.find(job_id):
            found = self._read(slot)
            if found is not None and found[1].id == job_id:
                return found[1]
        return None

    def holds(self, job_id: bytes) -> bool:
        return bool(self.index.live) and self.peek_id(job_id) is not None  # every new job ID asks: most ask an empty index

    def __len__(self) -> int:
        return self.index.live

    def ready(self, queue: Queue) -> None:
        """Before a pop: each level's head front must be its oldest job."""
        self.drained[queue.name] = None
        ctime = self.index.ctime
        for level in queue.levels:
            tail = level.tail
            if tail is None:
                continue
            first = level.first()
            while (slot := tail.front()) is not None and (first is None or ctime[slot] < first.ctime):
                self.misses += 1  # this pop waits for the disk
                if self.load(slot) is not None:
                    break
                if self.read_error is not None:
                    return
            else:
                if first is not None:
                    self.hits += 1

    def _refill(self, queue: Queue) -> None:
        """The heads back to `prefetch` jobs, from the highest priority's tail down."""
        want = self.life.config.read_behind_prefetch - queue.head_live()
        for level in queue.levels:
            tail = level.tail
            if tail is None:
                continue
            while want > 0 and (slot := tail.front()) is not None:
                if self.load(slot) is None and self.read_error is not None:
                    return
                want -= 1
            if not tail.live and tail.front() is None:
                level.tail = None

    # ------------------------------------------------------------ time

    def next_awake(self) -> int | None:
        second = self.index.next_awake()
        return None if second is None else second * 1000

    def tick(self) -> None:
        """Load what the wheel says is due; the scheduler then handles it."""
        now_s = self.life.now // 1000
        limit = self.limit()  # a tick loads about what the hysteresis frees, at most
        cap = max(1, (limit - self.memory.base) // 10) if limit else None
        for slot in self.index.due(now_s, MAX_LOADS_PER_TICK, cap):
            if self.load(slot) is None and self.index.is_live(slot):
                self.index.wake_at(slot, now_s + 1)  # the disk failed to read it: again in a second
        self._sync()

    def cron(self) -> None:
        self.bodies.flush()
        if self.read_error is not None:  # try again: one good read ends the error
            slot = next(self.index.live_slots(), None)
            if slot is None or self._read(slot) is not None:
                self.read_error = None
                for queue in self.life.queues.values():  # clients the disk kept waiting
                    if queue.has_tail() and queue.waiters:
                        self.life.consumers.ready[queue.name] = None
        now = self.life.now
        then, reads = self._reads_then
        if now - then >= 1000:
            self.reads_per_sec = (self.bodies.reads - reads) * 1000 // (now - then)
            self._reads_then = (now, self.bodies.reads)
        self._compact()

    def _compact(self) -> None:
        """Copy the live records of a mostly dead segment to the newest one,
        a bounded number of slots per call; the segment goes once empty."""
        seg = self.bodies.sparse()
        if seg is None:
            return
        index, bodies = self.index, self.bodies
        start = self._compact_cursor
        end = min(start + COMPACT_SLOTS_PER_TICK, len(index.flags))
        for slot in range(start, end):
            if index.flags[slot] & LIVE and bodies.segment_of(index.loc[slot]) == seg:
                try:
                    qtime, payload = bodies.read(index.loc[slot], index.size[slot])
                except (OSError, SpillCorrupt):
                    continue  # left where it is: a load will report it
                loc, size = bodies.append(qtime, payload)
                bodies.release(index.loc[slot], index.size[slot])
                index.loc[slot] = loc
                self.compacted += size
        self._compact_cursor = 0 if end >= len(index.flags) else end

    # ------------------------------------------------------------ whole-node operations

    def every_job(self) -> Iterator[Job]:
        """Every spilled job, loaded back one at a time (FLUSHALL deletes
        each before the next comes)."""
        flags = self.index.flags
        for slot in range(len(flags)):
            if flags[slot] & LIVE and (job := self.load(slot)) is not None:
                yield job

    def forget_queue(self, queue: Queue) -> None:
        """A queue goes: the jobs of its tail come back to its head first
        (to leave the queue as the others do), then the tail goes."""
        for level in queue.levels:
            tail = level.tail
            if tail is not None:
                for slot in list(tail.oldest()):
                    self.load(slot)
                for slot in tail.drop():  # what could not be read stays on disk, in no queue
                    self.index.flags[slot] &= ~IN_TAIL
                level.tail = None
        self._sync()

    def snapshot(self) -> SpilledJobs:
        """Every spilled job of a journaled queue, for an AOF rewrite (the
        body store's segments are held until it releases them)."""
        index = self.index
        flags, loc, size = index.flags, index.loc, index.size
        locs, sizes = array("Q"), array("I")
        for slot in range(len(flags)):
            if flags[slot] & LIVE and not flags[slot] & UNJOURNALED:
                locs.append(loc[slot])
                sizes.append(size[slot])
        return SpilledJobs(self.bodies, locs, sizes)

    def in_bucket(self, bucket: int) -> list[Job]:
        """JSCAN's jobs on disk in `bucket`, read and left there."""
        return [job for slot in self.index.in_bucket(bucket) if (job := self.peek(slot)) is not None]

    def counts(self) -> tuple[int, int]:
        """(queued, active) jobs on disk."""
        queued = sum(q.on_disk()[0] for q in self.life.queues.values())
        return queued, self.index.live - queued

    def info_fields(self) -> list[tuple[str, Any]]:
        life = self.life
        disk = self.bodies.figures()
        queued, active = self.counts()
        return [
            ("read_behind", "force" if self.force else "yes"),
            ("read_behind_limit", self.limit()),
            ("read_behind_spilling", int(self._over())),
            ("jobs_in_memory", len(life.jobs) - self.index.live),
            ("jobs_on_disk", self.index.live),
            ("queued_jobs_on_disk", queued),
            ("active_jobs_on_disk", active),
            ("bytes_on_disk", self.index.live_bytes),
            ("memory_per_job_on_disk", self.held // max(1, self.index.live)),
            ("segments", disk["segments"]),
            ("segment_bytes", disk["disk_bytes"]),
            ("dead_bytes", disk["dead_bytes"]),
            ("jobs_spilled", self.spilled),
            ("jobs_loaded", self.loaded),
            ("prefetch_hits", self.hits),
            ("prefetch_misses", self.misses),
            ("disk_reads", disk["reads"]),
            ("disk_reads_per_sec", self.reads_per_sec),
            ("disk_bytes_read", disk["read_bytes"]),
            ("disk_bytes_written", disk["written"]),
            ("compacted_bytes", self.compacted),
            ("lost_records", self.lost),
            ("read_behind_error", self.bodies.error or self.read_error or ""),
        ]
