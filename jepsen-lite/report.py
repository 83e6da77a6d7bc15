"""Plots (PNG) and the HTML summary of a run directory."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from disque.testing import checker_stats  # noqa: E402

COLORS = {
    "halves": "#f4a582", "majority": "#92c5de", "bridge": "#c2a5cf", "kill": "#d6604d",
    "pause": "#fddbc7", "netem": "#a6dba0", "admin": "#ffd92f", "clock": "#bababa",
}  # fmt: skip
OP_COLORS = {"enqueue": "#2166ac", "dequeue": "#1b7837", "ack": "#b2182b", "fastack": "#e08214", "scan": "#666666"}


def _shade(ax: Any, windows: list[dict[str, Any]], t0: int) -> None:
    seen = set()
    for w in windows:
        label = None if w["fault"] in seen else w["fault"]
        seen.add(w["fault"])
        ax.axvspan((w["start"] - t0) / 1000, (w["stop"] - t0) / 1000, color=COLORS.get(w["fault"], "#dddddd"),
                   alpha=0.45, label=label, lw=0)  # fmt: skip


def plots(rundir: Path, records: list[dict[str, Any]]) -> list[str]:
    if not records:
        return []
    t0 = min(r["time"] for r in records)
    windows = checker_stats.fault_windows(records)
    ops = [o for o in checker_stats.operations(records) if o["op"] != "scan"]

    fig, ax = plt.subplots(figsize=(11, 4.5))
    _shade(ax, windows, t0)
    for op in sorted({o["op"] for o in ops}):
        for kind, marker in (("ok", "."), ("fail", "x"), ("info", "^")):
            pts = [o for o in ops if o["op"] == op and o["type"] == kind]
            if pts:
                ax.scatter([(o["start"] - t0) / 1000 for o in pts], [max(o["latency"], 0.5) for o in pts], s=6 if kind == "ok" else 14,
                           marker=marker, color=OP_COLORS.get(op, "k"), alpha=0.6, label=f"{op} {kind}")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency per operation (shaded: faults)")
    ax.legend(fontsize=7, ncol=4, loc="upper left", markerscale=2)
    fig.tight_layout()
    fig.savefig(rundir / "latency.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 4.5))
    _shade(ax, windows, t0)
    series = checker_stats.throughput(records, 1000, start=t0)
    for op, counts in series.items():
        if op == "scan":
            continue
        ax.plot(range(len(counts)), counts, color=OP_COLORS.get(op, "k"), label=f"{op} ok/s", lw=1.2)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("successful operations per second")
    ax.set_title("Throughput over time (shaded: faults)")
    ax.legend(fontsize=8, ncol=4, loc="upper left")
    fig.tight_layout()
    fig.savefig(rundir / "throughput.png", dpi=110)
    plt.close(fig)
    return ["latency.png", "throughput.png"]


def _table(rows: list[list[Any]], head: list[str]) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def write(rundir: Path, records: list[dict[str, Any]], results: dict[str, Any]) -> None:
    images = plots(rundir, records)
    c = results["checker"]
    counts = [[k, c.get(k, 0)] for k in (
        "attempted", "acknowledged", "dequeued", "lost", "unexpected", "duplicated", "recovered",
        "at_most_once_duplicated", "late", "uncollected", "expired", "lost_best_effort",
    )]  # fmt: skip
    lat = [[op, s["count"], s["ok"], s["fail"], s["info"], s["p50"], s["p90"], s["p99"], s["p100"]]
           for op, s in results["latency_ms"].items()]  # fmt: skip
    faults = [[round(f["at"], 1), f["fault"], f["hold"],
               json.dumps({k: v for k, v in f.items() if k not in ("at", "fault", "hold")})] for f in results["faults"]]  # fmt: skip
    verdict = "VALID" if results["valid"] else "INVALID"
    color = "#1b7837" if results["valid"] else "#b2182b"
    problems = html.escape(json.dumps(c.get("problems", {}), indent=1))
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in results.get("notes", []))
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>jepsen-lite seed {results['seed']}</title>
<style>body{{font-family:sans-serif;max-width:1150px;margin:2em auto}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} .v{{color:{color};font-size:2em;font-weight:bold}}</style></head>
<body><h1>jepsen-lite run</h1><p class="v">{verdict}</p>
<p>mode <b>{results['mode']}</b>, seed {results['seed']}, workload {results['workload']}, acks {results['ack']},
{results['elapsed_s']} s, {results['ops_per_s']} successful ops/s.
Files: <a href="history.jsonl">history.jsonl</a>, <a href="results.json">results.json</a>, <a href="plan.json">plan.json</a>.</p>
<ul>{notes}</ul>
<h2>Total queue</h2>{_table(counts, ["count", "value"])}
<h2>Latency (ms)</h2>{_table(lat, ["op", "count", "ok", "fail", "info", "p50", "p90", "p99", "max"])}
{''.join(f'<p><img src="{i}" width="100%"></p>' for i in images)}
<h2>Faults</h2>{_table(faults, ["at (s)", "fault", "hold (s)", "parameters"])}
<h2>Problem samples</h2><pre>{problems}</pre></body></html>"""
    (rundir / "index.html").write_text(page)
