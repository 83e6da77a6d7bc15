"""disque/testing/checker_keys.py on hand-made histories: a key split
outside the faults, inside them, an ID lost, a delivery no ADDJOB made;
an ordered key's jobs out two at once, or out of order, outside and
inside the faults."""

from __future__ import annotations

from disque.testing.checker import ACK, INFO, INVOKE, OK
from disque.testing.checker_keys import DEBOUNCE, DEDUP, ORDERED, TAKE, check_debounce, check_keys, check_ordered
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


def ordered(time: int, key: str, seq: int, job: str) -> list[dict]:
    return [rec(time, 1, ORDERED, INVOKE, value={"key": key, "seq": seq}), rec(time + 5, 1, ORDERED, OK, job)]


def out(got: int, acked: int, process: int, job: str) -> list[dict]:
    taken = rec(got, process, TAKE, OK, job)
    taken["body"] = ORDERED
    return [taken, rec(acked, process, ACK, INVOKE, job)]


def test_ordered_keys_one_out_at_a_time_and_in_order() -> None:
    history = [
        *ordered(0, "a", 0, "A0"), *ordered(10, "a", 1, "A1"), *ordered(20, "b", 0, "B0"),
        *out(30, 40, 3, "A0"), *out(35, 45, 4, "B0"), *out(50, 60, 3, "A1"),  # a in order, b beside it
        rec(70, 3, TAKE, OK, "X"), *fault(500, 600),  # a plain job's delivery is not judged here
        *ordered(550, "c", 0, "C0"), *ordered(556, "c", 1, "C1"),
        *out(562, 600, 3, "C1"), *out(570, 620, 4, "C0"),  # inside: two out, and C1 first
    ]  # fmt: skip
    result = check_ordered(sorted(history, key=lambda r: r["time"]), settle_ms=50)
    assert result.valid, result.to_json()
    assert result.counts == {
        "ordered_keys": 3, "ordered_outside": 2, "ordered_jobs": 5, "two_out_outside": 0, "two_out_inside": 1,
        "order_outside": 0, "order_inside": 1, "ordered_lost": 0,
    }  # fmt: skip


def test_two_out_outside_and_a_lost_job_are_invalid_an_order_break_counted() -> None:
    history = [*ordered(0, "a", 0, "A0"), *ordered(10, "a", 1, "A1"), *ordered(20, "a", 2, "A2"),
               *out(30, 50, 3, "A1"), *out(40, 60, 4, "A0")]  # fmt: skip
    result = check_ordered(history, settle_ms=50)
    assert not result.valid
    assert result.problems == {"two_out_outside": ["a"], "order_outside": ["A1"], "ordered_lost": ["A2"]}


def burst(time: int, key: str, jobs: list[str | None], process: int = 1) -> list[dict]:
    """A key's DEBOUNCE burst: one ADDJOB every 100 ms, answered `ok` with its job (None: `info`)."""
    out = []
    for seq, job in enumerate(jobs):
        t = time + 100 * seq
        out.append(rec(t, process, DEBOUNCE, INVOKE, value={"key": key, "seq": seq}))
        out.append(rec(t + 5, process, DEBOUNCE, OK, job) if job else rec(t + 5, process, DEBOUNCE, INFO, value="timeout"))
    return out


def ran(time: int, job: str, body: str) -> dict:
    taken = rec(time, 3, TAKE, OK, job, body)
    taken["body"] = DEBOUNCE
    return taken


def test_one_run_per_burst_with_the_last_body_outside_the_faults() -> None:
    history = [
        *burst(0, "a", ["A0", "A1", "A2"]), ran(1300, "A2", "a:2"), ran(4000, "A2", "a:2"),  # a redelivery: one run
        *burst(2000, "b", ["B0", "B1"]), ran(3200, "B1", "b:1"),
        *fault(5000, 6000), *burst(5100, "c", ["C0", "C1"]), ran(5500, "C0", "c:0"), ran(6200, "C1", "c:1"),
        *burst(9000, "d", ["D0", None]), ran(10200, "D0", "d:0"),  # its last ADDJOB unanswered: its body may not run
    ]  # fmt: skip
    result = check_debounce(history, settle_ms=500, debounce_ms=1000)
    assert result.valid, result.to_json()
    assert result.counts == {
        "bursts": 4, "bursts_outside": 3, "debounce_adds": 8, "runs": 5, "extra_outside": 0, "extra_inside": 1,
        "stale_outside": 0, "stale_inside": 0, "early_outside": 0, "burst_lost": 0,
    }  # fmt: skip


def test_an_extra_run_a_stale_body_an_early_run_and_a_lost_burst_are_invalid() -> None:
    history = [
        *burst(0, "a", ["A0", "A1"]), ran(1200, "A0", "a:0"), ran(1300, "A1", "a:1"),
        *burst(3000, "b", ["B0", "B1"]), ran(4500, "B0", "b:0"),
        *burst(6000, "c", ["C0"]), ran(6500, "C0", "c:0"),
        *burst(9000, "d", ["D0"]),
        *fault(12000, 13000), *burst(12100, "e", ["E0", "E1"]), ran(13500, "E0", "e:0"),
    ]  # fmt: skip
    result = check_debounce(history, settle_ms=500, debounce_ms=1000)
    assert not result.valid
    assert result.problems == {
        "extra_outside": ["a"], "stale_outside": ["b"], "early_outside": ["c"], "burst_lost": ["d"], "stale_inside": ["e"],
    }  # fmt: skip
