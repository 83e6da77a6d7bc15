"""Cluster bus messages, one frozen dataclass per verb (spec/cluster.md §2.2).

Theory of operation: these are the values the core exchanges with the bus.
`membership.py`, `replication.py` and `federation.py` build them and match on
them; `codec.py` alone knows how they look on the wire and validates every
field on the way in, so a handler never sees a field of the wrong type or out
of range.  Every message travels with a `Header` (the envelope: who sent it).

Per-message flags (`mflags` on the wire) appear here as booleans on the
messages they belong to (`ReplJob.noreply`, `Queued.incr_nacks`,
`Queued.incr_deliv`, `YourJobs.pushed`, ...).

Jobs travel in their bus form, a `WireJob`: the plain dict made by
`records.job_to_wire(job, now_ms)` (store/records.py), with a relative `ttl` (ms) instead of an absolute
`etime`.  The receiver turns it into its own `Job` with
`records.job_from_wire(d, now_ms)` and then applies the receive rules of
spec/cluster.md §8.1.  Messages never hold a live `Job`: the sender keeps mutating
its record after the message is built, and a simulated network may deliver
the same message twice.  Treat a `WireJob` as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from disque.store.failure import NO_FAILURE, Failure
from disque.store.records import WireJob

# Node flag bits, as kept in the node table and sent in headers and gossip.
PFAIL: Final = 1
FAIL: Final = 2
MYSELF: Final = 4
HANDSHAKE: Final = 8
NOADDR: Final = 16
MEET: Final = 32
DELETED: Final = 64
LEAVING: Final = 128

# Feature bits a node sends in its PING, PONG and MEET (`features`): what it
# understands beyond the messages every version reads.  A peer sends a
# message of a feature only to a node that said it has it, so a node of an
# older version, which drops the link on a message type it does not know,
# never gets one (rolling upgrades, spec/cluster.md §2.3).
FEATURE_WAITING: Final = 1  # WAITING (core/federation.py)
FEATURE_SCHEDULES: Final = 2  # SCHEDSET and TICKED (core/schedules.py)
FEATURE_KEYS: Final = 4  # KEYCLAIM, KEYCLAIMED, KEYSET and KEYDONE (core/keys.py)
FEATURE_LIMITS: Final = 8  # QSET, LIMITASK and LIMITGRANT (core/limits.py)
FEATURE_BATCHES: Final = 16  # DEPEND and SETTLED (core/dependencies.py), BATCHSET (core/batches.py)
FEATURE_DEBOUNCE: Final = 32  # KEYCLAIM's `debounce` and KEYSET's debounced records (core/keys.py)
FEATURES: Final = FEATURE_WAITING | FEATURE_SCHEDULES | FEATURE_KEYS | FEATURE_LIMITS | FEATURE_BATCHES | FEATURE_DEBOUNCE  # this node's

ZONE_MAX_LEN: Final = 64


def valid_zone(name: str) -> bool:
    """A zone name (docs/zones.md): printable ASCII without spaces, so that
    it is one word in CLUSTER NODES and the config file; "" is no zone."""
    return len(name) <= ZONE_MAX_LEN and all("!" <= c <= "~" for c in name)


@dataclass(frozen=True, slots=True)
class Header:
    """Envelope of every message: sender's node ID, client port, node flags."""

    sender: str
    port: int
    flags: int


@dataclass(frozen=True, slots=True)
class GossipEntry:
    node_id: str
    ip: str
    port: int
    flags: int


@dataclass(frozen=True, slots=True)
class Ping:
    gossip: tuple[GossipEntry, ...] = ()
    features: int = 0  # the sender's FEATURE_* bits (0: an older node that sends none)
    zone: str = ""  # the sender's zone (docs/zones.md); "" from a node without one
    clock: int = 0  # the sender's clock (ms) as it sent this (0: an older node that sends none)


@dataclass(frozen=True, slots=True)
class Pong:
    gossip: tuple[GossipEntry, ...] = ()
    features: int = 0  # the sender's FEATURE_* bits (0: an older node that sends none)
    zone: str = ""  # the sender's zone (docs/zones.md); "" from a node without one
    clock: int = 0  # the sender's clock (ms) as it sent this (0: an older node that sends none)


@dataclass(frozen=True, slots=True)
class Meet:
    gossip: tuple[GossipEntry, ...] = ()
    features: int = 0  # the sender's FEATURE_* bits (0: an older node that sends none)
    zone: str = ""  # the sender's zone (docs/zones.md); "" from a node without one
    clock: int = 0  # the sender's clock (ms) as it sent this (0: an older node that sends none)


@dataclass(frozen=True, slots=True)
class Fail:
    node: str


