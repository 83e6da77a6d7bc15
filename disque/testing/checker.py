"""Histories of queue operations and the checker that judges them.

Theory of operation: a test harness (the in-process simulation, jepsen-lite
against real processes) records every client operation as two records, an
`invoke` when the client sends it and a completion when it knows the outcome,
then hands the whole history to `check()`.  The checker needs no cluster: it
only reads the records, so the same code judges both harnesses.

A record is a flat JSON-friendly dict (one line of a JSON-lines file):

    {"time": unix ms, "process": client id, "node": where it ran,
     "op": "enqueue" | "dequeue" | "ack" | "fastack" | "scan" | "wipe",
     "type": "invoke" | "ok" | "fail" | "info",
     "job": job ID (str) or None, "body": job body (str) or None,
     "value": op-specific}

* `enqueue` (ADDJOB): the invoke carries the unique `body` and, in `value`,
  the job's options `{"queue", "replicate", "retry", "ttl"}` (and "minrepl").  `ok` carries
  the job ID; `fail` means the job certainly does not exist (refused before
  creation); `info` means nobody knows (timeout, NOREPL after a replication
  timeout, lost connection).  An invoke without a completion counts as info.
* `dequeue` (GETJOB COUNT 1): `ok` carries the one job received (`job`,
  `body`); an empty or failed fetch is `fail`.
* `ack`, `fastack`: the invoke names `job`; `ok` means the command returned.
* `nack` (NACK, with or without DELAY): the invoke names `job`; the job is
  delivered again later (a duplicate, allowed for at-least-once).
* `waitjob` (WAITJOB of one job): the invoke names `job`; `ok` carries in
  `value` the number the server said was acknowledged (0 or 1).
* `scan`: after the run, the IDs of every job a node still holds (`value`, a
  list).  Only the last scan of each node counts.
* `wipe`: a harness destroyed on purpose every job of `node` (DEBUG FLUSHALL,
  CLUSTER RESET SOFT or HARD, a restart without the AOF).  One record, no
  invoke: `ok` when it happened, `info` when it may have; `value` is
  `{"action": what was done, "held": IDs of every job the node held at that
  instant}`.  `node` names the machine, not its node ID: a node reset HARD
  several times is still one node.

Bodies identify values: every enqueue uses a body no other enqueue uses.

The counts (jepsen.md, "total-queue"):
* `lost`: acknowledged at-least-once enqueues (RETRY > 0 and REPLICATE >= 2)
  never dequeued, although their TTL cannot have passed by the end;
* `unexpected`: dequeued values never enqueued, or whose enqueue failed;
* `altered`: deliveries whose body is not the body added under that job ID
  (a job served with bytes a damaged disk changed);
* `duplicated`: values dequeued more than once (allowed for at-least-once);
* `recovered`: indeterminate enqueues that were dequeued.
Also reported: `lost_best_effort` (the same as lost for RETRY 0 or
REPLICATE 1 jobs, which a crash or a lost message may legitimately lose),
`expired` (acknowledged, never dequeued, TTL may have passed), `wiped`
(acknowledged, never dequeued, TTL not passed, and wiped on purpose: the
wipe records list its ID on at least REPLICATE distinct nodes, 3 when the
enqueue did not say, so every copy the ADDJOB made may have been destroyed;
a job listed on fewer nodes had a copy no wipe touched, and is lost or
lost_best_effort as usual.  The rule does not follow copies that federation
adds later, so a job wiped on REPLICATE nodes is excused even if such a copy
existed),
`phantom_acks` (a WAITJOB that answered 1 for a job no client had sent an
ACK or FASTACK for before it answered), `at_most_once_duplicated` (RETRY 0 values dequeued twice), `late`
(deliveries after the job's TTL, plus `ttl_grace_ms`: every node-to-node
transfer may extend a job's life by up to a second, spec/cluster.md §8.1) and
`uncollected` (acknowledged job IDs that a final scan still found).

A run is valid when lost, unexpected, altered, at_most_once_duplicated,
late, uncollected and phantom_acks are all zero.  Values moved to a dead-letter
queue (MAXATTEMPTS) keep their body, so their delivery from there counts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
ENQUEUE, DEQUEUE, ACK, FASTACK, SCAN, WIPE = "enqueue", "dequeue", "ack", "fastack", "scan", "wipe"
NACK, WAITJOB = "nack", "waitjob"

Record = dict[str, Any]

SAMPLE = 20  # offending values listed per problem in the result


class History:
    """Records operations with times from `now_ms` (unix ms)."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self.now_ms = now_ms
        self.records: list[Record] = []

    def add(
        self, type: str, process: int, node: Any, op: str, *, job: str | None = None,
        body: str | None = None, value: Any = None,
    ) -> Record:  # fmt: skip
        record = {
            "time": self.now_ms(), "process": process, "node": node, "op": op, "type": type,
            "job": job, "body": body, "value": value,
        }  # fmt: skip
        self.records.append(record)
        return record

    def invoke(self, process: int, node: Any, op: str, **fields: Any) -> Record:
        return self.add(INVOKE, process, node, op, **fields)

    def complete(self, invoked: Record, type: str, **fields: Any) -> Record:
        """The completion of `invoked`: same process, node, op (and job, body
        unless given)."""
        fields.setdefault("job", invoked["job"])
        fields.setdefault("body", invoked["body"])
        return self.add(type, invoked["process"], invoked["node"], invoked["op"], **fields)

    def dump(self, out: IO[str]) -> None:
        for record in self.records:
            out.write(json.dumps(record, sort_keys=True) + "\n")


