"""The checker of consumer-group histories (docs/consumer-groups.md).

Theory of operation: the same harnesses that judge jobs (disque/testing/checker.py)
record a groups workload with their own operations, in the same record
format:

* `qadd`: the invoke carries the unique `body` and `value` {"queue", "ttl"}
  (seconds); `ok` carries the event ID (`job`), `fail` means the event was
  certainly not stored, `info` that nobody knows.
* `qget`: `value` {"group"}; `ok` carries the event (`job`, `body`) handed to
  that group, an empty answer is `fail`.
* `qack`: `job` and `value` {"group"} on the invoke; `ok` carries the reply
  (1: acknowledged, 0: the deadline had passed) in `value`.
* `nemesis` records (disque/testing/checker_stats.py) name the fault windows.

The guarantees checked, for every event whose QADD said ok and every group
of `groups`:
* `lost`: the group never got the event although its TTL cannot have
  passed by the end (the harness drains every group on every node);
* `unexpected`: a delivery of a body never added, or whose QADD failed;
* `late`: a delivery after the event's TTL plus `ttl_grace_ms`;
* `redelivered_after_ack`: the group got the event again by a QGET sent
  after a QACK of it answered 1, with no fault window between that answer
  and the new delivery.  The same with a fault window in between is
  `redelivered_after_fault` (allowed: an acknowledgement still travelling
  to the event's server when the fault struck, or both sides of a
  partition serving it), and a redelivery never preceded by an
  acknowledgement is `redo` (the deadline passed).
A run is valid when lost, unexpected, late and redelivered_after_ack are 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from disque.testing.checker import FAIL, INFO, INVOKE, OK, Record, Result
from disque.testing.checker_stats import NEMESIS, fault_windows

QADD, QGET, QACK = "qadd", "qget", "qack"


class GroupsResult(Result):
    INVALID = ("lost", "unexpected", "late", "redelivered_after_ack")


def check_groups(history: Iterable[Record], groups: Iterable[str], *, ttl_grace_ms: int = 2000) -> GroupsResult:
    records = list(history)
    windows = [(w["start"], w["stop"]) for w in fault_windows(records)]
    adds: dict[str, tuple[Record, str, str | None]] = {}  # body -> (invoke, outcome, event ID)
    pending: dict[Any, Record] = {}  # process -> its operation in flight
    deliveries: list[tuple[str, str, int, int]] = []  # (body, group, time, position of the QGET's invoke)
    acked_at: dict[tuple[str, str], tuple[int, int]] = {}  # (event ID, group) -> (time, position) of the first QACK answering 1
    position: dict[int, int] = {}  # id(invoke) -> its position in the history
    end = 0
    for i, r in enumerate(records):
        end = max(end, r["time"])
        op, kind = r["op"], r["type"]
        if op == NEMESIS:
            continue
        if kind == INVOKE:
            pending[r["process"]] = r
            position[id(r)] = i
            if op == QADD:
                adds[r["body"]] = (r, INFO, None)
            continue
        invoked = pending.pop(r["process"], None)
        if invoked is None:
            continue
        if op == QADD:
            adds[invoked["body"]] = (invoked, kind, r["job"])
        elif op == QGET and kind == OK:
            deliveries.append((r["body"], invoked["value"]["group"], r["time"], position[id(invoked)]))
        elif op == QACK and kind == OK and r["value"] == 1:
            acked_at.setdefault((invoked["job"], invoked["value"]["group"]), (r["time"], i))

    def ttl_end(invoked: Record) -> int:
        return invoked["time"] + invoked["value"]["ttl"] * 1000

    def fault_between(start: int, stop: int) -> bool:
        return any(a <= stop and b >= start for a, b in windows)

    result = GroupsResult()
    groups = list(groups)
    ok = {body: (inv, event) for body, (inv, outcome, event) in adds.items() if outcome == OK}
    got: dict[tuple[str, str], list[tuple[int, int]]] = {}
    late, unexpected = [], []
    for body, group, at, asked in deliveries:
        got.setdefault((body, group), []).append((at, asked))
        add = adds.get(body)
        if add is None or add[1] == FAIL:
            unexpected.append(body)
        elif at > ttl_end(add[0]) + ttl_grace_ms:
            late.append(body)
    result.counts["attempted"] = len(adds)
    result.counts["acknowledged"] = len(ok)
    result.counts["deliveries"] = len(deliveries)
    result.counts["acks"] = len(acked_at)
    result._note("lost", [
        f"{body} to {group}" for body, (inv, _) in ok.items() for group in groups
        if (body, group) not in got and ttl_end(inv) - 1000 > end
    ])  # fmt: skip
    result._note("unexpected", unexpected)
    result._note("late", late)
    after_ack, after_fault, redo = [], [], []
    for (body, group), times in got.items():
        event = ok[body][1] if body in ok else None
        acked = acked_at.get((event, group)) if event is not None else None  # type: ignore[arg-type]
        for at, asked in times[1:]:
            if acked is None or asked < acked[1]:  # asked for before the acknowledgement was answered
                redo.append(f"{body} to {group}")
            elif fault_between(acked[0], at):
                after_fault.append(f"{body} to {group}")
            else:
                after_ack.append(f"{body} to {group}")
    result._note("redelivered_after_ack", after_ack)
    result._note("redelivered_after_fault", after_fault)
    result._note("redo", redo)
    return result
