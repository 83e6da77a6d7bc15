"""Performance views of a `disque.testing.checker` history: latency per operation and
throughput over time, plus the fault windows a harness recorded.

These complement `disque.testing.checker.check` (which judges safety) and read the
same records.  A harness may add nemesis records to a history:

    {"op": "nemesis", "type": "info", "value": {"fault": name, "phase":
     "start" | "stop", ...}, "time": ..., "process": "nemesis", ...}

`check` ignores them; `fault_windows` pairs them into intervals.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from disque.testing.checker import INVOKE, Record

NEMESIS = "nemesis"


def operations(history: Iterable[Record]) -> list[dict[str, Any]]:
    """Each completed client operation as {op, type, node, start, latency}
    (ms): an invoke paired with the next completion of its process."""
    pending: dict[Any, Record] = {}
    done: list[dict[str, Any]] = []
    for r in history:
        if r["op"] == NEMESIS:
            continue
        if r["type"] == INVOKE:
            pending[r["process"]] = r
        elif (inv := pending.pop(r["process"], None)) is not None and inv["op"] == r["op"]:
            done.append({
                "op": r["op"], "type": r["type"], "node": inv["node"],
                "start": inv["time"], "latency": r["time"] - inv["time"],
            })  # fmt: skip
    return done


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return 0.0
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil
    return float(sorted_values[int(min(rank, len(sorted_values))) - 1])


def latencies(history: Iterable[Record], qs: tuple[float, ...] = (50, 90, 99, 100)) -> dict[str, dict[str, Any]]:
    """Per op: count, how many completed ok/fail/info, and latency percentiles
    (ms) named p50, p90, p99, p100 (the maximum)."""
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in operations(history):
        by_op[o["op"]].append(o)
    stats: dict[str, dict[str, Any]] = {}
    for op, ops in sorted(by_op.items()):
        values = sorted(o["latency"] for o in ops)
        row: dict[str, Any] = {"count": len(ops)}
        for kind in ("ok", "fail", "info"):
            row[kind] = sum(1 for o in ops if o["type"] == kind)
        for q in qs:
            row[f"p{q:g}"] = percentile(values, q)
        stats[op] = row
    return stats


def throughput(history: Iterable[Record], bucket_ms: int = 1000, *, start: int | None = None) -> dict[str, list[int]]:
    """Per op, successful completions per bucket, buckets counted from `start`
    (default: the first record).  All lists have the same length."""
    records = list(history)
    if not records:
        return {}
    t0 = min(r["time"] for r in records) if start is None else start
    t1 = max(r["time"] for r in records)
    n = (t1 - t0) // bucket_ms + 1
    series: dict[str, list[int]] = {}
    for o in operations(records):
        if o["type"] != "ok":
            continue
        bucket = (o["start"] + o["latency"] - t0) // bucket_ms
        series.setdefault(o["op"], [0] * n)[min(max(bucket, 0), n - 1)] += 1
    return dict(sorted(series.items()))


def fault_windows(history: Iterable[Record]) -> list[dict[str, Any]]:
    """Nemesis start/stop records paired per fault name: [{fault, start, stop,
    value}] in start order; a fault never stopped ends at the last record."""
    open_: dict[str, Record] = {}
    windows: list[dict[str, Any]] = []
    end = 0
    for r in history:
        end = max(end, r["time"])
        if r["op"] != NEMESIS:
            continue
        v = r.get("value") or {}
        name = v.get("fault", "?")
        if v.get("phase") == "start":
            open_[name] = r
        elif v.get("phase") == "stop" and name in open_:
            s = open_.pop(name)
            windows.append({"fault": name, "start": s["time"], "stop": r["time"], "value": s.get("value")})
    for name, s in open_.items():
        windows.append({"fault": name, "start": s["time"], "stop": end, "value": s.get("value")})
    return sorted(windows, key=lambda w: w["start"])
