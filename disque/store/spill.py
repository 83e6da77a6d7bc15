"""The compact index of jobs whose records live on disk (read-behind).

Theory of operation: a job "spilled" by read-behind (core/read_behind.py)
is not a `Job` object any more: its whole storage record (body included) is
in a body segment on disk, and this index keeps only what the node must
know without reading it, in parallel arrays indexed by a *slot* number:
where the record is (`loc`, `size`), the body length (queue byte counts),
the creation time and the priority (queue order), a 64-bit hash of the ID,
its queue, a few flag bits and the second it must be looked at (`awake`).  A slot costs
about 88 bytes with its share of the ID table and of its queue's tail
(arrays of machine integers, no per-job Python object), against several
hundred for a `Job` in memory.  `nbytes` is what the index holds as
allocated, for the memory account: the arrays at their capacity (they
grow by a sixteenth and never shrink while a slot is in use), the ID
table at its size (4 to 8 entries a slot after a rebuild, 2 at half
load), the free list and the wheel's and tails' entries.  Once every slot
is free the index starts over empty, so a drained backlog gives its
arrays back.

Lookups by ID go through an open-addressing table of slot numbers (linear
probing, tombstones, rebuilt at half load); a hit is only a candidate: the
caller confirms it against the ID in the record it reads.  Slots are reused
once free: a slot is free when its job is no longer `LIVE` and no queue
`Tail` still lists it (`IN_TAIL`), so a tail never points at a reused slot.

A `Tail` is the spilled end of one queue's level (one priority): slots in (ctime, id) order,
consumed from the front (`pos`); a slot that died in the middle (an ACK, a
job loaded back by ID) is skipped when the front reaches it.  Dead entries
keep their slot (and so its ctime) until the front passes them, so the
listed slots stay sorted and new ones are merged in at their place.

The awake *wheel* maps a second to the slots to look at then (expiry for a
queued job, the requeue or expiry of an active copy), with a heap of the
seconds.  Entries are checked when due: a slot whose job died or moved to
another second meanwhile is skipped.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator

from disque.store.job import DEFAULT_PRIORITY, Job
from disque.store.scan import NBUCKETS

LIVE = 1
IN_TAIL = 2  # listed by a queue's Tail
REPLAYED_QUEUED = 4  # stored `queued` in the AOF being replayed (queued again if the file is trusted)
UNJOURNALED = 8  # its queue is not in the AOF (left out of rewrites)
_MASK64 = (1 << 64) - 1
_MIN_TABLE = 1024
_DELETED = 0xFFFFFFFF
SLOT_BYTES = 88  # a slot's average cost (84-89 under tracemalloc), what read-behind expects a move to disk to add
ARRAY_BYTES = 43  # a slot's bytes in the parallel arrays: loc, ctime, keyh 8; size, blen, awake, qid 4; bucket 2; flags 1
_EMPTY_Q = array("Q").__sizeof__()


class SpillCorrupt(Exception):
    """A record that is not what its location says (torn, damaged, gone)."""


def id_hash(job_id: bytes) -> int:
    return hash(job_id) & _MASK64


class SpillIndex:
    __slots__ = (
        "loc", "size", "blen", "ctime", "keyh", "flags", "awake", "qid", "bucket", "priority", "names", "_name_ids",
        "live", "live_bytes", "_table", "_used", "_free", "wheel", "_heap", "entries",
    )  # fmt: skip

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self.loc = array("Q")  # where the record is (the body store's location)
        self.size = array("I")  # record length
        self.blen = array("I")  # body length
        self.ctime = array("Q")
        self.keyh = array("Q")
        self.flags = bytearray()
        self.awake = array("I")  # second of its wheel entry (0: none)
        self.qid = array("I")  # its queue, as an index in `names`
        self.bucket = bytearray()  # its ID's JSCAN bucket (2 bytes, little-endian), as in memory
        self.priority = bytearray()  # its job's priority: the level whose tail lists it
        self.names: list[bytes] = []
        self._name_ids: dict[bytes, int] = {}
        self.live = 0  # slots holding a job
        self.live_bytes = 0  # record bytes of those
        self._table = array("I", bytes(4 * _MIN_TABLE))  # slot + 1; 0 empty, _DELETED deleted
        self._used = 0  # table entries that are not empty (live and deleted)
        self._free = array("I")
        self.wheel: dict[int, array[int]] = {}
        self._heap: list[int] = []
        self.entries = 0  # listed by the wheel and the tails

    def __len__(self) -> int:
        return self.live

    # -- slots --------------------------------------------------------------

    def add(self, job_id: bytes, queue: bytes, loc: int, size: int, blen: int, ctime: int, marks: int,
            priority: int = DEFAULT_PRIORITY) -> int:  # fmt: skip
        """A new live slot for a job whose record is at `loc`; `marks`: the
        other flag bits."""
        if (self._used + 1) * 2 > len(self._table):
            self._rebuild()
        flags = LIVE | marks
        h = id_hash(job_id)
        qid = self._name_ids.get(queue)
        if qid is None:
            qid = self._name_ids[queue] = len(self.names)
            self.names.append(queue)
        if self._free:
            slot = self._free.pop()
            self.loc[slot], self.size[slot], self.blen[slot] = loc, size, blen
            self.ctime[slot], self.keyh[slot], self.flags[slot], self.awake[slot] = ctime, h, flags, 0
            self.qid[slot], self.priority[slot] = qid, priority
            self.bucket[2 * slot : 2 * slot + 2] = (h % NBUCKETS).to_bytes(2, "little")
        else:
            slot = len(self.flags)
            self.loc.append(loc)
            self.size.append(size)
            self.blen.append(blen)
            self.ctime.append(ctime)
            self.keyh.append(h)
            self.flags.append(flags)
            self.awake.append(0)
            self.qid.append(qid)
            self.priority.append(priority)
            self.bucket += (h % NBUCKETS).to_bytes(2, "little")
        self.live += 1
        self.live_bytes += size
        self._insert(h, slot)
        return slot

    def kill(self, slot: int) -> None:
        """The job of `slot` left the disk (loaded back, or gone)."""
        self.flags[slot] &= IN_TAIL
        self.live -= 1
        self.live_bytes -= self.size[slot]
        table, mask = self._table, len(self._table) - 1
        i = self.keyh[slot] & mask
        while table[i] != slot + 1:  # it is there: every live slot is in the table
            i = (i + 1) & mask
        table[i] = _DELETED
        if not self.flags[slot]:
            self._free.append(slot)

    def leave_tail(self, slot: int) -> None:
        flags = self.flags[slot] & ~IN_TAIL
        self.flags[slot] = flags
        if not flags & LIVE:
            self._free.append(slot)

    def restart_if_idle(self) -> None:
        """Start over empty once no slot is in use (then no wheel entry is
        live and no tail lists a slot).  Called between steps: a tail
        releasing its last slot still walks its list."""
        if self.flags and len(self._free) == len(self.flags):
            self._start()

    def nbytes(self) -> int:
        """What the index holds, as allocated (see above)."""
        capacity = (self.loc.__sizeof__() - _EMPTY_Q) // 8
        return capacity * ARRAY_BYTES + 4 * (len(self._table) + len(self._free) + self.entries)

    def is_live(self, slot: int) -> bool:
        return bool(self.flags[slot] & LIVE)

    def queue_of(self, slot: int) -> bytes:
        return self.names[self.qid[slot]]

    def find(self, job_id: bytes) -> Iterable[int]:
        """Live slots whose ID hash matches (candidates, in probe order)."""
        return self._probe(id_hash(job_id)) if self.live else ()  # most lookups miss an empty index

    def _probe(self, h: int) -> Iterator[int]:
        table, keyh = self._table, self.keyh
        mask = len(table) - 1
        i = h & mask
        while (v := table[i]) != 0:
            if v != _DELETED and keyh[v - 1] == h:
                yield v - 1
            i = (i + 1) & mask

    def in_bucket(self, bucket: int) -> Iterator[int]:
        """The live slots whose ID falls in JSCAN bucket `bucket`."""
        buckets, flags = self.bucket, self.flags
        pattern = bucket.to_bytes(2, "little")
        pos = 0
        while (pos := buckets.find(pattern, pos)) >= 0:  # a search in C: other buckets cost no Python
            if pos & 1:  # across two entries
                pos += 1
                continue
            if flags[pos >> 1] & LIVE:
                yield pos >> 1
            pos += 2

    def live_slots(self) -> Iterator[int]:
        flags = self.flags
        return (slot for slot in range(len(flags)) if flags[slot] & LIVE)

    def _insert(self, h: int, slot: int) -> None:
        table = self._table
        mask = len(table) - 1
        i = h & mask
        while table[i] not in (0, _DELETED):
            i = (i + 1) & mask
        if table[i] == 0:
            self._used += 1
        table[i] = slot + 1

    def _rebuild(self) -> None:
        """A table four times the live slots (deleted entries dropped)."""
        n = _MIN_TABLE
        while n < 4 * (self.live + 1):
            n *= 2
        self._table = array("I", bytes(4 * n))
        self._used = 0
        for slot in self.live_slots():
            self._insert(self.keyh[slot], slot)

    # -- the wheel ----------------------------------------------------------

    def wake_at(self, slot: int, second: int) -> None:
        self.awake[slot] = second
        bucket = self.wheel.get(second)
        if bucket is None:
            bucket = self.wheel[second] = array("I")
            heapq.heappush(self._heap, second)
        bucket.append(slot)
        self.entries += 1

    def next_awake(self) -> int | None:
        """The earliest second with a wheel entry."""
        return self._heap[0] if self._heap else None

    def due(self, now_s: int, limit: int, max_bytes: int | None = None) -> list[int]:
        """Live slots whose second has come (at most `limit`, and records of
        about `max_bytes` if given; earliest first); they leave the wheel."""
        out: list[int] = []
        heap, wheel, flags, awake, size = self._heap, self.wheel, self.flags, self.awake, self.size
        left = max_bytes
        while heap and heap[0] <= now_s and len(out) < limit and (left is None or left > 0):
            second = heap[0]
            bucket = wheel[second]
            while bucket and len(out) < limit and (left is None or left > 0):
                slot = bucket.pop()
                self.entries -= 1
                if flags[slot] & LIVE and awake[slot] == second:
                    awake[slot] = 0  # taken: a second entry of the slot (reused meanwhile) is stale
                    out.append(slot)
                    if left is not None:
                        left -= size[slot]
            if not bucket:
                del wheel[second]
                heapq.heappop(heap)
        return out


class Tail:
    """The spilled end of one queue: slots in queue order (see above), and
    `read`, which gives one slot's job without loading it (None when it
    cannot be read)."""

    __slots__ = ("index", "read", "slots", "pos", "live", "nbytes", "last_ctime")

    def __init__(self, index: SpillIndex, read: Callable[[int], Job | None]) -> None:
        self.index = index
        self.read = read
        self.slots = array("I")
        self.pos = 0
        self.live = 0  # live jobs listed
        self.nbytes = 0  # their body bytes
        self.last_ctime = 0  # ctime of the newest job appended: only newer ones may follow

    def append(self, slot: int, ctime: int, blen: int) -> None:
        self.slots.append(slot)
        self.index.entries += 1
        self.live += 1
        self.nbytes += blen
        self.last_ctime = ctime

    def insert(self, slots: list[int], nbytes: int) -> None:
        """List jobs (in order, `nbytes` of bodies) each at its place by
        creation time.  Jobs queued again (a requeue, a restart's RETRY)
        fall among those listed: a merge, one copy of the listed slots;
        jobs all older than the front go in the room before it if there
        is some, and jobs all newer than the last at the end."""
        ctime = self.index.ctime
        old, pos, n = self.slots, self.pos, len(slots)
        if pos == len(old) or ctime[slots[0]] >= ctime[old[-1]]:
            old.extend(slots)
        elif ctime[slots[-1]] < ctime[old[pos]] and n <= pos:
            old[pos - n : pos] = array("I", slots)
            self.pos = pos - n
        else:
            key = ctime.__getitem__
            merged, at = array("I"), pos
            for slot in slots:
                i = bisect_right(old, ctime[slot], at, len(old), key=key)
                merged += old[at:i]
                merged.append(slot)
                at = i
            merged += old[at:]
            self.slots, self.pos = merged, 0
        self.live += n
        self.nbytes += nbytes
        self.index.entries += n
        self.last_ctime = max(self.last_ctime, ctime[slots[-1]])

    def front(self) -> int | None:
        """The oldest live slot; dead ones passed on the way are released."""
        index = self.index
        slots, pos, flags = self.slots, self.pos, index.flags
        while pos < len(slots):
            slot = slots[pos]
            if flags[slot] & LIVE:
                break
            index.leave_tail(slot)
            pos += 1
        else:
            index.entries -= len(slots)
            self.slots, self.pos = array("I"), 0
            return None
        if pos > 4096 and pos * 2 > len(slots):
            del slots[:pos]  # consumed entries go (amortised: at least as many stay)
            index.entries -= pos
            pos = 0
        self.pos = pos
        return slots[pos]

    def take(self, slot: int) -> None:
        """A listed job leaves the tail (loaded, or gone): it stays listed
        as a dead entry until the front passes it."""
        self.live -= 1
        self.nbytes -= self.index.blen[slot]

    def oldest(self) -> Iterator[int]:
        slots, flags = self.slots, self.index.flags
        return (slots[i] for i in range(self.pos, len(slots)) if flags[slots[i]] & LIVE)

    def newest(self) -> Iterator[int]:
        slots, flags = self.slots, self.index.flags
        return (slots[i] for i in range(len(slots) - 1, self.pos - 1, -1) if flags[slots[i]] & LIVE)

    def jobs(self, slots: Iterator[int]) -> Iterator[Job]:
        for slot in slots:
            job = self.read(slot)
            if job is not None:
                yield job

    def drop(self) -> list[int]:
        """Empty the tail; returns the live slots it listed (their jobs are
        the caller's to delete)."""
        index = self.index
        live = []
        for i in range(self.pos, len(self.slots)):
            slot = self.slots[i]
            if index.flags[slot] & LIVE:
                live.append(slot)
            index.leave_tail(slot)
        index.entries -= len(self.slots)
        self.slots, self.pos = array("I"), 0
        self.live = self.nbytes = 0
        return live
