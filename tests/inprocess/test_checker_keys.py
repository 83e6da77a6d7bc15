"""disque/testing/checker_keys.py on hand-made histories: a key split
outside the faults, inside them, an ID lost, a delivery no ADDJOB made."""

from __future__ import annotations

from disque.testing.checker import INFO, INVOKE, OK
from disque.testing.checker_keys import DEDUP, TAKE, check_keys
from disque.testing.checker_stats import NEMESIS


def rec(time: int, process: int, op: str, type: str, job: str | None = None, value: object = None) -> dict:
    return {"time": time, "process": process, "node": 0, "op": op, "type": type, "job": job, "body": None, "value": value}


def add(time: int, process: int, key: str, job: str | None) -> list[dict]:
    done = rec(time + 5, process, DEDUP, OK, job) if job else rec(time + 5, process, DEDUP, INFO, value="timeout")
    return [rec(time, process, DEDUP, INVOKE, value={"key": key}), done]


def fault(start: int, stop: int) -> list[dict]:
    return [rec(start, 0, NEMESIS, INFO, value={"fault": "kill", "phase": "start"}),
            rec(stop, 0, NEMESIS, INFO, value={"fault": "kill", "phase": "stop"})]  # fmt: skip


def test_one_job_per_key_outside_the_faults_and_nothing_lost() -> None:
    history = [
        *add(0, 1, "a", "J1"), *add(10, 2, "a", "J1"), *add(20, 1, "b", None),  # one ID for a; b unanswered
        *fault(100, 200), *add(150, 1, "c", "J2"), *add(160, 2, "c", "J3"),  # split inside: allowed
        rec(300, 3, TAKE, OK, "J1"), rec(301, 3, TAKE, OK, "J2"), rec(302, 3, TAKE, OK, "J3"),
    ]  # fmt: skip
    result = check_keys(history, settle_ms=50)
    assert result.valid, result.to_json()
    assert result.counts | {} == {
        "keys": 3, "outside": 2, "adds": 4, "deliveries": 3, "split_outside": 0, "split_inside": 1, "lost": 0, "unexpected": 0,
    }  # fmt: skip


def test_a_split_outside_a_lost_id_and_an_unexpected_delivery_are_invalid() -> None:
    history = [*add(0, 1, "a", "J1"), *add(10, 2, "a", "J2"), rec(300, 3, TAKE, OK, "J1"), rec(301, 3, TAKE, OK, "J9")]
    result = check_keys(history, settle_ms=50)
    assert not result.valid
    assert result.problems == {"split_outside": ["a"], "lost": ["J2"], "unexpected": ["J9"]}
