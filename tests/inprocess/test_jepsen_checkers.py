"""The checkers jepsen-lite runs, on hand-written JSON-lines histories in the
form the harness writes (nemesis records included): `disque.testing.checker.check`
for safety and `disque.testing.checker_stats` for latency, throughput and faults."""

from __future__ import annotations

import json

import pytest

from disque.testing import checker_stats
from disque.testing.checker import check, load

ALO = {"queue": "jepsen", "replicate": 3, "retry": 1, "ttl": 300}
AMO = {"queue": "jepsen", "replicate": 1, "retry": 0, "ttl": 300}


def rec(time, process, op, type, node=0, job=None, body=None, value=None):
    return json.dumps({"time": time, "process": process, "node": node, "op": op, "type": type,
                       "job": job, "body": body, "value": value}, sort_keys=True)  # fmt: skip


def enqueue(t, p, body, opts=ALO, outcome="ok", latency=5):
    lines = [rec(t, p, "enqueue", "invoke", body=body, value=opts)]
    if outcome:
        lines.append(rec(t + latency, p, "enqueue", outcome, job=f"D-{body}" if outcome == "ok" else None, body=body))
    return lines


def dequeue(t, p, body, latency=2, node=1):
    return [rec(t, p, "dequeue", "invoke", node=node, value={"queues": ["jepsen"]}),
            rec(t + latency, p, "dequeue", "ok", node=node, job=f"D-{body}", body=body)]  # fmt: skip


def ack(t, p, body, kind="ackjob"):
    op = "fastack" if kind == "fastack" else "ack"
    return [rec(t, p, op, "invoke", job=f"D-{body}"), rec(t + 1, p, op, "ok", job=f"D-{body}", value=1)]


def nemesis(t, phase, fault="halves"):
    return [rec(t, "nemesis", "nemesis", "info", node=None, value={"fault": fault, "phase": phase})]


def scan(t, node, jobs):
    return [rec(t, "scan", "scan", "invoke", node=node), rec(t + 1, "scan", "scan", "ok", node=node, value=jobs)]


def judge(lines):
    return check(load(lines))


BASE = [
    *enqueue(1000, 0, "0-1"), *enqueue(1010, 0, "0-2", AMO), *nemesis(1015, "start"),
    *dequeue(1020, 1000, "0-1"), *ack(1023, 1000, "0-1"), *dequeue(1030, 1000, "0-2"),
    *ack(1033, 1000, "0-2", "fastack"), *nemesis(1040, "stop"), *scan(1100, 0, []), *scan(1100, 1, []),
]  # fmt: skip


def test_valid_history_with_nemesis_records():
    result = judge(BASE)
    assert result.valid
    assert result.counts["acknowledged"] == 2
    assert result.counts["lost"] == result.counts["unexpected"] == result.counts["duplicated"] == 0


def test_lost():
    result = judge([*BASE, *enqueue(1050, 0, "0-3")])
    assert not result.valid and result.counts["lost"] == 1 and result.problems["lost"] == ["0-3"]


def test_duplicated_at_least_once_is_valid_but_counted():
    result = judge([*BASE, *dequeue(1060, 1001, "0-1")])
    assert result.valid and result.counts["duplicated"] == 1


def test_duplicated_at_most_once_is_invalid():
    result = judge([*BASE, *dequeue(1060, 1001, "0-2")])
    assert not result.valid and result.counts["at_most_once_duplicated"] == 1


def test_unexpected():
    result = judge([*BASE, *dequeue(1060, 1001, "9-9")])
    assert not result.valid and result.counts["unexpected"] == 1


def test_indeterminate_then_delivered_is_recovered():
    result = judge([*BASE, *enqueue(1050, 0, "0-3", outcome="info"), *dequeue(1060, 1001, "0-3")])
    assert result.valid and result.counts["recovered"] == 1


def test_acked_job_still_on_a_node_is_uncollected():
    result = judge([*BASE, *scan(1200, 1, ["D-0-1"])])
    assert not result.valid and result.counts["uncollected"] == 1


def test_delivery_after_ttl_is_late():
    short = {**ALO, "ttl": 1}
    result = judge([*BASE, *enqueue(1050, 0, "0-3", short), *dequeue(1050 + 4000, 1001, "0-3")])
    assert not result.valid and result.counts["late"] == 1


def test_latency_percentiles_per_op():
    lines = [line for k in range(100) for line in enqueue(1000 + 10 * k, 0, f"0-{k}", latency=k + 1)]
    stats = checker_stats.latencies(load(lines))
    assert set(stats) == {"enqueue"}
    row = stats["enqueue"]
    assert (row["count"], row["ok"], row["fail"], row["info"]) == (100, 100, 0, 0)
    assert (row["p50"], row["p90"], row["p99"], row["p100"]) == (50, 90, 99, 100)


def test_latency_pairs_each_process_with_its_own_completion():
    lines = [
        rec(0, 1, "enqueue", "invoke", body="a", value=ALO), rec(0, 2, "dequeue", "invoke"),
        rec(30, 2, "dequeue", "fail"), rec(70, 1, "enqueue", "info", body="a"),
    ]  # fmt: skip
    ops = {o["op"]: o for o in checker_stats.operations(load(lines))}
    assert ops["enqueue"]["latency"] == 70 and ops["enqueue"]["type"] == "info"
    assert ops["dequeue"]["latency"] == 30


def test_throughput_buckets_successes_by_completion_time():
    lines = [*enqueue(0, 0, "a"), *enqueue(500, 0, "b"), *enqueue(2100, 0, "c"),
             *enqueue(2200, 0, "d", outcome="fail"), *dequeue(2300, 1, "a")]  # fmt: skip
    series = checker_stats.throughput(load(lines), 1000)
    assert series == {"dequeue": [0, 0, 1], "enqueue": [2, 0, 1]}


def test_fault_windows():
    lines = [*nemesis(100, "start"), *nemesis(900, "stop"), *nemesis(1000, "start", "kill"), *enqueue(5000, 0, "a")]
    windows = checker_stats.fault_windows(load(lines))
    assert [(w["fault"], w["start"], w["stop"]) for w in windows] == [("halves", 100, 900), ("kill", 1000, 5005)]


@pytest.mark.parametrize("q,expected", [(0, 1), (1, 1), (50, 2), (100, 4)])
def test_percentile_nearest_rank(q, expected):
    assert checker_stats.percentile([1, 2, 3, 4], q) == expected
