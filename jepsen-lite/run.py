#!/usr/bin/env python3
"""jepsen-lite: a fault-injection run against a real Disque cluster.

    .venv/bin/python jepsen-lite/run.py [--faults halves,kill] [--workload mixed]
        [--duration 60] [--seed 1] [--nodes 5] [--mode auto|netns|proxy] ...

See jepsen-lite/README.md.  Exit status 0 when the history checks valid.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hiredis import ReplyError  # noqa: E402

import admin  # noqa: E402
import disk  # noqa: E402
from cluster import Conn, Node, call_once, join, wait_mesh  # noqa: E402
from disque.testing import checker_stats  # noqa: E402
from disque.testing.checker import ACK, DEQUEUE, ENQUEUE, FAIL, FASTACK, INFO, NACK, OK, SCAN, WAITJOB, History, check  # noqa: E402
from disque.testing.checker_groups import QACK, QADD, QGET, check_groups  # noqa: E402
from disque.testing.checker_schedules import SCHEDULE, TICK, check_schedules  # noqa: E402
from disque.testing.checker_keys import DEBOUNCE, DEDUP, ORDERED, TAKE, check_debounce, check_keys, check_ordered  # noqa: E402
from disque.testing.checker_limits import check_concurrency  # noqa: E402
from disque.testing.checker_workflows import BATCH, CHILD, CLOSE, PARENT, RESULT, TAKE, check_workflows  # noqa: E402

ALL_FAULTS = ("halves", "majority", "bridge", "kill", "pause", "netem", "admin", "clock", "zone", "disk")
CLOCK_STEPS = (-3600, -60, 60, 600)  # seconds a node's wall clock is stepped by (the clock fault)
QUEUE = "jepsen"
DEAD = QUEUE + "-dead"  # --extensions: where jobs out of attempts go (they are consumed from there too)
MAX_ATTEMPTS = 4  # --extensions: MAXATTEMPTS of at-least-once jobs
NACK_RATE = 0.25  # --extensions: deliveries answered with NACK DELAY 1 instead of an ACK, before the drain
WAITJOB_RATE = 0.1  # --extensions: acknowledged ADDJOBs followed by a WAITJOB TIMEOUT 300 of the job
TTLS = (20, 300, 300, 300)  # seconds, drawn per job
GROUPS = ("billing", "audit", "search")  # --workload groups: the consumer groups reading QUEUE
GROUP_CRASH_RATE = 0.05  # --workload groups: deliveries never acknowledged (redo at the deadline)
TICKS = QUEUE + "-ticks"  # --schedules: the queue of every schedule's ticks
TICK_OPTIONS = {"every": 1000, "ttl": 300, "retry": 5, "replicate": 2}  # --schedules: each schedule's
TICK_CONSUMERS = 2  # --schedules: threads reading TICKS
LIMITED = QUEUE + "-limited"  # --limit: the queue with a concurrency limit, its jobs and consumers apart
LIMITED_RETRY = 5  # s, the RETRY of its jobs (a lost node's jobs come back this soon)
PARENTS, CHILDREN, CALLBACKS = QUEUE + "-parents", QUEUE + "-children", QUEUE + "-callbacks"  # --batches: (AFTER) and the batch's
PAIR_OPTIONS = ("REPLICATE", 2, "RETRY", 5, "TTL", 600)  # --batches: each parent's and child's
KEYED = QUEUE + "-keyed"  # --keys: jobs with KEY and DEDUP, each key added one to three times
ORDERED_QUEUE = QUEUE + "-ordered"  # --keys: an ordered queue (QCONFIG ... ordered yes)
ORDERED_JOBS = 8  # --keys: jobs per ordered key, added one after the other through one node
DEBOUNCED = QUEUE + "-debounced"  # --keys: a burst of ADDJOB ... KEY DEBOUNCE per key, on random nodes
DEBOUNCE_MS = 1000


def now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------- schedule


def zone_of(i: int, n: int, zones: int) -> str:
    """--zones: node i's zone, the nodes split in order into `zones` zones."""
    return f"z{i * zones // n}"