def load(lines: Iterable[str]) -> Iterator[Record]:
    """Records from JSON lines (blank lines skipped)."""
    for line in lines:
        if line.strip():
            yield json.loads(line)


@dataclass(slots=True)
class _Enqueue:
    invoked: Record
    outcome: str = INFO  # until a completion says otherwise
    job: str | None = None

    @property
    def opts(self) -> dict[str, Any]:
        return self.invoked["value"] or {}

    @property
    def at_most_once(self) -> bool:
        return self.opts.get("retry") == 0

    @property
    def copies(self) -> int:
        """Nodes a successful ADDJOB surely put the job on: MINREPL when
        given (the producer may have settled for it), else REPLICATE (the
        default's maximum when the option was not given)."""
        return self.opts.get("minrepl", self.opts.get("replicate", 3))

    @property
    def protected(self) -> bool:
        """At-least-once: survives a node crash and message loss."""
        return self.opts.get("retry", 1) > 0 and self.opts.get("replicate", 2) >= 2

    def deadline(self, grace: int) -> int | None:
        """Latest legitimate delivery time, None without a TTL."""
        ttl = self.opts.get("ttl")
        return None if ttl is None else self.invoked["time"] + ttl * 1000 + grace

    def may_have_expired(self, end: int) -> bool:
        ttl = self.opts.get("ttl")  # a job may disappear from TTL - 1 s on
        return ttl is not None and self.invoked["time"] + (ttl - 1) * 1000 <= end


@dataclass
class Result:
    counts: dict[str, int] = field(default_factory=dict)
    problems: dict[str, list[Any]] = field(default_factory=dict)  # samples per count

    INVALID = ("lost", "unexpected", "altered", "at_most_once_duplicated", "late", "uncollected", "phantom_acks")

    @property
    def valid(self) -> bool:
        return not any(self.counts.get(name) for name in self.INVALID)

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, **self.counts, "problems": self.problems}

    def _note(self, name: str, values: list[Any]) -> None:
        self.counts[name] = len(values)
        if values:
            self.problems[name] = values[:SAMPLE]


def check(history: Iterable[Record], *, ttl_grace_ms: int = 2000) -> Result:
    """Judge a history (see the module docstring for the counts)."""
    enqueues: dict[str, _Enqueue] = {}
    pending: dict[Any, _Enqueue] = {}  # process -> its enqueue in flight
    deliveries: list[Record] = []
    acked: set[str] = set()
    scans: dict[Any, Record] = {}
    wiped_on: dict[str, set[Any]] = {}  # job ID -> nodes wiped while holding it
    ack_sent: set[str] = set()  # job IDs an ACK or FASTACK was sent for, so far
    phantom: list[str] = []
    end = 0
    for r in history:
        end = max(end, r["time"])
        op, kind = r["op"], r["type"]
        if op == ENQUEUE:
            if kind == INVOKE:
                pending[r["process"]] = enqueues[r["body"]] = _Enqueue(r)
            elif (enq := pending.pop(r["process"], None)) is not None:
                enq.outcome, enq.job = kind, r["job"]
        elif op == DEQUEUE and kind == OK:
            deliveries.append(r)
        elif op in (ACK, FASTACK):
            if kind == INVOKE:
                ack_sent.add(r["job"])
            elif kind == OK:
                acked.add(r["job"])
        elif op == WAITJOB and kind == OK and r["value"] and r["job"] not in ack_sent:
            phantom.append(r["job"])
        elif op == SCAN and kind == OK:
            scans[r["node"]] = r
        elif op == WIPE and kind in (OK, INFO):
            for job in r["value"]["held"]:
                wiped_on.setdefault(job, set()).add(r["node"])

    result = Result()
    times = Counter(d["body"] for d in deliveries)
    ok = [(body, e) for body, e in enqueues.items() if e.outcome == OK]
    result.counts["attempted"] = len(enqueues)
    result.counts["acknowledged"] = len(ok)
    result.counts["dequeued"] = len(times)
    undelivered = [(body, e) for body, e in ok if body not in times]
    result._note("expired", [b for b, e in undelivered if e.may_have_expired(end)])
    unexpired = [(b, e) for b, e in undelivered if not e.may_have_expired(end)]
    wiped = {b for b, e in unexpired if len(wiped_on.get(e.job or "", ())) >= e.copies}
    result._note("wiped", [b for b, e in unexpired if b in wiped])
    alive = [(b, e) for b, e in unexpired if b not in wiped]
    result._note("lost", [b for b, e in alive if e.protected])
    result._note("lost_best_effort", [b for b, e in alive if not e.protected])
    result._note("unexpected", [b for b in times if b not in enqueues or enqueues[b].outcome == FAIL])
    added = {e.job: body for body, e in enqueues.items() if e.job is not None}
    result._note("altered", [d["job"] for d in deliveries if d["job"] in added and added[d["job"]] != d["body"]])
    result._note("duplicated", [b for b, n in times.items() if n > 1])
    result._note(
        "at_most_once_duplicated", [b for b, n in times.items() if n > 1 and b in enqueues and enqueues[b].at_most_once]
    )
    result._note("recovered", [b for b in times if b in enqueues and enqueues[b].outcome == INFO])
    late = []
    for d in deliveries:
        enq = enqueues.get(d["body"])
        deadline = None if enq is None else enq.deadline(ttl_grace_ms)
        if deadline is not None and d["time"] > deadline:
            late.append(d["body"])
    result._note("late", late)
    result._note(
        "uncollected", sorted({job for scan in scans.values() for job in scan["value"] if job in acked})
    )
    result._note("phantom_acks", phantom)
    return result
