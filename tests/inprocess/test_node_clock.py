"""The node's clock against a wall clock that steps (fake sources)."""

from __future__ import annotations

from disque.shell.clock import SLEW, NodeClock

START_NS = 1_700_000_000_000 * 1_000_000


class Sources:
    def __init__(self) -> None:
        self.wall = START_NS
        self.mono = 5 * 10**9

    def run(self, ms: int) -> None:
        self.wall += ms * 1_000_000
        self.mono += ms * 1_000_000


def clock() -> tuple[NodeClock, Sources]:
    src = Sources()
    return NodeClock(lambda: src.wall, lambda: src.mono), src


def test_it_is_the_wall_clock_while_the_wall_clock_does_not_step():
    c, src = clock()
    for _ in range(100):
        src.run(37)
        assert c.now_ms() == src.wall // 1_000_000


def test_a_step_back_does_not_stop_time_and_is_absorbed_slowly():
    c, src = clock()
    src.run(1_000)
    before = c.now_ms()
    src.wall -= 60_000 * 1_000_000  # one minute back
    seen = [before]
    for _ in range(20):
        src.run(100)
        seen.append(c.now_ms())
    steps = [b - a for a, b in zip(seen, seen[1:])]
    assert all(99 <= s <= 100 for s in steps)  # timers go on at their rate, less 1%
    src.run(int(60_000 / SLEW) + 10_000)
    assert c.now_ms() == src.wall // 1_000_000  # caught up after 100 times the step


def test_a_step_forward_fires_no_timer_early():
    c, src = clock()
    start = c.now_ms()
    src.wall += 600_000 * 1_000_000  # ten minutes forward
    src.run(60_000)
    assert 60_000 <= c.now_ms() - start <= 60_000 * (1 + SLEW) + 1  # a TTL-60 job is not expired at once
    assert c.wall_us() == src.wall // 1000  # TIME still tells the date


def test_it_never_goes_backwards():
    c, src = clock()
    last = c.now_ms()
    for delta in (-10**12, 5, 10**12, 1, -10**9, 0):
        src.wall += delta
        src.run(3)
        now = c.now_ms()
        assert now >= last
        last = now
