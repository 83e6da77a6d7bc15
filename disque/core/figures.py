"""A node's figures as plain data, for the metrics endpoint and the dashboard.

Theory of operation: `node_figures(node)` reads the node once and returns
dicts, lists, strings and numbers only, so the shell can render them
(Prometheus text, JSON) without reaching into core objects.  It is a read:
nothing changes.  Most figures are counters or sizes the node keeps anyway;
jobs by state are counted by walking the job table (O(jobs), a few ms per
100,000 jobs), the rest is O(queues + nodes).  INFO keeps its own text
sections (protocols/resp/admin.py); the names here follow them where they
overlap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disque.cluster.membership import MYSELF, flags_text
from disque.store.job import State
from disque.store.queue import PAUSE_NAMES, Queue

if TYPE_CHECKING:
    from disque.core.node import NodeCore

STATE_NAMES = {state: state.name.lower().replace("_", "-") for state in State}


def node_figures(node: NodeCore) -> dict[str, Any]:
    jobs = dict.fromkeys(STATE_NAMES.values(), 0)
    for job in node.jobs.values():
        jobs[STATE_NAMES[job.state]] += 1
    if node.read_behind is not None:  # the jobs on disk: queued in a tail, or active copies
        queued, active = node.read_behind.counts()
        jobs["queued"] += queued
        jobs["active"] += active
    stats, fed, repl = node.stats, node.federation, node.replication
    return {
        "node_id": node.cluster.my_id,
        "jobs": jobs,
        "used_memory": node.used_memory,
        "peak_memory": node.peak_memory,
        "clients": len(node.clients),
        "blocked_clients": len(node.blocked) + len(node.repl_waiters),
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
        "federation": {
            "needjobs_sent": fed.needjobs_sent,
            "jobs_exported": fed.jobs_exported,
            "jobs_imported": fed.jobs_imported,
        },
        "commands": {name: list(calls) for name, calls in stats.calls.items()},
        "nodes": [
            {
                "id": peer.id,
                "addr": f"{peer.ip}:{peer.port}",
                "flags": flags_text(peer.flags),
                "myself": bool(peer.flags & MYSELF),
                "link": bool(peer.flags & MYSELF or peer.link),
            }
            for peer in node.cluster.nodes.values()
        ],
        "queues": [queue_figures(node, queue) for queue in node.queues.values()],
    }


def queue_figures(node: NodeCore, queue: Queue) -> dict[str, Any]:
    oldest = next(queue.oldest(), None)
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
        "import_rate": node.import_rate(queue),
        "pause": PAUSE_NAMES[queue.pause],
    }
