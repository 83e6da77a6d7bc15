"""The same operations on a core with read-behind forced on (two jobs per
queue in memory, the rest on disk) and on one without: every reply must be
the same.  Both cores draw the same random numbers (no jitter), so job IDs
and requeue times match, a queued job's too: one loaded back gets the
requeue visits it missed on disk at their own times."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from disque.core.node import NodeCore
from invariants import advance, check_core, quick_and_slow
from support import NODE_ID, FakeClock, FakeHost, Session, body_store, make_config

QUEUES = ("q1", "q2")
# (TTL, RETRY): a job that expires here has no requeue timer.  One that has
# expires at the first scheduler visit past its TTL, up to a second earlier
# in memory than on disk (docs/read-behind.md): not a difference to compare,
# so its TTL is longer than the longest run (80 steps of at most 5 s).
TIMES = ((None, None), (None, 0), (None, 2), (600, 2), (4, 0), (3, 0))


class NoJitter(random.Random):
    """No requeue jitter, so the other draws stay in step between the two
    cores: NodeCore.jitter draws 9 bits until they are below 500 and takes
    250 off, and no other draw of the core asks for 9 bits."""

    def getrandbits(self, k: int) -> int:
        return 250 if k == 9 else super().getrandbits(k)


class SameReplies(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clocks = (FakeClock(), FakeClock())
        plain = NodeCore(make_config(read_behind="no"), NODE_ID, clock=self.clocks[0], rng=NoJitter(1), host=FakeHost())
        config = make_config(read_behind="force", read_behind_prefetch=2)
        disk = NodeCore(config, NODE_ID, clock=self.clocks[1], rng=NoJitter(1), host=FakeHost(), bodies=body_store())
        self.cores = (plain, disk)
        self.sessions = (Session(plain), Session(disk))
        self.ids: list[bytes] = []

    def both(self, *args: Any) -> Any:
        a, b = (s(*args) for s in self.sessions)
        assert a == b, (args, a, b)
        return a

    @rule(queue=st.sampled_from(QUEUES), times=st.sampled_from(TIMES), delay=st.sampled_from((0, 0, 1)),
          body=st.binary(max_size=20))  # fmt: skip
    def addjob(self, queue: str, times: tuple[int | None, int | None], delay: int, body: bytes) -> None:
        ttl, retry = times
        opts: list[Any] = []
        if ttl is not None:
            opts += ["TTL", ttl]
        if retry is not None:
            opts += ["RETRY", retry]
        if delay:
            opts += ["DELAY", delay]
        reply = self.both("ADDJOB", queue, body, 0, *opts)
        if isinstance(reply, bytes):
            self.ids.append(bytes(reply))

    @rule(queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2), count=st.integers(1, 4))
    def getjob(self, queues: list[str], count: int) -> None:
        self.both("GETJOB", "NOHANG", "WITHCOUNTERS", "COUNT", count, "FROM", *queues)

    @precondition(lambda self: self.ids)
    @rule(data=st.data(), verb=st.sampled_from(("ACKJOB", "FASTACK", "NACK", "DEQUEUE", "ENQUEUE", "DELJOB", "SHOW", "WORKING")))
    def by_id(self, data: st.DataObject, verb: str) -> None:
        self.both(verb, data.draw(st.sampled_from(self.ids)))

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(-5, 5))
    def qpeek(self, queue: str, count: int) -> None:
        self.both("QPEEK", queue, count)

    @rule()
    def counts(self) -> None:
        for queue in QUEUES:
            self.both("QLEN", queue)
        a, b = (sorted(s("JSCAN", "0", "BUSYLOOP")[1]) for s in self.sessions)
        assert a == b
        a, b = (s("INFO", "jobs") for s in self.sessions)
        assert a == b

    @rule(ms=st.sampled_from((100, 1000, 2500, 5000)))
    def wait(self, ms: int) -> None:
        for core, clock in zip(self.cores, self.clocks):
            advance(core, clock, ms)

    @invariant()
    def consistent(self) -> None:
        check_core(self.cores[1])


TestSameReplies, TestSameRepliesLong = quick_and_slow(SameReplies, quick=(25, 40), slow=(300, 80))
