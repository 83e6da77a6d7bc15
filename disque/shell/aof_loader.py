"""Loading the AOF at start-up (and DEBUG LOADAOF): verify, repair, replay.

Theory of operation (spec/persistence.md §7).  The file is read in chunks
through the streaming parser (store/aof.py's `RecordReader`) and each record
is handed to the core's replay (core/replay.py).  Every LOAD_YIELD_EVERY
records the loader yields, so the event loop can answer -LOADING meanwhile.
What a damaged file costs is decided here: an unfinished last record (a
crash in the middle of a write) or a tail of NUL bytes is cut off (with
`aof-load-truncated yes`, the default) and the node starts; damage followed
by complete records stops the start with a message that names the file and
the offset, for `disque check-aof --fix`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from disque.core.node import NodeCore
from disque.core.replay import Replay
from disque.store.aof import AofCorrupt, RecordReader, all_nul, tail_is_corrupt

log = logging.getLogger("disque")

READ_CHUNK = 4 << 20
LOAD_YIELD_EVERY = 1000  # records between two event-loop turns while loading


class AofLoadError(Exception):
    """The AOF cannot be loaded: the message is logged and the node exits."""


class AofLoader:
    def __init__(self, core: NodeCore, config: Any) -> None:
        self.core = core
        self.config = config
        self.status = core.aof

    def steps(self, path: str) -> Iterator[None]:
        """Replay the file into the core; yields every LOAD_YIELD_EVERY
        records so the event loop can answer -LOADING.  Raises AofLoadError."""
        replay = self.core.begin_load(trust_queued=self.config.aof_enqueue_jobs_once)
        try:
            yield from self._replay_file(path, replay)
        finally:
            self.core.end_load()

    def _replay_file(self, path: str, replay: Replay) -> Iterator[None]:
        config, status = self.config, self.status
        started = time.monotonic()
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed below)
        except OSError as e:
            raise AofLoadError(f"Fatal error: can't open the append log file for reading: {e.strerror}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            status.loading_start_time = int(time.time())
            status.loading_total_bytes = size
            status.loading_loaded_bytes = 0
            status.loading_elapsed = 0.0
            reader = RecordReader()
            truncated_at: int | None = None
            count = 0
            while truncated_at is None:
                chunk = f.read(READ_CHUNK)
                if not chunk:
                    break
                reader.feed(chunk)
                try:
                    for offset, args in reader:
                        replay.apply(offset, args)
                        count += 1
                        if not count % LOAD_YIELD_EVERY:
                            status.loading_loaded_bytes = reader.offset
                            status.loading_elapsed = time.monotonic() - started
                            yield
                            replay.refresh_time()
                except AofCorrupt as e:
                    if not self._rest_is_nul(f, e.byte_offset):
                        raise AofLoadError(
                            f"Bad file format reading the append only file {path}: {e.message} "
                            f"at offset {e.offset} (byte {e.byte_offset}). Make a backup of your AOF file, "
                            f"then use 'disque check-aof --fix {path}'."
                        ) from None
                    truncated_at = e.offset
            if truncated_at is None and reader.pending:
                tail = reader.tail()
                if not all_nul(tail) and tail_is_corrupt(tail):
                    raise AofLoadError(
                        f"Bad file format reading the append only file {path}: damaged record at offset "
                        f"{reader.offset} (complete records follow an unfinished one). Make a backup of "
                        f"your AOF file, then use 'disque check-aof --fix {path}'."
                    )
                truncated_at = reader.offset
        if truncated_at is not None:
            replay.clean_marker = None  # something was being appended after it
            if not config.aof_load_truncated:
                raise AofLoadError(
                    f"Unexpected end of file reading the append only file {path} (last complete record "
                    f"ends at offset {truncated_at}). You can: 1) Make a backup of your AOF file, then use "
                    f"'disque check-aof --fix {path}'. 2) Alternatively you can set the 'aof-load-truncated' "
                    "configuration option to yes and restart the server."
                )
            log.warning("!!! Warning: short read while loading the AOF file %s!!!", path)
            log.warning(
                "!!! Truncating the AOF at offset %d (dropping %d bytes of an unfinished record) !!!",
                truncated_at,
                size - truncated_at,
            )
            self._truncate(path, truncated_at)
            log.warning("AOF loaded anyway because aof-load-truncated is enabled")
        for _ in replay.requeue():
            yield
        queued = replay.requeued
        if replay.clean_marker is not None:
            # trusted once: a crash after this start must not trust it again
            self._truncate(path, replay.clean_marker)
            log.info("Clean shutdown snapshot: %d queued jobs put back in their queues", queued)
        elif queued:
            log.info("aof-enqueue-jobs-once: %d queued jobs put back in their queues", queued)
        status.loading_loaded_bytes = size
        log.info(
            "DB loaded from append only file: %.3f seconds (%d jobs, %d expired while down)",
            time.monotonic() - started,
            replay.loaded - replay.deleted,
            replay.expired,
        )

    @staticmethod
    def _rest_is_nul(f: Any, offset: int) -> bool:
        f.seek(offset)
        while chunk := f.read(READ_CHUNK):
            if not all_nul(chunk):
                return False
        return True

    @staticmethod
    def _truncate(path: str, size: int) -> None:
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise AofLoadError(f"Error truncating the AOF file {path}: {e.strerror}") from None

