"""The node's clock: wall-clock time that never steps.

Theory of operation
-------------------
The core reads one time base, `now_ms()`, for everything: local timers
(DELAY, RETRY, blocking timeouts, ACK GC, node timeouts, the deadline loop)
and the values that cross nodes (a job's ctime and absolute expire time).
If that were the wall clock, a step of it (an operator's `date -s`, NTP
stepping a badly wrong clock, a VM resumed) would move every timer at once:
a step back freezes them for its size, a step forward fires them all,
expiring every job whose TTL is shorter than the step.

So `now_ms()` advances with the monotonic clock, and leans toward the wall
clock by at most `SLEW` of the time that passed (10 ms per second), as an
NTP daemon slews rather than steps.  Timers therefore keep running at their
rate within 1% whatever the wall clock does, and a step of S seconds is
absorbed over 100 * S seconds, after which the values sent to other nodes
are the wall clock's again.  Until then they are off by what is left of the
step; that is the price of never moving a timer (docs/reliability.md).

The wall clock is read at most once per `SLEW_EVERY_NS` of monotonic time
(the lean allowed, 1% of the time since the last lean, is the same; a node
that reads its clock once per request reads one clock, not two).

`wall_us()` is the wall clock itself, for what reports the date (TIME,
MONITOR); `since_us()` is the monotonic time since the last `now_ms()`, for
the duration of a command (timed from its step's reading of the clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

SLEW = 0.01  # the largest share of elapsed time by which the clock may lean toward the wall clock
_SLEW_DIV = round(1 / SLEW)
SLEW_EVERY_NS: Final = 1_000_000  # the wall clock is read once this much monotonic time has passed since


class NodeClock:
    __slots__ = ("_ns", "_mono_ns", "_unleaned", "_wall", "_mono")

    def __init__(self, wall_ns: Callable[[], int] = time.time_ns, mono_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._wall, self._mono = wall_ns, mono_ns
        self._mono_ns = mono_ns()
        self._ns = wall_ns()
        self._unleaned = 0  # monotonic ns since the clock last leaned toward the wall clock

    def now_ms(self) -> int:
        mono = self._mono()
        elapsed = mono - self._mono_ns
        self._mono_ns = mono
        at = self._ns + elapsed
        unleaned = self._unleaned + elapsed
        if unleaned >= SLEW_EVERY_NS:
            lean = self._wall() - at
            limit = unleaned // _SLEW_DIV
            at += limit if lean > limit else -limit if lean < -limit else lean
            unleaned = 0
        self._unleaned = unleaned
        self._ns = at
        return at // 1_000_000

    def since_us(self) -> int:
        return (self._mono() - self._mono_ns) // 1000

    def wall_us(self) -> int:
        return self._wall() // 1000

