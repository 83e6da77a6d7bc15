"""Recurring jobs on the simulated network under a fault plan, recorded for
disque/testing/checker_schedules.py.

Theory of operation: `run_schedule_workload(plan, seed)` forms a
`SimCluster`, sets every node's `schedule-grace` to GRACE, adds SCHEDULES
schedules (EVERY 1 s, REPLICATE 2) on node 0, and runs consumers that
GETJOB the ticks' queue on random live nodes and ACKJOB each job at once
(the run, and the ticks judged, begin once every node knows the schedules),
while the nemesis plays `plan.steps`: each step is a fault held `hold` ms,
undone, then `gap` ms of a whole cluster, recorded as nemesis start and
stop records (the checker's fault windows).  The faults: a partition (a
bridge node possibly in both groups), a kill -9 (undone by a restart from
the AOF), and a clock jump of one node by `offset` ms, forward or back
(undone by putting the clock right, a jump the other way).  A core whose
clock went back runs none of its periodic work (pings, ACK collection,
federation, schedules) until its clock passes the time it last did, so a
clock fault ends only then: `offset` ms after the clock is put right when
it had jumped forward (the shell's clock never jumps: shell/clock.py).  The network
loses nothing (a lost notice fires a tick twice, allowed only inside a
fault window) but may duplicate and delay.  Then the schedules are
deleted, and a drainer reads every node until nothing came for QUIET_S.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import trio

from disque.core.types import NIL_ARRAY
from disque.testing.checker import ACK, FAIL, INFO, OK, History, Record
from disque.testing.checker_schedules import SCHEDULE, TICK
from disque.testing.checker_stats import NEMESIS
from sim.network import CONNECTION_LOST, SimCluster, now_ms

QUEUE = "ticks"
GRACE = 500  # ms, every node's schedule-grace
SCHEDULES = 2
OPTIONS = {"every": 1000, "ttl": 300, "retry": 5, "replicate": 2}
QUIET_S = 8
AFTER_S = 5  # ticks go on this long on the healed cluster


@dataclass
class SchedulePlan:
    """`steps`: (fault, *params, hold ms, gap ms), the fault one of
    ("partition", groups), ("kill", i), ("clock", i, offset ms)."""

    nodes: int = 3
    dup: float = 0.0
    delay: tuple[float, float] = (0.1, 2.0)  # ms
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    node_timeout: int = 1000


class ScheduleWorkload:
    def __init__(self, cluster: SimCluster, plan: SchedulePlan, seed: int) -> None:
        self.cluster, self.plan = cluster, plan
        self.rng = random.Random(f"{seed}/schedules")
        self.history = History(now_ms)
        self.last_delivery = 0.0

    async def consumer(self, process: int, drain: bool = False) -> None:
        turn = process
        while True:
            turn += 1
            live = [n.index for n in self.cluster.nodes if n.alive]
            node = turn % len(self.cluster.nodes) if drain else self.rng.choice(live)
            if not self.cluster.nodes[node].alive:
                await trio.sleep(0.05)
                continue
            op = self.history.invoke(process, node, TICK, value={"queues": [QUEUE]})
            reply = await self.cluster.call(node, "GETJOB", *(("NOHANG",) if drain else ("TIMEOUT", 500)), "FROM", QUEUE)
            if reply is CONNECTION_LOST:
                self.history.complete(op, INFO, value="connection lost")
            elif not isinstance(reply, list):
                self.history.complete(op, FAIL, value=str(reply))
                if drain or reply is not NIL_ARRAY:
                    await trio.sleep(0.05)
                continue
            else:
                job = reply[0][1].decode()
                self.history.complete(op, OK, job=job)
                self.last_delivery = trio.current_time()
                ack = self.history.invoke(process, node, ACK, job=job)
                answer = await self.cluster.call(node, "ACKJOB", job)
                self.history.complete(ack, OK if isinstance(answer, int) else INFO, value=str(answer))
            await trio.sleep(self.rng.uniform(0.01, 0.05))

    def fault(self, phase: str, name: str) -> None:
        self.history.add(INFO, "nemesis", None, NEMESIS, value={"fault": name, "phase": phase})

    async def nemesis(self) -> None:
        cluster = self.cluster
        for fault, *params, hold, gap in self.plan.steps:
            self.fault("start", fault)
            if fault == "partition":
                cluster.partition(params[0])
            elif fault == "kill":
                cluster.kill(params[0])
            else:
                cluster.nodes[params[0]].step_clock(params[1])
            await trio.sleep(hold / 1000)
            if fault == "partition":
                cluster.heal()
            elif fault == "kill":
                await cluster.restart(params[0], aof=True)
            else:
                cluster.nodes[params[0]].step_clock(0)
                await trio.sleep(max(0, params[1]) / 1000)  # back by `offset`: until its crons run again
            self.fault("stop", fault)
            await trio.sleep(gap / 1000)

    async def schedules(self, action: str) -> None:
        for k in range(SCHEDULES):
            name = f"s{k}"
            if action == "add":
                self.history.invoke("schedules", 0, SCHEDULE, value={"action": "add", "name": name, **OPTIONS})
                reply = await self.cluster.call(0, "SCHEDULE", "ADD", name, QUEUE, name, "EVERY", OPTIONS["every"],
                                                "TTL", OPTIONS["ttl"], "RETRY", OPTIONS["retry"],
                                                "REPLICATE", OPTIONS["replicate"])  # fmt: skip
                assert reply == b"OK", reply
                await self.cluster.wait_for(lambda: all(name.encode() in n.core.schedules.names() for n in self.cluster.nodes), 5)
                self.history.add(OK, "schedules", 0, SCHEDULE, value={"action": "add", "name": name, **OPTIONS})
            else:
                self.history.add(OK, "schedules", 0, SCHEDULE, value={"action": "del", "name": name})
                await self.cluster.call(0, "SCHEDULE", "DEL", name)

    async def run(self) -> list[Record]:
        cluster = self.cluster
        await cluster.form()
        for node in cluster.nodes:
            assert await cluster.call(node.index, "CONFIG", "SET", "schedule-grace", GRACE) == b"OK"
        await self.schedules("add")
        async with trio.open_nursery() as clients:
            for process in (1, 2):
                clients.start_soon(self.consumer, process)
            await self.nemesis()
            await cluster.form()
            await trio.sleep(AFTER_S)
            await self.schedules("del")
            await self.drain(clients, self.consumer)
        return self.history.records

    async def drain(self, clients: trio.Nursery, drainer: Any) -> None:
        """`drainer` reads every node in turn until nothing came for QUIET_S; then every client stops."""
        clients.start_soon(drainer, 3, True)
        self.last_delivery = trio.current_time()
        while trio.current_time() - self.last_delivery < QUIET_S:
            await trio.sleep(1)
        clients.cancel_scope.cancel()


async def run_schedule_workload(plan: SchedulePlan, seed: int) -> list[Record]:
    async with SimCluster(plan.nodes, seed, dup=plan.dup, delay=plan.delay, node_timeout=plan.node_timeout) as cluster:
        return await ScheduleWorkload(cluster, plan, seed).run()
