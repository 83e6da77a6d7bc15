"""A hypothesis state machine: one node, one queue, three consumer groups,
against a plain model of bananaq's rules (spec/bananaq.md §2, §4): QGET
hands the lowest redo event, else the lowest fresh one; QACK holds only
within the deadline; EX 0 is done at once; an expired event is gone for
every purpose; QFLUSH forgets everything.  Every reply is compared."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from support import Session, make_core

GROUPS = ("a", "b", "c")
DONE = 0


class GroupsAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core, self.clock, _ = make_core()
        self.s = Session(self.core)
        self.events: list[tuple[bytes, bytes, int]] = []  # (id, body, etime in s), in ID order
        self.progress: dict[str, dict[bytes, int]] = {g: {} for g in GROUPS}

    def live(self) -> list[tuple[bytes, bytes, int]]:
        now = self.clock.ms
        return [ev for ev in self.events if ev[2] * 1000 > now]

    @rule(ttl=st.sampled_from([1, 2, 5, 60]), body=st.binary(max_size=3))
    def qadd(self, ttl: int, body: bytes) -> None:
        event = self.s("QADD", "q", ttl, body)
        assert not self.events or int(event) > int(self.events[-1][0])
        self.events.append((event, body, self.clock.ms // 1000 + ttl))

    @rule(group=st.sampled_from(GROUPS), ex=st.sampled_from([0, 500, 2000]))
    def qget(self, group: str, ex: int) -> None:
        now, progress = self.clock.ms, self.progress[group]
        live = self.live()
        redo = [ev for ev in live if 0 < progress.get(ev[0], 0) < now]
        fresh = [ev for ev in live if ev[0] not in progress]
        expected = (redo or fresh or [None])[0]
        got = self.s("QGET", "q", group, "EX", f"{ex / 1000}")
        assert got == (None if expected is None else [expected[0], expected[1]])
        if expected is not None:
            progress[expected[0]] = now + ex if ex else DONE

    @rule(group=st.sampled_from(GROUPS), pick=st.integers(0, 50))
    def qack(self, group: str, pick: int) -> None:
        if not self.events:
            return
        event = self.events[pick % len(self.events)][0]
        deadline = self.progress[group].get(event)
        ok = any(ev[0] == event for ev in self.live()) and bool(deadline) and deadline >= self.clock.ms  # type: ignore[operator]
        assert self.s("QACK", "q", group, event) == int(ok)
        if ok:
            self.progress[group][event] = DONE

    @rule(ms=st.sampled_from([1, 100, 499, 1000, 2500]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.core.tick()

    @rule()
    def qflush(self) -> None:
        assert self.s("QFLUSH", "q") == b"OK"
        self.events.clear()
        self.progress = {g: {} for g in GROUPS}

    @invariant()
    def figures_match(self) -> None:
        now = self.clock.ms
        live = {ev[0] for ev in self.live()}
        [[_, flat]] = self.s("QSTATUS", "q", "GROUPS", *GROUPS)
        for group, values in zip(flat[::2], flat[1::2]):
            progress = self.progress[group.decode()]
            states = [d for e, d in progress.items() if e in live]
            inprogress = sum(1 for d in states if d >= now and d != DONE)
            redo = sum(1 for d in states if 0 < d < now)
            done = states.count(DONE)
            assert values[1::2] == [len(live), inprogress, redo, done, len(live) - inprogress - redo - done, 0]


TestGroupsAgainstModel = GroupsAgainstModel.TestCase
TestGroupsAgainstModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
