"""The checker of jobs that wait for jobs and of results (docs/workflows.md).

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
* `children`, `delivered`, `results`.
A run is valid when early, stuck, lost_results and wrong_results are 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from disque.testing.checker import ACK, INVOKE, OK, Record, Result

PARENT, CHILD, TAKE, RESULT = "parent", "child", "take", "result"


class WorkflowsResult(Result):
    INVALID = ("early", "stuck", "lost_results", "wrong_results")


def check_workflows(history: Iterable[Record]) -> WorkflowsResult:
    parents_of: dict[str, list[str]] = {}  # child -> its parents
    ack_sent: dict[str, int] = {}  # job -> when its first ACKJOB was sent
    acked: dict[str, str | None] = {}  # job -> the result of an answered ACKJOB (None: none)
    acks_in_flight: dict[Any, Record] = {}  # process -> its ACKJOB invoke
    delivered: dict[str, int] = {}  # job -> when first delivered
    early: list[str] = []
    reads: dict[str, list[Any]] = {}  # job -> the results the final reads returned
    for r in history:
        op, kind = r["op"], r["type"]
        if op == CHILD and kind == OK:
            parents_of[r["job"]] = list(r["value"]["after"])
        elif op == ACK and kind == INVOKE:
            ack_sent.setdefault(r["job"], r["time"])
            acks_in_flight[r["process"]] = r
        elif op == ACK and kind == OK:
            invoked = acks_in_flight.pop(r["process"])
            acked.setdefault(invoked["job"], (invoked["value"] or {}).get("result"))  # (an ACK of another workload: none)
        elif op == TAKE and kind == OK:
            job = r["job"]
            delivered.setdefault(job, r["time"])
            parents = parents_of.get(job, ())
            if any(ack_sent.get(p, r["time"] + 1) > r["time"] for p in parents):
                early.append(job)
        elif op == RESULT and kind == OK:
            reads.setdefault(r["job"], []).append(r["value"])
    stuck = [c for c, parents in parents_of.items() if all(p in acked for p in parents) and c not in delivered]
    lost = [job for job, kept in acked.items() if kept is not None and job in reads and kept not in reads[job]]
    wrong = [job for job, got in reads.items() if job in acked and any(v is not None and v != acked[job] for v in got)]
    result = WorkflowsResult()
    result._note("early", early)
    result._note("stuck", stuck)
    result._note("lost_results", lost)
    result._note("wrong_results", wrong)
    result.counts.update(children=len(parents_of), delivered=len(delivered), results=len(reads))
    return result
