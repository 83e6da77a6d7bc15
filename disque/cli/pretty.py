"""The pretty output mode: views drawn with rich as tables and key/value
blocks, `top`'s live screen and the progress bars of export and import.

Imported only when something is printed this way (a terminal, or
`--no-raw`): rich takes longer to load than a one-shot command to run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from disque.cli.views import body_text, human_time, job_info_fields, plain_lines, record_fields, text
from disque.client import Job, JobInfo


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Piped output is not cut at 80 columns: job IDs alone take 48.
    width = None if stream.isatty() or "COLUMNS" in os.environ else 200
    return Console(file=stream, width=width, highlight=False, stderr=stderr)


def kv_block(values: Any, full: bool = False) -> Group:
    values = record_fields(values)
    width = max(map(len, values), default=0)
    return Group(*(Text.assemble((key.ljust(width), "bold cyan"), "  ", field_text(key, value, full)) for key, value in values.items()))


def field_text(key: str, value: Any, full: bool = False) -> str:
    """A field as a table shows it: SHOW's ctime (ns since the epoch) as a
    local time, a body cut short unless `full`."""
    if key == "body":
        return body_text(value, full)
    return human_time(value) if key == "ctime" and isinstance(value, int) else text(value)


def titled(title: str, table: Table) -> Group:
    return Group(Text(title, style="bold"), table)


def jobs_table(jobs: list[Job], full: bool = False) -> Group:
    counters = any(j.nacks is not None for j in jobs)
    table = Table()
    for name in ("queue", "id", "body", *(("nacks", "redelivered") if counters else ())):
        table.add_column(name, no_wrap=name not in ("queue", "body"), overflow="fold")
    for j in jobs:
        extra = (str(j.nacks), str(j.additional_deliveries)) if counters else ()
        table.add_row(Text(j.queue), j.id, Text(body_text(j.body, full)), *extra)
    return titled(f"{len(jobs)} job(s)", table)


def job_infos_table(jobs: list[JobInfo], full: bool = False) -> Group:
    table = Table()
    for name in ("id", "queue", "state", "ttl", "retry", "nacks", "redelivered", "body"):
        table.add_column(name, no_wrap=name not in ("queue", "body"), overflow="fold")
    for j in jobs:
        table.add_row(j.id, Text(text(j.queue)), j.state, str(j.ttl), str(j.retry), str(j.nacks), str(j.additional_deliveries), Text(body_text(j.body, full)))
    return titled(f"{len(jobs)} job(s)", table)


def names_table(title: str, rows: Iterable[Iterable[Any]], columns: Iterable[str]) -> Group:
    table = Table()
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(Text(text(v)) for v in row))
    return titled(title, table)


def render(kind: str, value: Any, full: bool = False) -> RenderableType:
    """A view drawn; job bodies cut short unless `full`."""
    if kind == "record":
        return kv_block(job_info_fields(value) if isinstance(value, JobInfo) else value, full)
    if kind == "dead-letters":  # dead_letter_rows
        columns = ["error", "message", "from", "dead-lettered", "id", "original-id", "nacks", "node"]
        return names_table(f"{len(value)} dead letter(s)", ([r[c] for c in columns] for r in value), columns)
    if kind == "by-node":  # {"total": a record, "nodes": [(node ID, address, that node's record)], "asked": nodes that answered}
        return by_node(value["total"], value["nodes"], value.get("asked"))
    if kind == "hello":
        table = Table()
        for name in ("node", "address", "priority", ""):
            table.add_column(name, no_wrap=True)
        for n in value.nodes:
            table.add_row(n.id, f"{n.host}:{n.port}", str(n.priority), "(this node)" if n.id == value.node_id else "")
        return titled(f"HELLO v{value.version}, connected to {value.node_id}", table)
    if kind == "info":
        return Group(*(part for title, fields in value.items() for part in (Text(f"# {title}", style="bold"), kv_block(fields), Text(""))))
    if kind == "nodes":
        table = Table()
        for name in ("id", "address", "flags", "ping-sent", "pong-received", "link"):
            table.add_column(name, no_wrap=name in ("id", "address"), overflow="fold")
        for n in value:
            table.add_row(n.id, n.address, ",".join(n.flags), str(n.ping_sent), str(n.pong_received), n.link)
        return titled(f"{len(value)} node(s)", table)
    if kind == "jobs":
        return jobs_table(value, full)
    if kind == "job-infos":  # JobInfo records, or bare IDs
        if value and isinstance(value[0], JobInfo):
            return job_infos_table(value, full)
        return names_table(f"{len(value)} job(s)", ([i] for i in value), ["id"])
    if kind == "queues":  # names, or {"queue": name, "len": n} rows
        rows = [q if isinstance(q, dict) else {"queue": q} for q in value]
        return names_table(f"{len(rows)} queue(s)", (r.values() for r in rows), list(rows[0]) if rows else ["queue"])
    if kind == "schedules":  # schedule list: rows of SCHEDULE SHOW
        columns = ["name", "queue", "when", "paused", "last-tick", "last-node", "next-tick", "jobs", "consumer"]
        return names_table(f"{len(value)} schedule(s)", ([r[c] for c in columns] for r in value), columns)
    if kind == "limits":  # qconfig list: rows of QCONFIG GET
        columns = ["queue", "rate-limit", "concurrency", "out", "lease", "handed", "waiting", "waited-ms"]
        return names_table(f"{len(value)} limited queue(s)", ([r[c] for c in columns] for r in value), columns)
    if kind == "keys":  # keys: QKEYS added up over the nodes
        title = f"{value['queue']}: {value['keys']} key(s) with jobs queued, {value['jobs']} keyed job(s), {len(value['nodes'])} node(s)"
        busiest = names_table(title, ([b["key"], b["jobs"]] for b in value["busiest"]), ["key", "jobs"])
        if len(value["nodes"]) < 2:
            return busiest
        return Group(busiest, Text(""), names_table("per node", (n.values() for n in value["nodes"]), ["node", "address", "keys", "jobs"]))
    if kind == "groups":  # qstat --groups: QSTATUS rows
        return groups_table(f"{len(value)} consumer group(s)", value)
    if kind == "scan":
        items = value.get("queues", value.get("jobs"))
        return Group(Text(f"cursor: {value['cursor']}"), render("queues" if "queues" in value else "job-infos", items, full))
    return Text("\n".join(plain_lines(value)))


NOT_PER_NODE = {"name", "queue", "import-from", "import-rate"}  # the same on every row, or too wide for one


def by_node(total: Any, nodes: list[tuple[str, str, Any]], asked: int | None = None) -> Group:
    """A figure added up over the cluster, then what each node holds (when
    there are several); `asked`: the nodes that answered, when only some of
    them (`nodes`) hold what is counted."""
    asked = len(nodes) if asked is None else asked
    held = f", {len(nodes)} holding it" if len(nodes) < asked else ""
    parts: list[RenderableType] = [Text(f"cluster-wide, {asked} node(s){held}", style="bold"), kv_block(total)]
    if len(nodes) > 1:
        columns = [name for name in record_fields(nodes[0][2]) if name not in NOT_PER_NODE]
        table = Table()
        for name in ("node", "address", *columns):
            table.add_column(name, no_wrap=True, justify="left" if name in ("node", "address", "pause") else "right")
        for node, address, record in nodes:
            fields = record_fields(record)
            table.add_row(node, address, *(text(fields[name]) for name in columns))
        parts += [Text(""), titled("per node", table)]
    return Group(*parts)


def show(kind: str, value: Any, full: bool = False) -> None:
    console().print(render(kind, value, full))


def groups_table(title: str, rows: list[dict[str, Any]]) -> Group:
    """QSTATUS rows: queue, group and bananaq's six figures."""
    table = Table()
    for name in ("queue", "group", "total", "inprogress", "redo", "done", "available", "consumers"):
        table.add_column(name, justify="left" if name in ("queue", "group") else "right", overflow="fold")
    for r in rows:
        table.add_row(Text(r["queue"]), Text(r["group"]), *(str(v) for v in list(r.values())[2:]))
    return titled(title, table)


