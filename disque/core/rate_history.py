"""Per-queue rate history: the jobs queued and taken out of each queue over
the last hour, for the dashboard.

Theory of operation: the HTTP port calls `sample(now_s, counters)` every
SLOT_SECONDS with every queue's `jobs_in` and `jobs_out` counters (they only
grow while the queue lives).  What a queue's counters grew since the last
sample is added to the slot of `now_s` (wall-clock time divided in
SLOT_SECONDS slots, so that the nodes' slots line up and `merge` can add
them up); a ring of SLOTS slots per queue keeps the last hour.

Bounded: at most `max_queues` queues have a series of their own.  A queue
gets one when it is first seen with room left, or in the place of a queue
idle for the whole window, and a series is shown until it has been idle for
the whole window.  Its counts start from zero when every queue had a series
at the last sample (the queue is new: its counters started at zero), else
from that sample.  What the queues without a series (and such a queue's
first interval) did goes into `other`: the growth of the sum of every queue's counters less what the
series took.  A queue destroyed meanwhile (an idle, empty queue collected)
takes its counters out of that sum, so `other` can miss what the others did
in that one slot; it never goes below zero.  A counter lower than the last
one seen is a queue made again: it counts from zero.

Pure: the caller gives the time and the counters (a read of the core on the
event loop) and renders `snapshot()`; nothing here reads a clock.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import Any

SLOT_SECONDS = 10
SLOTS = 360  # an hour of 10 s slots
MAX_QUEUES = 200  # queues with a series of their own
COUNT_MAX = 0xFFFFFFFF  # a slot's count saturates (array 'I')


class Series:
    """One queue's ring of slots, and its counters at the last sample."""

    __slots__ = ("ins", "outs", "last_in", "last_out", "active")

    def __init__(self, slots: int, last_in: int, last_out: int, slot: int) -> None:
        self.ins = array("I", bytes(4 * slots))
        self.outs = array("I", bytes(4 * slots))
        self.last_in, self.last_out = last_in, last_out
        self.active = slot  # the last slot that counted a job (at first: when the series began)

    def add(self, index: int, slot: int, jobs_in: int, jobs_out: int) -> None:
        if jobs_in or jobs_out:
            self.ins[index] = min(COUNT_MAX, self.ins[index] + jobs_in)
            self.outs[index] = min(COUNT_MAX, self.outs[index] + jobs_out)
            self.active = slot

    def clear(self, index: int) -> None:
        self.ins[index] = self.outs[index] = 0

    def window(self, first: int) -> dict[str, list[int]]:
        """Oldest first: the ring read from index `first`."""
        ins, outs = self.ins, self.outs
        return {"in": (ins[first:] + ins[:first]).tolist(), "out": (outs[first:] + outs[:first]).tolist()}


