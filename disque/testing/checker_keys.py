"""The checker of keyed jobs' deduplication (docs/keys.md): one job per key.

Theory of operation: a harness that adds jobs with `KEY <key> DEDUP <ms>`
(the in-process simulation, tests/sim/workload_keys.py) records, in the
format of disque/testing/checker.py:

* `dedup`: an ADDJOB ... KEY DEDUP; the invoke carries the key (`value`
  {"key": ...}, the window far longer than the run), `ok` the ID answered
  (`job`); an error or a lost connection is `info` (nothing known);
* `take`: a GETJOB of the keyed queue; `ok` carries the job (`job`) and
  its key (`value`);
* `nemesis` records (disque/testing/checker_stats.py): the fault windows.

A key's span runs from its first ADDJOB sent to its last answered, and
is *outside* when it meets no fault window ([start, stop + settle_ms]).

The counts:
* `keys`, `outside`, `adds` (answered), `deliveries`;
* `split_outside`: the keys outside whose ADDJOBs were answered more than
  one job ID (each extra ID one violation): while the cluster is whole,
  one job per key and window;
* `split_inside`: the extra IDs of the other keys (allowed: each side of a
  partition has a home, a home that dies may not have told its standbys,
  an unanswered claim lets the job in);
* `lost`: answered IDs never delivered (the harness drains every node);
* `unexpected`: deliveries of IDs no ADDJOB answered.
A run is valid when split_outside, lost and unexpected are 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from disque.testing.checker import INVOKE, OK, Record, Result
from disque.testing.checker_stats import fault_windows

DEDUP, TAKE = "dedup", "take"


class KeysResult(Result):
    INVALID = ("split_outside", "lost", "unexpected")


def check_keys(history: Iterable[Record], *, settle_ms: int) -> KeysResult:
    records = list(history)
    faults = [(w["start"], w["stop"] + settle_ms) for w in fault_windows(records)]
    spans: dict[str, list[int]] = {}  # key -> [first sent, last answered]
    ids: dict[str, set[str]] = {}  # key -> the IDs answered
    sent: dict[Any, str] = {}  # process -> the key of its ADDJOB in flight
    delivered: set[str] = set()
    deliveries = adds = 0
    for r in records:
        op, kind = r["op"], r["type"]
        if op == DEDUP and kind == INVOKE:
            key = sent[r["process"]] = r["value"]["key"]
            spans.setdefault(key, [r["time"], r["time"]])
        elif op == DEDUP and kind == OK:
            key = sent[r["process"]]
            spans[key][1] = r["time"]
            ids.setdefault(key, set()).add(r["job"])
            adds += 1
        elif op == TAKE and kind == OK:
            delivered.add(r["job"])
            deliveries += 1
    answered = set().union(*ids.values())
    split_outside, split_inside = [], []
    outside = 0
    for key, (first, last) in spans.items():
        is_outside = not any(a <= last and b >= first for a, b in faults)
        outside += is_outside
        extra = [key] * (len(ids.get(key, ())) - 1)
        (split_outside if is_outside else split_inside).extend(extra)
    result = KeysResult()
    result.counts.update(keys=len(spans), outside=outside, adds=adds, deliveries=deliveries)
    result._note("split_outside", split_outside)
    result._note("split_inside", split_inside)
    result._note("lost", sorted(answered - delivered))
    result._note("unexpected", sorted(delivered - answered))
    return result