# The two the core makes for every replicated job write their own __init__:
# the compiled build keeps a generated one interpreted (docs/performance.md).
@dataclass(slots=True, init=False)
class ReplJob:
    job: WireJob
    noreply: bool

    def __init__(self, job: WireJob, noreply: bool = False) -> None:
        self.job = job
        self.noreply = noreply


@dataclass(slots=True, init=False)
class GotJob:
    id: bytes

    def __init__(self, id: bytes) -> None:
        self.id = id


@dataclass(frozen=True, slots=True)
class ReplJobs:
    """REPLJOB for several jobs in one body: what a link in the positional
    form carries for the REPLJOBs (all with the same `noreply`) one step
    sends a peer in a row (shell/bus.py)."""

    jobs: tuple[WireJob, ...]  # at least one
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class GotJobs:
    """GOTJOB for several jobs in one body, as ReplJobs is for REPLJOB."""

    ids: tuple[bytes, ...]  # at least one


@dataclass(frozen=True, slots=True)
class Enqueue:
    id: bytes
    delay: int  # seconds, counted from reception


@dataclass(frozen=True, slots=True)
class Queued:
    id: bytes
    incr_nacks: bool = False
    incr_deliv: bool = False
    delay: int = 0  # NACK DELAY: seconds before any node may queue the job again
    failure: Failure | tuple[()] = NO_FAILURE  # NACK ERROR: the failure the consumer reported (store/failure.py)


@dataclass(frozen=True, slots=True)
class Working:
    id: bytes


@dataclass(frozen=True, slots=True)
class WillQueue:
    id: bytes


@dataclass(frozen=True, slots=True)
class SetAck:
    id: bytes
    mayhave: int  # size of the sender's nodes_delivered
    holders: tuple[str, ...] = ()  # the sender's nodes_delivered (an older node sends none)
    result: bytes = b""  # the result the consumer acknowledged with (store/results.py; b"": none)


@dataclass(frozen=True, slots=True)
class GotAck:
    id: bytes
    known: bool


@dataclass(frozen=True, slots=True)
class DelJob:
    id: bytes
    acked: bool = True  # False: deleted without an acknowledgement (aborted replication, dead-lettered)


@dataclass(frozen=True, slots=True)
class NeedJobs:
    queue: bytes
    count: int


@dataclass(frozen=True, slots=True)
class YourJobs:
    jobs: tuple[WireJob, ...]  # at least one
    pushed: bool = False  # to a node that announced waiting consumers, not an answer to NEEDJOBS (counted only)


@dataclass(frozen=True, slots=True)
class Pause:
    queue: bytes
    flags: int  # bit 1 = paused for input, bit 2 = paused for output


@dataclass(frozen=True, slots=True)
class Fanout:
    """A fanout child (`parent+child`, docs/kestrel.md) starts receiving its
    parent's items (`joined`), or stops."""

    child: bytes
    joined: bool = True


@dataclass(frozen=True, slots=True)
class GroupSet:
    """Consumer-group progress of an event (core/groups.py), told to its
    holders: `group` holds it until `deadline` (ms), or is done with it (0)."""

    id: bytes
    group: bytes
    deadline: int


@dataclass(frozen=True, slots=True)
class Claim:
    """A QGET on the sender asks the event's server to hand it to `group`
    until `deadline` (0: done at once); `ticket` names the waiting QGET."""

    id: bytes
    group: bytes
    deadline: int
    ticket: int


@dataclass(frozen=True, slots=True)
class GroupAck:
    """A QACK on the sender, passed on to the event's server."""

    id: bytes
    group: bytes
    ticket: int


@dataclass(frozen=True, slots=True)
class Claimed:
    """The server's answer to a `Claim` or a `GroupAck`; `unknown`: it does
    not hold the event (any more); `id`: the event granted (a claim)."""

    ticket: int
    granted: bool = False
    unknown: bool = False
    id: bytes = b""


@dataclass(frozen=True, slots=True)
class NeedEvent:
    """A QGET found nothing among the events its node holds: may the
    receiver hand `group` one of the events it serves, until `deadline` (0:
    done at once)?  Answered by `YourEvent`, or a `Claimed` that is not granted."""

    queue: bytes
    group: bytes
    deadline: int
    ticket: int


@dataclass(frozen=True, slots=True)
class YourEvent:
    """An event handed to the asker of a `NeedEvent`, which does not hold it."""

    ticket: int
    id: bytes
    body: bytes


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event was added to `queue` (to the nodes that do not hold it)."""

    queue: bytes


@dataclass(frozen=True, slots=True)
class GroupFlush:
    """QFLUSH: every event of `queue` and its groups' progress go."""

    queue: bytes


