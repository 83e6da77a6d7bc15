"""Give the memory freed by jobs that went to disk back to the system.

Theory of operation: glibc's allocator keeps freed memory for reuse and
returns it to the system only from the top of its heap.  When read-behind
moves a backlog's jobs to disk, the memory their bodies and records used is
scattered through the heap, and the compact slots that replace them grow
elsewhere (large arrays are mapped apart), so the process would keep the
freed memory in its RSS.  `malloc_trim(0)` releases the free pages inside
the heap too, so every few seconds in which jobs moved to disk the server
calls it.  On a C library without it (not glibc) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

import trio

TRIM_EVERY_S = 5.0


def malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


async def trim_after_spills(core: Any, trim: Callable[[int], int] | None = None) -> None:
    """The server's task: trim the heap after read-behind moved jobs to disk."""
    trim = trim or malloc_trim()
    if trim is None or core.read_behind is None:
        return
    seen = 0
    while True:
        await trio.sleep(TRIM_EVERY_S)
        spilled = core.read_behind.spilled
        if spilled != seen:
            seen = spilled
            trim(0)
