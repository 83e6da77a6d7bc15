"""Jobs that wait for jobs: ADDJOB ... AFTER <id> (docs/workflows.md).

Theory of operation: a child is made, replicated and stored as any job is,
carrying the parents it still waits for (`Job.parents`) and what a parent
that fails does to it (`Job.on_parent_fail`).  While it has parents it is
held: `Lifecycle.enqueue` refuses it and zeroes its requeue time, so no path
(the timer, ENQUEUE, a replay, NACK) queues it.  The waiting state lives in
the child's copies and nowhere else: no node keeps a record of the graph.

Each holder of a held child learns its parents' fate on its own:
- from what it knows (`fate`): a parent acknowledged here (an acked record,
  a result kept, an ID collected after its ACK) or gone without one (an ID
  collected unacknowledged);
- by asking: DEPEND (the parents) goes to every linked peer when it starts
  holding the child and again every `DEPEND_EVERY_MS` while it holds one;
  a peer answers SETTLED for each parent whose fate it knows, and keeps
  the asker as a watcher of each parent it holds pending;
- by being told: when a watched parent is acknowledged, or goes without
  that (it expired or was dead-lettered: `settled`), SETTLED goes to its
  watchers and the children held here are resolved.
SETTLED carries the parent's result, which the child's holder keeps
(store/results.py), so a child's consumer reads its parents' results on
the node that served it.

Resolving: an acknowledged parent leaves the child's list; once the list is
empty the child is released (and logged again, without parents, so that a
restart does not hold it again).  Its creator, when it is among its holders
seen up, else the holder first in the child's order (core/homes.py, among
those) queues it now; the others set a RETRY requeue timer as any
replica's copy has, so it is queued once in a connected cluster and at
least once under faults (a creator still waiting for its copies queues it
when they are made, so that no copy runs before its ADDJOB is answered).  A parent that fails applies
ON-PARENT-FAIL: `run` takes it as acknowledged, `drop` deletes every copy
(each holder its own), `fail` dead-letters the child at that first holder
(the move deletes the other copies) and the others drop theirs.

Faults: watchers live in memory (a restart forgets them) and DEPEND's
repeat finds them again; a parent whose fate no node remembers any more
(an ID collected more than 5 minutes ago with no result kept) leaves its
children held until their TTL.  Owned by the lifecycle (`life.deps`);
called by ADDJOB and adoption (`hold`), the ACK paths, expiry and
dead-lettering (`settled`), the bus (DEPEND, SETTLED) and the cron.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from disque.cluster import messages as m
from disque.core.homes import score
from disque.store.failure import Failure
from disque.store.ids import node_prefix
from disque.store.job import BCAST_WILLQUEUE, Job, State

if TYPE_CHECKING:
    from disque.core.lifecycle import Lifecycle

DEPEND_EVERY_MS: Final = 1000  # a holder of held children asks its peers again this often
DEPEND_BATCH: Final = 1000  # parent IDs per DEPEND
FAIL, RUN, DROP = 0, 1, 2  # ON-PARENT-FAIL (store/job_options.py's ON_PARENT_FAIL)
_WAITING: Final = (State.WAIT_REPL, State.ACTIVE)  # the states a held child can be in


class Dependencies:
    def __init__(self, life: Lifecycle) -> None:
        self.life = life
        self.held: dict[bytes, set[bytes]] = {}  # parent ID -> the children held here that wait for it
        self.watchers: dict[bytes, set[str]] = {}  # parent ID held here -> the nodes that asked about it
        self._last_ask = 0
        self.released = self.failed = 0  # INFO workflows: children released here, parents that failed one

    def hold(self, job: Job) -> None:
        """A child with parents is held here (new, or a copy adopted)."""
        job.qtime = 0
        for parent in job.parents:
            self.held.setdefault(parent, set()).add(job.id)
        self._ask(job.parents)

    def fate(self, job_id: bytes) -> bool | None:
        """True: acknowledged; False: gone without it; None: pending or unknown here."""
        life = self.life
        job = life.jobs.get(job_id)
        if job is not None:
            return True if job.state == State.ACKED else None
        if job_id in life.collected:
            return life.collected.acked(job_id)
        return True if life.results.get(job_id, life.now) is not None else None

    def _ask(self, parents: tuple[bytes, ...] | list[bytes]) -> None:
        """What this node knows of `parents` at once; DEPEND to the peers for the rest."""
        unknown = []
        for parent in parents:
            fate = self.fate(parent)
            if fate is None:
                unknown.append(parent)
            else:
                self.resolve_all(parent, fate)
        peers = self.life.membership.linked_ids(features=m.FEATURE_BATCHES)
        for i in range(0, len(unknown) if peers else 0, DEPEND_BATCH):
            self.life.out.broadcast(peers, m.Depend(tuple(unknown[i : i + DEPEND_BATCH])))

    def cron(self) -> None:
        """Every DEPEND_EVERY_MS while children are held here: ask again."""
        now = self.life.now
        if self.held and now - self._last_ask >= DEPEND_EVERY_MS:
            self._last_ask = now
            self._ask(list(self.held))

    # ------------------------------------------------------------ a parent's fate

    def settled(self, job_id: bytes, acked: bool) -> None:
        """Job `job_id` was acknowledged here (or learned so), or went
        without that: its watchers and the children held here hear of it.
        The callers test `watchers or held` first (plain jobs pay nothing)."""
        life = self.life
        nodes = self.watchers.pop(job_id, None)
        if nodes:
            life.out.broadcast(nodes, m.Settled(job_id, acked, life.results.get(job_id, life.now) or b""))
        self.resolve_all(job_id, acked)

    def on_depend(self, sender: str, msg: m.Depend) -> None:
        life = self.life
        for parent in msg.ids:
            fate = self.fate(parent)
            if fate is not None:
                life.out.send(sender, m.Settled(parent, fate, life.results.get(parent, life.now) or b""))
            elif parent in life.jobs:
                self.watchers.setdefault(parent, set()).add(sender)

    def on_settled(self, sender: str, msg: m.Settled) -> None:
        if msg.result:
            self.life.collector.keep_result(msg.id, None, msg.result)
        self.resolve_all(msg.id, msg.acked)

    # ------------------------------------------------------------ the children

    def resolve_all(self, parent: bytes, acked: bool) -> None:
        life = self.life
        for child_id in self.held.pop(parent, ()):
            child = life.jobs.get(child_id)
            if child is not None and child.state in _WAITING and parent in child.parents:
                self.resolve(child, parent, acked)

    def resolve(self, child: Job, parent: bytes, acked: bool) -> None:
        """One of `child`'s parents was acknowledged, or failed (`acked` False)."""
        life = self.life
        policy = child.on_parent_fail
        if not acked:
            self.failed += 1
        if not acked and policy != RUN:
            if policy == FAIL and child.state == State.ACTIVE and self._first(child):
                life.set_failure(child, Failure(b"ParentFailed", b"job %s went unacknowledged" % parent, b"", b"", 0, life.now))
                life.dead_letter_job(child)
            else:
                life.delete_job(child)
            return
        child.hold(tuple(p for p in child.parents if p != parent), policy)
        if child.parents:
            return
        self.released += 1
        if child.state == State.WAIT_REPL:
            child.qtime = life.now  # queued by its creator once its copies are made
            return
        if self._first(child):
            child.qtime = life.now
            life.enqueue(child)
        else:  # the others' timers, as for any copy (adopt; a RETRY 0 job has one copy, whose node comes first)
            child.flags |= BCAST_WILLQUEUE
            child.qtime = life.now + child.retry * 1000 + life.jitter()
            life.reschedule(child)
        life.out.aof_loadjob(child)

    def info_fields(self) -> list[tuple[str, int]]:
        """INFO workflows (docs/workflows.md)."""
        life = self.life
        held = {c for children in self.held.values() for c in children if (job := life.jobs.peek(c)) is not None and job.parents}
        return [
            ("jobs_held", len(held)), ("jobs_released", self.released), ("parents_failed", self.failed),
            ("parents_watched", len(self.watchers)), ("results_kept", len(life.results)), ("results_bytes", life.results.size),
        ]

    def _first(self, child: Job) -> bool:
        """Whether this node comes first among the child's holders it sees
        up: its creator when it is one of them (a creator still waiting for
        the copies queues it once they are made: a copy queued elsewhere
        could run, and be acknowledged, before its ADDJOB is answered),
        else the first in the child's order."""
        life = self.life
        holders = [n for n in life.membership.up_ids() if n in child.nodes_delivered]
        creator = node_prefix(child.id)
        first = min(holders, key=lambda n: (not n.startswith(creator), score(child.id, n)), default=life.membership.my_id)
        return first == life.membership.my_id
