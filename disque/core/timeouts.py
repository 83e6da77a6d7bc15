"""Blocked clients' deadlines, kept to the millisecond.

Theory of operation: a client blocked with a timeout (GETJOB TIMEOUT, a
memcache GET `/t=`, WAITJOB, QGET's wait for a remote answer, a late AUTH
answer) has a `Waiter` with an absolute deadline.  `NodeCore.next_deadline`
asks `next()` for the earliest one and `NodeCore.tick` takes the `due(now)`
ones, so a timeout fires when it falls instead of at the next 100 ms client
cron; nothing is done per request that does not block.

The heap is lazy: a waiter that stops waiting before its deadline (served,
disconnected) leaves its entry behind, stale.  A stale entry is dropped when
it reaches the top (so it never makes the shell wake up for nothing), or
when stale entries outnumber the live ones by COMPACT_SLACK, which rebuilds
the heap from the live ones: memory stays within about twice the waiters.
A waiter is live while it is its client's waiter (`NodeCore.drop_waiter`
clears that first).  Equal deadlines fire in blocking order.
"""

from __future__ import annotations

import heapq

from disque.core.types import Waiter

COMPACT_SLACK = 64  # stale entries tolerated beyond the live ones before a rebuild


def _live(waiter: Waiter) -> bool:
    return waiter.client.waiter is waiter


class Timeouts:
    __slots__ = ("heap", "live", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, Waiter]] = []  # (deadline, blocking order, waiter)
        self.live = 0  # waiters with a deadline still waiting
        self.seq = 0

    def add(self, waiter: Waiter) -> None:
        """`waiter` blocked with a deadline."""
        self.seq += 1
        self.live += 1
        heapq.heappush(self.heap, (waiter.deadline, self.seq, waiter))

    def dropped(self) -> None:
        """A waiter with a deadline stopped waiting (timed out or not)."""
        self.live -= 1
        if len(self.heap) > 2 * self.live + COMPACT_SLACK:
            self.heap = [entry for entry in self.heap if _live(entry[2])]
            heapq.heapify(self.heap)

    def next(self) -> int | None:
        """The earliest deadline of a waiter still waiting, if any."""
        heap = self.heap
        while heap and not _live(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def due(self, now: int) -> list[Waiter]:
        """The waiters whose deadline is `now` or earlier, in deadline order;
        the caller unblocks them."""
        heap = self.heap
        out = []
        while heap and heap[0][0] <= now:
            waiter = heapq.heappop(heap)[2]
            if _live(waiter):
                out.append(waiter)
        return out
