"""The cluster-wide views (`qlen`, `qstat`, `top`; the others with
`--cluster`), and the rates `top` shows.

Theory of operation: a cluster-wide view runs on every node the connected
one lists in HELLO (`Session.each_node`) and merges the answers with the
functions here, which do no I/O (`qlen` simply adds up):

- a queue (`merge_stats`): a job is queued on one node at a time, so lengths,
  jobs in and out, blocked clients and import rates add up; the age is the
  oldest node's, the idle time the most recently active node's, the nodes
  imported from are the union, and the pause state is the nodes' common one
  or "mixed";
- queue lengths (`merge_lengths`): summed by name;
- jobs (`merge_jobs`): a job known to several nodes (its replicas) is listed
  once, with the record of the node that has it furthest along: acked, then
  queued, then active, then wait-repl.

`QueueRates` turns successive samples of queue counters into jobs/s in and
out, whether the counters come from one node or from a merge.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from disque.client import JobInfo, QueueStats

STATE_RANK = {"acked": 0, "queued": 1, "active": 2, "wait-repl": 3}


def merge_stats(stats: list[QueueStats]) -> QueueStats:
    """One queue's QSTATs from several nodes (at least one) as one."""
    pauses = {s.pause for s in stats}
    return QueueStats(
        name=stats[0].name,
        len=sum(s.len for s in stats),
        age=max(s.age for s in stats),
        idle=min(s.idle for s in stats),
        blocked=sum(s.blocked for s in stats),
        import_from=list(dict.fromkeys(node for s in stats for node in s.import_from)),
        import_rate=sum(s.import_rate for s in stats),
        jobs_in=sum(s.jobs_in for s in stats),
        jobs_out=sum(s.jobs_out for s in stats),
        pause=pauses.pop() if len(pauses) == 1 else "mixed",
    )


def merge_queues(stats: Iterable[QueueStats]) -> list[QueueStats]:
    """QSTATs of many queues from several nodes: one merged record per queue, by name."""
    by_name: dict[str, list[QueueStats]] = {}
    for s in stats:
        by_name.setdefault(s.name, []).append(s)
    return [merge_stats(by_name[name]) for name in sorted(by_name)]


def merge_lengths(per_node: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for lengths in per_node:
        for name, n in lengths.items():
            total[name] = total.get(name, 0) + n
    return dict(sorted(total.items()))


def merge_jobs(per_node: Iterable[list[Any]]) -> list[Any]:
    """Job records (`JobInfo`) or bare IDs from several nodes, each job once, in the order first seen."""
    jobs: dict[str, Any] = {}
    for items in per_node:
        for item in items:
            key = item.id if isinstance(item, JobInfo) else item
            if key not in jobs or (isinstance(item, JobInfo) and STATE_RANK.get(item.state, 9) < STATE_RANK.get(jobs[key].state, 9)):
                jobs[key] = item
    return list(jobs.values())


@dataclass
class QueueRates:
    """Turns successive QSTATs into jobs/s in and out (None until two samples)."""

    last: dict[str, tuple[float, QueueStats]] = field(default_factory=dict)

    def update(self, stats: list[QueueStats], now: float) -> list[dict[str, Any]]:
        rows = []
        for s in stats:
            rate_in = rate_out = None
            if s.name in self.last:
                then, old = self.last[s.name]
                elapsed = max(now - then, 1e-9)
                rate_in = round((s.jobs_in - old.jobs_in) / elapsed, 1)
                rate_out = round((s.jobs_out - old.jobs_out) / elapsed, 1)
            rows.append({"queue": s.name, "len": s.len, "in_per_sec": rate_in, "out_per_sec": rate_out, "blocked": s.blocked, "pause": s.pause})
        self.last = {s.name: (now, s) for s in stats}
        return rows
