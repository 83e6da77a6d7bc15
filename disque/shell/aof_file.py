"""The AOF writer of a running node: files, fsync, rewrites, loading.

Theory of operation (spec/persistence.md §5-§9).  The core emits records as
`AofAppend` effects; the server hands them to `append`, which adds them to
the in-memory buffer (and to the rewrite buffer while a rewrite runs).  At
the end of every batch of effects the server calls `flush`, which writes the
buffer with one `write()`.  Before the server sends any reply bytes it
asks `hold()` for the offset those replies depend on: 0 when every record
they follow is in the file (`always`: and fsynced); otherwise it sends them
once `when_safe()` calls back (`barrier()`, the awaitable form, serves
TLS clients).  A client that got a reply can therefore count on its records being at least in the
OS page cache, and with `always` on the disk.

fsync happens in a worker thread (`_fsync_loop`).  With `always` the thread
does group commit: every client waiting at the barrier is released by the
first fdatasync that covers its records.  A batch that also sends bus
messages is fsynced inline before returning, because bus frames do not wait
at the barrier (a replica must not answer GOTJOB before its LOADJOB is
durable).  With `everysec` a background fsync starts when the wall-clock
second has changed; while one is running writes are postponed for up to 2 s
(`aof_delayed_fsync` counts the writes made anyway).  `no` never fsyncs.

A failing write (no space, file too large, I/O error) is undone with
ftruncate, the data stays in the buffer, the node enters MISCONF
(`core.aof_error`) and the cron retries every 100 ms until a write
succeeds.  Replies held for records that could not be written are not
sent: `when_safe`'s `on_error` callback has them answered with the error
instead (`failed` says when), so nothing acknowledged is lost and no
client waits for a disk that may stay full.  While the file fails, a reply
waits only for the LOADJOBs among its records (`needed`): a DELJOB or a
GROUPSET lost in a crash costs a redelivery, never a job, so consumers
(ACKJOB, QACK) are answered and drain what filled the disk; their records
are written once it has room.  A failing fsync schedules a rewrite instead
(the kernel may have dropped the dirty pages).

Rewrites (BGREWRITEAOF, automatic growth, CONFIG SET appendonly yes): the
list of active/queued jobs is taken on the event loop, a worker thread
encodes and writes it to a temp file, records arriving meanwhile go to the
rewrite buffer; back on the loop the buffer is appended, fsynced, and the
temp file renamed over the AOF, which becomes the file we append to.  A
controlled shutdown writes the same snapshot synchronously and ends it with
a CLEANSHUTDOWN record (see aof.py), then exits at once, so nothing runs
between the snapshot and the exit.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any, Protocol

import trio

from disque.core.errors import DisqueError, err
from disque.core.node import NodeCore
from disque.core.replay import Replay
from disque.core.types import Status
from disque.store.aof import (
    AofCorrupt,
    RecordReader,
    all_nul,
    encode_clean_marker,
    encode_loadjob,
    tail_is_corrupt,
)
from disque.store.job import Job, State
from disque.store.spill import SpillCorrupt
from disque.shell.segments import Segments

log = logging.getLogger("disque")

READ_CHUNK = 4 << 20
LOAD_YIELD_EVERY = 1000  # records between two event-loop turns while loading
SNAPSHOT_WRITE = 1 << 20  # write the snapshot in pieces of this size
INCREMENTAL_FSYNC = 32 << 20
DIFF_IN_MEMORY = 8 << 20  # a rewrite diff past this goes to a file (_Rewrite)
POSTPONE_MAX = 2.0  # seconds a write may wait for a running everysec fsync

_ACTIVE, _QUEUED = State.ACTIVE, State.QUEUED
_LOADJOB = b"*2\r\n$7\r\nLOADJOB\r\n"  # (store/aof.py's encode_loadjob)


class AofLoadError(Exception):
    """The AOF cannot be loaded: the message is logged and the node exits."""


class _Cancelled(Exception):
    pass


class _Rewrite:
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


def write_snapshot(
    path: str,
    jobs: Sequence[Job],
    *,
    spilled: SpilledRecords | None = None,
    progress: Sequence[bytes] = (),
    incremental_fsync: bool = True,
    marker: bytes | None = None,
    rewrite: _Rewrite | None = None,
) -> int:
    """One LOADJOB per active/queued job (those in memory, then the
    `spilled` ones read from read-behind's segments), then the consumer
    groups' `progress` records (then `marker`) into a new file at `path`,
    fsynced.  Returns its size.  Runs in a worker thread for background
    rewrites: jobs that changed state meanwhile are written as they are now,
    the rewrite buffer replays what happened since."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        out: list[bytes] = []
        pending = total = unsynced = 0
        records = _loadjobs(jobs, rewrite)
        if spilled is not None:
            records = chain(records, spilled.records(rewrite))
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
        for record in (*progress, marker) if marker is not None else progress:
            out.append(record)
            pending += len(record)
        if out:
            _write_all(fd, b"".join(out))
            total += pending
        os.fsync(fd)
        return total
    finally:
        os.close(fd)


def _loadjobs(jobs: Sequence[Job], rewrite: _Rewrite | None) -> Iterator[bytes]:
    for i, job in enumerate(jobs):
        if rewrite is not None and not i & 1023 and rewrite.cancelled:
            raise _Cancelled
        state = job.state
        if state is _ACTIVE or state is _QUEUED:
            yield encode_loadjob(job)


class SpilledRecords:
    """The records of the jobs read-behind keeps on disk, as LOADJOBs for a
    snapshot; the segments are held (kept) until `release`."""

    def __init__(self, core: NodeCore, bodies: Segments) -> None:
        assert core.read_behind is not None
        self.bodies = bodies
        bodies.hold()
        self.locs, self.sizes = core.read_behind.snapshot()

    def __len__(self) -> int:
        return len(self.locs)

    def records(self, rewrite: _Rewrite | None) -> Iterator[bytes]:
        read = self.bodies.read
        for i, (loc, size) in enumerate(zip(self.locs, self.sizes)):
            if rewrite is not None and not i & 1023 and rewrite.cancelled:
                raise _Cancelled
            try:
                payload = read(loc, size)[1]
            except SpillCorrupt as e:  # keep the old file rather than write one without this job
                raise OSError(errno.EIO, f"damaged read-behind record: {e}") from None
            yield b"*2\r\n$7\r\nLOADJOB\r\n$%d\r\n%s\r\n" % (len(payload), payload)

    def release(self) -> None:
        self.bodies.unhold()


def snapshot_jobs(core: NodeCore) -> list[Job]:
    return [job for job in core.jobs.values() if (job.state is _ACTIVE or job.state is _QUEUED) and core.journaled(job)]


class AofHost(Protocol):
    """The server's services the AOF writer uses."""

    def rewrite_config(self) -> None: ...
    def flush_all_nowait(self) -> None: ...
    def save_cluster_config(self, fsync: bool) -> None: ...


class AofFile:
    def __init__(
        self, core: NodeCore, config: Any, host: AofHost, drain: Callable[[], None], bodies: Segments | None = None
    ) -> None:
        self.core = core
        self.config = config  # Config's attributes are its directives, set at run time
        self.host = host
        self.drain = drain  # the node's dispatcher: carries out the effects of loading
        self.bodies = bodies  # read-behind's segments (their jobs go into snapshots), or None
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
        self.rewrite: _Rewrite | None = None
        self.fsync_running = False
        self.fsync_wanted: trio.Event | None = None
        self.last_fsync_sec = 0
        self.postponed_since = 0.0
        self.close_after_fsync: list[int] = []
        self.write_error: str | None = None
        self.fsync_error: str | None = None
        self.bus_seen = 0
        self.nursery: trio.Nursery | None = None
        self.started = False  # loaded: the cron may run
        self.rewrites = 0
        if hasattr(signal, "SIGXFSZ"):
            # a file-size limit must give EFBIG (MISCONF), not kill the node
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    @property
    def path(self) -> str:
        return os.path.join(self.config.dir, self.config.appendfilename)

    # ------------------------------------------------------------ records

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

    def _wake(self) -> None:
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
        self._wake()

    def _write(self) -> bool:
        data = b"".join(self.buf) if len(self.buf) > 1 else self.buf[0]
        fd = self.fd
        assert fd is not None
        done = 0
        try:
            view = memoryview(data)
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
            self._set_write_error(e.strerror or str(e))
            return False
        self.buf.clear()
        self.buf_len = 0
        self.status.buffer_length = 0
        self._written(len(data))
        if self.write_error is not None:
            log.warning("AOF write error looks solved, Disque can write again.")
            self.write_error = None
            self._update_error()
        return True

    def _written(self, n: int) -> None:
        self.file_size += n
        self.written += n
        self.status.current_size = self.file_size

    def _set_write_error(self, strerror: str) -> None:
        if self.write_error is None:
            log.warning("Error writing to the AOF file: %s", strerror)
        self.write_error = strerror
        self._update_error()
        self._fail_waiters()

    def _update_error(self) -> None:
        error = self.write_error or self.fsync_error
        self.core.set_aof_error(error)
        self.status.last_write_ok = error is None

    # ------------------------------------------------------------ fsync

    def _request_fsync(self) -> None:
        if self.fsync_wanted is not None:
            self.fsync_wanted.set()

    def _fsync_inline(self) -> None:
        assert self.fd is not None
        target = self.written
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            self._fsync_failed(e)
            return
        self.synced = max(self.synced, target)
        self.last_fsync_sec = int(time.time())

    def _fsync_failed(self, e: OSError) -> None:
        strerror = e.strerror or str(e)
        log.warning("Error syncing the AOF file to disk: %s. Rewriting it from memory.", strerror)
        self.fsync_error = strerror
        self._update_error()
        self.status.rewrite_scheduled = True
        self._fail_waiters()

    async def _fsync_loop(self) -> None:
        while True:
            assert self.fsync_wanted is not None
            await self.fsync_wanted.wait()
            self.fsync_wanted = trio.Event()
            fd = self.fd
            if fd is None or self.written <= self.synced or self.fsync_error:
                continue
            target = self.written
            self.fsync_running = True
            self.status.pending_bio_fsync = 1
            try:
                await trio.to_thread.run_sync(os.fdatasync, fd)
            except OSError as e:
                if fd == self.fd:
                    self._fsync_failed(e)
            else:
                if fd == self.fd:
                    self.synced = max(self.synced, target)
            finally:
                self.fsync_running = False
                self.status.pending_bio_fsync = 0
                self.last_fsync_sec = int(time.time())
                for old in self.close_after_fsync:
                    os.close(old)
                self.close_after_fsync.clear()
            if self.buf and self.postponed_since:
                self.flush()  # writes postponed behind this fsync
            self._wake()
            if self.config.appendfsync == "always" and self.written > self.synced:
                self._request_fsync()  # records written while we synced

    def _close_fd(self, fd: int) -> None:
        if self.fsync_running:
            self.close_after_fsync.append(fd)
        else:
            os.close(fd)

    # ------------------------------------------------------------ main task

    async def run(self) -> None:
        """Load the AOF (start-up); owns the fsync task and the rewrite
        tasks.  Once loaded, the server's deadline pass runs `cron`."""
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self.fsync_wanted = trio.Event()
            nursery.start_soon(self._fsync_loop)
            await self._startup()
            self.started = True  # the server's deadline pass runs `cron` every 100 ms from now on
            await trio.sleep_forever()

    async def _startup(self) -> None:
        config, core = self.config, self.core
        fd = None
        if config.appendonly:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as e:
                self._fatal(f"Can't open the append-only file: {e.strerror}")
        if config.appendonly or config.aof_enqueue_jobs_once:
            try:
                for _ in self._load_steps(self.path):
                    await trio.sleep(0)
            except AofLoadError as e:
                self._fatal(str(e))
            self.drain()  # QUEUED broadcasts of re-queued jobs
            if config.aof_enqueue_jobs_once:
                config.aof_enqueue_jobs_once = False
                if config.config_file:
                    try:
                        self.host.rewrite_config()
                    except DisqueError as e:
                        log.warning("Could not switch aof-enqueue-jobs-once off in the config file: %s", e.message)
        if fd is not None:
            self._open(fd)

    def _open(self, fd: int) -> None:
        self.fd = fd
        self.file_size = os.fstat(fd).st_size
        self.written = self.synced = self.appended  # offsets only grow
        self.status.state = "on"
        self.status.current_size = self.status.base_size = self.file_size
        self.bus_seen = self.core.stats.bus_sent

    @staticmethod
    def _fatal(message: str) -> None:
        log.warning("%s", message)
        logging.shutdown()
        os._exit(1)

    def cron(self) -> None:
        status, config = self.status, self.config
        if self.buf and status.state == "on":
            self.flush()
        if (
            self.fd is not None
            and status.state == "on"
            and self.written > self.synced
            and not self.fsync_running
            and not self.fsync_error
            and self._fsync_allowed()
        ):
            policy = config.appendfsync
            if policy == "always" or (policy == "everysec" and int(time.time()) != self.last_fsync_sec):
                self._request_fsync()
        rw = self.rewrite
        if rw is not None:
            status.current_rewrite_time_sec = int(time.monotonic() - rw.started)
        elif status.rewrite_scheduled:
            self.start_rewrite()
        elif status.state == "on" and config.auto_aof_rewrite_percentage:
            base = status.base_size or 1
            growth = status.current_size * 100 // base - 100
            if status.current_size > config.auto_aof_rewrite_min_size and growth >= config.auto_aof_rewrite_percentage:
                log.info("Starting automatic rewriting of AOF on %d%% growth", growth)
                self.start_rewrite()
        self._wake()

    # ------------------------------------------------------------ loading

    def _load_steps(self, path: str) -> Iterator[None]:
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

    # ------------------------------------------------------------ rewrite

    def start_rewrite(self) -> bool:
        if self.rewrite is not None or self.nursery is None:
            return False
        self.status.rewrite_scheduled = False
        # a name per rewrite: a cancelled one may still be writing its own file
        self.rewrites += 1
        name = f"temp-rewriteaof-bg-{os.getpid()}-{self.rewrites}.aof"
        rw = _Rewrite(os.path.join(self.config.dir, name))
        jobs = snapshot_jobs(self.core)
        spilled = self._spilled()
        progress = self.core.state_records()
        self.rewrite = rw
        self.status.rewrite_in_progress = True
        self.status.current_rewrite_time_sec = 0
        self.status.rewrite_buffer_length = 0
        log.info(
            "Background append only file rewriting started (%d jobs)", len(jobs) + (len(spilled) if spilled else 0)
        )
        self.nursery.start_soon(self._run_rewrite, rw, jobs, spilled, progress)
        return True

    def _spilled(self) -> SpilledRecords | None:
        bodies = self.bodies
        return None if bodies is None or self.core.read_behind is None else SpilledRecords(self.core, bodies)

    async def _run_rewrite(
        self, rw: _Rewrite, jobs: list[Job], spilled: SpilledRecords | None, progress: list[bytes]
    ) -> None:
        incremental = self.config.aof_rewrite_incremental_fsync
        try:
            size = await trio.to_thread.run_sync(
                lambda: write_snapshot(
                    rw.tmp, jobs, spilled=spilled, progress=progress, incremental_fsync=incremental, rewrite=rw
                )
            )
        except _Cancelled:
            self._remove(rw.tmp)
            return
        except OSError as e:
            if not rw.cancelled:
                self._rewrite_failed(rw, f"Background AOF rewrite failed: {e.strerror}")
            return
        finally:
            if spilled is not None:
                spilled.release()
        del jobs
        if rw.cancelled:
            self._remove(rw.tmp)
            return
        self._finish_rewrite(rw, size)

    def _finish_rewrite(self, rw: _Rewrite, size: int) -> None:
        """On the loop: append the rewrite buffer, fsync, rename, switch."""
        status = self.status
        log.info("Background AOF rewrite terminated with success")
        fd = None
        try:
            fd = os.open(rw.tmp, os.O_WRONLY | os.O_APPEND)
            diff = rw.write_diff(fd)
            os.fdatasync(fd)
            os.rename(rw.tmp, self.path)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            self._rewrite_failed(rw, f"Error finishing the AOF rewrite: {e.strerror}")
            return
        finally:
            rw.discard()
        fsync_dir(self.path)
        log.info("Residual parent diff successfully flushed to the rewritten AOF (%.2f MB)", diff / (1 << 20))
        size += diff
        if status.state != "off":
            old = self.fd
            self.fd = fd
            if old is not None:
                self._close_fd(old)
            self.buf.clear()  # its content is in the new file
            self.buf_len = status.buffer_length = 0
            self.written = self.synced = self.appended
            self.postponed_since = 0.0
            self.file_size = size
            if self.write_error or self.fsync_error:
                log.warning("AOF write error looks solved, Disque can write again.")
            self.write_error = self.fsync_error = None
            self._update_error()
            if status.state == "wait-rewrite":
                status.state = "on"
                log.info("Background AOF rewrite finished successfully: the append only file is on")
            status.current_size = status.base_size = size
        else:
            os.close(fd)
        self.rewrite = None
        status.rewrite_in_progress = False
        status.rewrite_buffer_length = 0
        status.current_rewrite_time_sec = -1
        status.last_bgrewrite_ok = True
        status.last_rewrite_time_sec = int(time.monotonic() - rw.started)
        log.info("Background AOF rewrite finished successfully (%d bytes)", size)
        self._wake()

    def _rewrite_failed(self, rw: _Rewrite, message: str) -> None:
        log.warning("%s", message)
        self._remove(rw.tmp)
        rw.discard()
        status = self.status
        if self.rewrite is rw:
            self.rewrite = None
            status.rewrite_in_progress = False
            status.rewrite_buffer_length = 0
            status.current_rewrite_time_sec = -1
            status.last_rewrite_time_sec = int(time.monotonic() - rw.started)
        status.last_bgrewrite_ok = False
        if status.state == "wait-rewrite" or self.fsync_error:
            status.rewrite_scheduled = True  # retried by the cron

    def _cancel_rewrite(self) -> None:
        rw = self.rewrite
        if rw is None:
            return
        log.warning("Killing the running AOF rewrite")
        rw.cancelled = True
        self.rewrite = None
        self._remove(rw.tmp)
        rw.discard()
        status = self.status
        status.rewrite_in_progress = False
        status.rewrite_buffer_length = 0
        status.current_rewrite_time_sec = -1

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass

    # ------------------------------------------------------------ Host services

    def bgrewriteaof(self) -> Any:
        if self.rewrite is not None:
            return err("Background append only file rewriting already in progress")
        if self.start_rewrite():
            return Status(b"Background append only file rewriting started")
        return DisqueError("ERR")

    def apply_config(self, changed: list[str]) -> None:
        if "appendonly" not in changed:
            return
        if self.config.appendonly and self.status.state == "off":
            try:
                self._start_aof()
            except DisqueError:
                self.config.appendonly = False
                raise
        elif not self.config.appendonly and self.status.state != "off":
            self._stop_aof()

    def _start_aof(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            log.warning("Disque needs to enable the AOF but can't open the append only file: %s", e.strerror)
            raise err("Unable to turn on AOF. Check server logs.") from None
        self._cancel_rewrite()  # a one-off rewrite does not collect records
        self.fd = fd
        self.file_size = os.fstat(fd).st_size
        self.written = self.synced = self.appended  # offsets only grow
        self.bus_seen = self.core.stats.bus_sent
        self.status.state = "wait-rewrite"
        if not self.start_rewrite():
            os.close(fd)
            self.fd = None
            self.status.state = "off"
            log.warning("Disque needs to enable the AOF but can't trigger a background AOF rewrite operation.")
            raise err("Unable to turn on AOF. Check server logs.")

    def _stop_aof(self) -> None:
        if self.status.state == "on" and self.buf:
            self.flush(force=True)
        self._datasync_quietly()
        if self.fd is not None:
            self._close_fd(self.fd)
        self.fd = None
        self._cancel_rewrite()
        status = self.status
        status.state = "off"
        status.rewrite_scheduled = False
        status.buffer_length = 0
        self.buf.clear()
        self.buf_len = 0
        self.write_error = self.fsync_error = None
        self._update_error()
        self.written = self.synced = self.appended  # offsets only grow
        while self.waiters:  # nothing more will be written for them
            self.waiters.popleft()[1]()

    def _datasync_quietly(self) -> None:
        """fdatasync the open file, if any; a failure is not reported (the
        caller is leaving or reloading the file, not acknowledging writes)."""
        if self.fd is not None:
            try:
                os.fdatasync(self.fd)
            except OSError:
                pass

    def debug_loadaof(self) -> Any:
        """DEBUG LOADAOF: flush, empty the dataset, reload the file.  The
        flush does not log DELJOB records (the upstream defect of spec/commands.md §12 item 5, fixed)."""
        if self.status.state == "on":
            self.flush(force=True)
            self._datasync_quietly()
        saved, self.status.state = self.status.state, "off"
        core = self.core
        try:
            core.flush_all()
            for _ in self._load_steps(self.path):
                pass
        except AofLoadError as e:
            log.warning("%s", e)
            return DisqueError("ERR")
        finally:
            self.status.state = saved
        return Status(b"OK")

    def prepare_shutdown(self, rewrite_aof: bool) -> bool:
        """The AOF steps of SHUTDOWN / SIGTERM (spec/persistence.md §8.1).  False
        refuses the shutdown.  When a snapshot was written the process exits
        here, so no command runs between the snapshot and the exit."""
        status = self.status
        if self.core.loading:
            return True  # nothing consistent to save: exit at once
        if status.state == "wait-rewrite":
            log.warning("Writing initial AOF, can't exit.")
            return False
        if self.rewrite is not None:
            log.warning("There is a child rewriting the AOF. Killing it!")
            self._cancel_rewrite()
        if status.state == "on" or rewrite_aof:
            if status.state == "on":
                log.info("Calling fsync() on the AOF file.")
                self.flush(force=True)
            try:
                self.write_clean_snapshot()
            except OSError as e:
                log.warning("Error writing the shutdown snapshot of the AOF: %s", e.strerror)
                return False
            self._exit_now()
        return True

    def write_clean_snapshot(self) -> int:
        """Synchronous rewrite ending with the CLEANSHUTDOWN marker."""
        tmp = os.path.join(self.config.dir, f"temp-rewriteaof-{os.getpid()}.aof")
        started = time.monotonic()
        jobs = snapshot_jobs(self.core)
        spilled = self._spilled()
        marker = encode_clean_marker(self.core.clock.now_ms())
        try:
            size = write_snapshot(
                tmp, jobs, spilled=spilled, progress=self.core.state_records(),
                incremental_fsync=self.config.aof_rewrite_incremental_fsync, marker=marker,
            )  # fmt: skip
            os.rename(tmp, self.path)
        except OSError:
            self._remove(tmp)
            raise
        finally:
            if spilled is not None:
                spilled.release()
        fsync_dir(self.path)
        queued = sum(1 for job in jobs if job.state is _QUEUED)
        log.warning(
            "Shutdown snapshot of the AOF written: %d jobs (%d queued, %d on disk), %d bytes in %.3f seconds",
            len(jobs) + (len(spilled) if spilled else 0), queued, len(spilled) if spilled else 0,
            size, time.monotonic() - started,
        )  # fmt: skip
        return size

    def _exit_now(self) -> None:
        host = self.host
        host.flush_all_nowait()
        if self.core.conf_dirty():
            try:
                host.save_cluster_config(fsync=True)
            except OSError:
                pass
        log.warning("Disque is now ready to exit, bye bye...")
        logging.shutdown()
        os._exit(0)
