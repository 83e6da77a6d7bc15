"""The job record and its state machine.

Theory of operation: a `Job` is one node's copy of a job (spec/cluster.md §8.0).
Its `state` moves only along `TRANSITIONS`; `Job.move(event)` is the one place
that changes it, so an unlisted (state, event) pair is a bug that raises.
Timers are not kept here: `qtime` (next requeue, 0 = never) and `awake` (next
scheduler visit) are plain fields that the scheduler in `jobs.py` reads, and
`tpos` is where jobs.py lists the job in its bucket.

Memory matters (hundreds of thousands of queued jobs): the record uses
`__slots__`, `nodes_delivered` is a tuple (shared between jobs while it is the
single-node tuple, or a received one: cluster/codec.py), and
`nodes_confirmed` exists only while replication or an ACK is being
confirmed.  The fields few jobs set (DELAY, the NACK count, MAXATTEMPTS, a
dead-lettered copy's origin, the last failure a consumer reported, the ACK
garbage collector's attempt count, ADDJOB KEY) share one slot, `rare`, None
for most jobs.  In the compiled build (disque/compiled.py) an int field holds its value unboxed, so every field
costs 8 bytes and the record's allocation changes only in steps of two fields
(CPython rounds to 16 bytes): the 17 below take 192 bytes (176 in the pure
build).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Final

from disque.store.failure import NO_FAILURE, Failure


class State(IntEnum):
    WAIT_REPL = 0
    ACTIVE = 1
    QUEUED = 2
    ACKED = 3


STATE_NAMES = {State.WAIT_REPL: "wait-repl", State.ACTIVE: "active", State.QUEUED: "queued", State.ACKED: "acked"}
STATE_BY_NAME = {v: k for k, v in STATE_NAMES.items()}

# Job flags (spec/cluster.md §8.0).  IN_LIST and IN_TIMER are local bookkeeping of
# queue.py and jobs.py and are masked out whenever a job is serialized.
BCAST_QUEUED: Final = 1
BCAST_WILLQUEUE: Final = 2
DELIVERED: Final = 4
IN_LIST: Final = 8
NACKED: Final = 16  # NACK ... DELAY: the job's next enqueue here is that NACK's, not a redelivery (local, never sent)
EVENT: Final = 32  # a consumer-group event (core/groups.py): never queued, read through groups; travels with the job
IN_TIMER: Final = 64
WIRE_FLAGS: Final = BCAST_QUEUED | BCAST_WILLQUEUE | DELIVERED | EVENT

# Events that change a job's state.
REPLICATED: Final = "replicated"  # synchronous replication achieved
ENQUEUE: Final = "enqueue"
FETCH: Final = "fetch"  # GETJOB, or handed to another node through YOURJOBS
DEQUEUE: Final = "dequeue"  # DEQUEUE, QUEUED/WORKING messages, WORKING command
ACK: Final = "ack"
ABORT: Final = "abort"  # sync replication gave up: the job is deleted right after
AWAIT_REPL: Final = "await-repl"  # ADDJOB: a new job waits for its synchronous replicas
# A copy received from a peer (REPLJOB, YOURJOBS) or replayed from the AOF
# becomes this node's active copy.  The record arrives carrying the state its
# sender (or the file) had, which says nothing about this node: any state adopts.
ADOPT: Final = "adopt"

W, A, Q, K = State.WAIT_REPL, State.ACTIVE, State.QUEUED, State.ACKED
TRANSITIONS: dict[State, dict[str, State]] = {
    W: {REPLICATED: A, ENQUEUE: Q, ACK: K, ABORT: A, ADOPT: A},
    A: {ENQUEUE: Q, ACK: K, AWAIT_REPL: W, ADOPT: A},
    Q: {FETCH: A, DEQUEUE: A, ACK: K, ADOPT: A},
    K: {ADOPT: A},
}


DEFAULT_PRIORITY: Final = 5  # ADDJOB PRIORITY's default, and that of a frame or record without one
MAX_PRIORITY: Final = 9

RARE_BYTES: Final = 128  # a Rare record (GC header included)
FAILURE_BYTES: Final = 104  # a Failure tuple of six (GC header included), beside its strings
MAX_KEY: Final = 1024  # ADDJOB KEY's longest key, in bytes (docs/keys.md)


def key_problem(key: bytes) -> str | None:
    """What breaks the key rule in `key`, or None when it keeps it: the one
    rule ADDJOB, the bus and the AOF loader apply (b"": no key)."""
    return f"KEY longer than {MAX_KEY} bytes" if len(key) > MAX_KEY else None


class Rare:
    """The fields of a job that few jobs set: `delay` (ADDJOB DELAY),
    `nacks` (NACKed jobs), ADDJOB MAXATTEMPTS (0: no limit), the deliveries
    before `dead_letter`, the queue a job out of attempts moves to; `origin`,
    a dead-lettered copy's former ID; `failure`, the last failure a
    consumer reported (store/failure.py); `gc_retry`, the ACK garbage
    collector's attempts so far; `key`, ADDJOB KEY (docs/keys.md);
    `parents`, the jobs not yet acknowledged that ADDJOB ... AFTER holds
    this one for, and `on_parent_fail`, what a parent that fails does to it
    (core/dependencies.py); `after`, every parent AFTER named, kept once
    they are acknowledged (SHOW: a child reads its parents' results);
    `batch`, the batch ADDJOB ... BATCH put it in
    (core/batches.py)."""

    __slots__ = (
        "delay", "nacks", "max_attempts", "dead_letter", "origin", "failure", "gc_retry", "key", "parents",
        "on_parent_fail", "batch", "after",
    )  # fmt: skip

    def __init__(self) -> None:
        self.delay = 0
        self.nacks = 0
        self.max_attempts = 0
        self.dead_letter = b""
        self.origin = b""
        self.failure: Failure | tuple[()] = NO_FAILURE
        self.gc_retry = 0
        self.key = b""
        self.parents: tuple[bytes, ...] = ()
        self.on_parent_fail = 0
        self.batch = b""
        self.after: tuple[bytes, ...] = ()


class Job:
    __slots__ = (
        "id", "state", "flags", "repl", "etime", "ctime", "retry", "deliv", "queue", "body",
        "nodes_delivered", "nodes_confirmed", "qtime", "awake", "tpos", "rare", "priority",
    )  # fmt: skip

    def __init__(
        self,
        id: bytes,
        queue: bytes | None,
        body: bytes | None,
        state: State = State.ACTIVE,
        flags: int = 0,
        repl: int = 1,
        etime: int = 0,
        ctime: int = 0,
        delay: int = 0,
        retry: int = 0,
        nacks: int = 0,
        deliv: int = 0,
        nodes_delivered: tuple[str, ...] = (),
        max_attempts: int = 0,
        dead_letter: bytes = b"",
        origin: bytes = b"",
        priority: int = DEFAULT_PRIORITY,
        failure: Failure | tuple[()] = NO_FAILURE,
        key: bytes = b"",
        parents: tuple[bytes, ...] = (),
        on_parent_fail: int = 0,
        batch: bytes = b"",
        after: tuple[bytes, ...] = (),
    ) -> None:
        self.id = id
        self.queue = queue
        self.body = body
        self.state = state
        self.flags = flags
        self.repl = repl
        self.etime = etime
        self.ctime = ctime  # creation time in Disque's unit (ms x 1,000,000, + a tie breaker)
        self.retry = retry
        self.deliv = deliv
        self.nodes_delivered = nodes_delivered
        self.nodes_confirmed: set[str] | None = None
        self.qtime = 0
        self.awake = 0
        self.tpos = 0
        self.rare: Rare | None = None
        self.priority = priority  # 0-9, fixed at creation: higher is served first (store/queue.py)
        if delay or nacks or max_attempts or dead_letter or origin:
            rare = self.rare = Rare()
            rare.delay, rare.nacks, rare.max_attempts, rare.dead_letter, rare.origin = (
                delay, nacks, max_attempts, dead_letter, origin
            )
        if failure:
            self._rare().failure = failure
        if key:
            self._rare().key = key
        if after:
            self._rare().after = after
        if parents:
            self.hold(parents, on_parent_fail)
        if batch:
            self._rare().batch = batch

    def _rare(self) -> Rare:
        if self.rare is None:
            self.rare = Rare()
        return self.rare

    @property
    def delay(self) -> int:
        return self.rare.delay if self.rare is not None else 0

    @property
    def nacks(self) -> int:
        return self.rare.nacks if self.rare is not None else 0

    @nacks.setter
    def nacks(self, value: int) -> None:
        if value or self.rare is not None:
            self._rare().nacks = value

    @property
    def max_attempts(self) -> int:
        return self.rare.max_attempts if self.rare is not None else 0

    @property
    def dead_letter(self) -> bytes:
        return self.rare.dead_letter if self.rare is not None else b""

    @property
    def origin(self) -> bytes:
        return self.rare.origin if self.rare is not None else b""

    @property
    def failure(self) -> Failure | tuple[()]:
        """The last failure a consumer reported (NO_FAILURE: none); set it
        through `Lifecycle.set_failure`, which accounts its bytes."""
        return self.rare.failure if self.rare is not None else NO_FAILURE

    @failure.setter
    def failure(self, value: Failure | tuple[()]) -> None:
        if value or self.rare is not None:
            self._rare().failure = value

    @property
    def key(self) -> bytes:
        """ADDJOB KEY (b"": none), fixed at creation (docs/keys.md)."""
        return self.rare.key if self.rare is not None else b""

    @key.setter
    def key(self, value: bytes) -> None:
        if value or self.rare is not None:
            self._rare().key = value

    @property
    def gc_retry(self) -> int:
        return self.rare.gc_retry if self.rare is not None else 0

    @gc_retry.setter
    def gc_retry(self, value: int) -> None:
        if value or self.rare is not None:
            self._rare().gc_retry = value

    @property
    def parents(self) -> tuple[bytes, ...]:
        """The parents this job still waits for (core/dependencies.py)."""
        return self.rare.parents if self.rare is not None else ()

    @property
    def after(self) -> tuple[bytes, ...]:
        """Every parent ADDJOB ... AFTER named, those acknowledged included."""
        return self.rare.after if self.rare is not None else ()

    @property
    def on_parent_fail(self) -> int:
        return self.rare.on_parent_fail if self.rare is not None else 0

    @property
    def batch(self) -> bytes:
        """The batch this job belongs to (b"": none; core/batches.py)."""
        return self.rare.batch if self.rare is not None else b""

    def join(self, batch: bytes) -> None:
        """ADDJOB ... BATCH (core/batches.py)."""
        self._rare().batch = batch

    def hold(self, parents: tuple[bytes, ...], on_parent_fail: int) -> None:
        rare = self._rare()
        rare.parents, rare.on_parent_fail = parents, on_parent_fail
        if not rare.after:  # the first hold names them all
            rare.after = parents

    def set_attempts(self, max_attempts: int, dead_letter: bytes) -> None:
        rare = self._rare()
        rare.max_attempts, rare.dead_letter = max_attempts, dead_letter

    def extra_size(self) -> int:
        """The bytes of the `rare` record when a field fixed at creation
        needs it (DELAY, MAXATTEMPTS, `origin`, KEY), with their strings, and of
        its failure (memory accounting: a job counts the same bytes as long
        as it keeps the same failure, so a record that only holds a NACK
        count or the collector's is not charged)."""
        rare = self.rare
        if rare is None:
            return 0
        size = 0
        if failure := rare.failure:
            size = FAILURE_BYTES + len(failure.type) + len(failure.message) + len(failure.traceback) + len(failure.host)
        if not (rare.delay or rare.max_attempts or rare.dead_letter or rare.origin or rare.key):
            return size
        return size + RARE_BYTES + len(rare.dead_letter) + len(rare.origin) + len(rare.key)

    def fields(self, flag_mask: int) -> dict[str, Any]:
        """The constructor's arguments by name, flags masked by `flag_mask`:
        what the codec's job forms carry (cluster/codec.py)."""
        return {
            "id": self.id, "state": self.state, "flags": self.flags & flag_mask, "repl": self.repl,
            "ctime": self.ctime, "delay": self.delay, "retry": self.retry, "nacks": self.nacks,
            "deliv": self.deliv, "queue": self.queue, "body": self.body, "nodes_delivered": self.nodes_delivered,
            "max_attempts": self.max_attempts, "dead_letter": self.dead_letter, "origin": self.origin,
            "parents": self.parents, "on_parent_fail": self.on_parent_fail, "batch": self.batch,
            "after": self.after,
        }  # fmt: skip

    def move(self, event: str) -> None:
        """Apply a state transition; an unlisted one is a programming error."""
        try:
            self.state = TRANSITIONS[self.state][event]
        except KeyError:
            raise AssertionError(f"job {self.id!r}: no transition {event!r} from {STATE_NAMES[self.state]}") from None

    @property
    def is_dummy_ack(self) -> bool:
        return not self.nodes_delivered

    def add_delivered(self, node_id: str) -> None:
        if node_id not in self.nodes_delivered:
            self.nodes_delivered = self.nodes_delivered + (node_id,)

    def sort_key(self) -> tuple[int, bytes]:
        return (self.ctime, self.id)

    def __repr__(self) -> str:
        return f"<Job {self.id.decode()} {STATE_NAMES[self.state]} q={self.queue!r}>"
