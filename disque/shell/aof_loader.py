"""Loading the AOF at start-up (and DEBUG LOADAOF): verify, repair, replay.

Theory of operation (spec/persistence.md §7).  The file is read in chunks
through the streaming parser (store/aof.py's `RecordReader`) and each record
is handed to the core's replay (core/replay.py).  Every LOAD_YIELD_EVERY
records the loader yields, so the event loop can answer -LOADING meanwhile.
What a damaged file costs is decided here (docs/persistence.md): every
record's seal is checked as it is read, and a record that fails it is never
applied.  Damage with nothing whole after it (an unfinished last record, a
torn or bit-flipped one, a tail of NUL bytes) is a crash in the middle of a
write: the file is cut back to the last whole record (`aof-load-truncated
yes`, the default) and the node starts.  Damage with whole records after
it (bit rot) is skipped to the next whole record (`aof-load-damaged yes`,
the default), logged with the jobs it held and counted in INFO, or stops
the start with a message that names the file and the offset.  A file that
had damage or records without seals (an older version) is rewritten once
loaded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from disque.core.node import NodeCore
from disque.core.replay import Replay
from disque.store.aof import LOADJOB, AofCorrupt, RecordReader
from disque.store.records import DecodeError, decode_storage

log = logging.getLogger("disque")

READ_CHUNK = 4 << 20
LOAD_YIELD_EVERY = 1000  # records between two event-loop turns while loading


class AofLoadError(Exception):
    """The AOF cannot be loaded: the message is logged and the node exits."""


class Damage:
    """Damaged bytes from `start`, and the jobs of the damaged LOADJOBs
    whose IDs can still be read."""

    def __init__(self, start: int, reason: str, byte: int) -> None:
        self.start = start
        self.reason = reason
        self.byte = byte
        self.jobs: list[tuple[bytes, bytes]] = []

    def note(self, record: list[bytes] | None) -> None:
        if record and len(record) == 2 and record[0].upper() == LOADJOB:
            try:
                job = decode_storage(record[1])
            except DecodeError:
                return  # its ID went with it
            self.jobs.append((job.id, job.queue))


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
            status.damaged_records = status.damaged_bytes = status.dropped_jobs = 0  # what this load costs
            reader = RecordReader()
            damage: Damage | None = None  # damaged bytes not yet known to be in the middle or at the end
            dropped: list[tuple[bytes, bytes]] = []  # (job ID, queue) of the damaged LOADJOBs skipped
            count = 0
            final = False
            while not final:
                chunk = f.read(READ_CHUNK)
                final = not chunk
                reader.feed(chunk)
                while True:
                    try:
                        for offset, args in reader:
                            if damage is not None:  # whole records follow it: damage in the middle
                                self._skip_damage(path, damage, offset, dropped)
                                damage = None
                            try:
                                replay.apply(offset, args)
                            except AofCorrupt as e:  # well framed, not valid: the reader is past it
                                e.end, e.record = reader.offset, args
                                raise
                            count += 1
                            if not count % LOAD_YIELD_EVERY:
                                status.loading_loaded_bytes = reader.offset
                                status.loading_elapsed = time.monotonic() - started
                                yield
                                replay.refresh_time()
                    except AofCorrupt as e:
                        damage = damage or Damage(e.offset, e.message, e.byte_offset)
                        damage.note(e.record)
                        if e.end is None:
                            reader.skip(final)
                        continue
                    if final and reader.pending:  # an unfinished record: torn, unless whole records follow
                        damage = damage or Damage(reader.offset, "unfinished record", reader.offset)
                        reader.skip(final)
                        continue
                    break
        if damage is not None:
            replay.clean_marker = None  # something was being appended after it
            if not config.aof_load_truncated:
                raise AofLoadError(
                    f"Unexpected end of file reading the append only file {path} (last complete record "
                    f"ends at offset {damage.start}). You can: 1) Make a backup of your AOF file, then use "
                    f"'disque check-aof --fix {path}'. 2) Alternatively you can set the 'aof-load-truncated' "
                    "configuration option to yes and restart the server."
                )
            log.warning("!!! Warning: short read while loading the AOF file %s!!!", path)
            log.warning(
                "!!! Truncating the AOF at offset %d (dropping %d bytes of an unfinished record) !!!",
                damage.start,
                size - damage.start,
            )
            dropped += damage.jobs
            self._truncate(path, damage.start)
            log.warning("AOF loaded anyway because aof-load-truncated is enabled")
        self._report_dropped(dropped)
        if config.appendonly and (reader.unsealed or status.damaged_records):
            status.rewrite_scheduled = True  # a whole file, every record sealed
            log.warning(
                "The AOF will be rewritten: %s",
                "it has damaged records" if status.damaged_records else "its records have no checksums (older version)",
            )
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

    def _skip_damage(self, path: str, damage: Damage, end: int, dropped: list[tuple[bytes, bytes]]) -> None:
        """Damage with whole records after it (bit rot, a bad copy): never
        delivered.  Refuse to start (`aof-load-damaged no`), or start
        without it, logged and counted (INFO, /metrics)."""
        where = f"{damage.reason} at offset {damage.start} (byte {damage.byte})"
        if not self.config.aof_load_damaged:
            raise AofLoadError(
                f"Bad file format reading the append only file {path}: {where}. Make a backup of your AOF "
                f"file, then use 'disque check-aof --fix {path}', or set 'aof-load-damaged' to yes to start "
                "without the damaged records."
            )
        status = self.status
        status.damaged_records += 1
        status.damaged_bytes += end - damage.start
        log.warning("!!! Damaged records in the AOF file %s: %s, %d bytes skipped !!!", path, where, end - damage.start)
        dropped += damage.jobs

    def _report_dropped(self, dropped: list[tuple[bytes, bytes]]) -> None:
        """The jobs whose LOADJOB was skipped and that no later record
        brought back: lost here; a copy on another node comes back when its
        retry time requeues it."""
        jobs = self.core.jobs
        for job_id, queue in dropped:
            if job_id not in jobs:
                self.status.dropped_jobs += 1
                log.warning(
                    "Job %s of queue %s dropped: its AOF record is damaged (other nodes holding a copy "
                    "requeue it after its retry time)",
                    job_id.decode("ascii", "replace"),
                    queue.decode("utf-8", "replace"),
                )

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

