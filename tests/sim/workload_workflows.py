"""Parents, their children (ADDJOB ... AFTER), a batch and results on the
simulated network under a fault plan, recorded for
disque/testing/checker_workflows.py.

Theory of operation: `run_workflow_workload(plan, seed)` forms a
`SimCluster`, makes a batch with an ON-COMPLETE callback, and runs
producers that add a parent (in the batch) on a random live node, then a
child AFTER it on another, and consumers that GETJOB the three queues on
random live nodes and acknowledge each job with a result naming it, while
the nemesis of the schedules' workload plays `plan.steps` (partitions,
kill -9 and restart from the AOF, clock jumps).  Then the batch is closed,
a drainer reads every node until nothing came for QUIET_S, and each job
acknowledged is read back with RESULT from every node.
"""

from __future__ import annotations

import trio

from disque.testing.checker import ACK, FAIL, INFO, OK, Record
from disque.testing.checker_workflows import BATCH, CHILD, CLOSE, PARENT, RESULT, TAKE
from sim.network import CONNECTION_LOST, SimCluster
from sim.workload_schedules import QUIET_S, SchedulePlan, ScheduleWorkload

PARENTS, CHILDREN, CALLBACKS = "parents", "children", "callbacks"
PAIRS = 12  # per producer
OPTIONS = ("REPLICATE", 2, "RETRY", 3, "TTL", 600)


class WorkflowWorkload(ScheduleWorkload):
    batch = b""

    def node(self) -> int:
        return self.rng.choice([n.index for n in self.cluster.nodes if n.alive])

    async def add(self, process: int, op: str, queue: str, *after: str) -> str | None:
        node = self.node()
        value = {"after": list(after)}
        call = self.history.invoke(process, node, op, value=value)
        batch = ("BATCH", self.batch) if op == PARENT else ()
        reply = await self.cluster.call(node, "ADDJOB", queue, op, 5000, *OPTIONS, *batch, *(x for p in after for x in ("AFTER", p)))
        if not hasattr(reply, "decode"):
            self.history.complete(call, INFO if reply is CONNECTION_LOST else FAIL, value=value)
            return None
        job = bytes(reply).decode()
        self.history.complete(call, OK, job=job, value=value)
        return job

    async def producer(self, process: int) -> None:
        for _ in range(PAIRS):
            parent = await self.add(process, PARENT, PARENTS)
            if parent is not None:
                await self.add(process, CHILD, CHILDREN, parent)
            await trio.sleep(self.rng.uniform(0.05, 0.3))

    async def consumer(self, process: int, drain: bool = False) -> None:
        turn = process
        while True:
            turn += 1
            node = turn % len(self.cluster.nodes) if drain else self.node()
            if not self.cluster.nodes[node].alive:
                await trio.sleep(0.05)
                continue
            op = self.history.invoke(process, node, TAKE)
            wait = ("NOHANG",) if drain else ("TIMEOUT", 500)
            reply = await self.cluster.call(node, "GETJOB", *wait, "FROM", PARENTS, CHILDREN, CALLBACKS)
            if not isinstance(reply, list):
                self.history.complete(op, INFO if reply is CONNECTION_LOST else FAIL, value=str(reply))
                await trio.sleep(0.05)
                continue
            job = reply[0][1].decode()
            self.history.complete(op, OK, job=job)
            self.last_delivery = trio.current_time()
            result = f"done {job}"
            ack = self.history.invoke(process, node, ACK, job=job, value={"result": result})
            answer = await self.cluster.call(node, "ACKJOB", job, "RESULT", result)
            self.history.complete(ack, OK if isinstance(answer, int) else INFO, value={"result": result})
            await trio.sleep(self.rng.uniform(0.01, 0.05))

    async def read_results(self) -> None:
        acked = {r["job"] for r in self.history.records if r["op"] == ACK and r["type"] == OK}
        for job in sorted(acked):
            for node in self.cluster.nodes:
                reply = await self.cluster.call(node.index, "RESULT", job)
                self.history.add(OK, "reader", node.index, RESULT, job=job, value=None if reply is None else reply.decode())

    async def run(self) -> list[Record]:
        cluster = self.cluster
        await cluster.form()
        self.batch = bytes(await cluster.call(0, "BATCH", "NEW", "ON-COMPLETE", CALLBACKS, "batch done"))
        shown = dict(zip(*[iter(await cluster.call(0, "BATCH", "SHOW", self.batch))] * 2))
        value = {"id": self.batch.decode(), "callback": shown[b"callback-ids"][1].decode()}
        self.history.add(OK, "batches", 0, BATCH, value=value)
        async with trio.open_nursery() as clients:
            for process in (1, 2):
                clients.start_soon(self.consumer, process)
            async with trio.open_nursery() as producers:
                for process in (3, 4):
                    producers.start_soon(self.producer, process)
                await self.nemesis()
            await cluster.form()
            assert await cluster.call(1, "BATCH", "CLOSE", self.batch) == b"OK"
            self.history.add(OK, "batches", 1, CLOSE, value={"id": self.batch.decode()})
            clients.start_soon(self.consumer, 5, True)
            self.last_delivery = trio.current_time()
            while trio.current_time() - self.last_delivery < QUIET_S:
                await trio.sleep(1)
            clients.cancel_scope.cancel()
        await self.read_results()
        return self.history.records


async def run_workflow_workload(plan: SchedulePlan, seed: int) -> list[Record]:
    async with SimCluster(plan.nodes, seed, dup=plan.dup, delay=plan.delay, node_timeout=plan.node_timeout) as cluster:
        return await WorkflowWorkload(cluster, plan, seed).run()
