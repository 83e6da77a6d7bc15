"""The settings the request path reads, typed: a copy `Config` keeps current.

Theory of operation: `Config` (core/config.py) is a plain object with one
attribute per directive, so the compiled core reads each with a generic
attribute lookup, and a request reads several.  `Settings` is a native
class (compiled) holding the few that every request, or every job, reads:
the compiled build reads them as fields.  `Config.__setattr__` copies each
assignment of one of `HOT` here (its defaults, a config file's lines,
CONFIG SET, RELOAD's queue settings, a test setting the attribute), so the
copy is never stale; nothing else writes it.
"""

from __future__ import annotations

from typing import Final

from disque.store.queue_config import QueueConfig

HOT: Final = frozenset({
    "requirepass", "maxmemory", "job_memory_limit", "min_zones", "slowlog_log_slower_than",
    "client_output_buffer_limit", "priority_aging", "queue_config", "max_job_size",
})  # fmt: skip


class Settings:
    """The values of `HOT`, under the attribute names `Config` gives them
    (the values here until `Config` sets them: placeholders)."""

    def __init__(self) -> None:
        self.requirepass: str | None = None
        self.maxmemory = 0
        self.job_memory_limit = 0
        self.min_zones = 1
        self.slowlog_log_slower_than = 0
        self.client_output_buffer_limit: tuple[int, int, int] = (0, 0, 0)
        self.priority_aging = 0
        self.queue_config = QueueConfig()
        self.max_job_size = 0