def top_table(label: str, rows: list[dict[str, Any]], interval: float, groups: bool = False) -> Group:
    title = f"{label}  {len(rows)} {'group(s)' if groups else 'queue(s)'}  {time.strftime('%H:%M:%S')}  every {interval:g}s"
    if groups:
        return groups_table(title, rows)
    table = Table()
    for name in ("queue", "len", "in/s", "out/s", "blocked", "pause"):
        table.add_column(name, justify="left" if name in ("queue", "pause") else "right")
    for r in rows:
        rates = ["-" if r[k] is None else f"{r[k]:g}" for k in ("in_per_sec", "out_per_sec")]
        table.add_row(Text(r["queue"]), str(r["len"]), *rates, str(r["blocked"]), r["pause"])
    return titled(title, table)


def top_screen(label: str, frames: Iterable[list[dict[str, Any]]], interval: float, groups: bool = False) -> None:
    """`top` in a terminal: one screen, redrawn with every frame; elsewhere one table per frame."""
    out = console()
    if not out.is_terminal:
        for rows in frames:
            out.print(top_table(label, rows, interval, groups))
        return
    with Live(console=out, auto_refresh=False) as live:
        for rows in frames:
            live.update(top_table(label, rows, interval, groups), refresh=True)


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[[], None]]:
    with Progress(console=console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)
