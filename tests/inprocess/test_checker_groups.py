"""The consumer-group checker (disque/testing/checker_groups.py) on hand-written histories."""

from __future__ import annotations

from disque.testing.checker import FAIL, INFO, OK
from disque.testing.checker_groups import QACK, QADD, QGET, check_groups
from disque.testing.checker_stats import NEMESIS
from support import HistoryScript


class Script(HistoryScript):
    def qadd(self, body: str, outcome: str = OK, ttl: int = 60) -> str:
        op = self.history.invoke(1, "n1", QADD, body=body, value={"queue": "q", "ttl": ttl})
        self.history.complete(op, outcome, job=f"{body}-id" if outcome == OK else None)
        return f"{body}-id"

    def qget(self, body: str | None, group: str) -> None:
        op = self.history.invoke(2, "n2", QGET, value={"group": group})
        if body is None:
            self.history.complete(op, FAIL, value="None")
        else:
            self.history.complete(op, OK, job=f"{body}-id", body=body)

    def qack(self, body: str, group: str, reply: int = 1) -> None:
        op = self.history.invoke(2, "n2", QACK, job=f"{body}-id", value={"group": group})
        self.history.complete(op, OK, value=reply)

    def fault(self, phase: str) -> None:
        self.history.add(INFO, "nemesis", None, NEMESIS, value={"fault": "kill", "phase": phase})

    def check(self, groups=("a", "b")) -> dict:
        result = check_groups(self.history.records, groups)
        return {k: v for k, v in result.counts.items() if v} | {"valid": result.valid}


def test_every_group_must_get_every_event():
    s = Script()
    s.qadd("x")
    s.qget("x", "a")
    s.qack("x", "a")
    assert s.check() == {"attempted": 1, "acknowledged": 1, "deliveries": 1, "acks": 1, "lost": 1, "valid": False}
    s.qget("x", "b")
    assert s.check()["valid"]


def test_an_event_that_may_have_expired_is_not_lost():
    s = Script()
    s.qadd("x", ttl=1)
    s.at(5_000).qget(None, "a")
    assert s.check(("a",))["valid"]


def test_unexpected_and_late_deliveries():
    s = Script()
    s.qadd("x", ttl=1)
    s.qadd("y", outcome=FAIL)
    s.qadd("z", outcome=INFO)
    s.at(3_500).qget("x", "a")
    s.qget("y", "a")
    s.qget("w", "a")
    s.qget("z", "a")
    counts = s.check(("a",))
    assert counts["late"] == 1 and counts["unexpected"] == 2 and not counts["valid"]


def test_redelivery_after_an_acknowledgement_needs_a_fault():
    s = Script()
    s.qadd("x")
    s.qget("x", "a")
    s.qack("x", "a", 0)  # too late: does not count
    s.qget("x", "a")  # redo
    s.qack("x", "a")
    s.qget("x", "a")
    counts = s.check(("a",))
    assert counts["redo"] == 1 and counts["redelivered_after_ack"] == 1 and not counts["valid"]
    s = Script()
    s.qadd("x")
    s.qget("x", "a")
    s.qack("x", "a")
    s.at(100).fault("start")
    s.at(200).fault("stop")
    s.at(300).qget("x", "a")
    counts = s.check(("a",))
    assert counts["redelivered_after_fault"] == 1 and counts["valid"]


def test_a_completion_without_its_invoke_is_ignored():
    s = Script()
    s.history.add(OK, 9, "n1", QGET, job="x-id", body="x")
    assert s.check(("a",)) == {"valid": True}
