"""The checkers of keyed jobs (docs/keys.md): one job per key (DEDUP), one
job of a key out at a time, in order (an ordered queue), and one run per
burst with the last body (DEBOUNCE).

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

`check_ordered` judges an ordered queue's history: `ordered` records are
its ADDJOB ... KEY (the invoke's `value` {"key", "seq"}: the producer adds
a key's jobs one after the other, `seq` counting from 0; `ok` the ID), its
deliveries are `take` records whose `body` is ORDERED, each out from the
GETJOB's answer to its ACKJOB's invoke.  A key is *outside* when its span
(first ADDJOB sent to last ACKJOB) meets no fault window.  The counts:
`ordered_keys`, `ordered_outside`, `ordered_jobs`; `two_out_outside` /
`two_out_inside`: a job of a key handed out while another of it was out;
`order_outside` / `order_inside`: a job handed out for the first time
before an older one of its key (answered) was; `ordered_lost`: answered
jobs never delivered.  Valid when `two_out_outside` and `ordered_lost`
are 0: creation order is kept among a key's jobs queued on one node, not
across nodes (docs/keys.md), so the order breaks are counted, not judged.

`check_debounce` judges DEBOUNCE bursts: `debounce` records are ADDJOB ...
KEY DEBOUNCE <debounce_ms> (the invoke's `value` {"key", "seq"}: a key's
ADDJOBs are one burst, each sent within the window of the one before,
`seq` counting from 0; `ok` the ID, anything else `info`), its deliveries
`take` records whose `body` is DEBOUNCE and `value` the job's body
(`<key>:<seq>`).  A key's span runs from its first ADDJOB sent to
`debounce_ms` after its last answered; *outside* when it meets no fault
window.  A key *runs* each job of it delivered (distinct IDs; a RETRY's
redelivery of one job is not another run).  The counts: `bursts`,
`bursts_outside`, `debounce_adds`, `runs`; `extra_outside` / `extra_inside`:
the runs of a key beyond its first; `stale_outside` / `stale_inside`: a key
whose runs do not include its last ADDJOB's body (the last answered `ok`);
`early_outside`: a run delivered before `debounce_ms` after the last
ADDJOB of its key sent before it; `burst_lost`: a key whose last ADDJOB was
answered `ok` and nothing of it ran.  Valid when `extra_outside`,
`stale_outside`, `early_outside` and `burst_lost` are 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from disque.testing.checker import ACK, INVOKE, OK, Record, Result
from disque.testing.checker_stats import fault_windows

DEDUP, TAKE, ORDERED, DEBOUNCE = "dedup", "take", "ordered", "debounce"


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
        elif op == TAKE and kind == OK and r["body"] not in (ORDERED, DEBOUNCE):
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


class OrderedResult(Result):
    INVALID = ("two_out_outside", "ordered_lost")


def check_ordered(history: Iterable[Record], *, settle_ms: int) -> OrderedResult:
    records = list(history)
    faults = [(w["start"], w["stop"] + settle_ms) for w in fault_windows(records)]
    adding: dict[Any, tuple[str, int]] = {}  # process -> the (key, seq) of its ADDJOB in flight
    spans: dict[str, list[int]] = {}  # key -> [first sent, last event]
    jobs: dict[str, tuple[str, int]] = {}  # job ID -> (key, seq)
    taken: dict[Any, tuple[str, int]] = {}  # process -> (job, since) it holds
    out: dict[str, list[tuple[int, int]]] = {}  # key -> (from, to) each of its jobs was out
    first: dict[str, int] = {}  # job ID -> its first delivery's time
    for r in records:  # the jobs first: one may be handed out before its ADDJOB's answer is read
        op, kind, t = r["op"], r["type"], r["time"]
        if op == ORDERED and kind == INVOKE:
            key, seq = adding[r["process"]] = r["value"]["key"], r["value"]["seq"]
            spans.setdefault(key, [t, t])
        elif op == ORDERED and kind == OK:
            jobs[r["job"]] = adding[r["process"]]
    for r in records:
        op, kind, t = r["op"], r["type"], r["time"]
        if op == TAKE and kind == OK and r["body"] == ORDERED and r["job"] in jobs:
            taken[r["process"]] = r["job"], t
            first.setdefault(r["job"], t)
        elif op == ACK and kind == INVOKE and taken.get(r["process"], ("",))[0] == r["job"]:
            job, since = taken.pop(r["process"])
            key = jobs[job][0]
            out.setdefault(key, []).append((since, t))
            spans[key][1] = max(spans[key][1], t)
    outside = {key for key, (a, b) in spans.items() if not any(x <= b and y >= a for x, y in faults)}
    two_out: dict[bool, list[str]] = {True: [], False: []}
    for key, spells in out.items():
        spells.sort()
        end = 0
        for since, until in spells:
            if since < end:
                two_out[key in outside].append(key)
            end = max(end, until)
    order: dict[bool, list[str]] = {True: [], False: []}
    for job, (key, seq) in jobs.items():
        older = [first.get(j) for j, (k, s) in jobs.items() if k == key and s < seq]
        if job in first and any(t is None or t > first[job] for t in older):
            order[key in outside].append(job)
    result = OrderedResult()
    result.counts.update(ordered_keys=len(spans), ordered_outside=len(outside), ordered_jobs=len(jobs))
    result._note("two_out_outside", two_out[True])
    result._note("two_out_inside", two_out[False])
    result._note("order_outside", order[True])
    result._note("order_inside", order[False])
    result._note("ordered_lost", sorted(set(jobs) - set(first)))
    return result


class DebounceResult(Result):
    INVALID = ("extra_outside", "stale_outside", "early_outside", "burst_lost")


def check_debounce(history: Iterable[Record], *, settle_ms: int, debounce_ms: int) -> DebounceResult:
    records = list(history)
    faults = [(w["start"], w["stop"] + settle_ms) for w in fault_windows(records)]
    adding: dict[Any, tuple[str, int, int]] = {}  # process -> the (key, seq, sent at) of its ADDJOB in flight
    spans: dict[str, list[int]] = {}  # key -> [first sent, last answered + debounce_ms]
    sent: dict[str, list[int]] = {}  # key -> when each of its ADDJOBs was sent
    last: dict[str, tuple[int, bool]] = {}  # key -> (seq, answered ok) of its latest ADDJOB answered
    runs: dict[str, dict[str, tuple[int, int]]] = {}  # key -> job ID -> (seq of its body, first delivery)
    adds = 0
    for r in records:
        op, kind, t = r["op"], r["type"], r["time"]
        if op == DEBOUNCE and kind == INVOKE:
            key, seq = r["value"]["key"], r["value"]["seq"]
            adding[r["process"]] = key, seq, t
            spans.setdefault(key, [t, t + debounce_ms])
            sent.setdefault(key, []).append(t)
        elif op == DEBOUNCE:
            key, seq, _ = adding.pop(r["process"])
            adds += kind == OK
            spans[key][1] = t + debounce_ms
            if seq >= last.get(key, (-1, False))[0]:
                last[key] = seq, kind == OK
        elif op == TAKE and kind == OK and r["body"] == DEBOUNCE:
            key, seq = r["value"].rsplit(":", 1)
            runs.setdefault(key, {}).setdefault(r["job"], (int(seq), t))
    outside = {key for key, (a, b) in spans.items() if not any(x <= b and y >= a for x, y in faults)}
    found: dict[str, dict[bool, list[str]]] = {name: {True: [], False: []} for name in ("extra", "stale")}
    early: list[str] = []
    lost: list[str] = []
    for key in spans:
        ran = runs.get(key, {})
        side = key in outside
        found["extra"][side].extend([key] * (len(ran) - 1))
        seq, ok = last.get(key, (-1, False))
        if ran and ok and seq not in {s for s, _ in ran.values()}:
            found["stale"][side].append(key)
        if side and any(t < max((x for x in sent[key] if x <= t), default=t) + debounce_ms for _, t in ran.values()):
            early.append(key)
        if not ran and ok:
            lost.append(key)
    result = DebounceResult()
    result.counts.update(bursts=len(spans), bursts_outside=len(outside), debounce_adds=adds,
                         runs=sum(map(len, runs.values())))  # fmt: skip
    for name in ("extra", "stale"):
        result._note(f"{name}_outside", found[name][True])
        result._note(f"{name}_inside", found[name][False])
    result._note("early_outside", early)
    result._note("burst_lost", lost)
    return result
