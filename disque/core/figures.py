"""A node's figures as plain data, for the metrics endpoint and the dashboard.

Theory of operation: `node_figures(node)` reads the node once and returns
dicts, lists, strings and numbers only, so the shell can render them
(Prometheus text, JSON) without reaching into core objects.  It is a read:
nothing changes.  Most figures are counters or sizes the node keeps anyway;
jobs by state are counted by walking the job table (O(jobs), a few ms per
100,000 jobs), the rest is O(queues + nodes); the metrics endpoint caps
the queues and groups it shows in detail (`max_queues`, `group_figures`);
the dashboard's clients and dead letters are capped too (`client_figures`,
`dead_letter_figures`), and so are the queues whose keys are shown
(`key_figures`: O(keys) for those).
INFO keeps its own text sections (protocols/resp/admin.py); the names here
follow them where they overlap.
"""

from __future__ import annotations

import heapq
from itertools import islice
from typing import TYPE_CHECKING, Any

from disque.cluster.membership import MYSELF, flags_text
from disque.store.job import STATE_NAMES
from disque.store.queue import PAUSE_NAMES, Queue

if TYPE_CHECKING:
    from disque.core.node import NodeCore
    from disque.store.job import Job
    from disque.core.types import Connection

BODY_PREVIEW = 120  # bytes of a dead letter's body in its figures
MAX_KEY_QUEUES = 100  # queues whose keys are shown (the most keyed jobs first) ...
TOP_KEYS = 5  # ... each with this many of its busiest keys: at most 500 key series on /metrics


def node_figures(node: NodeCore, max_queues: int | None = None) -> dict[str, Any]:
    """The figures; with `max_queues`, "queues" holds at most that many, the
    longest (ties: the first in the queue table), and "other_queues" the
    sums of the rest."""
    jobs = dict.fromkeys(STATE_NAMES.values(), 0)
    for job in node.jobs.values():
        jobs[STATE_NAMES[job.state]] += 1
    queued, active = node.read_behind.counts()  # the jobs on disk: queued in a tail, or active copies
    jobs["queued"] += queued
    jobs["active"] += active
    stats, fed, repl = node.stats, node.federation, node.replication
    return {
        "node_id": node.membership.my_id,
        "jobs": jobs,
        "used_memory": node.memory.used,
        "peak_memory": node.memory.peak,
        "mem_level": node.memory.level(),
        "maxmemory": node.config.maxmemory,
        "clients": len(node.clients),
        "blocked_clients": node.blocking.count(),
        "connections_received": stats.connections,
        "commands_processed": stats.commands,
        "auth_failures": stats.auth_failures,
        "bus_sent": stats.bus_sent,
        "bus_received": stats.bus_received,
        "aof": dict(node.aof.info_fields(node.loading)),
        "replication": {
            "pending": len(repl.pending),
            "achieved": repl.achieved_count,
            "aborted": repl.aborted_count,
        },
        "federation": dict(fed.info_fields()),
        "commands": {name: list(calls) for name, calls in stats.calls.items()},
        "nodes": [
            {
                "id": peer.id,
                "addr": f"{peer.ip}:{peer.port}",
                "flags": flags_text(peer.flags),
                "myself": bool(peer.flags & MYSELF),
                "link": bool(peer.flags & MYSELF or peer.link),
                "zone": peer.zone,
            }
            for peer in node.membership.nodes.values()
        ],
        "schedules": dict(node.schedules.info_fields()),
        "keys": dict(node.keys.info_fields()),
        "key_list": key_figures(node),
        "workflows": dict(node.deps.info_fields() + node.batches.info_fields()),
        "schedule_list": schedule_figures(node),
        "limits": dict(node.limits.info_fields()),
        "limit_list": node.limits.figures(),
        **queues_figures(node, max_queues),
    }


def key_figures(node: NodeCore, max_queues: int = MAX_KEY_QUEUES, top: int = TOP_KEYS) -> list[dict[str, Any]]:
    """The queues with keyed jobs queued here, at most `max_queues`, those
    with the most keyed jobs (ties: the first in the queue table): the keys
    with jobs queued, the keyed jobs, and the `top` busiest keys as [key,
    jobs] (QKEYS's figures, store/queue.py `Fair.busiest`: one pass over
    each queue's keys)."""
    fairs = [(queue.name, queue.fair) for queue in node.queues.values() if queue.fair is not None and queue.fair.live]
    out = []
    for name, fair in heapq.nlargest(max_queues, fairs, key=lambda entry: entry[1].live):
        keys, busiest = fair.busiest(top)
        out.append({"queue": _text(name), "keys": keys, "jobs": fair.live, "busiest": [[_text(key), n] for key, n in busiest]})
    return out


