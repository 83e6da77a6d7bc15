"""Give the memory freed by jobs that went to disk back to the system.

Theory of operation: glibc's allocator keeps freed memory for reuse and
returns it to the system only from the top of its heap.  When read-behind
moves a backlog's jobs to disk, the memory their bodies and records used is
scattered through the heap, and the compact slots that replace them grow
elsewhere (large arrays are mapped apart), so the process would keep the
freed memory in its RSS.  `malloc_trim(0)` releases the free pages inside
the heap too, so every few seconds in which jobs moved to disk the server
calls it.  The slots' arrays grow by reallocation; glibc raises its mmap
threshold each time a mapped block is freed, so after a few doublings the
arrays would come from the heap and leave holes of their old size behind
(RSS 14 % above `used_memory` at a full node).  With read-behind on, the
server fixes the threshold at 128 KiB (`mallopt`), so large blocks stay
mapped and go back to the system when freed or moved (`mremap`).  On a C
library without these calls (not glibc) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

import trio

TRIM_EVERY_S = 5.0
M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
MMAP_THRESHOLD = 128 << 10


def _libc(name: str) -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def malloc_trim() -> Callable[[int], int] | None:
    return _libc("malloc_trim")


def map_large_blocks(mallopt: Callable[[int, int], int] | None = None) -> bool:
    """Fix the size past which blocks are mapped apart (see above); whether
    the C library took it."""
    mallopt = mallopt or _libc("mallopt")
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


async def trim_after_spills(core: Any, trim: Callable[[int], int] | None = None) -> None:
    """The server's task on a node with read-behind: trim the heap after
    jobs moved to disk."""
    trim = trim or malloc_trim()
    if trim is None:
        return
    seen = 0
    while True:
        await trio.sleep(TRIM_EVERY_S)
        spilled = core.read_behind.spilled
        if spilled != seen:
            seen = spilled
            trim(0)
