"""The history checker on hand-written histories."""

from __future__ import annotations

import io

from disque.testing.checker import ACK, DEQUEUE, ENQUEUE, FAIL, FASTACK, INFO, OK, SCAN, WAITJOB, WIPE, check, load
from support import HistoryScript

AT_LEAST_ONCE = {"queue": "q", "replicate": 3, "retry": 2, "ttl": 60}
AT_MOST_ONCE = {"queue": "q", "replicate": 1, "retry": 0, "ttl": 60}


class Script(HistoryScript):
    def enqueue(self, body: str, outcome: str = OK, opts: dict | None = None, process: int = 1) -> str:
        op = self.history.invoke(process, "n1", ENQUEUE, body=body, value=opts or AT_LEAST_ONCE)
        job = f"D-{body}"
        if outcome is not None:
            self.history.complete(op, outcome, job=job if outcome == OK else None)
        return job

    def dequeue(self, body: str | None, process: int = 2) -> None:
        op = self.history.invoke(process, "n2", DEQUEUE, value={"queues": ["q"]})
        if body is None:
            self.history.complete(op, FAIL, value="empty")
        else:
            self.history.complete(op, OK, job=f"D-{body}", body=body)

    def ack(self, job: str, kind: str = ACK) -> None:
        op = self.history.invoke(2, "n2", kind, job=job)
        self.history.complete(op, OK, value=1)

    def scan(self, node: str, jobs: list[str]) -> None:
        op = self.history.invoke(9, node, SCAN)
        self.history.complete(op, OK, value=jobs)

    def wipe(self, node: str, held: list[str], outcome: str = OK) -> None:
        self.history.add(outcome, "nemesis", node, WIPE, value={"action": "flushall", "held": held})

    def check(self, **kw):
        return check(self.history.records, **kw)


def test_valid_history():
    s = Script()
    a = s.enqueue("a")
    b = s.enqueue("b", opts=AT_MOST_ONCE)
    s.dequeue(None)
    s.at(10).dequeue("a")
    s.ack(a)
    s.dequeue("b")
    s.ack(b, FASTACK)
    s.scan("n1", [])
    s.scan("n2", ["D-other"])
    result = s.check()
    assert result.valid
    assert result.counts == {
        "attempted": 2, "acknowledged": 2, "dequeued": 2, "expired": 0, "wiped": 0, "lost": 0, "lost_best_effort": 0,
        "unexpected": 0, "altered": 0, "duplicated": 0, "at_most_once_duplicated": 0, "recovered": 0, "late": 0, "uncollected": 0,
        "phantom_acks": 0,
    }  # fmt: skip
    assert result.to_json()["valid"] is True and result.to_json()["problems"] == {}


def test_lost_at_least_once_job_is_invalid():
    s = Script()
    s.enqueue("a")
    s.enqueue("b", opts=AT_MOST_ONCE)  # at-most-once may be lost
    s.enqueue("c", opts={**AT_LEAST_ONCE, "replicate": 1})  # so may a single copy
    s.enqueue("d", outcome=FAIL)  # never existed
    s.enqueue("e", outcome=INFO)  # nobody knows
    result = s.check()
    assert not result.valid
    assert result.counts["lost"] == 1 and result.problems["lost"] == ["a"]
    assert result.problems["lost_best_effort"] == ["b", "c"]
    assert result.counts["attempted"] == 5 and result.counts["acknowledged"] == 3


def test_undelivered_job_past_its_ttl_is_expired_not_lost():
    s = Script()
    s.enqueue("a", opts={**AT_LEAST_ONCE, "ttl": 5})
    s.enqueue("b", opts={**AT_LEAST_ONCE, "ttl": 10})
    s.at(4_000).dequeue(None)  # a may be gone from TTL - 1 s on
    result = s.check()
    assert result.problems["expired"] == ["a"] and result.problems["lost"] == ["b"]


def test_a_job_wiped_on_as_many_nodes_as_its_copies_is_excused():
    s = Script()
    three = s.enqueue("three")  # REPLICATE 3
    two = s.enqueue("two", opts={**AT_LEAST_ONCE, "replicate": 2})
    once = s.enqueue("once", opts=AT_MOST_ONCE)
    one_node = s.enqueue("one-node", opts={**AT_LEAST_ONCE, "replicate": 2})
    short = s.enqueue("short")  # REPLICATE 3, wiped on two nodes only
    default = s.enqueue("default", opts={"queue": "q", "retry": 1})  # no REPLICATE: 3 copies assumed
    refused = s.enqueue("refused", opts={**AT_LEAST_ONCE, "replicate": 2})
    s.wipe("n1", [three, two, once, one_node, short, default, refused])
    s.wipe("n2", [three, short, default, "D-unknown"], outcome=INFO)  # may have happened: counts
    s.wipe("n3", [three, two])
    s.wipe("n1", [one_node])  # the same node again (a second RESET HARD): still one copy
    s.wipe("n4", [default, refused], outcome=FAIL)  # did not happen
    result = s.check()
    assert result.problems["wiped"] == ["three", "two", "once"]
    assert result.problems["lost"] == ["one-node", "short", "default", "refused"]
    assert not result.valid


