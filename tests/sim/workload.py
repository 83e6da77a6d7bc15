"""A recorded producer/consumer workload under a fault schedule (a nemesis).

Theory of operation: `run_workload(plan, seed)` builds a `SimCluster`,
forms it, and runs producers, consumers and the nemesis concurrently.
Producers ADDJOB unique bodies on random live nodes, mixing at-least-once
jobs (REPLICATE 2-3, RETRY 1-3) and at-most-once jobs (REPLICATE 1,
RETRY 0), some with a short TTL or a DELAY; consumers GETJOB one job at a
time on random live nodes and ACKJOB or FASTACK it, sometimes after a
WORKING, or now and then NACK it or crash before acknowledging.  The
nemesis plays `plan.steps`: partitions, heals, and the kill and restart of
one victim node (restarts lose the victim's jobs, so only one node may ever
die: a REPLICATE 2 job keeps a copy elsewhere).

After the schedule the cluster heals, the victim comes back and the mesh
re-forms; producers stop a little later; consumers keep going while a
drainer polls every node, until no job has turned up for a while.  The run
then waits for ACK garbage collection to settle, ends with a `scan` of every
node, and asserts that no dummy ACK survived (the scan cannot see them).
Every client operation is recorded in a `disque.checker.History`, whose
records `run_workload` returns for `disque.checker.check`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import trio

from disque import errors
from disque.checker import ACK, DEQUEUE, ENQUEUE, FAIL, FASTACK, INFO, OK, SCAN, History, Record
from disque.errors import DisqueError
from disque.resp import NIL_ARRAY
from sim.network import CONNECTION_LOST, SimCluster, now_ms

QUEUE = "jobs"
ADDJOB_TIMEOUT_MS = 1000
PRODUCE_AFTER_S = 3  # producers keep going this long on the healed cluster
QUIET_S = 10  # a drain ends after this long without a delivery
DRAIN_LIMIT_S = 120
GC_LIMIT_S = 400
ACK_COMMANDS = {ACK: "ACKJOB", FASTACK: "FASTACK"}


@dataclass
class FaultPlan:
    nodes: int = 5
    drop: float = 0.0
    dup: float = 0.0
    delay: tuple[float, float] = (0.1, 2.0)  # ms
    victim: int = 0  # the one node the plan may kill
    steps: list[tuple[Any, ...]] = field(default_factory=list)  # (action, *args, wait ms)
    producers: int = 3
    consumers: int = 2
    node_timeout: int = 1000


class Workload:
    def __init__(self, cluster: SimCluster, plan: FaultPlan, seed: int) -> None:
        self.cluster = cluster
        self.plan = plan
        self.rng = random.Random(f"{seed}/workload")
        self.history = History(now_ms)
        self.producing = True
        self.last_delivery = 0.0
        self.acked: set[str] = set()
        self._bodies = 0
        self._processes = 0

    def _process(self) -> int:
        self._processes += 1
        return self._processes

    def _live_node(self) -> int | None:
        live = [n.index for n in self.cluster.nodes if n.alive]
        return self.rng.choice(live) if live else None

    # ------------------------------------------------------------ clients

    async def producer(self) -> None:
        process = self._process()
        while self.producing:
            node = self._live_node()
            if node is None:
                await trio.sleep(0.1)
                continue
            self._bodies += 1
            body = f"v{self._bodies}"
            if self.rng.random() < 0.25:
                opts = {"queue": QUEUE, "replicate": 1, "retry": 0}
            else:
                opts = {"queue": QUEUE, "replicate": self.rng.choice((2, 3)), "retry": self.rng.randint(1, 3)}
            opts["ttl"] = self.rng.choice((15, 300, 300, 300))
            delay = self.rng.choice((0, 0, 0, 1))
            op = self.history.invoke(process, node, ENQUEUE, body=body, value=opts)
            reply = await self.cluster.call(
                node, "ADDJOB", QUEUE, body, ADDJOB_TIMEOUT_MS, "REPLICATE", opts["replicate"],
                "RETRY", opts["retry"], "TTL", opts["ttl"], "DELAY", delay,
            )  # fmt: skip
            if isinstance(reply, bytes):
                self.history.complete(op, OK, job=reply.decode())
            elif reply is errors.NOREPL_REACH:  # refused before the job existed
                self.history.complete(op, FAIL, value=str(reply))
            else:  # a replication timeout leaves copies behind, a dead node tells nothing
                self.history.complete(op, INFO, value=str(reply))
            await trio.sleep(self.rng.uniform(0.01, 0.2))

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
            op = self.history.invoke(process, node, DEQUEUE, value={"queues": [QUEUE]})
            reply = await self.cluster.call(node, "GETJOB", *options, "FROM", QUEUE)
            if reply is CONNECTION_LOST:
                self.history.complete(op, INFO, value="connection lost")
            elif reply is NIL_ARRAY or isinstance(reply, DisqueError):
                self.history.complete(op, FAIL, value=str(reply))
                if nohang:
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
        if roll < 0.1:  # gave up on it: queued again at once (not recorded)
            await self.cluster.call(node, "NACK", job)
            return
        if roll < 0.15:  # a slow worker asks for more time first
            await self.cluster.call(node, "WORKING", job)
        kind = FASTACK if roll < 0.3 else ACK
        op = self.history.invoke(process, node, kind, job=job)
        reply = await self.cluster.call(node, ACK_COMMANDS[kind], job)
        if isinstance(reply, int):
            self.acked.add(job)
            self.history.complete(op, OK, value=reply)
        else:
            self.history.complete(op, INFO, value=str(reply))

    # ------------------------------------------------------------ nemesis

    async def nemesis(self) -> None:
        cluster, victim = self.cluster, self.plan.victim
        for action, *args in self.plan.steps:
            *params, wait_ms = args
            if action == "partition":
                cluster.partition(params[0])
            elif action == "heal":
                cluster.heal()
            elif action == "kill" and cluster.nodes[victim].alive:
                cluster.kill(victim)
            elif action == "restart" and not cluster.nodes[victim].alive:
                await cluster.restart(victim)
            await trio.sleep(wait_ms / 1000)

    async def recover(self) -> None:
        cluster = self.cluster
        cluster.heal()
        if not cluster.nodes[self.plan.victim].alive:
            await cluster.restart(self.plan.victim)
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
        dummies = [job for node in cluster.nodes for job in node.core.jobs.values() if job.is_dummy_ack]  # type: ignore[union-attr]
        assert not dummies, f"dummy ACKs outlive the GC on a whole cluster: {dummies}"
        return self.history.records


async def run_workload(plan: FaultPlan, seed: int) -> list[Record]:
    async with SimCluster(
        plan.nodes, seed, drop=plan.drop, dup=plan.dup, delay=plan.delay, node_timeout=plan.node_timeout
    ) as cluster:
        return await Workload(cluster, plan, seed).run()
