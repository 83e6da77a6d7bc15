"""The checker of recurring jobs (docs/schedules.md): one job per tick.

Theory of operation: a harness that runs schedules (jepsen-lite's
`--schedules`, the in-process simulation) records, in the format of
disque/testing/checker.py:

* `schedule`: an `ok` record per change (for an ADD, once every node
  knows the schedule: a node that dies before telling any other takes the
  schedule with it until it is back), `value` {"action": "add", "name",
  "every" (ms), "ttl" (s, 86400 when not given), "retry" (s, -1 when not
  given), "replicate" (3 when not given)} for SCHEDULE ADD (its invoke,
  with the same value, says when it was sent: the ticks from then on are
  recognised, but judged only after the ok), or
  {"action": "del", "name"} for SCHEDULE DEL, recorded when it is sent;
* `tick`: a GETJOB from the schedules' queue: `ok` carries the job (`job`),
  an empty answer is `fail`;
* `ack` (ACKJOB of a tick's job, as in checker.py): `ok` when answered;
* `nemesis` records (disque/testing/checker_stats.py): the fault windows;
* `wipe` records (checker.py): jobs a harness destroyed on purpose.

A tick's job ID is made from (schedule, tick) alone (`tick_job_id`), so
every delivery names its tick.  The ticks judged are those of the schedule's
period after its ADD was answered and up to its DEL less `grace_ms` x
`nodes` (the last node in line may still have been waiting for its turn);
a delivery of any other tick of the schedule (before, after, or early
because a node's clock ran ahead) is counted as `beyond`, and a job of the
queue that is no tick at all as `unexpected`.

Which ticks must have exactly one delivery.  A tick t's own window is
[t, t + grace_ms x nodes]: the time for every node in line to take its
turn (the node of rank r fires at t + grace x r unless it heard the tick
fired) and one more grace for the job to be delivered; it is stretched to
the first answered ACKJOB of its job when that comes later (until then,
a copy on a node cut off later may be queued again by its retry timer).
A fault window is [start, stop + settle_ms], from the nemesis's start
record to its stop record and the time the cluster needs to be whole again
(links up, failure flags cleared, a restarted node's quiet grace).  A tick
is *outside* when its window meets no fault window.

The counts:
* `missing`: judged ticks never delivered (every tick must produce a job
  while any node is up, and the harness drains every node), but for
* `wiped`: those whose job the wipe records list on at least REPLICATE
  nodes (every copy the firing node made may have been destroyed);
* `duplicated_outside`: the deliveries of outside ticks after their first;
* `duplicated_inside`: the same for the other ticks (allowed: both sides of
  a partition fire the tick, a node that did not hear it fired fires too);
* `retried`: deliveries asked for while an earlier delivery of the same
  job had no answered ACKJOB (the queue's retry, not the schedule: allowed,
  and not counted as duplicates);
* `unexpected`, `beyond` as above; `ticks`, `outside`, `deliveries`.
A run is valid when missing, duplicated_outside and unexpected are 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from disque.store.ids import tick_job_id
from disque.testing.checker import ACK, INFO, INVOKE, OK, WIPE, Record, Result
from disque.testing.checker_stats import fault_windows

SCHEDULE, TICK = "schedule", "tick"
MAP_AHEAD_MS = 3_600_000  # ticks this far past the history are still recognised (a clock run ahead)


class SchedulesResult(Result):
    INVALID = ("missing", "duplicated_outside", "unexpected")


def check_schedules(history: Iterable[Record], *, grace_ms: int, nodes: int, settle_ms: int) -> SchedulesResult:
    records = list(history)
    end = max((r["time"] for r in records), default=0)
    faults = [(w["start"], w["stop"] + settle_ms) for w in fault_windows(records)]
    added: dict[str, tuple[int, dict[str, Any]]] = {}  # name -> (ADD answered at, its value)
    sent: dict[str, int] = {}  # name -> ADD sent at
    deleted: dict[str, int] = {}  # name -> DEL sent at
    asked: dict[Any, int] = {}  # process -> when its GETJOB in flight was sent
    deliveries: list[tuple[str, int, int]] = []  # (job, asked at, delivered at)
    acked: dict[str, int] = {}  # job -> its first answered ACKJOB
    wiped_on: dict[str, set[Any]] = {}  # job -> nodes wiped while holding it
    for r in records:
        op, kind = r["op"], r["type"]
        if op == SCHEDULE and kind == INVOKE:
            sent.setdefault(r["value"]["name"], r["time"])
        elif op == SCHEDULE and kind == OK:
            value = r["value"]
            if value["action"] == "add":
                added[value["name"]] = (r["time"], value)
            else:
                deleted[value["name"]] = r["time"]
        elif op == TICK:
            if kind == INVOKE:
                asked[r["process"]] = r["time"]
            elif kind == OK:
                deliveries.append((r["job"], asked.pop(r["process"], r["time"]), r["time"]))
        elif op == ACK and kind == OK:
            acked.setdefault(r["job"], r["time"])
        elif op == WIPE and kind in (OK, INFO):
            for job in r["value"]["held"]:
                wiped_on.setdefault(job, set()).add(r["node"])

    ticks: dict[str, tuple[str, int, bool]] = {}  # job -> (schedule, tick, judged)
    copies: dict[str, int] = {}  # schedule -> REPLICATE
    for name, (since, value) in added.items():
        copies[name] = value.get("replicate", 3)
        every = value["every"]
        last = deleted.get(name, end) - grace_ms * nodes
        for t in range(min(since, sent.get(name, since)) // every * every, end + MAP_AHEAD_MS, every):
            job = tick_job_id(name.encode(), t, value.get("ttl", 86400), value.get("retry", -1)).decode()
            ticks[job] = (name, t, since < t <= last)

    result = SchedulesResult()
    got: dict[str, list[tuple[int, int]]] = {job: [] for job, (_, _, judged) in ticks.items() if judged}
    unexpected, beyond = [], []
    for job, at_ask, at in deliveries:
        if job not in ticks:
            unexpected.append(job)
        elif job not in got:
            beyond.append(job)
        else:
            got[job].append((at_ask, at))
    retried, inside, outside_dup = [], [], []
    outside = 0
    for job, times in got.items():
        name, t, _ = ticks[job]
        ack = acked.get(job)
        stop = max(t + grace_ms * nodes, end if ack is None else ack)
        is_outside = not any(a <= stop and b >= t for a, b in faults)
        outside += is_outside
        for at_ask, _ in times[1:]:
            if ack is None or at_ask < ack:
                retried.append(f"{name}@{t}")
            elif is_outside:
                outside_dup.append(f"{name}@{t}")
            else:
                inside.append(f"{name}@{t}")
    result.counts.update(schedules=len(added), ticks=len(got), outside=outside, deliveries=len(deliveries))
    never = [job for job, times in got.items() if not times]
    wiped = [job for job in never if len(wiped_on.get(job, ())) >= copies[ticks[job][0]]]
    result._note("missing", [f"{ticks[job][0]}@{ticks[job][1]}" for job in never if job not in wiped])
    result._note("wiped", [f"{ticks[job][0]}@{ticks[job][1]}" for job in wiped])
    result._note("duplicated_outside", outside_dup)
    result._note("duplicated_inside", inside)
    result._note("retried", retried)
    result._note("unexpected", unexpected)
    result._note("beyond", beyond)
    return result