def schedule_figures(node: NodeCore) -> list[dict[str, Any]]:
    """Every schedule as SCHEDULE SHOW describes it, in name order (the
    dashboard's panel): texts as str, the ADDJOB options as one string."""
    out = []
    for name in node.schedules.names():
        row: dict[str, Any] = {}
        for key, value in node.schedules.show(name) or ():  # (names() lists the live ones)
            if isinstance(value, list):
                value = b" ".join(value)
            row[key.decode()] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        out.append(row)
    return out


def queues_figures(node: NodeCore, max_queues: int | None) -> dict[str, Any]:
    shown: Any = node.queues.values()
    other = {"count": 0, "len": 0, "jobs_in": 0, "jobs_out": 0, "blocked": 0}
    if max_queues is not None and len(node.queues) > max_queues:
        shown = heapq.nlargest(max_queues, node.queues.values(), key=len)  # ties: the first in the table
        chosen = {id(q) for q in shown}
        for queue in node.queues.values():
            if id(queue) not in chosen:
                other["count"] += 1
                other["len"] += len(queue)
                other["jobs_in"] += queue.jobs_in
                other["jobs_out"] += queue.jobs_out
                other["blocked"] += len(queue.waiters)
    return {"queues": [queue_figures(node, queue) for queue in shown], "queues_total": len(node.queues), "other_queues": other}


def group_figures(node: NodeCore, max_groups: int) -> tuple[list[tuple[bytes, int, list[Any]]], int]:
    """QSTATUS's figures of at most `max_groups` consumer groups (queues in
    name order, their groups in name order), and how many groups there are."""
    groups = node.groups
    total = sum(len(q.groups) for q in groups.queues.values())
    out: list[tuple[bytes, int, list[Any]]] = []
    room = max_groups
    for name in sorted(groups.queues):
        if room <= 0:
            break
        names = sorted(groups.queues[name].groups)[:room]
        if names:
            out += groups.status([name], names)
            room -= len(names)
    return out, total


def dead_letter_figures(node: NodeCore, max_queues: int, sample: int) -> list[dict[str, Any]]:
    """The dead-letter queues (those whose oldest queued job is a
    dead-lettered copy, MAXATTEMPTS), at most `max_queues`: their length and
    their `sample` oldest jobs, bodies and error messages cut to
    BODY_PREVIEW bytes."""
    out: list[dict[str, Any]] = []
    for queue in node.queues.values():
        if not len(queue):
            continue
        oldest = queue.oldest()
        first = next(oldest, None)
        if first is None or not first.origin:
            continue
        jobs = [first, *islice(oldest, sample - 1)]
        out.append({"name": _text(queue.name), "len": len(queue), "jobs": [
            {"id": _text(job.id), "from": _text(job.dead_letter), "nacks": job.nacks, "deliveries": job.deliv,
             "age_ms": max(0, node.now - job.ctime // 1_000_000), "body": _text((job.body or b"")[:BODY_PREVIEW]),
             **_failure(job)}
            for job in jobs
        ]})  # fmt: skip
        if len(out) == max_queues:
            break
    return out


def _failure(job: Job) -> dict[str, str]:
    """A dead letter's last failure for the dashboard (NACK ... ERROR): its
    type and the start of its message; nothing without one."""
    failure = job.failure
    return {"error": _text(failure.type), "message": _text(failure.message[:BODY_PREVIEW])} if failure else {}


def client_figures(node: NodeCore, max_clients: int) -> list[dict[str, Any]]:
    """CLIENT LIST's fields of at most `max_clients` clients: the blocked
    ones first (waiting in GETJOB: `queues`), then the named ones (a worker
    that sets CLIENT SETNAME), then by age."""
    now = node.now

    def order(client: Connection) -> tuple[bool, bool, int]:
        return client.waiter is None, not client.name, client.id

    return [
        {
            "id": c.id, "addr": c.addr, "name": _text(c.name), "lib": _text(c.lib_name), "age_s": (now - c.ctime) // 1000,
            "idle_s": (now - c.last) // 1000, "cmd": c.last_cmd,
            "queues": [_text(q) for q in c.waiter.queues] if c.waiter is not None else [],
        }  # fmt: skip
        for c in heapq.nsmallest(max_clients, node.clients.values(), key=order)
    ]


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def queue_figures(node: NodeCore, queue: Queue) -> dict[str, Any]:
    oldest = queue.eldest()
    return {
        "name": queue.name.decode("utf-8", "backslashreplace"),
        "len": len(queue),
        "jobs_in": queue.jobs_in,
        "jobs_out": queue.jobs_out,
        "blocked": len(queue.waiters),
        "oldest_age_ms": 0 if oldest is None else max(0, node.now - oldest.ctime // 1_000_000),
        "nacks": queue.nacks,
        "redeliveries": queue.redeliveries,
        "dead_lettered": queue.dead_lettered,
        "import_rate": node.federation.import_rate(queue),
        "pause": PAUSE_NAMES[queue.pause],
    }
