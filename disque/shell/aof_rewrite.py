"""AOF rewrites: a snapshot of the node written to a new file, and the
diff of what was appended meanwhile.

Theory of operation (spec/persistence.md §6).  Rewrites (BGREWRITEAOF,
automatic growth, CONFIG SET appendonly yes, a suspect file): the core's
`Snapshot` (core/snapshot.py) is taken on the event loop, a worker thread
writes its records to a temp file behind a format marker (store/aof.py),
records arriving meanwhile go to the rewrite's diff (`Rewrite`); back on the
loop the diff is appended, fsynced, and the temp file renamed over the AOF,
which becomes the file the writer appends to (`AofWriter.switch_to`).  A
controlled shutdown writes the same snapshot synchronously and ends it with
a CLEANSHUTDOWN record (`write_clean_snapshot`).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

import trio

from disque.core.node import NodeCore
from disque.core.snapshot import Snapshot
from disque.shell.aof_writer import AofWriter
from disque.store.aof import encode_clean_marker, format_marker
from disque.store.spill import SpillCorrupt

log = logging.getLogger("disque")

SNAPSHOT_WRITE = 1 << 20  # write the snapshot in pieces of this size
INCREMENTAL_FSYNC = 32 << 20
DIFF_IN_MEMORY = 8 << 20  # a rewrite diff past this goes to a file (Rewrite)


class Rewrite:
    """A background rewrite: its file, and the records appended meanwhile
    (the diff, written to the new file at the end).  The diff goes to a file
    of its own past DIFF_IN_MEMORY bytes: a rewrite of a large AOF takes
    long enough for it to grow past the node's memory."""

    __slots__ = ("tmp", "buf", "buf_len", "held", "diff_fd", "diff_error", "cancelled", "started")

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.buf: list[bytes] = []
        self.buf_len = 0  # the whole diff
        self.held = 0  # its bytes in `buf`
        self.diff_fd: int | None = None
        self.diff_error: str | None = None
        self.cancelled = False
        self.started = time.monotonic()

    def add(self, record: bytes) -> None:
        self.buf.append(record)
        self.buf_len += len(record)
        self.held += len(record)
        if self.held >= DIFF_IN_MEMORY and self.diff_error is None:
            try:
                if self.diff_fd is None:
                    self.diff_fd = os.open(self.tmp + ".diff", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                _write_all(self.diff_fd, b"".join(self.buf))
            except OSError as e:
                self.diff_error = e.strerror or str(e)  # the rewrite fails at its end; the AOF is not touched
                return
            self.buf.clear()
            self.held = 0

    def write_diff(self, fd: int) -> int:
        """Append the diff to `fd`; its size."""
        if self.diff_error is not None:
            raise OSError(errno.EIO, self.diff_error)
        if self.diff_fd is not None:
            offset = 0
            while chunk := os.pread(self.diff_fd, 1 << 20, offset):
                _write_all(fd, chunk)
                offset += len(chunk)
        _write_all(fd, b"".join(self.buf))
        return self.buf_len

    def discard(self) -> None:
        if self.diff_fd is not None:
            os.close(self.diff_fd)
            self.diff_fd = None
            try:
                os.unlink(self.tmp + ".diff")
            except OSError:
                pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_snapshot(path: str, records: Iterable[bytes], *, incremental_fsync: bool = True) -> int:
    """The records into a new file at `path`, fsynced; its size.  Runs in
    a worker thread for background rewrites."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        out: list[bytes] = []
        pending = total = unsynced = 0
        for record in records:
            out.append(record)
            pending += len(record)
            if pending >= SNAPSHOT_WRITE:
                _write_all(fd, b"".join(out))
                out.clear()
                total += pending
                unsynced += pending
                pending = 0
                if incremental_fsync and unsynced >= INCREMENTAL_FSYNC:
                    os.fdatasync(fd)
                    unsynced = 0
        if out:
            _write_all(fd, b"".join(out))
            total += pending
        os.fsync(fd)
        return total
    finally:
        os.close(fd)


def _readable(records: Iterable[bytes]) -> Iterator[bytes]:
    """A job on disk that cannot be read fails the snapshot as an I/O error
    would: the old file is kept rather than one without that job."""
    try:
        yield from records
    except SpillCorrupt as e:
        raise OSError(errno.EIO, f"damaged read-behind record: {e}") from None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Rewriter:
    """Starts, finishes and cancels the writer's rewrites."""

    def __init__(self, writer: AofWriter, core: NodeCore, config: Any) -> None:
        self.writer = writer
        self.core = core
        self.config = config
        self.status = core.aof
        self.nursery: trio.Nursery | None = None  # set once the AOF task runs
        self.rewrites = 0

    def start(self) -> bool:
        writer = self.writer
        if writer.rewrite is not None or self.nursery is None:
            return False
        self.status.rewrite_scheduled = False
        # a name per rewrite: a cancelled one may still be writing its own file
        self.rewrites += 1
        name = f"temp-rewriteaof-bg-{os.getpid()}-{self.rewrites}.aof"
        rw = Rewrite(os.path.join(self.config.dir, name))
        snapshot = self.core.snapshot()
        writer.rewrite = rw
        self.status.rewrite_in_progress = True
        self.status.current_rewrite_time_sec = 0
        self.status.rewrite_buffer_length = 0
        log.info("Background append only file rewriting started (%d jobs)", len(snapshot))
        self.nursery.start_soon(self._run, rw, snapshot)
        return True

    async def _run(self, rw: Rewrite, snapshot: Snapshot) -> None:
        incremental = self.config.aof_rewrite_incremental_fsync
        records = _readable(snapshot.records(stop=lambda: rw.cancelled))
        try:
            size = await trio.to_thread.run_sync(
                lambda: write_snapshot(rw.tmp, chain((format_marker(),), records), incremental_fsync=incremental)
            )
        except OSError as e:
            if not rw.cancelled:
                self._failed(rw, f"Background AOF rewrite failed: {e.strerror}")
            return
        finally:
            snapshot.release()
        del snapshot
        if rw.cancelled:
            _remove(rw.tmp)
            return
        self._finish(rw, size)

    def _finish(self, rw: Rewrite, size: int) -> None:
        """On the loop: append the diff, fsync, rename, switch."""
        status, writer = self.status, self.writer
        log.info("Background AOF rewrite terminated with success")
        fd = None
        try:
            fd = os.open(rw.tmp, os.O_WRONLY | os.O_APPEND)
            diff = rw.write_diff(fd)
            os.fdatasync(fd)
            os.rename(rw.tmp, writer.path)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            self._failed(rw, f"Error finishing the AOF rewrite: {e.strerror}")
            return
        finally:
            rw.discard()
        fsync_dir(writer.path)
        log.info("Residual parent diff successfully flushed to the rewritten AOF (%.2f MB)", diff / (1 << 20))
        size += diff
        if status.state != "off":
            writer.switch_to(fd, size)
            if status.state == "wait-rewrite":
                status.state = "on"
                log.info("Background AOF rewrite finished successfully: the append only file is on")
            status.current_size = status.base_size = size
        else:
            os.close(fd)
        writer.rewrite = None
        status.rewrite_in_progress = False
        status.rewrite_buffer_length = 0
        status.current_rewrite_time_sec = -1
        status.last_bgrewrite_ok = True
        status.last_rewrite_time_sec = int(time.monotonic() - rw.started)
        log.info("Background AOF rewrite finished successfully (%d bytes)", size)
        writer.wake()

    def _failed(self, rw: Rewrite, message: str) -> None:
        log.warning("%s", message)
        _remove(rw.tmp)
        rw.discard()
        status = self.status
        if self.writer.rewrite is rw:
            self.writer.rewrite = None
            status.rewrite_in_progress = False
            status.rewrite_buffer_length = 0
            status.current_rewrite_time_sec = -1
            status.last_rewrite_time_sec = int(time.monotonic() - rw.started)
        status.last_bgrewrite_ok = False
        if status.state == "wait-rewrite" or self.writer.fsync_error:
            status.rewrite_scheduled = True  # retried by the cron

    def cancel(self) -> None:
        rw = self.writer.rewrite
        if rw is None:
            return
        log.warning("Killing the running AOF rewrite")
        rw.cancelled = True
        self.writer.rewrite = None
        _remove(rw.tmp)
        rw.discard()
        status = self.status
        status.rewrite_in_progress = False
        status.rewrite_buffer_length = 0
        status.current_rewrite_time_sec = -1

    def cron(self) -> None:
        status, config = self.status, self.config
        rw = self.writer.rewrite
        if rw is not None:
            status.current_rewrite_time_sec = int(time.monotonic() - rw.started)
        elif status.rewrite_scheduled:
            self.start()
        elif status.state == "on" and config.auto_aof_rewrite_percentage:
            base = status.base_size or 1
            growth = status.current_size * 100 // base - 100
            if status.current_size > config.auto_aof_rewrite_min_size and growth >= config.auto_aof_rewrite_percentage:
                log.info("Starting automatic rewriting of AOF on %d%% growth", growth)
                self.start()

    def write_clean_snapshot(self) -> int:
        """Synchronous rewrite ending with the CLEANSHUTDOWN marker."""
        path = self.writer.path
        tmp = os.path.join(self.config.dir, f"temp-rewriteaof-{os.getpid()}.aof")
        started = time.monotonic()
        snapshot = self.core.snapshot()
        marker = encode_clean_marker(self.core.clock.now_ms())
        try:
            size = write_snapshot(
                tmp, _readable(chain((format_marker(),), snapshot.records(), (marker,))),
                incremental_fsync=self.config.aof_rewrite_incremental_fsync,
            )  # fmt: skip
            os.rename(tmp, path)
        except OSError:
            _remove(tmp)
            raise
        finally:
            snapshot.release()
        fsync_dir(path)
        on_disk = len(snapshot.spilled)
        log.warning(
            "Shutdown snapshot of the AOF written: %d jobs (%d queued, %d on disk), %d bytes in %.3f seconds",
            len(snapshot), snapshot.queued(), on_disk, size, time.monotonic() - started,
        )  # fmt: skip
        return size
