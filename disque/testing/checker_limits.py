"""How many jobs of a limited queue were out at once, from the consumers' history (docs/limits.md).

Theory of operation: each consumer records, for every job it got, when
the GETJOB reply came and when it sent the ACKJOB (or gave the job up: its
node went away).  `check_concurrency` sweeps those intervals in time order
(an interval ending at the instant another starts does not overlap it) and
reports every instant more than `limit` were open.  An instant inside a
fault window (from a fault's start until `settle_ms` after its end: the
leases lapse, the jobs a lost node handed out come back by their RETRY) is
counted apart: the limit is promised while the cluster is connected, and
what faults cost is counted and printed, not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ConcurrencyResult:
    limit: int
    most: int = 0  # the most out at once, outside fault windows
    most_in_faults: int = 0
    violations: list[tuple[float, int]] = field(default_factory=list)  # (time, out) outside fault windows
    fault_violations: list[tuple[float, int]] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        return (f"concurrency {self.limit}: at most {self.most} out at once while connected, "
                f"{self.most_in_faults} under faults ({len(self.fault_violations)} instants above the limit under faults, "
                f"{len(self.violations)} while connected)")  # fmt: skip


def check_concurrency(
    intervals: list[tuple[float, float]], limit: int, faults: list[tuple[float, float]] = (), settle_ms: float = 0  # type: ignore[assignment]
) -> ConcurrencyResult:
    """`intervals`: (got, ended) of every job, in ms; `faults`: (start, stop) ms."""
    result = ConcurrencyResult(limit)
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    out = 0
    for at, step in events:
        out += step
        if step < 0:
            continue
        in_fault = any(start <= at <= stop + settle_ms for start, stop in faults)
        if in_fault:
            result.most_in_faults = max(result.most_in_faults, out)
        else:
            result.most = max(result.most, out)
        if out > limit:
            (result.fault_violations if in_fault else result.violations).append((at, out))
    return result
