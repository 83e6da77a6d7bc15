"""The AOF writer of a running node: the buffer, its waiters, fsync, errors.

Theory of operation (spec/persistence.md §5-§9).  The core emits records as
`AofAppend` effects; the server hands them to `append`, which adds them to
the in-memory buffer (and to the rewrite's diff while a rewrite runs,
shell/aof_rewrite.py).  At the end of every batch of effects the server
calls `flush`, which writes the buffer with one `write()`.  Before the
server sends any reply bytes it asks `hold()` for the offset those replies
depend on: 0 when every record they follow is in the file (`always`: and
fsynced); otherwise it sends them once `when_safe()` calls back
(`barrier()`, the awaitable form, serves TLS clients).  A client that got a
reply can therefore count on its records being at least in the OS page
cache, and with `always` on the disk.

fsync happens in a worker thread (`fsync_loop`).  With `always` the thread
does group commit: every client waiting at the barrier is released by the
first fdatasync that covers its records.  A batch that also sends bus
messages is fsynced inline before returning, because bus frames do not wait
at the barrier (a replica must not answer GOTJOB before its LOADJOB is
durable).  With `everysec` a background fsync starts when the wall-clock
second has changed; while one is running writes are postponed for up to 2 s
(`aof_delayed_fsync` counts the writes made anyway).  `no` never fsyncs.

A write that fails for want of room (no space, file too large) is undone
with ftruncate, the data stays in the buffer, the node enters MISCONF
(`core.aof_error`) and the cron retries every 100 ms until a write
succeeds.  Replies held for records that could not be written are not
sent: `when_safe`'s `on_error` callback has them answered with the error
instead (`failed` says when), so nothing acknowledged is lost and no client
waits for a disk that may stay full.  While the file fails, a reply waits
only for the LOADJOBs among its records (`needed`): a DELJOB or a GROUPSET
lost in a crash costs a redelivery, never a job, so consumers (ACKJOB,
QACK) are answered and drain what filled the disk; their records are
written once it has room.

A failing fsync, or a write failing with EIO, is never retried: the kernel
may have dropped the dirty pages it could not write and marked them clean,
so a later fsync that succeeds proves nothing about them (PostgreSQL's
"fsyncgate").  The file is then *suspect* (`fsync_error`): the node answers
MISCONF to every write that needs the AOF and says why, a rewrite is
scheduled, and only the rewrite's new file, written from memory and
fsynced whole, clears the error (`switch_to`).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from disque.core.node import NodeCore
from disque.store.aof import format_marker

if TYPE_CHECKING:
    from disque.shell.aof_rewrite import Rewrite

log = logging.getLogger("disque")

POSTPONE_MAX = 2.0  # seconds a write may wait for a running everysec fsync

_LOADJOB = b"*3\r\n$7\r\nLOADJOB\r\n"  # (store/aof.py's loadjob_record)


class AofWriter:
    def __init__(self, core: NodeCore, config: Any) -> None:
        self.core = core
        self.config = config  # Config's attributes are its directives, set at run time
        self.status = core.aof
        self.fd: int | None = None
        self.file_size = 0
        self.buf: list[bytes] = []
        self.buf_len = 0
        # logical offsets in the stream of records sent to the normal buffer
        self.appended = 0
        self.written = 0
        self.synced = 0
        self.sync_upto = 0  # the end of the last record of a `sync_journal` queue
        self.needed = 0  # the end of the last LOADJOB appended: what replies wait for while the file fails
        self.waiters: deque[tuple[int, Callable[[], None], Callable[[], None] | None]] = deque()
        self.targets: dict[Any, tuple[int, int]] = {}  # connection -> offsets its next reply waits for (all, needed)
        self.mark = 0  # `appended` at the end of the previous flush
        self.rewrite: Rewrite | None = None  # the running rewrite, whose diff gets every record too
        self.fsync_running = False
        self.fsync_wanted: trio.Event | None = None
        self.last_fsync_sec = 0
        self.postponed_since = 0.0
        self.close_after_fsync: list[int] = []
        self.write_error: str | None = None
        self.fsync_error: str | None = None  # the file is suspect until a rewrite replaced it (see above)
        self.bus_seen = 0
        self.fault: str | None = None  # DEBUG AOF-FAULT: the next `write` or `fsync` fails with EIO
        if hasattr(signal, "SIGXFSZ"):
            # a file-size limit must give EFBIG (MISCONF), not kill the node
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    @property
    def path(self) -> str:
        return os.path.join(self.config.dir, self.config.appendfilename)

    def append(self, record: bytes, sync: bool = False) -> None:
        state = self.status.state
        if state == "on":
            self.buf.append(record)
            self.buf_len += len(record)
            self.appended += len(record)
            if record.startswith(_LOADJOB):
                self.needed = self.appended
            self.status.buffer_length = self.buf_len
            if sync:  # a `sync_journal` queue: replies after it wait for an fsync, whatever the policy
                self.sync_upto = self.appended
        rw = self.rewrite
        if rw is not None and state != "off":
            rw.add(record)
            self.status.rewrite_buffer_length = rw.held

    def _fsync_allowed(self) -> bool:
        return not (self.rewrite is not None and self.config.no_appendfsync_on_rewrite)

    def _level(self) -> float:
        """Offset up to which records count as safe for the current policy."""
        if self.fd is None or self.status.state != "on":
            return float("inf")
        if (self.config.appendfsync == "always" or self.sync_upto > self.synced) and self._fsync_allowed():
            return self.synced
        return self.written

    def hold(self, conn: Any = None) -> int:
        """The offset the replies queued for a connection must wait for,
        or 0 when they may be sent now: the records of the connection's last
        commands (`flush(conn)`), or else every record appended so far;
        while the file fails, their LOADJOBs only (see above)."""
        targets = self.targets.pop(conn, None) if conn is not None else None
        if self.fd is None:
            return 0
        target, needed = (self.appended, self.needed) if targets is None else targets
        if self.write_error is not None or self.fsync_error is not None:
            target = needed
        return 0 if target <= self._level() else target

    def safe(self, target: int) -> bool:
        return target <= self._level()

    def failed(self, target: int) -> str | None:
        """Why the records up to `target` cannot be safe for now (their
        write, or the fsync they wait for, failed), or None."""
        if self.write_error is not None and target > self.written:
            return self.write_error
        if self.fsync_error is not None and target > self._level():
            return self.fsync_error
        return None

    def when_safe(self, target: int, callback: Callable[[], None], on_error: Callable[[], None] | None = None) -> None:
        """Call `callback` (on the event loop) once `target` is safe, or
        `on_error`, if given, once it `failed`."""
        self.waiters.append((target, callback, on_error))

    def _fail_waiters(self) -> None:
        """A write or fsync failed: the waiters it leaves unsafe that can be
        told hear it now."""
        failed = [w for w in self.waiters if w[2] is not None and self.failed(w[0]) is not None]
        if failed:
            self.waiters = deque(w for w in self.waiters if w[2] is None or self.failed(w[0]) is None)
            for waiter in failed:
                waiter[2]()  # type: ignore[misc]

    async def barrier(self, conn: Any = None) -> str | None:
        """Wait until the replies queued for `conn` may be sent (`hold`):
        None, or why their records cannot be written for now (`failed`),
        at once, the replies then to be answered with -MISCONF."""
        target = self.hold(conn)
        if not target:
            return None
        refused = self.failed(target)
        if refused is None:
            event = trio.Event()
            outcome: list[str | None] = [None]

            def on_error() -> None:
                outcome[0] = self.failed(target)
                event.set()

            self.when_safe(target, event.set, on_error)
            await event.wait()
            refused = outcome[0]
        return refused

    def wake(self) -> None:
        waiters = self.waiters
        if not waiters:
            return
        level = self._level()
        while waiters and waiters[0][0] <= level:
            waiters.popleft()[1]()

    def flush(self, current: Any = None, force: bool = False) -> None:
        """Write the buffer (end of every batch of effects, and cron).
        `current` is the connection whose commands produced this batch: its
        next reply waits for these records only (none: no wait), so a client
        reading during a write error is not held up by someone else's
        unwritten record."""
        if self.fd is None:
            return
        if current is not None:
            appended, needed = self.appended, self.needed
            self.targets[current] = (appended if appended != self.mark else 0, needed if needed > self.mark else 0)
        self.mark = self.appended
        policy = self.config.appendfsync
        if self.buf:
            if policy == "everysec" and self.fsync_running and not force:
                now = time.monotonic()
                if not self.postponed_since:
                    self.postponed_since = now
                    return
                if now - self.postponed_since < POSTPONE_MAX:
                    return
                self.status.delayed_fsync += 1
                log.warning(
                    "Asynchronous AOF fsync is taking too long (disk is busy?). Writing the AOF buffer "
                    "without waiting for fsync to complete, this may slow down Disque."
                )
            self.postponed_since = 0.0
            if not self._write():
                return
            if self._fsync_allowed() and not self.fsync_error:
                if policy == "always" or self.sync_upto > self.synced:
                    self._request_fsync()
                elif policy == "everysec" and not self.fsync_running and int(time.time()) != self.last_fsync_sec:
                    self._request_fsync()
        bus = self.core.stats.bus_sent
        if bus != self.bus_seen:
            self.bus_seen = bus
            if policy == "always" and self.written > self.synced and self._fsync_allowed() and not self.fsync_error:
                self._fsync_inline()
        self.wake()

    def _write(self) -> bool:
        data = b"".join(self.buf) if len(self.buf) > 1 else self.buf[0]
        fd = self.fd
        assert fd is not None
        done = 0
        try:
            view = memoryview(data)
            self._injected("write")
            while done < len(data):
                done += os.write(fd, view[done:])
        except OSError as e:
            if done:
                try:
                    os.ftruncate(fd, self.file_size)
                    done = 0
                except OSError as te:
                    log.warning("Could not remove short write from the append-only file: %s", te.strerror)
            if done:  # those bytes stay in the file: account for them
                self._written(done)
                data = data[done:]
            self.buf = [data]
            self.buf_len = len(data)
            self.status.buffer_length = self.buf_len
            self._set_write_error(e)
            return False
        self.buf.clear()
        self.buf_len = 0
        self.status.buffer_length = 0
        self._written(len(data))
        if self.write_error is not None:
            if self.fsync_error is None:
                log.warning("AOF write error looks solved, Disque can write again.")
            self.write_error = None
            self._update_error()
        return True

    def _written(self, n: int) -> None:
        self.file_size += n
        self.written += n
        self.status.current_size = self.file_size

    def _set_write_error(self, e: OSError) -> None:
        strerror = e.strerror or str(e)
        if self.write_error is None:
            log.warning("Error writing to the AOF file: %s", strerror)
        self.write_error = strerror
        if e.errno == errno.EIO and self.fsync_error is None:  # what was written before may be lost too
            log.warning("The AOF file can no longer be trusted: rewriting it from memory.")
            self._suspect(strerror)
        self._update_error()
        self._fail_waiters()

    def _update_error(self) -> None:
        error = self.write_error or self.fsync_error
        self.core.set_aof_error(error)
        self.status.last_write_ok = error is None

    def inject_fault(self, kind: str | None) -> None:
        """DEBUG AOF-FAULT: the next write or fsync of the file fails with
        EIO, as the kernel reports a failing disk (a test of what follows)."""
        self.fault = kind

    def _injected(self, kind: str) -> None:
        if self.fault == kind:
            self.fault = None
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    # ------------------------------------------------------------ fsync

    def _fdatasync(self, fd: int) -> None:
        self._injected("fsync")
        os.fdatasync(fd)

    def _request_fsync(self) -> None:
        if self.fsync_wanted is not None:
            self.fsync_wanted.set()

    def _fsync_inline(self) -> None:
        assert self.fd is not None
        target, size = self.written, self.file_size
        try:
            self._fdatasync(self.fd)
        except OSError as e:
            self._fsync_failed(e)
            return
        self._synced(target, size)
        self.last_fsync_sec = int(time.time())

    def _synced(self, target: int, size: int) -> None:
        """The records up to `target` (the file up to `size`) are on disk."""
        if target > self.synced:
            self.synced = target
            self.status.fsynced_size = size

    def _fsync_failed(self, e: OSError) -> None:
        strerror = e.strerror or str(e)
        log.warning("Error syncing the AOF file to disk: %s. Rewriting it from memory.", strerror)
        self._suspect(strerror)
        self._update_error()
        self._fail_waiters()

    def _suspect(self, strerror: str) -> None:
        """Never retried (see above): writes that need the AOF get MISCONF
        until a rewrite's new file is fsynced whole."""
        self.fsync_error = strerror
        self.status.rewrite_scheduled = True

    async def fsync_loop(self) -> None:
        while True:
            assert self.fsync_wanted is not None
            await self.fsync_wanted.wait()
            self.fsync_wanted = trio.Event()
            fd = self.fd
            if fd is None or self.written <= self.synced or self.fsync_error:
                continue
            target, size = self.written, self.file_size
            self.fsync_running = True
            self.status.pending_bio_fsync = 1
            try:
                await trio.to_thread.run_sync(self._fdatasync, fd)
            except OSError as e:
                if fd == self.fd:
                    self._fsync_failed(e)
            else:
                if fd == self.fd:
                    self._synced(target, size)
            finally:
                self.fsync_running = False
                self.status.pending_bio_fsync = 0
                self.last_fsync_sec = int(time.time())
                for old in self.close_after_fsync:
                    os.close(old)
                self.close_after_fsync.clear()
            if self.buf and self.postponed_since:
                self.flush()  # writes postponed behind this fsync
            self.wake()
            if self.config.appendfsync == "always" and self.written > self.synced:
                self._request_fsync()  # records written while we synced

    def _close_fd(self, fd: int) -> None:
        if self.fsync_running:
            self.close_after_fsync.append(fd)
        else:
            os.close(fd)


    def sync_cron(self) -> None:
        """The cron's part: write what waits, and start the fsync the
        policy asks for."""
        if self.buf and self.status.state == "on":
            self.flush()
        if (
            self.fd is not None
            and self.status.state == "on"
            and self.written > self.synced
            and not self.fsync_running
            and not self.fsync_error
            and self._fsync_allowed()
        ):
            policy = self.config.appendfsync
            if policy == "always" or (policy == "everysec" and int(time.time()) != self.last_fsync_sec):
                self._request_fsync()

    # ------------------------------------------------------------ the file

    def open(self, fd: int) -> None:
        """Append to `fd` (the file just loaded) from now on."""
        self.fd = fd
        self.file_size = os.fstat(fd).st_size
        self.written = self.synced = self.appended  # offsets only grow
        self.status.state = "on"
        self.status.current_size = self.status.base_size = self.status.fsynced_size = self.file_size
        self.bus_seen = self.core.stats.bus_sent
        if not self.file_size:  # a new file: every record of it is sealed
            self.append(format_marker())

    def switch_to(self, fd: int, size: int) -> None:
        """Append to a rewrite's new file, fsynced whole with everything
        appended so far: the buffer is in it, and errors are over."""
        old = self.fd
        self.fd = fd
        if old is not None:
            self._close_fd(old)
        self.buf.clear()  # its content is in the new file
        self.buf_len = self.status.buffer_length = 0
        self.written = self.synced = self.appended
        self.postponed_since = 0.0
        self.file_size = self.status.fsynced_size = size
        if self.write_error or self.fsync_error:
            log.warning("AOF write error looks solved, Disque can write again.")
        self.write_error = self.fsync_error = None
        self._update_error()

    def close(self) -> None:
        """Stop appending (CONFIG SET appendonly no): what the buffer holds
        is written, and the waiters are released."""
        if self.status.state == "on" and self.buf:
            self.flush(force=True)
        self.datasync_quietly()
        if self.fd is not None:
            self._close_fd(self.fd)
        self.fd = None
        self.status.buffer_length = 0
        self.buf.clear()
        self.buf_len = 0
        self.write_error = self.fsync_error = None
        self._update_error()
        self.written = self.synced = self.appended  # offsets only grow
        while self.waiters:  # nothing more will be written for them
            self.waiters.popleft()[1]()

    def datasync_quietly(self) -> None:
        """fdatasync the open file, if any; a failure is not reported (the
        caller is leaving or reloading the file, not acknowledging writes)."""
        if self.fd is not None:
            try:
                os.fdatasync(self.fd)
            except OSError:
                pass