class RateHistory:
    def __init__(self, slot_seconds: int = SLOT_SECONDS, slots: int = SLOTS, max_queues: int = MAX_QUEUES) -> None:
        self.slot_seconds, self.slots, self.max_queues = slot_seconds, slots, max_queues
        self.slot: int | None = None  # the newest slot (wall-clock seconds // slot_seconds); None before a sample
        self.series: dict[bytes, Series] = {}
        self.other = Series(slots, 0, 0, 0)  # last_in / last_out: the sums of every queue's counters
        self.complete = False  # every queue had a series at the last sample

    def sample(self, now_s: float, counters: Iterable[tuple[bytes, int, int]]) -> None:
        """Count what every queue did since the last sample (`counters`:
        name, jobs_in, jobs_out) in the slot of `now_s`.  A clock that went
        back counts in the newest slot."""
        slot = int(now_s // self.slot_seconds)
        first = self.slot is None
        if first or slot > self.slot:  # type: ignore[operator]
            self._advance(slot)
        index = self.slot % self.slots  # type: ignore[operator]
        total_in = total_out = taken_in = taken_out = 0
        seen, complete = set(), True  # complete: no queue was left without a series (then none has room)
        for name, jobs_in, jobs_out in counters:
            total_in += jobs_in
            total_out += jobs_out
            seen.add(name)
            series = self.series.get(name)
            if series is None:
                if not complete or not self._room():  # once a queue found no room, none does in this sample
                    complete = False
                    continue
                new = self.complete and not first  # made since the last sample: counted from zero
                series = self.series[name] = Series(self.slots, 0 if new else jobs_in, 0 if new else jobs_out, self.slot)  # type: ignore[arg-type]
            grew_in = jobs_in - series.last_in if jobs_in >= series.last_in else jobs_in
            grew_out = jobs_out - series.last_out if jobs_out >= series.last_out else jobs_out
            series.last_in, series.last_out = jobs_in, jobs_out
            series.add(index, self.slot, grew_in, grew_out)  # type: ignore[arg-type]
            taken_in += grew_in
            taken_out += grew_out
        other = self.other
        if not first:
            other.add(index, self.slot, max(0, total_in - other.last_in - taken_in),  # type: ignore[arg-type]
                      max(0, total_out - other.last_out - taken_out))  # fmt: skip
        other.last_in, other.last_out = total_in, total_out
        self.complete = complete
        for name in [name for name, series in self.series.items() if name not in seen and self._idle(series)]:
            del self.series[name]  # gone, and nothing left to show

    def _advance(self, slot: int) -> None:
        """Make `slot` the newest: the slots passed since are emptied."""
        gone = self.slots if self.slot is None else min(slot - self.slot, self.slots)
        for step in range(gone):
            index = (slot - step) % self.slots
            self.other.clear(index)
            for series in self.series.values():
                series.clear(index)
        self.slot = slot

    def _idle(self, series: Series) -> bool:
        return self.slot - series.active >= self.slots  # type: ignore[operator]

    def _room(self) -> bool:
        """Whether a new queue may have a series: room left, or a queue idle for the whole window gives way."""
        if len(self.series) < self.max_queues:
            return True
        idle = next((name for name, series in self.series.items() if self._idle(series)), None)
        if idle is None:
            return False
        del self.series[idle]
        return True

    def snapshot(self) -> dict[str, Any]:
        """The window as plain data, oldest slot first: `end` is when the
        newest slot ends (wall-clock seconds); only the queues with a job
        counted in the window are listed, by name as text."""
        if self.slot is None:
            return {"slot_seconds": self.slot_seconds, "end": 0, "queues": {}, "other": {"in": [], "out": []}}
        first = (self.slot + 1) % self.slots
        queues = {
            name.decode("utf-8", "backslashreplace"): series.window(first)
            for name, series in self.series.items() if not self._idle(series)
        }  # fmt: skip
        return {
            "slot_seconds": self.slot_seconds, "end": (self.slot + 1) * self.slot_seconds,
            "queues": queues, "other": self.other.window(first),
        }  # fmt: skip


def merge(snapshots: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The sum of several nodes' snapshots, lined up on the latest `end` (an
    older snapshot's slots shift back; those that fall out of the window are
    dropped).  Snapshots of another layout than the first (slot length,
    number of slots) are left out."""
    live = [snap for snap in snapshots if snap["end"]]
    if not live:
        return snapshots[0] if snapshots else RateHistory().snapshot()
    step, width = live[0]["slot_seconds"], len(live[0]["other"]["in"])
    live = [snap for snap in live if snap["slot_seconds"] == step and len(snap["other"]["in"]) == width]  # not another version's
    end = max(snap["end"] for snap in live)
    out: dict[str, Any] = {"slot_seconds": step, "end": end, "queues": {}, "other": {"in": [0] * width, "out": [0] * width}}

    def add(into: dict[str, list[int]], window: dict[str, list[int]], shift: int) -> None:
        for key in ("in", "out"):
            target, source = into[key], window[key]
            for i in range(shift, width):
                target[i - shift] += source[i]

    for snap in live:
        shift = (end - snap["end"]) // step
        add(out["other"], snap["other"], shift)
        for name, window in snap["queues"].items():
            add(out["queues"].setdefault(name, {"in": [0] * width, "out": [0] * width}), window, shift)
    return out
