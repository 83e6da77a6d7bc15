"""The checker of jobs that wait for jobs, batches and results (docs/workflows.md).

Theory of operation: a harness that adds parents and their children
(jepsen-lite's `--batches`, the in-process simulation) records, in the
format of disque/testing/checker.py:

* `parent`, `child`: an ADDJOB, `ok` with the job (`job`) once answered;
  a child's `value` lists its parents ({"after": [IDs]});
* `take`: a GETJOB of either queue, `ok` with the job delivered;
* `ack` (ACKJOB ... RESULT, as in checker.py): `value` {"result": bytes as
  text}; `ok` once answered;
* `result`: a RESULT read after the run, `ok` with `value` the text (None
  for nil), one per node asked;
* `batch`: a BATCH NEW, `ok` with `value` {"id", "callback": the ID of its
  ON-COMPLETE job}; `close`: its BATCH CLOSE, `ok` once answered (`value`
  {"id"}); the callback's deliveries are `take` records of its ID;
* `nemesis` records (disque/testing/checker_stats.py).

The counts:
* `early`: deliveries of a child completed before an ACKJOB of each of its
  parents had been sent (a parent's ACK takes effect somewhere between its
  invoke and its answer, so this is the strict test);
* `stuck`: children whose parents all had an answered ACKJOB, never
  delivered (the harness drains every node after the faults);
* `lost_results`: jobs acknowledged with a result (answered) that no node
  returned in the final reads;
* `wrong_results`: a final read that returned another result than the one
  acknowledged with;
* `callbacks_missing`: batches closed whose ON-COMPLETE job was never
  delivered; `callbacks_duplicated_outside`: those delivered more than once
  with no fault window (nemesis records, extended by `settle_ms`) between
  the close and their last delivery;
* `children`, `delivered`, `results`, `batches`.
A run is valid when early, stuck, lost_results, wrong_results,
callbacks_missing and callbacks_duplicated_outside are 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from disque.testing.checker import ACK, INVOKE, OK, Record, Result
from disque.testing.checker_stats import fault_windows

PARENT, CHILD, TAKE, RESULT, BATCH, CLOSE = "parent", "child", "take", "result", "batch", "close"


class WorkflowsResult(Result):
    INVALID = ("early", "stuck", "lost_results", "wrong_results", "callbacks_missing", "callbacks_duplicated_outside")


def check_workflows(history: Iterable[Record], settle_ms: int = 0) -> WorkflowsResult:
    records = list(history)
    faults = [(w["start"], w["stop"] + settle_ms) for w in fault_windows(records)]
    parents_of: dict[str, list[str]] = {}  # child -> its parents
    ack_sent: dict[str, int] = {}  # job -> when its first ACKJOB was sent
    acked: dict[str, str | None] = {}  # job -> the result of an answered ACKJOB (None: none)
    acks_in_flight: dict[Any, Record] = {}  # process -> its ACKJOB invoke
    delivered: dict[str, int] = {}  # job -> when first delivered
    early: list[str] = []
    reads: dict[str, list[Any]] = {}  # job -> the results the final reads returned
    callbacks: dict[str, str] = {}  # batch -> its ON-COMPLETE job
    closed: dict[str, int] = {}  # batch -> when its BATCH CLOSE was answered
    takes: dict[str, list[int]] = {}  # job -> its deliveries
    for r in records:
        op, kind = r["op"], r["type"]
        if op == CHILD and kind == OK:
            parents_of[r["job"]] = list(r["value"]["after"])
        elif op == ACK and kind == INVOKE:
            ack_sent.setdefault(r["job"], r["time"])
            acks_in_flight[r["process"]] = r
        elif op == ACK and kind == OK:
            invoked = acks_in_flight.pop(r["process"])
            acked.setdefault(invoked["job"], (invoked["value"] or {}).get("result"))  # (an ACK of another workload: none)
        elif op == BATCH and kind == OK:
            callbacks[r["value"]["id"]] = r["value"]["callback"]
        elif op == CLOSE and kind == OK:
            closed[r["value"]["id"]] = r["time"]
        elif op == TAKE and kind == OK:
            job = r["job"]
            delivered.setdefault(job, r["time"])
            takes.setdefault(job, []).append(r["time"])
            parents = parents_of.get(job, ())
            if any(ack_sent.get(p, r["time"] + 1) > r["time"] for p in parents):
                early.append(job)
        elif op == RESULT and kind == OK:
            reads.setdefault(r["job"], []).append(r["value"])
    stuck = [c for c, parents in parents_of.items() if all(p in acked for p in parents) and c not in delivered]
    lost = [job for job, kept in acked.items() if kept is not None and job in reads and kept not in reads[job]]
    wrong = [job for job, got in reads.items() if job in acked and any(v is not None and v != acked[job] for v in got)]
    missing = [b for b in closed if not takes.get(callbacks[b])]
    twice = [
        b for b in closed
        if len(times := takes.get(callbacks[b], [])) > 1 and not any(s <= max(times) and e >= closed[b] for s, e in faults)
    ]  # fmt: skip
    result = WorkflowsResult()
    result._note("early", early)
    result._note("stuck", stuck)
    result._note("lost_results", lost)
    result._note("wrong_results", wrong)
    result._note("callbacks_missing", missing)
    result._note("callbacks_duplicated_outside", twice)
    result.counts.update(children=len(parents_of), delivered=len(delivered), results=len(reads), batches=len(closed))
    return result
