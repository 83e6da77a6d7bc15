"""Replies as `disque` prints them, short of drawing tables (`pretty.py`).

Theory of operation: `parse_reply` turns a server reply into a (view kind,
value) pair from the command name: SHOW and QSTAT give records, HELLO a
`Hello`, GETJOB and QPEEK jobs, JSCAN and QSCAN a page, INFO its sections,
CLUSTER NODES/INFO their fields; anything else stays "plain".  The three
output modes then print it: pretty (rich, from `pretty.py`), `--json`
(`jsonable`), or `--raw`, bare values one per line (`raw_lines`, as redis-cli
does when piped).  `plain_lines` is redis-cli's numbered listing, which the
pretty mode uses for plain replies.  Nothing here imports rich or the client
library at start-up: a one-shot command pays only for what it prints.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClusterNode:
    """One line of CLUSTER NODES."""

    id: str
    address: str
    flags: list[str]
    ping_sent: int
    pong_received: int
    link: str

    @classmethod
    def parse_all(cls, text: bytes) -> list[ClusterNode]:
        rows = [line.split() for line in text.decode("utf-8", "replace").splitlines() if line.strip()]
        return [cls(r[0], r[1], r[2].split(","), int(r[3]), int(r[4]), r[5]) for r in rows]


def _fields(text: bytes) -> dict[str, str]:
    return {k: v for k, _, v in (line.partition(":") for line in text.decode("utf-8", "replace").splitlines()) if k}


def parse_reply(words: list[str], reply: Any) -> tuple[str, Any]:
    """(view kind, value) for a command's reply; ("plain", reply) when there is no better view."""
    from disque.client import Hello, Job, JobInfo, QueueStats, parse_info

    name = words[0].upper()
    sub = words[1].upper() if len(words) > 1 else ""
    if isinstance(reply, list):
        if name == "SHOW":
            return "record", JobInfo.from_reply(reply)
        if name == "QSTAT":
            return "record", QueueStats.from_reply(reply)
        if name == "HELLO":
            return "hello", Hello.from_reply(reply)
        if name in ("GETJOB", "QPEEK"):
            return "jobs", [Job.from_entry(entry) for entry in reply]
        if name in ("JSCAN", "QSCAN") and len(reply) == 2:
            cursor, items = reply
            if name == "QSCAN":
                return "scan", {"cursor": text(cursor), "queues": [text(q) for q in items]}
            jobs = [JobInfo.from_reply(i) if isinstance(i, list) else text(i) for i in items]
            return "scan", {"cursor": text(cursor), "jobs": jobs}
    if isinstance(reply, bytes):
        if name == "INFO":
            return "info", parse_info(reply)
        if name == "CLUSTER" and sub == "NODES":
            return "nodes", ClusterNode.parse_all(reply)
        if name == "CLUSTER" and sub == "INFO":
            return "record", _fields(reply)
    return "plain", reply


BODY_SHOWN = 200  # bytes of a job's body the tables show (`--full`: all of it)


def body_text(body: Any, full: bool = False) -> str:
    """A job's body as the tables show it: its first BODY_SHOWN bytes and
    its size when it is longer, unless `full`."""
    if full or not isinstance(body, bytes) or len(body) <= BODY_SHOWN:
        return text(body)
    return f"{text(body[:BODY_SHOWN])}... ({len(body):,} bytes; --full prints it all)"


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if value is None:
        return "(nil)"
    if isinstance(value, list):
        return ", ".join(text(v) for v in value) or "(empty)"
    return str(value)


def human_time(ns: int) -> str:
    """Nanoseconds since the epoch as a local time to the millisecond, with its UTC offset."""
    return _dt.datetime.fromtimestamp(ns / 1e9).astimezone().isoformat(sep=" ", timespec="milliseconds")


def dead_letter_rows(found: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """DEADLETTER LIST replies of the nodes `found` ((node, address, reply))
    as table rows, the error first (as Flower shows a failed task)."""
    rows = []
    for node, _, entries in found:
        for entry in entries:
            f = {text(k): v for k, v in (entry.items() if isinstance(entry, dict) else zip(entry[::2], entry[1::2]))}
            rows.append({
                "error": text(f["error-type"]) if "error-type" in f else "", "message": text(f.get("error-message", b"")),
                "from": text(f["dead-letter-from"]), "dead-lettered": human_time(f["dead-lettered-at"] * 1_000_000),
                "id": text(f["id"]), "original-id": text(f["dead-letter-of"]), "nacks": f["nacks"], "node": node,
            })  # fmt: skip
    return rows


def job_info_fields(info: Any) -> dict[str, Any]:
    """SHOW's fields for printing: the last error first when the job has one
    (with its time readable), the extensions' fields it does not use left out."""
    fields = record_fields(info)
    error = {k: fields.pop(k) for k in list(fields) if k.startswith("error-")}
    for k in ("dead-letter-of", "dead-letter-from", "key", "after", "waits-for", "batch"):
        if not fields[k]:  # None, or no parents
            del fields[k]
    if error["error-type"] is None:
        return fields
    error["error-time"] = human_time(error["error-time"] * 1_000_000)
    return error | fields


def record_fields(value: Any) -> dict[str, Any]:
    """A record's fields as the server names them (`jobs-in`), for a dataclass or a dict."""
    if dataclasses.is_dataclass(value):
        return {f.name.replace("_", "-"): getattr(value, f.name) for f in dataclasses.fields(value)}
    return dict(value)


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


def raw_lines(reply: Any) -> Iterator[bytes]:
    """redis-cli --raw: every value on its own line, arrays flattened."""
    if isinstance(reply, list):
        for item in reply:
            yield from raw_lines(item)
    else:
        yield b"" if reply is None else reply if isinstance(reply, bytes) else str(reply).encode()


def plain_lines(reply: Any) -> list[str]:
    """The redis-cli listing: `(integer) 1`, `(nil)`, numbered nested arrays."""
    if isinstance(reply, list):
        if not reply:
            return ["(empty array)"]
        lines = []
        width = len(str(len(reply)))
        for n, item in enumerate(reply, 1):
            head = f"{n:>{width}}) "
            sub = plain_lines(item)
            lines.append(head + sub[0])
            lines += [" " * len(head) + s for s in sub[1:]]
        return lines
    if isinstance(reply, int):
        return [f"(integer) {reply}"]
    return text(reply).splitlines() or [""]
