"""Clients that wait: blocked GETJOB, WAITJOB, late answers, and serving ready queues.

Theory of operation: a client whose request cannot be answered yet gets a
`Waiter` (`block`) and its request returns BLOCKED; the answer goes out
later as a reply effect (`unblock`).  Three kinds wait:
* GETJOB (and Kestrel's GET, with `take`) on queues: the waiter is listed in
  each queue's `waiters`, in arrival order;
* WAITJOB on job IDs (`job_waits`): the lifecycle calls `settle_waits` when
  a job is acknowledged or goes without it;
* a late answer (AUTH's throttle, a paused client): no queue, no job, just
  the reply at its deadline (`expiry`);
* a long command (DEADLETTER REQUEUE of many jobs, QFLUSH of a long queue):
  `in_slices` runs its first slice at once, then one slice per step
  (`step_slices`, NodeCore's tick, due at once while any runs), so other
  clients wait for a slice, never for the whole command; its client runs
  nothing meanwhile and gets the reply at the end.
Deadlines sit in `timeouts`; `next_deadline` and `tick` (NodeCore) read
them.  A queue that got jobs while someone waits for it is marked `ready`
(by the lifecycle's `enqueue`), and `serve_ready` runs at the end of every
step: one job to each waiter in arrival order, then, if jobs are left and
nobody waits here, federation may hand them to a peer whose consumers wait.

Invariant: clients blocked in GETJOB are served after every command, one
job each, in arrival order.

Collaborators: the job lifecycle (queues, fetch), the outbox (replies) and
federation (NEEDJOBS for empty queues, the queues announced as waited for);
the shell's `wake` when a deadline comes before the one it sleeps until.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from disque.core import errors
from disque.core.federation import CLIENTS_WAITING, REACHED_ZERO
from disque.core.timeouts import Timeouts
from disque.core.types import BLOCKED, NIL_ARRAY, Connection, Host, Waiter
from disque.store.job import State
from disque.store.queue import PAUSE_OUT

if TYPE_CHECKING:
    from disque.core.federation import Federation
    from disque.core.lifecycle import Lifecycle
    from disque.core.limits import Limits
    from disque.core.outbox import Outbox
    from disque.store.job import Job
    from disque.store.queue import Queue

S_ACKED = State.ACKED


class Blocking:
    def __init__(self, life: Lifecycle, out: Outbox, federation: Federation, host: Host, limits: Limits) -> None:
        self.life = life
        self.limits = limits  # a limited queue's jobs are taken through it (core/limits.py)
        self.out = out
        self.federation = federation
        self.host = host
        self.blocked: dict[int, Waiter] = {}
        self.timeouts = Timeouts()  # blocked clients' deadlines
        self.job_waits: dict[bytes, list[Waiter]] = {}  # job ID -> WAITJOB clients waiting for it
        self.ready: dict[bytes, None] = {}
        self.sliced: dict[int, Waiter] = {}  # clients whose long command runs in slices
        self.promised = 0  # the last next_deadline() the shell was given (it sleeps until then)

    def count(self) -> int:
        """INFO's blocked_clients: waiters, and producers waiting for their replicas."""
        return len(self.blocked) + len(self.out.repl_waiters)

    def block(self, client: Connection, queues: tuple[bytes, ...], withcounters: bool, timeout: int, expiry: Any = None) -> Waiter:
        waiter = Waiter(client, queues, withcounters, self.life.now + timeout if timeout else 0, expiry)
        client.waiter = waiter
        self.blocked[client.id] = waiter
        changed = self.federation.changed  # peers hear of it at the end of the step
        for name in queues:
            self.life.queue(name).waiters[client.id] = waiter
            changed[name] = None
        if waiter.deadline:
            self.timeouts.add(waiter)
            if waiter.deadline < self.promised:  # the shell sleeps past it: it must ask next_deadline() again
                self.promised = waiter.deadline
                self.host.wake(waiter.deadline)
        return waiter

    def get_jobs(
        self, client: Connection, names: list[bytes], count: int, nohang: bool, withcounters: bool, timeout: int
    ) -> Any:
        """GETJOB after option parsing: rounds over the queues (spec/commands.md §4.2)."""
        out: list[Any] = []
        life, federation = self.life, self.federation
        while True:
            took = False
            for name in names:
                queue = life.queues.get(name)
                if queue is None or queue.pause & PAUSE_OUT or (job := self.fetch(queue)) is None:
                    federation.need_jobs(queue or life.queue(name), CLIENTS_WAITING)
                    continue
                took = True
                out.append(self.job_entry(job, withcounters))
                if not len(queue):
                    federation.need_jobs(queue, REACHED_ZERO)
                if len(out) == count:
                    return out
            if not took:
                break
        if out:
            return out
        if nohang:
            return NIL_ARRAY
        if life.membership.leaving:
            raise errors.leaving()
        self.block(client, tuple(dict.fromkeys(names)), withcounters, timeout)
        return BLOCKED

    def wait_jobs(self, client: Connection, ids: list[bytes], timeout: int, with_results: bool = False) -> Any:
        """WAITJOB (an extension, docs/commands.md): the number of `ids`
        acknowledged (acked here, or collected after an ACK, a FASTACK or a
        peer's DELJOB), once none is pending any more or `timeout` ms (0:
        none) have passed; `with_results`: that number and the result kept
        for each ID (`waited`).  A job that goes without an acknowledgement
        (expired, deleted, dead-lettered) stops being waited for and is not
        counted.  An ID this node does not know (nor keeps a result for) is
        -NOJOB: ask a node that holds the jobs."""
        life = self.life
        acked, pending = 0, set()
        ids = list(dict.fromkeys(ids))
        for job_id in ids:
            job = life.jobs.get(job_id)
            if job is None:
                if job_id in life.collected:
                    acked += life.collected.acked(job_id)
                elif life.results.get(job_id, life.now) is not None:
                    acked += 1  # collected long ago, or before a restart: its result says it was acknowledged
                else:
                    raise errors.nojob()
            elif job.state == S_ACKED:
                acked += 1
            else:
                pending.add(job_id)
        results = tuple(ids) if with_results else None
        if not pending:
            return self.waited(acked, results)
        waiter = self.block(client, (), False, timeout)
        waiter.jobs, waiter.acked, waiter.results = pending, acked, results
        for job_id in pending:
            self.job_waits.setdefault(job_id, []).append(waiter)
        return BLOCKED

    def settle_waits(self, job_id: bytes, acked: bool) -> None:
        """A job is acknowledged, or gone without it: tell WAITJOB clients."""
        for waiter in self.job_waits.pop(job_id, ()):
            assert waiter.jobs is not None
            waiter.jobs.discard(job_id)
            waiter.acked += acked
            if not waiter.jobs:
                self.unblock(waiter.client, self.waited(waiter.acked, waiter.results))

    def waited(self, acked: int, results: tuple[bytes, ...] | None) -> Any:
        """WAITJOB's reply: how many were acknowledged; with WITHRESULTS,
        that and the result of each of `results` (nil: none kept here)."""
        if results is None:
            return acked
        now = self.life.now
        return [acked, [self.life.results.get(job_id, now) for job_id in results]]

    def answer_late(self, client: Connection, delay: int, reply: Any) -> Any:
        """`reply` (raised if it is an error) now, or BLOCKED when `delay`
        ms must pass first: the client runs nothing meanwhile, then gets it."""
        if not delay:
            if isinstance(reply, errors.DisqueError):
                raise reply
            return reply
        self.block(client, (), False, delay, reply)
        return BLOCKED

    def in_slices(self, client: Connection, work: Generator[None, None, Any]) -> Any:
        """A long command: `work` yields after each slice and returns the
        reply.  Its first slice runs now; the reply, or BLOCKED while slices
        remain (`step_slices`)."""
        try:
            next(work)
        except StopIteration as done:
            return done.value
        waiter = self.block(client, (), False, 0)
        waiter.work = work
        self.sliced[client.id] = waiter
        return BLOCKED

    def step_slices(self) -> None:
        """One slice of each long command; its reply once it is done."""
        for waiter in list(self.sliced.values()):
            try:
                next(waiter.work)
            except StopIteration as done:
                self.unblock(waiter.client, done.value)

    def drop_waiter(self, waiter: Waiter) -> None:
        waiter.client.waiter = None
        self.blocked.pop(waiter.client.id, None)
        self.sliced.pop(waiter.client.id, None)  # (a client gone: the rest of its command is not done)
        if waiter.deadline:
            self.timeouts.dropped()
        for job_id in waiter.jobs or ():
            waits = self.job_waits[job_id]
            waits.remove(waiter)
            if not waits:
                del self.job_waits[job_id]
        for name in waiter.queues:
            queue = self.life.queues.get(name)
            if queue is not None:  # pragma: no branch - a queue with blocked clients is never destroyed
                queue.waiters.pop(waiter.client.id, None)
                self.federation.changed[name] = None

    def unblock(self, client: Connection, value: Any) -> None:
        if client.waiter is not None:  # pragma: no branch - callers pass the client of a live waiter
            self.drop_waiter(client.waiter)
        self.out.reply_to(client, value)

    def unblock_all(self, value: Any) -> None:
        for waiter in list(self.blocked.values()):
            self.unblock(waiter.client, value)

    def time_out(self, now: int) -> None:
        """Answer the waiters whose deadline has come."""
        for waiter in self.timeouts.due(now):
            if waiter.take is not None:
                reply = waiter.take(None)
            elif waiter.jobs is not None:
                reply = self.waited(waiter.acked, waiter.results)
            else:
                reply = waiter.timeout_reply()
            self.unblock(waiter.client, reply)

    def cron(self) -> None:
        """Every 100 ms: a GETJOB still waiting asks peers again (NEEDJOBS),
        or ends if this node is leaving."""
        life = self.life
        for waiter in list(self.blocked.values()):
            if not waiter.queues:  # WAITJOB, or a late AUTH answer
                continue
            if life.membership.leaving:
                self.unblock(waiter.client, errors.leaving())
            else:
                for name in waiter.queues:
                    self.federation.need_jobs(life.queue(name), CLIENTS_WAITING)

    def serve_ready(self) -> None:
        life = self.life
        while self.ready:
            name = next(iter(self.ready))
            del self.ready[name]
            queue = life.queues.get(name)
            if queue is None or queue.pause & PAUSE_OUT:
                continue
            while queue.waiters and len(queue):
                waiter = next(iter(queue.waiters.values()))
                job = self.fetch(queue)
                if job is None:  # a limit holds it back, or its job is on a disk that failed to read (MISCONF)
                    break
                take = waiter.take
                self.unblock(waiter.client, [self.job_entry(job, waiter.withcounters)] if take is None else take(job))
                if not len(queue):
                    self.federation.need_jobs(queue, REACHED_ZERO)
            if len(queue) and not queue.waiters:
                self.federation.hand_out(queue)

    def fetch(self, queue: Queue) -> Job | None:
        """The job to hand a consumer here: the lifecycle's, within the queue's limits if it has some."""
        limits = self.limits
        return self.life.fetch(queue) if queue.name not in limits.budgets else limits.fetch(queue)

    @staticmethod
    def job_entry(job: Job, withcounters: bool) -> list[Any]:
        if not withcounters:
            return [job.queue, job.id, job.body]
        rare = job.rare
        if rare is not None and rare.key:  # ADDJOB KEY, with the counters (docs/keys.md)
            return [job.queue, job.id, job.body, b"nacks", rare.nacks, b"additional-deliveries", job.deliv, b"key", rare.key]
        return [job.queue, job.id, job.body, b"nacks", job.nacks, b"additional-deliveries", job.deliv]
