"""The recurring-jobs checker (disque/testing/checker_schedules.py) on
hand-written histories: every judged tick delivered, exactly once outside
the fault windows, and what counts as outside."""

from __future__ import annotations

from disque.store.ids import tick_job_id
from disque.testing.checker import ACK, FAIL, INFO, OK, WIPE
from disque.testing.checker_schedules import SCHEDULE, TICK, check_schedules
from disque.testing.checker_stats import NEMESIS
from support import HistoryScript

T0 = 1_000_000  # the ADD is answered here; ticks every second from T0 + 1000
GRACE, NODES, SETTLE = 100, 3, 500  # a tick's own window: 300 ms


def job(t: int, name: str = "s") -> str:
    return tick_job_id(name.encode(), T0 + t, 60, 5).decode()


class Script(HistoryScript):
    def __init__(self) -> None:
        super().__init__()
        value = {"action": "add", "name": "s", "every": 1000, "ttl": 60, "retry": 5, "replicate": 2}
        self.at(-3000).history.invoke(0, 0, SCHEDULE, value=value)  # sent; known everywhere 3 s later
        self.at(0).history.add(OK, 0, 0, SCHEDULE, value=value)

    def get(self, job_id: str | None, ack: bool = True, latency: int = 5) -> None:
        op = self.history.invoke(1, 0, TICK, value={"queues": ["ticks"]})
        self.now += latency
        if job_id is None:
            self.history.complete(op, FAIL)
            return
        self.history.complete(op, OK, job=job_id)
        if ack:
            done = self.history.invoke(1, 0, ACK, job=job_id)
            self.history.complete(done, OK, value=1)

    def deliver(self, *ticks: int) -> None:
        for t in ticks:
            self.at(t + 10).get(job(t))

    def fault(self, start: int, stop: int) -> None:
        self.at(start).history.add(INFO, "nemesis", None, NEMESIS, value={"fault": "halves", "phase": "start"})
        self.at(stop).history.add(INFO, "nemesis", None, NEMESIS, value={"fault": "halves", "phase": "stop"})

    def delete(self, at: int) -> None:
        self.at(at).history.add(OK, 0, 0, SCHEDULE, value={"action": "del", "name": "s"})

    def check(self) -> dict:
        result = check_schedules(self.history.records, grace_ms=GRACE, nodes=NODES, settle_ms=SETTLE)
        return {k: v for k, v in result.counts.items() if v} | {"valid": result.valid}


def test_one_delivery_per_tick_is_valid():
    s = Script()
    s.deliver(1000, 2000, 3000, 4000)
    s.delete(4500)  # ticks up to 4500 - 300 are judged
    s.at(5000).get(None)
    assert s.check() == {"schedules": 1, "ticks": 4, "outside": 4, "deliveries": 4, "valid": True}


def test_a_tick_never_delivered_is_missing():
    s = Script()
    s.deliver(1000, 3000)
    s.delete(3500)
    result = check_schedules(s.history.records, grace_ms=GRACE, nodes=NODES, settle_ms=SETTLE)
    assert not result.valid and result.problems["missing"] == [f"s@{T0 + 2000}"]


def test_ticks_the_del_may_have_stopped_are_not_judged():
    s = Script()
    s.deliver(1000)
    s.delete(2200)  # tick 2000's last node in line would fire at 2200: not judged
    assert s.check() == {"schedules": 1, "ticks": 1, "outside": 1, "deliveries": 1, "valid": True}


def test_a_second_delivery_outside_the_faults_is_invalid_inside_allowed():
    s = Script()
    s.fault(2500, 3000)  # with the settle: [2500, 3500]; ticks 2000 (its window ends at 2300) and 4000 are outside
    s.deliver(1000, 2000, 3000, 4000)
    s.at(4600).get(job(3000))
    s.at(4700).get(job(4000))
    s.delete(5000)
    counts = s.check()
    assert counts["duplicated_inside"] == 1 and counts["duplicated_outside"] == 1 and not counts["valid"]
    assert counts["ticks"] == 4 and counts["outside"] == 3


def test_a_fault_before_the_first_acknowledgement_makes_the_tick_inside():
    s = Script()
    s.at(1010).get(job(1000), ack=False)
    s.fault(1500, 1600)
    s.at(1700).history.complete(s.history.invoke(1, 0, ACK, job=job(1000)), OK, value=1)
    s.at(4000).get(job(1000))  # a copy cut off before the ACK reached it, queued again by its retry timer
    s.delete(1900)
    counts = s.check()
    assert counts["duplicated_inside"] == 1 and counts["valid"] and "outside" not in counts


def test_a_redelivery_before_the_ack_was_answered_is_a_retry():
    s = Script()
    s.at(1010).get(job(1000), ack=False)  # the consumer died with it
    s.at(7010).get(job(1000))  # its retry (5 s)
    s.at(8000).get(job(1000))  # acknowledged by then, outside any fault: a duplicate
    s.delete(1900)
    counts = s.check()
    assert counts["retried"] == 1 and counts["duplicated_outside"] == 1 and not counts["valid"]


def test_other_ticks_are_beyond_and_other_jobs_unexpected():
    s = Script()
    s.deliver(1000)
    s.at(1100).get(job(0))  # the tick before the ADD was answered: not judged
    s.at(1150).get(job(-2000))  # nor one after it was sent
    s.at(1200).get(job(3_000_000))  # a tick fired early by a node whose clock ran 50 minutes ahead
    s.at(1300).get(job(1000, "other"))
    s.delete(1500)
    counts = s.check()
    assert counts["beyond"] == 3 and counts["unexpected"] == 1 and not counts["valid"]


def test_a_tick_wiped_on_every_copy_is_not_missing():
    s = Script()
    s.deliver(1000)
    for node in (0, 1, 2):  # ticks 2000 and 3000: on two nodes each, both wiped for 2000 only
        held = [job(2000)] * (node < 2) + [job(3000)] * (node == 0)
        s.at(3500).history.add(OK, "nemesis", node, WIPE, value={"action": "flushall", "held": held})
    s.delete(3900)
    result = check_schedules(s.history.records, grace_ms=GRACE, nodes=NODES, settle_ms=SETTLE)
    assert result.problems["wiped"] == [f"s@{T0 + 2000}"] and result.problems["missing"] == [f"s@{T0 + 3000}"]
