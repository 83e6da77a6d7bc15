"""A recorded producer/consumer workload under a fault schedule (a nemesis).

Theory of operation: `run_workload(plan, seed)` builds a `SimCluster`,
forms it, and runs producers, consumers and the nemesis concurrently.
Producers ADDJOB unique bodies on random live nodes, mixing at-least-once
jobs (REPLICATE 2-3, RETRY 1-3) and at-most-once jobs (REPLICATE 1,
RETRY 0), some with a short TTL or a DELAY; consumers GETJOB one job at a
time on random live nodes and ACKJOB or FASTACK it, sometimes after a
WORKING, or now and then NACK it or crash before acknowledging.  With
`extensions`, the NACKs are NACK ... DELAY 1, at-least-once jobs get
MAXATTEMPTS 3 with a dead-letter queue the consumers also read, every job
a PRIORITY (0-9, in turn: no random draw), and the first job added and a tenth of the others are followed by a WAITJOB (the
checker's phantom_acks; a run that added few jobs still waits for one);
without it, the random choices are exactly those of a plain run.  With
`plan.minrepl`, at-least-once jobs are REPLICATE 3 MINREPL 2: the checker
then counts 2 copies for each (a job wiped on 2 nodes is excused, on 1 lost).  The
nemesis plays `plan.steps` (see `FaultPlan`): network faults (partitions,
heals), crashes (kill -9, restart with or without the AOF), disks that
lie (a lost unsynced tail, a torn record, flipped bits, a full disk), and
administration, sent as commands to the node like any client would:
DEBUG FLUSHALL, CLUSTER RESET SOFT|HARD followed by the operator's re-MEET
(and, for HARD, CLUSTER FORGET of the old ID on every other live node),
CLUSTER FORGET of a live peer, CLUSTER LEAVING yes|no and CONFIG SET
cluster-node-timeout; in a cluster with zones, the loss of a whole zone
(its nodes cut off together, or killed together).

What the nemesis destroys on purpose is recorded as `wipe` records: the IDs
the node held at the instant of a FLUSHALL or RESET (read in the same
scheduler step as the command, so nothing can arrive in between), or at
its death for a restart without the AOF.  The checker excuses a job wiped
on as many nodes as it had copies (disque/testing/checker.py); any other job the
cluster loses is a loss.

After the schedule the cluster heals, every dead node comes back with its
AOF, LEAVING and the node timeout are undone, and the mesh re-forms;
producers stop a little later; consumers keep going while a drainer polls
every node, until no job has turned up for a while.  The run then waits for
ACK garbage collection to settle, ends with a `scan` of every node, and
asserts that no dummy ACK survived (the scan cannot see them).  Every client
operation is recorded in a `disque.testing.checker.History`, whose records
`run_workload` returns for `disque.testing.checker.check`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import trio

from disque.core import errors
from disque.testing.checker import ACK, DEQUEUE, ENQUEUE, FAIL, FASTACK, INFO, NACK, OK, SCAN, WAITJOB, WIPE, History, Record
from disque.core.errors import DisqueError
from disque.core.types import NIL_ARRAY
from sim.network import CONNECTION_LOST, SimCluster, now_ms
from support import all_jobs

QUEUE = "jobs"
DEAD = "jobs-dead"  # extensions: the dead-letter queue, consumed too
ADDJOB_TIMEOUT_MS = 1000
PRODUCE_AFTER_S = 3  # producers keep going this long on the healed cluster
DISK_FULL_MS = 2000  # how long a "full" disk step refuses writes
QUIET_S = 10  # a drain ends after this long without a delivery
DRAIN_LIMIT_S = 120
GC_LIMIT_S = 400
ACK_COMMANDS = {ACK: "ACKJOB", FASTACK: "FASTACK"}


@dataclass
class FaultPlan:
    """`steps`: (action, *params, wait ms), the action one of

    ("partition", groups)  node indexes talk when they share a group
    ("heal",)
    ("kill", i)            kill -9 (no-op if dead)
    ("restart", aof)       the node killed first comes back, with its AOF or without
    ("flushall", i)        DEBUG FLUSHALL
    ("reset", i, mode)     CLUSTER RESET soft|hard, then re-MEET
    ("forget", i, j)       CLUSTER FORGET on i of j's ID
    ("leaving", i, flag)   CLUSTER LEAVING yes|no
    ("timeout", i, ms)     CONFIG SET cluster-node-timeout
    ("zone", z, mode)      every node of zone z at once: "isolate" (a partition
                           of the zone from the rest) or "kill" (each killed)
    ("disk", i, how)       node i's disk lies: "lose-tail", "torn" or "bitflip"
                           kill it (-9) and damage its AOF (network.py's disk
                           model) for its next restart; "full" makes its AOF
                           fail (MISCONF) for DISK_FULL_MS

    Commands to a dead node (or i == j) are skipped."""

    nodes: int = 5
    drop: float = 0.0
    dup: float = 0.0
    delay: tuple[float, float] = (0.1, 2.0)  # ms
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    producers: int = 3
    consumers: int = 2
    node_timeout: int = 1000
    zones: tuple[str, ...] = ()  # node index -> zone; with zones, at-least-once jobs need ZONES 2
    minrepl: bool = False  # at-least-once jobs are REPLICATE 3 MINREPL 2 (the default ADDJOB's rule)


class Workload:
    def __init__(self, cluster: SimCluster, plan: FaultPlan, seed: int, extensions: bool = False) -> None:
        self.cluster = cluster
        self.plan = plan
        self.extensions = extensions
        self.queues = (QUEUE, DEAD) if extensions else (QUEUE,)
        self.rng = random.Random(f"{seed}/workload")
        self.history = History(now_ms)
        self.producing = True
        self.last_delivery = 0.0
        self.acked: set[str] = set()
        self.dead: list[int] = []  # killed nodes, in order of death
        self._bodies = 0
        self._waited = False  # a WAITJOB was sent
        self._processes = 0

    def _process(self) -> int:
        self._processes += 1
        return self._processes

    def _live_node(self) -> int | None:
        live = [n.index for n in self.cluster.nodes if n.alive]
        return self.rng.choice(live) if live else None

    # ------------------------------------------------------------ clients

    async def producer(self) -> None:
        """Unique bodies added on random live nodes (`produce`), until told to stop."""
        process = self._process()
        while self.producing:
            node = self._live_node()
            if node is None:
                await trio.sleep(0.1)
                continue
            self._bodies += 1
            await self.produce(process, node, f"v{self._bodies}")
            await trio.sleep(self.rng.uniform(0.01, 0.2))

    async def produce(self, process: int, node: int, body: str) -> None:
        """One ADDJOB of `body`, with options drawn at random."""
        if self.rng.random() < 0.25:
            opts = {"queue": QUEUE, "replicate": 1, "retry": 0}
        else:
            opts = {"queue": QUEUE, "replicate": self.rng.choice((2, 3)), "retry": self.rng.randint(1, 3)}
            if self.plan.minrepl:
                opts |= {"replicate": 3, "minrepl": 2}
        opts["ttl"] = self.rng.choice((15, 300, 300, 300))
        delay = self.rng.choice((0, 0, 0, 1))
        limits = ("MAXATTEMPTS", 3, "DEADLETTER", DEAD) if self.extensions and opts["retry"] else ()
        if self.plan.zones and opts["retry"]:
            limits += ("ZONES", 2)
        priority = ("PRIORITY", self._bodies % 10) if self.extensions else ()
        op = self.history.invoke(process, node, ENQUEUE, body=body, value=opts)
        reply = await self.cluster.call(
            node, "ADDJOB", QUEUE, body, ADDJOB_TIMEOUT_MS, "REPLICATE", opts["replicate"],
            "RETRY", opts["retry"], "TTL", opts["ttl"], "DELAY", delay, *limits, *priority,
            *(("MINREPL", opts["minrepl"]) if "minrepl" in opts else ()),
        )  # fmt: skip
        if self.added(op, reply) and self.extensions and (not self._waited or self.rng.random() < 0.1):
            self._waited = True  # (checked by phantom_acks)
            await self.job_command(process, node, WAITJOB, reply.decode(), "WAITJOB", reply.decode(), "TIMEOUT", 200)

    def added(self, op: Record, reply: Any) -> bool:
        """Record the outcome of an add: ok with the ID (True), fail when
        refused before anything existed, info otherwise (a replication
        timeout leaves copies behind, a dead node tells nothing)."""
        if isinstance(reply, bytes):
            self.history.complete(op, OK, job=reply.decode())
            return True
        refused = reply == errors.norepl_reach() or reply == errors.norepl_zones()
        self.history.complete(op, FAIL if refused else INFO, value=str(reply))
        return False

    async def consumer(self, nohang: bool = False) -> None:
        """GETJOB on random live nodes (or, when draining, on each node in
        turn without blocking), then acknowledge."""
        process = self._process()
        turn = 0
        while True:
            if nohang:
                turn += 1
                node = turn % len(self.cluster.nodes)
                if not self.cluster.nodes[node].alive:
                    continue
            else:
                node = self._live_node()
                if node is None:
                    await trio.sleep(0.1)
                    continue
            options = ("NOHANG",) if nohang else ("TIMEOUT", 500)
            op = self.history.invoke(process, node, DEQUEUE, value={"queues": list(self.queues)})
            reply = await self.cluster.call(node, "GETJOB", *options, "FROM", *self.queues)
            if reply is CONNECTION_LOST:
                self.history.complete(op, INFO, value="connection lost")
            elif reply is NIL_ARRAY or isinstance(reply, DisqueError):
                self.history.complete(op, FAIL, value=str(reply))
                if nohang or reply is not NIL_ARRAY:  # answered at once (-LEAVING, ...): no spinning
                    await trio.sleep(0.05)
                continue
            else:
                ((_, job_id, body),) = reply
                job = job_id.decode()
                self.history.complete(op, OK, job=job, body=body.decode())
                self.last_delivery = trio.current_time()
                await self.acknowledge(process, node, job)
            await trio.sleep(self.rng.uniform(0.01, 0.1))

    async def acknowledge(self, process: int, node: int, job: str) -> None:
        roll = self.rng.random()
        if roll < 0.05:
            return  # the consumer crashed: the job comes back after its retry
        if roll < 0.1 or (self.extensions and self.rng.random() < 0.3):  # gave up on it: queued again (at once, or after a second)
            if self.extensions:
                await self.job_command(process, node, NACK, job, "NACK", job, "DELAY", 1)
            else:
                await self.cluster.call(node, "NACK", job)
            return
        if roll < 0.15:  # a slow worker asks for more time first
            await self.cluster.call(node, "WORKING", job)
        kind = FASTACK if roll < 0.3 else ACK
        if await self.job_command(process, node, kind, job, ACK_COMMANDS[kind], job):
            self.acked.add(job)

    async def job_command(self, process: int, node: int, op: str, job: str, *command: Any) -> bool:
        """One command about `job`, recorded as `op`: ok (True) with an
        integer reply, info otherwise."""
        record = self.history.invoke(process, node, op, job=job)
        reply = await self.cluster.call(node, *command)
        done = isinstance(reply, int)
        self.history.complete(record, OK if done else INFO, value=reply if done else str(reply))
        return done

    # ------------------------------------------------------------ nemesis

    async def nemesis(self) -> None:
        for action, *args in self.plan.steps:
            *params, wait_ms = args
            await getattr(self, f"_{action}")(*params)
            await trio.sleep(wait_ms / 1000)

    async def _partition(self, groups: list[list[int]]) -> None:
        self.cluster.partition(groups)

    async def _heal(self) -> None:
        self.cluster.heal()

    async def _kill(self, i: int) -> None:
        if self.cluster.nodes[i].alive:
            self.cluster.kill(i)
            self.dead.append(i)

    async def _restart(self, aof: bool) -> None:
        if self.dead:
            i = self.dead.pop(0)
            if not aof:
                self._wiped(i, "restart without AOF", self.cluster.nodes[i].held_at_death)
            await self.cluster.restart(i, aof)

    async def _flushall(self, i: int) -> None:
        if self.cluster.nodes[i].alive:
            await self._wipe(i, "flushall", "DEBUG", "FLUSHALL")

    async def _reset(self, i: int, mode: str) -> None:
        """CLUSTER RESET as an operator does it: the old ID forgotten
        everywhere after a HARD reset, then a MEET to rejoin."""
        cluster = self.cluster
        if not cluster.nodes[i].alive:
            return
        old_id = cluster.node_id(i)
        await self._wipe(i, f"reset {mode}", "CLUSTER", "RESET", mode)
        others = [n.index for n in cluster.nodes if n.alive and n.index != i]
        if mode == "hard":
            for j in others:
                if old_id in cluster.core(j).membership.nodes:
                    await self._admin(j, "CLUSTER", "FORGET", old_id)
        if others:
            await cluster.meet(i, self.rng.choice(others))

    async def _forget(self, i: int, j: int) -> None:
        cluster = self.cluster
        if i != j and cluster.nodes[i].alive and cluster.node_id(j) in cluster.core(i).membership.nodes:
            await self._admin(i, "CLUSTER", "FORGET", cluster.node_id(j))

    async def _leaving(self, i: int, flag: str) -> None:
        if self.cluster.nodes[i].alive:
            await self._admin(i, "CLUSTER", "LEAVING", flag)

    async def _timeout(self, i: int, ms: int) -> None:
        if self.cluster.nodes[i].alive:
            await self._admin(i, "CONFIG", "SET", "cluster-node-timeout", ms)

    async def _disk(self, i: int, how: str) -> None:
        node = self.cluster.nodes[i]
        if how == "full":
            core = node.core
            if core is not None:
                core.set_aof_error("No space left on device")
                await trio.sleep(DISK_FULL_MS / 1000)
                core.set_aof_error(None)  # (a core killed meanwhile is gone: nothing to undo)
            return
        await self._kill(i)
        node.damage(how, self.rng)

    async def _zone(self, name: str, mode: str) -> None:
        cluster = self.cluster
        inside = cluster.zone(name)
        if mode == "isolate":
            cluster.partition([inside, [i for i in range(len(cluster.nodes)) if i not in inside]])
        else:
            for i in inside:
                await self._kill(i)

    async def _admin(self, i: int, *command: Any) -> None:
        reply = await self.cluster.call(i, *command)
        assert reply == b"OK", (i, command, reply)

    async def _wipe(self, i: int, action: str, *command: Any) -> None:
        """Run a command that drops every job of node i, and record what it
        held: read in the same scheduler step as the command runs (`call`
        enters the core before it awaits anything)."""
        held = self.cluster.nodes[i].held()
        await self._admin(i, *command)
        self._wiped(i, action, held)

    def _wiped(self, i: int, action: str, held: list[str]) -> None:
        self.history.add(OK, "nemesis", i, WIPE, value={"action": action, "held": held})

    async def recover(self) -> None:
        """Undo every fault: heal, restart the dead with their AOF, clear
        LEAVING and the timeouts set by CONFIG SET, re-form the mesh."""
        cluster = self.cluster
        cluster.heal()
        while self.dead:
            await self._restart(aof=True)
        for node in cluster.nodes:
            await self._admin(node.index, "CLUSTER", "LEAVING", "no")
            await self._admin(node.index, "CONFIG", "SET", "cluster-node-timeout", self.plan.node_timeout)
        await cluster.form()

    # ------------------------------------------------------------ phases

    async def wait_quiet(self) -> None:
        """Until QUIET_S seconds pass without a delivery."""
        start = trio.current_time()
        self.last_delivery = start
        while trio.current_time() - self.last_delivery < QUIET_S:
            assert trio.current_time() - start < DRAIN_LIMIT_S, "the drain does not end"
            await trio.sleep(1)

    def _holding_acked(self) -> bool:
        return any(job.encode() in node.core.jobs for node in self.cluster.nodes for job in self.acked if node.core)

    async def scan(self) -> None:
        process = self._process()
        for node in self.cluster.nodes:
            op = self.history.invoke(process, node.index, SCAN)
            _, ids = await self.cluster.call(node.index, "JSCAN", 0, "BUSYLOOP")
            self.history.complete(op, OK, value=sorted(i.decode() for i in ids))

    async def run(self) -> list[Record]:
        cluster = self.cluster
        await cluster.form()
        async with trio.open_nursery() as clients:
            for _ in range(self.plan.producers):
                clients.start_soon(self.producer)
            for _ in range(self.plan.consumers):
                clients.start_soon(self.consumer)
            await self.nemesis()
            await self.recover()
            await trio.sleep(PRODUCE_AFTER_S)
            self.producing = False
            clients.start_soon(self.consumer, True)
            await self.wait_quiet()
            clients.cancel_scope.cancel()
        waited = 0
        while self._holding_acked() and waited < GC_LIMIT_S:
            await trio.sleep(5)
            waited += 5
        await self.scan()
        dummies = [job for node in cluster.nodes for job in all_jobs(node.core) if job.is_dummy_ack]  # type: ignore[union-attr]
        assert not dummies, f"dummy ACKs outlive the GC on a whole cluster: {dummies}"
        return self.history.records


async def run_workload(plan: FaultPlan, seed: int, extensions: bool = False) -> list[Record]:
    async with SimCluster(
        plan.nodes, seed, drop=plan.drop, dup=plan.dup, delay=plan.delay, node_timeout=plan.node_timeout,
        zones=plan.zones,
    ) as cluster:
        return await Workload(cluster, plan, seed, extensions).run()
