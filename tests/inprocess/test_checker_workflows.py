"""disque/testing/checker_workflows.py on histories written by hand: each
count is found, and a clean history is valid."""

from __future__ import annotations

from disque.testing.checker import ACK, INVOKE, OK, History
from disque.testing.checker_stats import NEMESIS
from disque.testing.checker_workflows import BATCH, CHILD, CLOSE, PARENT, RESULT, TAKE, check_workflows


def history(child_taken_at: int, reads: list[str | None], child_taken: bool = True) -> list[dict]:
    clock = iter(range(100))
    h = History(lambda: next(clock))
    h.add(OK, 1, 0, PARENT, job="p", value={"after": []})
    h.add(OK, 1, 0, CHILD, job="c", value={"after": ["p"]})
    if child_taken_at == 0:
        h.add(OK, 2, 0, TAKE, job="c")
    h.add(OK, 2, 0, TAKE, job="p")
    ack = h.invoke(2, 0, ACK, job="p", value={"result": "r"})
    h.complete(ack, OK)
    if child_taken_at == 1 and child_taken:
        h.add(OK, 2, 0, TAKE, job="c")
    for value in reads:
        h.add(OK, "reader", 0, RESULT, job="p", value=value)
    return h.records


def test_a_clean_history_is_valid():
    result = check_workflows(history(1, ["r", None]))
    assert result.valid and result.counts == {
        "early": 0, "stuck": 0, "lost_results": 0, "wrong_results": 0, "callbacks_missing": 0,
        "callbacks_duplicated_outside": 0, "children": 1, "delivered": 2, "results": 1, "batches": 0,
    }  # fmt: skip


def test_each_problem_is_counted():
    assert check_workflows(history(0, ["r"])).counts["early"] == 1
    assert check_workflows(history(1, ["r"], child_taken=False)).counts["stuck"] == 1
    lost = check_workflows(history(1, [None, None]))
    assert lost.counts["lost_results"] == 1 and not lost.valid
    assert check_workflows(history(1, ["r", "other"])).counts["wrong_results"] == 1
    assert [r["type"] for r in history(1, []) if r["op"] == ACK] == [INVOKE, OK]


def batch_history(deliveries: int, fault: bool) -> list[dict]:
    clock = iter(range(100))
    h = History(lambda: next(clock))
    h.add(OK, 1, 0, BATCH, value={"id": "b", "callback": "cb"})
    h.add(OK, 1, 0, CLOSE, value={"id": "b"})
    if fault:
        h.add("info", "nemesis", None, NEMESIS, value={"fault": "kill", "phase": "start"})
        h.add("info", "nemesis", None, NEMESIS, value={"fault": "kill", "phase": "stop"})
    for _ in range(deliveries):
        h.add(OK, 2, 0, TAKE, job="cb")
    return h.records


def test_a_batch_callback_once_at_least_and_once_at_most_outside_faults():
    assert check_workflows(batch_history(1, False)).valid
    assert check_workflows(batch_history(0, False)).counts["callbacks_missing"] == 1
    assert check_workflows(batch_history(2, False)).counts["callbacks_duplicated_outside"] == 1
    assert check_workflows(batch_history(2, True)).valid  # a fault between: at least once
