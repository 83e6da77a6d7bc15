"""The consumer-group workload: bananaq's commands under the same fault
schedules as the job workload (tests/sim/workload.py).

Theory of operation: producers QADD unique bodies to one queue on random
live nodes (most events live 300 s, some 15 s); consumers pick one of three
groups and a random live node, QGET with an ack window of 1 to 5 s, and
QACK, except now and then, when they crash before acknowledging (the event
turns redo at its deadline).  The nemesis plays the plan's steps between a
`nemesis` start and stop record (disque/testing/checker_stats.py), and a network
that drops messages is a fault window of the whole run, so the checker
(disque/testing/checker_groups.py) knows when the cluster was under a fault.  After
recovery drainers (one per node and group, each going round all of them)
ask until no delivery has happened for a while; the history then goes to `check_groups`.
"""

from __future__ import annotations

from typing import Any

import trio

from disque.testing.checker import FAIL, INFO, OK, Record
from disque.testing.checker_groups import QACK, QADD, QGET
from disque.testing.checker_stats import NEMESIS
from sim.network import CONNECTION_LOST, SimCluster
from sim.workload import PRODUCE_AFTER_S, FaultPlan, Workload

QUEUE = "orders"
GROUPS = ("billing", "audit", "search")


class GroupsWorkload(Workload):
    async def produce(self, process: int, node: int, body: str) -> None:
        """One QADD of `body`."""
        ttl = self.rng.choice((15, 300, 300, 300))
        op = self.history.invoke(process, node, QADD, body=body, value={"queue": QUEUE, "ttl": ttl})
        self.added(op, await self.cluster.call(node, "QADD", QUEUE, ttl, body))

    async def consumer(self, drain: bool = False, turn: int = 0) -> None:
        process = self._process()
        while True:
            turn += 1
            if drain:  # every group on every node in turn
                node, group = turn % len(self.cluster.nodes), GROUPS[turn // len(self.cluster.nodes) % len(GROUPS)]
                if not self.cluster.nodes[node].alive:
                    continue
            else:
                live = self._live_node()
                if live is None:
                    await trio.sleep(0.1)
                    continue
                node, group = live, self.rng.choice(GROUPS)
            got = await self.qget(process, node, group, self.rng.choice((1, 2, 5)))
            if got is None:
                await trio.sleep(0.05)
                continue
            self.last_delivery = trio.current_time()
            if self.rng.random() >= 0.05:  # else the consumer crashed: redo at the deadline
                op = self.history.invoke(process, node, QACK, job=got, value={"group": group})
                reply = await self.cluster.call(node, "QACK", QUEUE, group, got)
                self.history.complete(op, OK if isinstance(reply, int) else INFO, value=reply if isinstance(reply, int) else str(reply))
            if not drain:
                await trio.sleep(self.rng.uniform(0.01, 0.1))

    async def qget(self, process: int, node: int, group: str, ex: int) -> str | None:
        op = self.history.invoke(process, node, QGET, value={"group": group})
        reply: Any = await self.cluster.call(node, "QGET", QUEUE, group, "EX", ex)
        if isinstance(reply, list):
            event, body = reply
            self.history.complete(op, OK, job=event.decode(), body=body.decode())
            return event.decode()
        self.history.complete(op, INFO if reply is CONNECTION_LOST else FAIL, value=str(reply))
        return None

    async def nemesis(self) -> None:
        self.history.add(INFO, "nemesis", None, NEMESIS, value={"fault": "plan", "phase": "start"})
        await super().nemesis()

    def lossy(self, phase: str) -> None:
        """A network that drops messages is a fault for the whole run."""
        if self.plan.drop:
            self.history.add(INFO, "nemesis", None, NEMESIS, value={"fault": "message loss", "phase": phase})

    async def run(self) -> list[Record]:
        self.lossy("start")
        await self.cluster.form()
        async with trio.open_nursery() as clients:
            for _ in range(self.plan.producers):
                clients.start_soon(self.producer)
            for _ in range(self.plan.consumers):
                clients.start_soon(self.consumer)
            await self.nemesis()
            await self.recover()
            self.history.add(INFO, "nemesis", None, NEMESIS, value={"fault": "plan", "phase": "stop"})
            await trio.sleep(PRODUCE_AFTER_S)
            self.producing = False
            for turn in range(len(self.cluster.nodes) * len(GROUPS)):  # every node and group at once
                clients.start_soon(self.consumer, True, turn)
            await self.wait_quiet()
            clients.cancel_scope.cancel()
        self.lossy("stop")
        return self.history.records


async def run_groups_workload(plan: FaultPlan, seed: int) -> list[Record]:
    async with SimCluster(
        plan.nodes, seed, drop=plan.drop, dup=plan.dup, delay=plan.delay, node_timeout=plan.node_timeout
    ) as cluster:
        return await GroupsWorkload(cluster, plan, seed).run()