def test_duplicates_allowed_for_at_least_once_only():
    s = Script()
    s.enqueue("a")
    s.enqueue("b", opts=AT_MOST_ONCE)
    for _ in range(2):
        s.dequeue("a")
        s.dequeue("b")
    result = s.check()
    assert result.problems["duplicated"] == ["a", "b"]
    assert result.problems["at_most_once_duplicated"] == ["b"]
    assert not result.valid


def test_unexpected_values():
    s = Script()
    s.enqueue("a", outcome=FAIL)
    s.dequeue("a")  # its enqueue failed for sure
    s.dequeue("ghost")  # never enqueued
    result = s.check()
    assert result.problems["unexpected"] == ["a", "ghost"] and not result.valid


def test_a_body_other_than_the_one_added_under_that_id_is_altered():
    s = Script()
    s.enqueue("hello-world-body")
    s.enqueue("other")
    op = s.history.invoke(2, "n2", DEQUEUE, value={"queues": ["q"]})
    s.history.complete(op, OK, job="D-hello-world-body", body="hello-World-body")  # a damaged disk's doing
    s.dequeue("other")
    result = s.check()
    assert result.problems["altered"] == ["D-hello-world-body"] and not result.valid


def test_indeterminate_enqueues_that_show_up_are_recovered():
    s = Script()
    s.enqueue("a", outcome=INFO)
    s.enqueue("b", outcome=None, process=3)  # no completion at all: indeterminate
    s.enqueue("c", outcome=INFO, process=4)  # never seen: fine
    s.dequeue("a")
    s.dequeue("b")
    result = s.check()
    assert result.valid and result.problems["recovered"] == ["a", "b"]
    assert result.counts["acknowledged"] == 0 and result.counts["lost"] == 0


def test_completion_pairs_with_its_own_process():
    s = Script()
    first = s.history.invoke(1, "n1", ENQUEUE, body="a", value=AT_LEAST_ONCE)
    s.history.invoke(2, "n1", ENQUEUE, body="b", value=AT_LEAST_ONCE)
    s.history.complete(first, FAIL)  # a failed; b stays indeterminate
    s.dequeue("b")
    result = s.check()
    assert result.valid and result.problems["recovered"] == ["b"]


def test_delivery_after_ttl_is_late():
    s = Script()
    s.enqueue("a", opts={**AT_LEAST_ONCE, "ttl": 5})
    s.enqueue("b", opts={**AT_LEAST_ONCE, "ttl": 5})
    s.at(6_500).dequeue("a")  # within the grace
    s.at(7_500).dequeue("b")
    result = s.check(ttl_grace_ms=2000)
    assert result.problems["late"] == ["b"] and not result.valid


def test_acked_job_still_held_is_uncollected():
    s = Script()
    a, b = s.enqueue("a"), s.enqueue("b")
    s.dequeue("a")
    s.dequeue("b")
    s.ack(a)
    s.ack(b, FASTACK)
    s.scan("n1", [a])  # an early scan, superseded below
    s.scan("n1", [])
    s.scan("n2", [b, "D-unacked"])
    result = s.check()
    assert result.problems["uncollected"] == [b] and not result.valid


def test_waitjob_may_only_count_jobs_an_ack_was_sent_for():
    s = Script()
    a, b = s.enqueue("a"), s.enqueue("b")
    s.dequeue("a")
    s.dequeue("b")
    waits = [s.history.invoke(3, "n1", WAITJOB, job=job) for job in (a, b)]
    s.ack(a)
    s.history.complete(waits[0], OK, job=a, value=1)  # a: its ACK was sent before the answer
    s.history.complete(waits[1], OK, job=b, value=1)  # b: nobody acknowledged it
    s.history.complete(s.history.invoke(3, "n1", WAITJOB, job=b), OK, job=b, value=0)
    result = s.check()
    assert result.problems["phantom_acks"] == [b] and not result.valid


def test_history_round_trips_through_json_lines():
    s = Script()
    s.enqueue("a")
    s.dequeue("a")
    out = io.StringIO()
    s.history.dump(out)
    records = list(load(out.getvalue().splitlines() + [""]))
    assert records == s.history.records
    assert set(records[0]) == {"time", "process", "node", "op", "type", "job", "body", "value"}
    assert check(records).counts == s.check().counts