@dataclass(frozen=True, slots=True)
class WaitEntry:
    queue: bytes
    count: int  # consumers blocked on the queue on the sender (0: none any more)


@dataclass(frozen=True, slots=True)
class Waiting:
    """Consumers blocked on the sender wait for jobs of these queues
    (core/federation.py): the receiver hands them jobs it has queued,
    with YOURJOBS, at once and as jobs come, until the entry expires."""

    entries: tuple[WaitEntry, ...]  # at least one


@dataclass(frozen=True, slots=True)
class SchedSet:
    """A schedule's definition (store/schedule.py's storage form, checked by
    the core, which drops a bad one alone), told to every node; the newer
    version wins."""

    record: bytes


@dataclass(frozen=True, slots=True)
class Ticked:
    """Tick `tick` (ms) of schedule `name` became a job, made by `node`
    (core/schedules.py): the nodes next in line for it stand down."""

    name: bytes
    tick: int
    node: str


@dataclass(frozen=True, slots=True)
class KeyClaim:
    """ADDJOB ... KEY DEDUP on a node that is not the key's home: may `job`
    hold (queue, key) for `hold` ms (`active`: until it is acknowledged, at
    most that; `debounce`: DEBOUNCE, superseding the key's pending job)?
    The home (core/keys.py) answers KEYCLAIMED."""

    ticket: int
    queue: bytes
    key: bytes
    job: bytes
    hold: int
    active: bool = False
    debounce: bool = False


@dataclass(frozen=True, slots=True)
class KeyClaimed:
    """The home's answer to KEYCLAIM `ticket`: the job that holds the key
    (the one asked for when the claim is granted)."""

    ticket: int
    queue: bytes
    key: bytes
    job: bytes


@dataclass(frozen=True, slots=True)
class KeySet:
    """A key's hold (store/keyed.py's storage form, checked by the core,
    which drops a bad one alone), from its home to its standbys, or to a
    node that links up; the newer version wins."""

    record: bytes


@dataclass(frozen=True, slots=True)
class KeyDone:
    """Job `job` no longer needs its hold of (queue, key): acknowledged
    (which ends a DEDUP ACTIVE hold), or never made (`aborted`: its ADDJOB
    failed, which ends any hold)."""

    queue: bytes
    key: bytes
    job: bytes
    aborted: bool = False


@dataclass(frozen=True, slots=True)
class QSet:
    """A queue's limits (store/limits.py's storage form, checked by the
    core, which drops a bad one alone), told to every node; the newer
    version wins."""

    record: bytes


@dataclass(frozen=True, slots=True)
class LimitAsk:
    """To a limited queue's (or key's) home (core/limits.py): the sender wants a lease
    of `want` slots (it has `out` jobs out and holds a lease of `held`)
    and `tokens` more tokens; `at` is its time of asking, echoed."""

    queue: bytes
    want: int
    out: int
    held: int
    tokens: int
    at: int
    key: bytes = b""  # a key's budget (per-key limits), not the queue's


@dataclass(frozen=True, slots=True)
class LimitGrant:
    """The home's answer to the LIMITASK of time `at`: a lease of `slots`
    (the whole lease), `tokens` tokens, and, with none, `retry` ms until
    the next token comes."""

    queue: bytes
    slots: int
    tokens: int
    retry: int
    at: int
    key: bytes = b""


@dataclass(frozen=True, slots=True)
class Depend:
    """The sender holds jobs waiting for these (core/dependencies.py): the
    receiver answers SETTLED for each one it knows acknowledged or gone,
    and for the others it holds, once they are."""

    ids: tuple[bytes, ...]  # at least one


@dataclass(frozen=True, slots=True)
class Settled:
    """Job `id` was acknowledged (`acked`, with its `result`, b"": none) or
    went without an acknowledgement (expired, dead-lettered, deleted)."""

    id: bytes
    acked: bool
    result: bytes = b""


@dataclass(frozen=True, slots=True)
class BatchSet:
    """A batch's whole record (store/batch.py's form, checked by the core,
    which drops a bad one alone), merged by union (core/batches.py)."""

    record: bytes


Message = (
    Ping | Pong | Meet | Fail | ReplJob | ReplJobs | GotJob | GotJobs | Enqueue | Queued | Working
    | WillQueue | SetAck | GotAck | DelJob | NeedJobs | YourJobs | Pause | Fanout
    | GroupSet | Claim | GroupAck | Claimed | NeedEvent | YourEvent | NewEvent | GroupFlush | Waiting
    | SchedSet | Ticked | KeyClaim | KeyClaimed | KeySet | KeyDone | QSet | LimitAsk | LimitGrant | Depend | Settled | BatchSet
)  # fmt: skip
