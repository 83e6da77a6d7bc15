"""AOF status as INFO reports it (persistence.md §11).

Theory of operation: the shell's AOF writer updates an `AofStatus`; the core
only reads it to answer INFO and to decide whether records are logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class AofStatus:
    state: str = "off"  # off | on | wait-rewrite
    rewrite_in_progress: bool = False
    rewrite_scheduled: bool = False
    last_rewrite_time_sec: int = -1
    current_rewrite_time_sec: int = -1
    last_bgrewrite_ok: bool = True
    last_write_ok: bool = True
    current_size: int = 0
    base_size: int = 0
    buffer_length: int = 0
    rewrite_buffer_length: int = 0
    pending_bio_fsync: int = 0
    delayed_fsync: int = 0

    def info_fields(self, loading: bool) -> list[tuple[str, Any]]:
        fields: list[tuple[str, Any]] = [
            ("loading", int(loading)),
            ("aof_enabled", int(self.state != "off")),
            ("aof_state", self.state),
            ("aof_rewrite_in_progress", int(self.rewrite_in_progress)),
            ("aof_rewrite_scheduled", int(self.rewrite_scheduled)),
            ("aof_last_rewrite_time_sec", self.last_rewrite_time_sec),
            ("aof_current_rewrite_time_sec", self.current_rewrite_time_sec),
            ("aof_last_bgrewrite_status", "ok" if self.last_bgrewrite_ok else "err"),
            ("aof_last_write_status", "ok" if self.last_write_ok else "err"),
        ]
        if self.state != "off":
            fields += [
                ("aof_current_size", self.current_size),
                ("aof_base_size", self.base_size),
                ("aof_pending_rewrite", int(self.rewrite_scheduled)),
                ("aof_buffer_length", self.buffer_length),
                ("aof_rewrite_buffer_length", self.rewrite_buffer_length),
                ("aof_pending_bio_fsync", self.pending_bio_fsync),
                ("aof_delayed_fsync", self.delayed_fsync),
            ]
        return fields