def schedule(rng: random.Random, faults: list[str], n: int, duration: float, fault_s: float, gap_s: float,
             zones: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """The fault plan, fixed by the seed: [{at, fault, hold, ...params}]."""
    plan, t, k = [], gap_s, 0
    order = list(faults)
    while t + fault_s <= duration and faults:
        if k % len(order) == 0:
            rng.shuffle(order)
        fault = order[k % len(order)]
        k += 1
        nodes = list(range(n))
        rng.shuffle(nodes)
        step: dict[str, Any] = {"at": round(t, 3), "fault": fault, "hold": fault_s}
        if fault == "halves":
            cut = n // 2
            step["groups"] = [sorted(nodes[:cut]), sorted(nodes[cut:])]
        elif fault == "majority":
            step["groups"] = [[nodes[0]], sorted(nodes[1:])]
        elif fault == "bridge":
            half = n // 2
            step["bridge"] = nodes[0]
            step["groups"] = [sorted(nodes[: half + 1]), sorted([nodes[0], *nodes[half + 1 :]])]
        elif fault in ("kill", "pause"):
            step["node"] = nodes[0]
        elif fault == "clock":
            step.update(node=nodes[0], offset_s=rng.choice(CLOCK_STEPS))
        elif fault == "disk":  # one node's AOF (disk.py)
            step.update(disk.plan(rng, nodes[0]))
        elif fault == "netem":
            step.update(nodes=sorted(nodes[: max(2, n // 2)]), loss=10, delay_ms=50, jitter_ms=25)
        elif fault == "admin":
            step.update(admin.plan(rng, nodes, sum(1 for s in plan if s["fault"] == "admin")))
        elif fault == "zone":  # every node of one zone at once (docs/zones.md)
            zone = zone_of(nodes[0], n, zones)
            step.update(zone=zone, nodes=[i for i in range(n) if zone_of(i, n, zones) == zone],
                        how=rng.choice(("isolate", "kill")))  # fmt: skip
        plan.append(step)
        t += fault_s + gap_s
    return plan


# ---------------------------------------------------------------- clients


class Workload:
    def __init__(self, args: argparse.Namespace, nodes: list[Node]) -> None:
        self.args, self.nodes = args, nodes
        self.queues = (QUEUE, DEAD) if args.extensions else (QUEUE,)  # consumers read the dead letters too
        self.history = History(now_ms)
        self.lock = threading.Lock()
        self.producing = threading.Event()
        self.consuming = threading.Event()
        self.draining = threading.Event()
        self.last_delivery = time.monotonic()
        self.next_process = 0
        self.down = args.down  # the last nodes, down until the heal
        self.limited: list[tuple[float, float]] = []  # --limit: (got, ended) ms of each job of LIMITED
        self.fault_windows: list[tuple[float, float]] = []  # (start, stop) ms of each fault
        self.batch = ""  # --batches: the batch the parents join
        self.keyed = History(now_ms)  # --keys: its own history (disque/testing/checker_keys.py)

    def record(self, type: str, process: Any, node: Any, op: str, **fields: Any) -> dict[str, Any]:
        with self.lock:
            return self.history.add(type, process, node, op, **fields)

    def nemesis(self, phase: str, fault: str, **value: Any) -> None:
        self.record(INFO, "nemesis", None, checker_stats.NEMESIS, value={"fault": fault, "phase": phase, **value})

    def options(self, rng: random.Random) -> dict[str, Any]:
        kind = self.args.workload
        if kind == "mixed":
            kind = "at-most-once" if rng.random() < 0.25 else "at-least-once"
        if kind == "default":  # no option sent: what the node applies (docs/replication.md), for the checker
            ttl = rng.choice(TTLS)
            repl = min(3, self.args.nodes)
            return {"queue": QUEUE, "replicate": repl, "minrepl": repl // 2 + 1, "retry": min(ttl // 10, 300) or 1, "ttl": ttl}
        if kind == "at-most-once":
            opts = {"queue": QUEUE, "replicate": 1, "retry": 0}
        else:
            opts = {"queue": QUEUE, "replicate": self.args.replicate or rng.choice((2, 3)), "retry": rng.randint(1, 3)}
            if self.args.min_zones:
                opts["zones"] = self.args.min_zones
            if self.args.extensions:
                opts["maxattempts"] = MAX_ATTEMPTS
        opts["ttl"] = rng.choice(TTLS)
        return opts

    def _conn(self, conns: dict[int, Conn], i: int) -> Conn:
        if i not in conns:
            node = self.nodes[i]
            conns[i] = Conn(node.host, node.port, self.args.client_timeout)
        return conns[i]

    def _call(self, conns: dict[int, Conn], i: int, *args: Any) -> Any:
        """The reply, a ReplyError, or an OSError/ConnectionError raised."""
        try:
            return self._conn(conns, i).call(*args)
        except (OSError, ConnectionError):
            c = conns.pop(i, None)
            if c:
                c.close()
            raise

    def producer(self, process: int) -> None:
        """ADDJOB (or, --workload groups, QADD) of unique bodies on random nodes."""
        rng = random.Random(f"{self.args.seed}-p{process}")
        conns: dict[int, Conn] = {}
        count = 0
        events = self.args.workload == "groups"
        while self.producing.is_set():
            i = rng.randrange(len(self.nodes) - self.down)  # not to the nodes down the whole run (--down)
            count += 1
            body = f"{process}-{count}"
            if events:
                op, value = QADD, {"queue": QUEUE, "ttl": rng.choice(TTLS)}
                command: tuple[Any, ...] = ("QADD", QUEUE, value["ttl"], body)
            elif self.args.workload == "default":
                op, value = ENQUEUE, self.options(rng)
                command = ("ADDJOB", QUEUE, body, self.args.addjob_timeout_ms, "TTL", value["ttl"])
            else:
                op, value = ENQUEUE, self.options(rng)
                limits = ("MAXATTEMPTS", value["maxattempts"], "DEADLETTER", DEAD) if "maxattempts" in value else ()
                limits += ("ZONES", value["zones"]) if "zones" in value else ()
                command = ("ADDJOB", QUEUE, body, self.args.addjob_timeout_ms, "REPLICATE", value["replicate"],
                           "RETRY", value["retry"], "TTL", value["ttl"], *limits)  # fmt: skip
            self.record("invoke", process, i, op, body=body, value=value)
            try:
                reply = self._call(conns, i, *command)
            except (OSError, ConnectionError) as e:
                self.record(INFO, process, i, op, body=body, value=repr(e))
                time.sleep(rng.uniform(0.05, 0.2))
                continue
            if isinstance(reply, bytes):
                job = reply.decode()
                self.record(OK, process, i, op, job=job, body=body)
                if not events and self.args.extensions and rng.random() < WAITJOB_RATE:  # checked by phantom_acks
                    self.job_command(conns, process, i, WAITJOB, job, "WAITJOB", job, "TIMEOUT", 300)
            elif isinstance(reply, ReplyError) and "Not enough reachable" in str(reply):
                self.record(FAIL, process, i, op, body=body, value=str(reply))
            else:  # a replication timeout leaves copies behind
                self.record(INFO, process, i, op, body=body, value=str(reply))
            time.sleep(rng.uniform(0.0, self.args.think_ms / 1000))

    def job_command(self, conns: dict[int, Conn], process: int, i: int, op: str, job: str, *command: Any, value: Any = None) -> None:
        """One command about `job` on node i, recorded as `op` (its invoke
        with `value`): ok with an integer reply, info otherwise (an error, a
        lost connection)."""
        self.record("invoke", process, i, op, job=job, value=value)
        try:
            reply = self._call(conns, i, *command)
        except (OSError, ConnectionError) as e:
            self.record(INFO, process, i, op, job=job, value=repr(e))
            return
        self.record(OK if isinstance(reply, int) else INFO, process, i, op, job=job, value=reply if isinstance(reply, int) else str(reply))

    def event_consumer(self, process: int) -> None:
        """--workload groups: QGET for a random group (every group on every
        node in turn while draining), then QACK, but for a few crashes."""
        rng = random.Random(f"{self.args.seed}-c{process}")
        conns: dict[int, Conn] = {}
        turn = process
        while self.consuming.is_set():
            turn += 1
            if self.draining.is_set():
                i, group = turn % len(self.nodes), GROUPS[turn // len(self.nodes) % len(GROUPS)]
            else:
                i, group = rng.randrange(len(self.nodes)), rng.choice(GROUPS)
            self.record("invoke", process, i, QGET, value={"group": group})
            try:
                reply = self._call(conns, i, "QGET", QUEUE, group, "EX", rng.choice((1, 2, 5)))
            except (OSError, ConnectionError) as e:
                self.record(INFO, process, i, QGET, value=repr(e))
                time.sleep(rng.uniform(0.05, 0.2))
                continue
            if not isinstance(reply, list):
                self.record(FAIL, process, i, QGET, value=None if reply is None else str(reply))
                time.sleep(0.02)
                continue
            event = reply[0].decode()
            self.record(OK, process, i, QGET, job=event, body=reply[1].decode())
            self.last_delivery = time.monotonic()
            if rng.random() < GROUP_CRASH_RATE:
                continue
            self.record("invoke", process, i, QACK, job=event, value={"group": group})
            try:
                answer = self._call(conns, i, "QACK", QUEUE, group, event)
            except (OSError, ConnectionError) as e:
                self.record(INFO, process, i, QACK, job=event, value=repr(e))
                continue
            self.record(OK if isinstance(answer, int) else INFO, process, i, QACK, job=event,
                        value=answer if isinstance(answer, int) else str(answer))  # fmt: skip

    def consumer(self, process: int, op: str = DEQUEUE) -> None:
        """GETJOB (TIMEOUT on random nodes; NOHANG on each node in turn while
        draining), then ACKJOB, FASTACK or NACK; `op` TICK reads the
        schedules' queue and acknowledges every tick's job at once."""
        if self.args.workload == "groups" and op == DEQUEUE:
            return self.event_consumer(process)
        queues = (TICKS,) if op == TICK else (PARENTS, CHILDREN, CALLBACKS) if op == TAKE else self.queues
        rng = random.Random(f"{self.args.seed}-c{process}")
        conns: dict[int, Conn] = {}
        turn = process
        while self.consuming.is_set():
            if self.draining.is_set():
                turn += 1
                i = turn % len(self.nodes)
                options: tuple[Any, ...] = ("NOHANG",)
            else:
                i = rng.randrange(len(self.nodes))
                options = ("TIMEOUT", 500)
            self.record("invoke", process, i, op, value={"queues": list(queues)})
            try:
                reply = self._call(conns, i, "GETJOB", *options, "COUNT", 1, "FROM", *queues)
            except (OSError, ConnectionError) as e:
                self.record(INFO, process, i, op, value=repr(e))
                time.sleep(rng.uniform(0.05, 0.2))
                continue
            if not isinstance(reply, list) or not reply:
                self.record(FAIL, process, i, op, value=None if reply is None else str(reply))
                if self.draining.is_set():
                    time.sleep(0.02)
                continue
            _, job, body = reply[0][:3]
            job = job.decode()
            self.record(OK, process, i, op, job=job, body=body.decode())
            self.last_delivery = time.monotonic()
            if op == TICK:  # at once: a tick delivered twice is then the schedule's doing, not a retry
                self.job_command(conns, process, i, ACK, job, "ACKJOB", job)
            elif op == TAKE:  # a parent or a child, acknowledged with a result naming it
                result = f"done {job}"
                self.job_command(conns, process, i, ACK, job, "ACKJOB", job, "RESULT", result, value={"result": result})
            elif self.args.extensions and not self.draining.is_set() and rng.random() < NACK_RATE:
                self.job_command(conns, process, i, NACK, job, "NACK", job, "DELAY", 1)  # back in a second, or dead-lettered
            else:
                self.acknowledge(conns, rng, process, i, job)

    def acknowledge(self, conns: dict[int, Conn], rng: random.Random, process: int, i: int, job: str) -> None:
        mode = self.args.ack
        kind = (FASTACK if rng.random() < 0.3 else ACK) if mode == "mixed" else (FASTACK if mode == "fastack" else ACK)
        self.job_command(conns, process, i, kind, job, "FASTACK" if kind == FASTACK else "ACKJOB", job)

    def limited_producer(self) -> None:
        """--limit: keeps about 50 jobs queued in LIMITED (ADDJOB ... ASYNC on
        random nodes); they are not judged by the main checker."""
        rng = random.Random(f"{self.args.seed}-lp")
        conns: dict[int, Conn] = {}
        while self.producing.is_set():
            i = rng.randrange(len(self.nodes))
            try:
                queued = self._call(conns, i, "QLEN", LIMITED)
                if isinstance(queued, int) and queued < 50:
                    self._call(conns, i, "ADDJOB", LIMITED, "x", 0, "REPLICATE", 2, "RETRY", LIMITED_RETRY, "ASYNC")
                    continue
            except (OSError, ConnectionError, ReplyError):
                pass
            time.sleep(0.05)

    def limited_consumer(self, process: int) -> None:
        """--limit: GETJOB from LIMITED on random nodes, WORKING (its RETRY
        counts from now: docs/limits.md), 20 to 100 ms of work, ACKJOB; each
        job's (got, done) times go to `limited`: the GETJOB's reply read, and
        the ACKJOB about to be sent (or the job given up)."""
        rng = random.Random(f"{self.args.seed}-lc{process}")
        conns: dict[int, Conn] = {}
        while self.consuming.is_set() and not self.draining.is_set():
            i = rng.randrange(len(self.nodes))
            try:
                reply = self._call(conns, i, "GETJOB", "TIMEOUT", 500, "FROM", LIMITED)
            except (OSError, ConnectionError, ReplyError):
                time.sleep(0.1)
                continue
            if not isinstance(reply, list) or not reply:
                continue
            got, job = now_ms(), reply[0][1]
            try:
                self._call(conns, i, "WORKING", job)
                time.sleep(rng.uniform(0.02, 0.1))
                ended = now_ms()  # (before the ACK: once the node reads it, another consumer may get the slot)
                self._call(conns, i, "ACKJOB", job)
            except (OSError, ConnectionError, ReplyError):
                ended = now_ms()  # its node went away: the job is given up here, and comes back by its RETRY
            with self.lock:
                self.limited.append((got, ended))
    def batch_new(self) -> None:
        """--batches: the batch every parent joins, its ON-COMPLETE job the check's."""
        node = self.nodes[0]
        self.batch = call_once(node.host, node.port, "BATCH", "NEW", "ON-COMPLETE", CALLBACKS, "batch done").decode()
        shown = call_once(node.host, node.port, "BATCH", "SHOW", self.batch)
        callback = dict(zip(shown[::2], shown[1::2]))[b"callback-ids"][1].decode()
        self.record(OK, "batches", 0, BATCH, value={"id": self.batch, "callback": callback})

    def batch_close(self) -> None:
        node = self.nodes[1 % len(self.nodes)]
        if call_once(node.host, node.port, "BATCH", "CLOSE", self.batch) == b"OK":
            self.record(OK, "batches", node.index, CLOSE, value={"id": self.batch})

    def pairs(self, process: int) -> None:
        """--batches: a parent (in the batch) on a random node, then a child
        AFTER it on another, `--batches` times (fewer if the producing ends first)."""
        rng = random.Random(f"{self.args.seed}-b{process}")
        conns: dict[int, Conn] = {}
        for _ in range(self.args.batches):
            if not self.producing.is_set():
                return
            parent = self.add_linked(conns, rng, process, PARENT, PARENTS, ())
            if parent is not None:
                self.add_linked(conns, rng, process, CHILD, CHILDREN, (parent,))
            time.sleep(rng.uniform(0.05, 0.3))

    def add_linked(self, conns: dict[int, Conn], rng: random.Random, process: int, op: str, queue: str, after: tuple[str, ...]) -> str | None:
        i = rng.randrange(len(self.nodes))
        value = {"after": list(after)}
        self.record("invoke", process, i, op, value=value)
        batch = ("BATCH", self.batch) if op == PARENT else ()
        command = ("ADDJOB", queue, op, self.args.addjob_timeout_ms, *PAIR_OPTIONS, *batch, *(x for p in after for x in ("AFTER", p)))
        try:
            reply = self._call(conns, i, *command)
        except (OSError, ConnectionError) as e:
            self.record(INFO, process, i, op, value=repr(e))
            return None
        if not isinstance(reply, bytes):
            self.record(INFO, process, i, op, value=str(reply))
            return None
        self.record(OK, process, i, op, job=reply.decode(), value=value)
        return reply.decode()

    def read_results(self) -> None:
        """--batches: RESULT of every job acknowledged with one, from every node."""
        with self.lock:
            jobs = sorted({r["job"] for r in self.history.records if r["op"] == ACK and r["type"] == "invoke" and r["value"]})
        for job in jobs:
            for node in self.nodes:
                try:
                    reply = call_once(node.host, node.port, "RESULT", job, timeout=5)
                except (OSError, ConnectionError) as e:
                    self.record(INFO, "reader", node.index, RESULT, job=job, value=repr(e))
                    continue
                self.record(OK, "reader", node.index, RESULT, job=job, value=None if reply is None else reply.decode())

    def keys_producer(self, process: int) -> None:
        """--keys: key after key, one to three ADDJOB ... KEY DEDUP of it on
        random nodes (a producer retrying elsewhere), then ORDERED_JOBS jobs
        of an ordered key through one node (another if it fails), then a
        burst of two to four ADDJOB ... KEY DEBOUNCE of it on random nodes."""
        rng = random.Random(f"{self.args.seed}-kp{process}")
        conns: dict[int, Conn] = {}
        n = 0
        while self.producing.is_set():
            key, n = f"p{process}-{n}", n + 1
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(self.nodes))
                self._keyed_add(conns, process, i, DEDUP, {"key": key}, KEYED, key, "DEDUP", 3_600_000)
            through = rng.randrange(len(self.nodes))
            for seq in range(ORDERED_JOBS):
                while self.producing.is_set() and not self._keyed_add(
                    conns, process, through, ORDERED, {"key": key, "seq": seq}, ORDERED_QUEUE, key
                ):
                    through = rng.randrange(len(self.nodes))
                    time.sleep(0.1)
            for seq in range(rng.randint(2, 4) if self.producing.is_set() else 0):
                i = rng.randrange(len(self.nodes))
                self._keyed_add(conns, process, i, DEBOUNCE, {"key": key, "seq": seq}, DEBOUNCED, key, "DEBOUNCE",
                                DEBOUNCE_MS, body=f"{key}:{seq}")  # fmt: skip
                time.sleep(rng.uniform(0.05, 0.3))

    def _keyed_add(self, conns: dict[int, Conn], process: int, i: int, op: str, value: dict[str, Any], queue: str,
                   key: str, *opts: Any, body: str | None = None) -> bool:  # fmt: skip
        with self.lock:
            invoked = self.keyed.invoke(process, i, op, value=value)
        try:
            reply = self._call(conns, i, "ADDJOB", queue, key if body is None else body, 2000, "KEY", key, *opts, "REPLICATE", 2, "RETRY",
                               LIMITED_RETRY, "TTL", 600)  # fmt: skip
        except (OSError, ConnectionError):
            reply = None
        with self.lock:
            if isinstance(reply, bytes):
                self.keyed.complete(invoked, OK, job=reply.decode())
            else:
                self.keyed.complete(invoked, INFO, value=str(reply))
        return isinstance(reply, bytes)

    def keys_consumer(self, process: int) -> None:
        """--keys: GETJOB from the three keyed queues on random nodes, ACKJOB, until
        the drain is over; each delivery and ACK recorded."""
        rng = random.Random(f"{self.args.seed}-kc{process}")
        conns: dict[int, Conn] = {}
        while self.consuming.is_set():
            i = rng.randrange(len(self.nodes))
            with self.lock:
                op = self.keyed.invoke(process, i, TAKE)
            try:
                reply = self._call(conns, i, "GETJOB", "TIMEOUT", 300, "FROM", KEYED, ORDERED_QUEUE, DEBOUNCED)
            except (OSError, ConnectionError):
                reply = None
            if not isinstance(reply, list) or not reply:
                with self.lock:
                    self.keyed.complete(op, FAIL if isinstance(reply, list) or reply is None else INFO, value=str(reply))
                time.sleep(0.05)
                continue
            queue, job = reply[0][0].decode(), reply[0][1].decode()
            with self.lock:
                marks = {ORDERED_QUEUE: ORDERED, DEBOUNCED: DEBOUNCE}
                self.keyed.complete(op, OK, job=job, body=marks.get(queue), value=reply[0][2].decode())
                ack = self.keyed.invoke(process, i, ACK, job=job)
            self.last_delivery = time.monotonic()
            time.sleep(rng.uniform(0.005, 0.03))
            try:
                answer = self._call(conns, i, "ACKJOB", job)
            except (OSError, ConnectionError):
                answer = None
            with self.lock:
                self.keyed.complete(ack, OK if isinstance(answer, int) else INFO, value=str(answer))

    def schedules(self, action: str) -> None:
        """--schedules: SCHEDULE ADD each schedule on a node in turn (recorded
        once every node lists it), or SCHEDULE DEL them all (recorded when sent)."""
        for k in range(self.args.schedules):
            name, node = f"{QUEUE}-tick-{k}", self.nodes[k % len(self.nodes)]
            if action == "add":
                opts = TICK_OPTIONS
                self.record("invoke", "schedules", node.index, SCHEDULE, value={"action": "add", "name": name, **opts})
                reply = call_once(node.host, node.port, "SCHEDULE", "ADD", name, TICKS, name, "EVERY", opts["every"],
                                  "TTL", opts["ttl"], "RETRY", opts["retry"], "REPLICATE", opts["replicate"])  # fmt: skip
                if reply != b"OK":
                    raise RuntimeError(f"SCHEDULE ADD {name}: {reply!r}")
                while not all(name.encode() in call_once(n.host, n.port, "SCHEDULE", "LIST") for n in self.nodes):
                    time.sleep(0.05)  # the ticks judged are those after every node knows the schedule
                self.record(OK, "schedules", node.index, SCHEDULE, value={"action": "add", "name": name, **opts})
            else:
                self.record(OK, "schedules", node.index, SCHEDULE, value={"action": "del", "name": name})
                call_once(node.host, node.port, "SCHEDULE", "DEL", name)

    def acked(self) -> set[str]:
        with self.lock:
            return {r["job"] for r in self.history.records if r["op"] in (ACK, FASTACK) and r["type"] == OK}

    def explain_uncollected(self, acked: set[str], limit: int = 10) -> list[Any]:
        """SHOW of acknowledged jobs some node still holds (for the report)."""
        out: list[Any] = []
        for node in self.nodes:
            try:
                _, ids = call_once(node.host, node.port, "JSCAN", 0, "BUSYLOOP", "COUNT", 1000000, timeout=10)
                for job in sorted(i.decode() for i in ids if i.decode() in acked)[:limit]:
                    show = call_once(node.host, node.port, "SHOW", job, timeout=5)
                    qlen = call_once(node.host, node.port, "QLEN", QUEUE, timeout=5)
                    peek = call_once(node.host, node.port, "QPEEK", QUEUE, 100, timeout=5)
                    out.append({"node": node.index, "job": job, "show": _text(show), "qlen": qlen,
                                "qpeek": [_text(p[1]) for p in peek]})
            except (OSError, ConnectionError, ValueError) as e:
                out.append({"node": node.index, "error": repr(e)})
        return out

    def scan(self, record: bool) -> set[str]:
        """IDs held per node (JSCAN BUSYLOOP); recorded as scan ops if asked."""
        held: set[str] = set()
        for node in self.nodes:
            if record:
                self.record("invoke", "scan", node.index, SCAN)
            try:
                _, ids = call_once(node.host, node.port, "JSCAN", 0, "BUSYLOOP", "COUNT", 1000000, timeout=10)
                ids = sorted(i.decode() for i in ids)
            except (OSError, ConnectionError, ValueError) as e:
                if record:
                    self.record(INFO, "scan", node.index, SCAN, value=repr(e))
                continue
            held.update(ids)
            if record:
                self.record(OK, "scan", node.index, SCAN, value=ids)
        return held


def _text(reply: Any) -> Any:
    if isinstance(reply, bytes):
        return reply.decode(errors="replace")
    if isinstance(reply, list):
        return [_text(r) for r in reply]
    return reply if isinstance(reply, (int, type(None))) else str(reply)


# ---------------------------------------------------------------- the run


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_net(args: argparse.Namespace, rng: random.Random) -> Any:
    """The netns network if it can be built (mode auto or netns), else proxies."""
    from net import NetnsNet, ProxyNet, Unavailable

    why = None
    if args.mode in ("auto", "netns"):
        net = NetnsNet(args.nodes)
        try:
            net.setup()
            return net
        except Unavailable as e:
            if args.mode == "netns":
                raise SystemExit(f"netns mode unavailable: {e}") from None
            why = f"netns mode unavailable ({e}): falling back to proxy mode"
            log(why)
    proxies = ProxyNet(args.nodes, random.Random(rng.random()))
    proxies.setup()
    if why:
        proxies.notes.append(why)
    return proxies


def start_cluster(args: argparse.Namespace, net: Any, workdir: Path) -> list[Node]:
    from disque.testing.devcluster import free_port

    conf = (
        f"protected-mode no\nappendonly yes\nappendfsync everysec\ncluster-node-timeout {args.node_timeout_ms}\n"
        f"read-behind {args.read_behind}\nschedule-grace {args.schedule_grace}\n"
        + ("read-behind-prefetch 2\n" if args.read_behind == "force" else "")
    )
    nodes = []
    for i in range(args.nodes):
        port = args.port if net.mode == "netns" else free_port()
        zone = f"zone {zone_of(i, args.nodes, args.zones)}\n" if args.zones else ""
        nodes.append(Node(i, net.hosts[i], port, workdir / f"n{i}", net.prefix(i), conf + zone, "clock" in chosen_faults(args)))
    for node in nodes:
        node.start()
    if net.mode == "proxy":
        from net import setup_proxies

        setup_proxies(net, nodes)
    else:
        join(nodes)
    return nodes


def apply(step: dict[str, Any], net: Any, nodes: list[Node], on: bool, wl: Workload) -> None:
    fault = step["fault"]
    if fault in ("halves", "majority", "bridge"):
        net.partition(step["groups"]) if on else net.heal()
    elif fault == "netem":
        net.netem(step["nodes"], step["loss"], step["delay_ms"], step["jitter_ms"]) if on else net.heal()
    elif fault == "kill":
        node = nodes[step["node"]]
        node.kill9() if on else node.start()
    elif fault == "pause":
        node = nodes[step["node"]]
        node.pause() if on else node.resume()
    elif fault == "clock":
        nodes[step["node"]].set_clock(step["offset_s"] if on else 0)
    elif fault == "disk":
        disk.apply(step, nodes[step["node"]], on)
    elif fault == "admin":
        admin.Admin(net, nodes, wl, wl.args.node_timeout_ms).apply(step, on)
    elif fault == "zone" and step["how"] == "isolate":
        net.partition([step["nodes"], [i for i in range(len(nodes)) if i not in step["nodes"]]]) if on else net.heal()
    elif fault == "zone":  # kill -9 of the zone's every node, restarted (AOF reload) when the fault ends
        for i in step["nodes"]:
            nodes[i].kill9() if on else nodes[i].start()


def chosen_faults(args: argparse.Namespace) -> tuple[str, ...]:
    """The faults asked for; `all` has the zone fault only with --zones, and
    not the disk fault (a damaged DELJOB brings an acknowledged RETRY 0 job
    back until its TTL: run it with the at-least-once workload)."""
    if args.faults == "all":
        return tuple(f for f in ALL_FAULTS if (f != "zone" or args.zones) and f != "disk")
    return tuple(f for f in args.faults.split(",") if f and f != "none")


def add_rates(records: list[dict[str, Any]], slack_ms: int) -> dict[str, dict[str, Any]]:
    """The producers' adds answered with an ID, among those sent outside the
    nemesis's fault windows (each widened by `slack_ms` after it ends: the
    cluster's time to flag and clear nodes) and those sent inside."""
    windows, opened = [], None
    for r in records:
        if r["op"] == checker_stats.NEMESIS:
            if r["value"]["phase"] == "start":
                opened = r["time"]
            elif opened is not None:
                windows.append((opened, r["time"] + slack_ms))
                opened = None
    if opened is not None:
        windows.append((opened, float("inf")))
    sent = {}
    counts = {"outside": [0, 0], "inside": [0, 0]}
    for r in records:
        if r["op"] != ENQUEUE:
            continue
        key = (r["process"], r["body"])
        if r["type"] == "invoke":
            sent[key] = r["time"]
        elif key in sent:
            at = sent.pop(key)
            where = "inside" if any(a <= at <= b for a, b in windows) else "outside"
            counts[where][0] += r["type"] == OK
            counts[where][1] += 1
    return {k: {"ok": ok, "all": n, "rate": ok / n if n else 1.0} for k, (ok, n) in counts.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    faults = chosen_faults(args)
    for f in faults:
        if f not in ALL_FAULTS:
            raise SystemExit(f"unknown fault {f!r} (choose from {', '.join(ALL_FAULTS)}, all, none)")
    if "zone" in faults and args.zones < 2:
        raise SystemExit("the zone fault needs --zones 2 or more")
    if not 0 <= args.down < args.nodes - 1:
        raise SystemExit("--down must leave at least two nodes up")
    plan = schedule(rng, list(faults), args.nodes - args.down, args.duration, args.fault_s, args.gap_s, args.zones)
    runs = Path(args.runs_dir)
    rundir = runs / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}-{os.getpid()}"
    rundir.mkdir(parents=True)
    latest = runs / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(rundir.name)
    log(f"run directory {rundir}")
    (rundir / "plan.json").write_text(json.dumps({"args": vars(args), "plan": plan}, indent=1))

    net = make_net(args, rng)
    log(f"mode: {net.mode}")
    nodes: list[Node] = []
    wl: Workload | None = None
    threads: list[threading.Thread] = []
    injected: list[dict[str, Any]] = []
    t_start = time.monotonic()
    notes: list[str] = []
    diagnostics: list[Any] = []
    try:
        nodes = start_cluster(args, net, rundir / "nodes")
        log(f"{len(nodes)} nodes up: {', '.join(f'{n.host}:{n.port}' for n in nodes)}")
        down = nodes[len(nodes) - args.down :]  # --down: killed before the first job, back only at the heal
        for node in down:
            node.kill9()
        if down:
            log(f"down for the whole run: node {', '.join(str(n.index) for n in down)}")
        wl = Workload(args, nodes)
        wl.producing.set()
        wl.consuming.set()
        for p in range(args.producers):
            threads.append(threading.Thread(target=wl.producer, args=(p,), daemon=True))
        for c in range(args.consumers):
            threads.append(threading.Thread(target=wl.consumer, args=(1000 + c,), daemon=True))
        if args.limit:
            assert call_once(nodes[0].host, nodes[0].port, "QCONFIG", LIMITED, "SET", "concurrency", args.limit) == b"OK"
            threads.append(threading.Thread(target=wl.limited_producer, daemon=True))
            for c in range(3 * len(nodes)):
                threads.append(threading.Thread(target=wl.limited_consumer, args=(3000 + c,), daemon=True))
        if args.keys:
            assert call_once(nodes[0].host, nodes[0].port, "QCONFIG", ORDERED_QUEUE, "SET", "ordered", "yes") == b"OK"
            for p in range(2):
                threads.append(threading.Thread(target=wl.keys_producer, args=(4000 + p,), daemon=True))
            for c in range(2 * len(nodes)):
                threads.append(threading.Thread(target=wl.keys_consumer, args=(5000 + c,), daemon=True))
        if args.schedules:
            wl.schedules("add")
            for c in range(TICK_CONSUMERS):
                threads.append(threading.Thread(target=wl.consumer, args=(2000 + c, TICK), daemon=True))
        if args.batches:
            wl.batch_new()
            threads.append(threading.Thread(target=wl.pairs, args=(3000,), daemon=True))
            for c in range(TICK_CONSUMERS):
                threads.append(threading.Thread(target=wl.consumer, args=(3001 + c, TAKE), daemon=True))
        for t in threads:
            t.start()
        t0 = time.monotonic()
        for step in plan:
            time.sleep(max(0.0, t0 + step["at"] - time.monotonic()))
            log(f"fault {step['fault']}: {json.dumps({k: v for k, v in step.items() if k not in ('at', 'fault', 'hold')})}")
            wl.nemesis("start", step["fault"], **{k: v for k, v in step.items() if k not in ("fault",)})
            fault_start = now_ms()
            try:
                apply(step, net, nodes, True, wl)
                injected.append(step)
            except Exception as e:  # noqa: BLE001
                notes.append(f"could not inject {step['fault']} at {step['at']}s: {e!r}")
            time.sleep(step["hold"])
            try:
                apply(step, net, nodes, False, wl)
            except Exception as e:  # noqa: BLE001
                notes.append(f"could not end {step['fault']} at {step['at']}s: {e!r}")
            wl.nemesis("stop", step["fault"])
            wl.fault_windows.append((fault_start, now_ms()))
            log(f"healed {step['fault']}")
        time.sleep(max(0.0, t0 + args.duration - time.monotonic()))
        # heal everything, restart what is down, wait for the full mesh
        net.heal()
        for node in down:
            node.start()
        wl.down = 0
        for node in nodes:
            node.resume()
            if not node.alive():
                notes.append(f"node {node.index} was down at the end of the faults (exit {node.proc.returncode if node.proc else None})")
                node.start()
        if not wait_mesh(nodes, 60):
            notes.append("the cluster did not reconnect within 60 s after healing")
        log("healed; producing a little longer")
        time.sleep(args.after_s)
        wl.producing.clear()
        if args.schedules:
            wl.schedules("del")
        if args.batches:
            wl.batch_close()
        wl.draining.set()
        log("draining every node")
        wl.last_delivery = time.monotonic()
        drain_start = time.monotonic()
        while time.monotonic() - wl.last_delivery < args.quiet_s:
            if time.monotonic() - drain_start > args.drain_limit_s:
                notes.append("drain did not go quiet in time")
                break
            time.sleep(0.5)
        wl.consuming.clear()
        for t in threads:
            t.join(10)
        if args.batches:
            wl.read_results()
        if args.workload != "groups":  # events are not collected: they live until their TTL
            log("waiting for acknowledged jobs to be collected")
            acked, gc_start = wl.acked(), time.monotonic()
            gc_limit = args.gc_limit_s
            hard = [s for s in injected if s.get("op") == "reset-hard"]
            if hard:  # acked jobs that listed the old ID wait for their TTL (admin.py)
                gc_limit = max(gc_limit, t0 + hard[-1]["at"] + max(TTLS) + 2 - gc_start)
                log(f"a node was reset HARD: waiting up to {gc_limit:.0f} s, until the TTL of the jobs it held")
            while wl.scan(record=False) & acked and time.monotonic() - gc_start < gc_limit:
                time.sleep(2)
            wl.scan(record=True)
            diagnostics = wl.explain_uncollected(acked)
        for node in nodes:
            if not node.alive():
                notes.append(f"node {node.index} died (exit {node.proc.returncode if node.proc else None})")
    finally:
        for node in nodes:
            node.stop()
        net.close()
        if wl is not None:
            with open(rundir / "history.jsonl", "w") as out:
                wl.history.dump(out)
    elapsed = time.monotonic() - t_start
    notes.extend(net.notes)

    records = wl.history.records
    if args.workload == "groups":
        verdict = check_groups(records, GROUPS, ttl_grace_ms=args.ttl_grace_ms).to_json()
    else:
        verdict = check(records, ttl_grace_ms=args.ttl_grace_ms).to_json()
    schedules = None
    if args.schedules:
        settle = args.settle_ms if args.settle_ms is not None else 2 * args.node_timeout_ms + args.schedule_grace
        schedules = check_schedules(records, grace_ms=args.schedule_grace, nodes=args.nodes, settle_ms=settle).to_json()
    # The jobs a lost node handed out count until their RETRY, and its lease until it lapses.
    out_settle = 2 * args.node_timeout_ms + LIMITED_RETRY * 1000 + 3000
    limits = check_concurrency(wl.limited, args.limit, wl.fault_windows, out_settle) if args.limit else None
    keys = None
    if args.keys:
        keyed = sorted(wl.keyed.records + [r for r in records if r["op"] == checker_stats.NEMESIS], key=lambda r: r["time"])
        keys = {"dedup": check_keys(keyed, settle_ms=out_settle).to_json(), "ordered": check_ordered(keyed, settle_ms=out_settle).to_json()}
        keys["debounce"] = check_debounce(keyed, settle_ms=out_settle, debounce_ms=DEBOUNCE_MS).to_json()
        keys["valid"] = keys["dedup"]["valid"] and keys["ordered"]["valid"] and keys["debounce"]["valid"]
    settle = args.settle_ms if args.settle_ms is not None else 2 * args.node_timeout_ms + args.schedule_grace
    workflows = check_workflows(records, settle_ms=settle).to_json() if args.batches else None
    results = {
        "valid": verdict["valid"] and (schedules is None or schedules["valid"]) and (limits is None or limits.valid)
        and (keys is None or keys["valid"]) and (workflows is None or workflows["valid"])
        and not any("died" in n for n in notes),
        "mode": net.mode,
        "seed": args.seed,
        "workload": args.workload,
        "ack": args.ack,
        "lost": verdict.get("lost", 0),
        "unexpected": verdict.get("unexpected", 0),
        "duplicated": verdict.get("duplicated", 0),
        "recovered": verdict.get("recovered", 0),
        "enqueued": verdict.get("acknowledged", 0),
        "checker": verdict,
        "schedules": schedules,
        "limits": None if limits is None else {
            "valid": limits.valid, "limit": limits.limit, "jobs": len(wl.limited), "most": limits.most,
            "most_in_faults": limits.most_in_faults, "violations": len(limits.violations),
            "fault_violations": len(limits.fault_violations),
        },
        "workflows": workflows,
        "keys": keys,
        "faults": injected,
        "fault_counts": {f: sum(1 for s in injected if s["fault"] == f) for f in sorted({s["fault"] for s in injected})},
        "latency_ms": checker_stats.latencies(records),
        "elapsed_s": round(elapsed, 1),
        "notes": notes,
        "diagnostics": diagnostics,
        "args": vars(args),
    }
    if args.workload != "groups":
        results["adds"] = add_rates(records, 2 * args.node_timeout_ms)
    ops = checker_stats.operations(records)
    results["ops_per_s"] = round(sum(1 for o in ops if o["type"] == OK) / max(elapsed, 1), 1)
    (rundir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    try:
        import report

        report.write(rundir, records, results)
    except ImportError as e:
        log(f"no plots ({e}); install matplotlib")
    if args.workload == "groups":
        log(
            f"{'VALID' if results['valid'] else 'INVALID'}: events added {results['enqueued']}, deliveries "
            f"{verdict.get('deliveries')}, lost {results['lost']}, unexpected {results['unexpected']}, late "
            f"{verdict.get('late')}, redelivered after an acknowledgement {verdict.get('redelivered_after_ack')} "
            f"(after a fault {verdict.get('redelivered_after_fault')}), redo {verdict.get('redo')} ({net.mode} mode, {elapsed:.0f}s)"
        )
    else:
        log(
            f"{'VALID' if results['valid'] else 'INVALID'}: enqueued {results['enqueued']}, lost {results['lost']}, "
            f"unexpected {results['unexpected']}, duplicated {results['duplicated']}, recovered {results['recovered']}, "
            f"late {verdict.get('late')}, uncollected {verdict.get('uncollected')}, wiped {verdict.get('wiped')}, "
            f"at-most-once duplicated {verdict.get('at_most_once_duplicated')}, phantom acks {verdict.get('phantom_acks')} "
            f"({net.mode} mode, {elapsed:.0f}s)"
        )
    if "adds" in results:
        outside, inside = results["adds"]["outside"], results["adds"]["inside"]
        log(
            f"producers' success rate outside the fault windows {outside['rate']:.2%} ({outside['ok']} of "
            f"{outside['all']}), inside {inside['rate']:.2%} ({inside['ok']} of {inside['all']})"
            + (f"; node {', '.join(str(i) for i in range(args.nodes - args.down, args.nodes))} down the whole run" if args.down else "")
        )
    if schedules is not None:
        log(
            f"schedules {'VALID' if schedules['valid'] else 'INVALID'}: {schedules['ticks']} ticks ({schedules['outside']} "
            f"outside the faults), missing {schedules['missing']}, delivered twice outside the faults "
            f"{schedules['duplicated_outside']}, inside {schedules['duplicated_inside']}, retried {schedules['retried']}, "
            f"unexpected {schedules['unexpected']}, other ticks {schedules['beyond']}, wiped {schedules['wiped']}"
        )
    if limits is not None:
        log(f"limits {'VALID' if limits.valid else 'INVALID'}: {len(wl.limited)} jobs of {LIMITED}, {limits.summary()}")
    if workflows is not None:
        log(
            f"workflows {'VALID' if workflows['valid'] else 'INVALID'}: {workflows['children']} children, delivered "
            f"before their parents' ACKs {workflows['early']}, never delivered after them {workflows['stuck']}, results "
            f"read {workflows['results']}, lost {workflows['lost_results']}, wrong {workflows['wrong_results']}; the "
            f"batch's callback missing {workflows['callbacks_missing']}, twice outside the faults "
            f"{workflows['callbacks_duplicated_outside']}"
        )
    if keys is not None:
        d, o = keys["dedup"], keys["ordered"]
        log(f"keys {'VALID' if keys['valid'] else 'INVALID'}: {d['keys']} keys, {d['split_outside']} with two jobs "
            f"outside the faults, {d['split_inside']} inside, {d['lost']} lost; ordered: {o['ordered_jobs']} jobs of "
            f"{o['ordered_keys']} keys, two out at once {o['two_out_outside']} outside the faults and "
            f"{o['two_out_inside']} inside, order breaks {o['order_outside']} outside and {o['order_inside']} inside, "
            f"{o['ordered_lost']} lost")  # fmt: skip
        b = keys["debounce"]
        log(f"  debounce: {b['bursts']} bursts ({b['bursts_outside']} clear of the faults), {b['runs']} runs; extra runs "
            f"{b['extra_outside']} outside the faults and {b['extra_inside']} inside, stale bodies {b['stale_outside']} "
            f"outside and {b['stale_inside']} inside, early {b['early_outside']}, bursts lost {b['burst_lost']}")  # fmt: skip
    for n in notes:
        log(f"note: {n}")
    return results


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Fault-injection run against a real Disque cluster.")
    p.add_argument("--faults", default="halves,majority,bridge,kill",
                   help=f"comma list of {', '.join(ALL_FAULTS)}; 'all' or 'none' (default: %(default)s)")  # fmt: skip
    p.add_argument("--workload", choices=("at-least-once", "at-most-once", "mixed", "groups", "default"), default="mixed",
                   help="jobs of either guarantee, or consumer-group events (QADD, QGET, QACK) read by three groups")  # fmt: skip
    p.add_argument("--ack", choices=("ackjob", "fastack", "mixed"), default="mixed", help="how consumers acknowledge")
    p.add_argument("--extensions", action="store_true",
                   help="also NACK ... DELAY a quarter of the deliveries, give at-least-once jobs MAXATTEMPTS 4 "
                        "(consumed from the dead-letter queue too) and WAITJOB a tenth of the jobs added")  # fmt: skip
    p.add_argument("--schedules", type=int, default=0,
                   help="also run this many schedules (EVERY 1 s) and check one job per tick (README)")  # fmt: skip
    p.add_argument("--batches", type=int, default=0,
                   help="also add this many parents, each with a child AFTER it, acknowledge them with results and "
                        "check that no child runs before its parent's ACK and no result is lost (README)")  # fmt: skip
    p.add_argument("--schedule-grace", type=int, default=2000, help="the nodes' schedule-grace, ms")
    p.add_argument("--keys", action="store_true",
                   help="keyed jobs beside the workload: KEY ... DEDUP, an ordered queue and DEBOUNCE bursts; VALID if "
                        "no key has two jobs, no ordered key two out at once and no burst two runs or a stale body "
                        "outside the faults, and none is lost (docs/keys.md)")  # fmt: skip
    p.add_argument("--limit", type=int, default=0,
                   help="also run a queue at QCONFIG concurrency N and check, from its consumers' history, that no more "
                        "than N jobs are out at once outside the faults (docs/limits.md)")  # fmt: skip
    p.add_argument("--settle-ms", type=int, default=None,
                   help="how long after a fault the schedules checker still excuses a tick "
                        "(default: 2 x node timeout + schedule grace)")  # fmt: skip
    p.add_argument("--duration", type=float, default=60, help="seconds of faults (default: %(default)s)")
    p.add_argument("--fault-s", type=float, default=8, help="how long each fault holds")
    p.add_argument("--gap-s", type=float, default=4, help="healthy seconds between faults")
    p.add_argument("--seed", type=int, default=1, help="fixes the fault schedule and the workload choices")
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--down", type=int, default=0, help="the last N nodes are down the whole run (back at the heal)")
    p.add_argument("--zones", type=int, default=0, help="split the nodes in order into this many zones (0: no zones)")
    p.add_argument("--min-zones", type=int, default=0, help="ADDJOB ZONES of the at-least-once jobs (0: not sent)")
    p.add_argument("--replicate", type=int, default=0, help="REPLICATE of the at-least-once jobs (0: 2 or 3 at random)")
    p.add_argument("--mode", choices=("auto", "netns", "proxy"), default="auto")
    p.add_argument("--producers", type=int, default=5)
    p.add_argument("--consumers", type=int, default=5)
    p.add_argument("--think-ms", type=float, default=50, help="max pause between enqueues per producer")
    p.add_argument("--port", type=int, default=7711, help="client port of every node in netns mode")
    p.add_argument("--node-timeout-ms", type=int, default=1000)
    p.add_argument("--read-behind", choices=("yes", "no", "force"), default="yes",
                   help="force: every queue keeps two jobs in memory, every replica is on disk")
    p.add_argument("--addjob-timeout-ms", type=int, default=1000)
    p.add_argument("--client-timeout", type=float, default=3.0, help="socket timeout, seconds")
    p.add_argument("--after-s", type=float, default=5, help="seconds of producing after healing")
    p.add_argument("--quiet-s", type=float, default=8, help="drain ends after this long without a delivery")
    p.add_argument("--drain-limit-s", type=float, default=120)
    p.add_argument("--gc-limit-s", type=float, default=60, help="max wait for acked jobs to be collected")
    p.add_argument("--ttl-grace-ms", type=int, default=2000)
    p.add_argument("--runs-dir", default=str(HERE / "runs"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    results = run(args)
    return 0 if results["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
