"""Keep CPython's cycle collector off the job store.

Theory of operation
-------------------
CPython frees objects by reference counting; its cycle collector exists for
the garbage that counting cannot free, reference cycles.  It runs a full pass,
which walks every tracked object, each time the objects that survived into
its oldest generation have grown by a quarter.  Every queued job is such an
object, so with a large backlog a full pass stops the node for a long time
(300-420 ms with a million jobs) and finds nothing: jobs hold no cycles.

So every second (the server's deadline pass calls `tick`) what has
survived so far goes to
`gc.freeze()`, which moves it to a permanent generation that the collector
skips.  Frozen objects are still freed by reference counting as soon as
nothing refers to them; the young generations are collected just before, so
no young garbage is frozen.  What freezing can hide is a cycle that becomes
garbage after its objects were frozen (the node makes almost none: a run of
300 client connections with every kind of command left none).  To bound
that, once an hour everything is unfrozen and collected in one full pass.
"""

from __future__ import annotations

import gc
from typing import Any

FREEZE_EVERY_MS = 1_000
FULL_PASS_EVERY_MS = 3_600_000


class GcFreezer:
    """Decides, from the time it is given, which collector calls to make.
    `collector` is the `gc` module, or a stand-in in tests."""

    def __init__(self, collector: Any = gc, now_ms: int = 0) -> None:
        self.gc = collector
        self.next_freeze = now_ms + FREEZE_EVERY_MS
        self.next_full_pass = now_ms + FULL_PASS_EVERY_MS

    def tick(self, now_ms: int) -> None:
        if now_ms >= self.next_full_pass:
            self.next_full_pass = now_ms + FULL_PASS_EVERY_MS
            self.gc.unfreeze()
            self.gc.collect()
        elif now_ms >= self.next_freeze:
            self.gc.collect(1)
        else:
            return
        self.next_freeze = now_ms + FREEZE_EVERY_MS
        self.gc.freeze()
