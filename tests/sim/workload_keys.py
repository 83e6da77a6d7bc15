"""Keyed jobs' deduplication and ordered keys on the simulated network
under a fault plan, recorded for disque/testing/checker_keys.py.

Theory of operation: `run_key_workload(plan, seed)` forms a `SimCluster`
and runs producers that, for key after key, send `ADDJOB ... KEY <key>
DEDUP <a window longer than the run>` to random live nodes, one to three
times (a producer retrying elsewhere after a timeout), and consumers that
GETJOB the queue on random live nodes and ACKJOB each job, while the
nemesis of tests/sim/workload_schedules.py plays `plan.steps` (partitions,
kills restarted from the AOF, clock jumps).  Beside them, the queue ORDERED_QUEUE is
ordered (QCONFIG ... ordered yes) and two more producers add, for each of
their keys, ORDERED_JOBS jobs one after the other through one node (another
live one if it is down), and two DEBOUNCE producers send, for each of
their keys, a burst of two to four `ADDJOB ... KEY <key> DEBOUNCE
DEBOUNCE_MS` to random live nodes, each well within the window of the one
before, then wait past the window before the next key's burst; the
consumers take from the three queues.  Then the producers stop and a drainer reads every node until nothing came for QUIET_S.
"""

from __future__ import annotations

import random
from typing import Any

import trio

from disque.core.types import NIL_ARRAY, Status
from disque.testing.checker import ACK, FAIL, INFO, OK, Record
from disque.testing.checker_keys import DEBOUNCE, DEDUP, ORDERED, TAKE
from sim.network import CONNECTION_LOST, SimCluster
from sim.workload_schedules import SchedulePlan, ScheduleWorkload

QUEUE = "kq"
WINDOW_MS = 3_600_000  # DEDUP's window: longer than any run
KEYS_PER_PRODUCER = 20
ORDERED_QUEUE = "oq"
ORDERED_KEYS, ORDERED_JOBS = 4, 8  # per producer, per key
DEBOUNCE_QUEUE = "bq"
DEBOUNCE_MS = 1000
DEBOUNCE_KEYS = 6  # per producer
DEBOUNCE_TTL = 3600  # s: a job that waits its window on a node whose clock jumped back 10 minutes outlives the jump


class KeyWorkload(ScheduleWorkload):
    """The schedules' workload's nemesis and history, with keyed producers."""

    def __init__(self, cluster: SimCluster, plan: SchedulePlan, seed: int) -> None:
        super().__init__(cluster, plan, seed)
        self.rng = random.Random(f"{seed}/keys")

    def live(self) -> list[int]:
        return [n.index for n in self.cluster.nodes if n.alive]

    async def producer(self, process: int) -> None:
        for n in range(KEYS_PER_PRODUCER):
            key = f"p{process}-{n}"
            for _ in range(self.rng.randint(1, 3)):
                node = self.rng.choice(self.live())
                op = self.history.invoke(process, node, DEDUP, body=key, value={"key": key})
                await self.add(op, node, QUEUE, key, key, "DEDUP", WINDOW_MS, "RETRY", 2)
                await trio.sleep(self.rng.uniform(0.05, 0.5))

    async def add(self, op: Record, node: int, queue: str, body: str, key: str, *opts: Any, ttl: int = 600) -> None:
        """ADDJOB of a keyed job, its answer recorded as `op`'s."""
        reply = await self.cluster.call(node, "ADDJOB", queue, body, 2000, "KEY", key, *opts, "REPLICATE", 2, "TTL", ttl)
        if isinstance(reply, Status):
            self.history.complete(op, OK, job=bytes(reply).decode())
        else:
            self.history.complete(op, INFO, value=str(reply))

    async def ordered_producer(self, process: int) -> None:
        for n in range(ORDERED_KEYS):
            key = f"o{process}-{n}"
            through = self.rng.choice(self.live())
            for seq in range(ORDERED_JOBS):
                node = through if through in self.live() else self.rng.choice(self.live())
                op = self.history.invoke(process, node, ORDERED, value={"key": key, "seq": seq})
                await self.add(op, node, ORDERED_QUEUE, f"{key}:{seq}", key, "RETRY", 5)
                await trio.sleep(self.rng.uniform(0.01, 0.1))
            await trio.sleep(self.rng.uniform(3, 6))  # (keys spread over the run, some clear of the faults)

    async def debounce_producer(self, process: int) -> None:
        for n in range(DEBOUNCE_KEYS):
            key = f"b{process}-{n}"
            for seq in range(self.rng.randint(2, 4)):
                node = self.rng.choice(self.live())
                op = self.history.invoke(process, node, DEBOUNCE, value={"key": key, "seq": seq})
                await self.add(op, node, DEBOUNCE_QUEUE, f"{key}:{seq}", key, "DEBOUNCE", DEBOUNCE_MS, "RETRY", 5, ttl=DEBOUNCE_TTL)
                await trio.sleep(self.rng.uniform(0.05, 0.3))
            await trio.sleep(self.rng.uniform(1.5, 3))  # (past the window: the next key's burst)

    async def taker(self, process: int, drain: bool = False) -> None:
        turn = process
        while True:
            turn += 1
            live = self.live()
            node = turn % len(self.cluster.nodes) if drain else self.rng.choice(live)
            if node not in live:
                await trio.sleep(0.05)
                continue
            op = self.history.invoke(process, node, TAKE)
            reply = await self.cluster.call(node, "GETJOB", *(("NOHANG",) if drain else ("TIMEOUT", 500)), "FROM", QUEUE,
                                            ORDERED_QUEUE, DEBOUNCE_QUEUE)  # fmt: skip
            if reply is CONNECTION_LOST or not isinstance(reply, list):
                self.history.complete(op, FAIL if reply is NIL_ARRAY else INFO, value=str(reply))
                await trio.sleep(0.05)
                continue
            job = reply[0][1].decode()
            marks = {ORDERED_QUEUE.encode(): ORDERED, DEBOUNCE_QUEUE.encode(): DEBOUNCE}
            self.history.complete(op, OK, job=job, value=reply[0][2].decode(), body=marks.get(reply[0][0]))
            self.last_delivery = trio.current_time()
            ack = self.history.invoke(process, node, ACK, job=job)
            answer = await self.cluster.call(node, "ACKJOB", job)
            self.history.complete(ack, OK if isinstance(answer, int) else INFO, value=str(answer))
            await trio.sleep(self.rng.uniform(0.01, 0.05))

    async def run(self) -> list[Record]:
        cluster = self.cluster
        await cluster.form()
        await cluster.call(0, "QCONFIG", ORDERED_QUEUE, "SET", "ordered", "yes")
        await trio.sleep(1)  # (QSET everywhere)
        async with trio.open_nursery() as clients:
            for process in (1, 2):
                clients.start_soon(self.taker, process)
            async with trio.open_nursery() as producers:
                for process in (10, 11, 12):
                    producers.start_soon(self.producer, process)
                for process in (20, 21):
                    producers.start_soon(self.ordered_producer, process)
                for process in (30, 31):
                    producers.start_soon(self.debounce_producer, process)
                await self.nemesis()
            await cluster.form()
            await self.drain(clients, self.taker)
        return self.history.records


async def run_key_workload(plan: SchedulePlan, seed: int) -> list[Record]:
    async with SimCluster(plan.nodes, seed, dup=plan.dup, delay=plan.delay, node_timeout=plan.node_timeout) as cluster:
        return await KeyWorkload(cluster, plan, seed).run()
