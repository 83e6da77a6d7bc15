"""The node's clock against a wall clock that steps (fake sources)."""

from __future__ import annotations

from disque.shell.clock import SLEW, SLEW_EVERY_NS, NodeClock

START_NS = 1_700_000_000_000 * 1_000_000


class Sources:
    def __init__(self) -> None:
        self.wall = START_NS
        self.mono = 5 * 10**9
        self.wall_reads = 0

    def read_wall(self) -> int:
        self.wall_reads += 1
        return self.wall

    def run(self, ms: int) -> None:
        self.wall += ms * 1_000_000
        self.mono += ms * 1_000_000


def clock() -> tuple[NodeClock, Sources]:
    src = Sources()
    return NodeClock(src.read_wall, lambda: src.mono), src


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


def test_the_wall_clock_is_read_once_a_millisecond_and_still_caught_up():
    """Requests microseconds apart read the monotonic clock only; the lean
    the skipped readings allowed is taken at the next one."""
    c, src = clock()
    src.run(1_000)
    start = c.now_ms()
    src.wall += 50 * 1_000_000  # 50 ms forward
    reads = src.wall_reads
    for _ in range(10_000):
        src.mono += 10_000  # 10 µs a request: 100 ms of requests
        src.wall += 10_000
        c.now_ms()
    assert src.wall_reads - reads == 10_000 * 10_000 // SLEW_EVERY_NS
    assert c.now_ms() - start == 100 + 1  # leaned 1 % of the 100 ms, as reading every time would


def test_a_command_is_timed_from_the_reading_of_its_step():
    c, src = clock()
    c.now_ms()
    src.mono += 1_234_567
    assert c.since_us() == 1_234 and c.since_us() == 1_234  # reading it starts nothing
    c.now_ms()
    assert c.since_us() == 0
