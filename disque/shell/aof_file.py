"""The AOF of a running node: its task, its cron and the server's services.

Theory of operation (spec/persistence.md §5-§9).  Three rooms do the work:
the writer (shell/aof_writer.py: buffer, waiters, fsync, errors), which
`AofFile` is, so the server, the dispatcher and the transports talk to it
directly; the loader (shell/aof_loader.py: verify, repair, replay) and the
rewriter (shell/aof_rewrite.py: snapshots, the diff).  This module starts
them (`run`: load, then the fsync task and the rewrites), runs their cron,
and serves the commands that turn the AOF on and off, reload it, rewrite
it, and the shutdown snapshot, which exits the process at once, so nothing
runs between the snapshot and the exit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

import trio

from disque.core.errors import DisqueError, err
from disque.core.node import NodeCore
from disque.core.types import Status
from disque.shell.aof_loader import AofLoader, AofLoadError
from disque.shell.aof_rewrite import Rewriter
from disque.shell.aof_writer import AofWriter

log = logging.getLogger("disque")


class AofHost(Protocol):
    """The server's services the AOF uses."""

    def rewrite_config(self) -> None: ...
    def flush_all_nowait(self) -> None: ...
    def save_cluster_config(self, fsync: bool) -> None: ...


class AofFile(AofWriter):
    def __init__(self, core: NodeCore, config: Any, host: AofHost, drain: Callable[[], None]) -> None:
        super().__init__(core, config)
        self.host = host
        self.drain = drain  # the node's dispatcher: carries out the effects of loading
        self.loader = AofLoader(core, config)
        self.rewriter = Rewriter(self, core, config)
        self.started = False  # loaded: the cron may run

    # ------------------------------------------------------------ main task

    async def run(self) -> None:
        """Load the AOF (start-up); owns the fsync task and the rewrite
        tasks.  Once loaded, the server's deadline pass runs `cron`."""
        async with trio.open_nursery() as nursery:
            self.rewriter.nursery = nursery
            self.fsync_wanted = trio.Event()
            nursery.start_soon(self.fsync_loop)
            await self._startup()
            self.started = True  # the server's deadline pass runs `cron` every 100 ms from now on
            await trio.sleep_forever()

    async def _startup(self) -> None:
        config = self.config
        fd = None
        if config.appendonly:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as e:
                self._fatal(f"Can't open the append-only file: {e.strerror}")
        if config.appendonly or config.aof_enqueue_jobs_once:
            try:
                for _ in self.loader.steps(self.path):
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
            self.open(fd)

    @staticmethod
    def _fatal(message: str) -> None:
        log.warning("%s", message)
        logging.shutdown()
        os._exit(1)

    def cron(self) -> None:
        self.sync_cron()
        self.rewriter.cron()
        self.wake()

    # ------------------------------------------------------------ Host services

    def bgrewriteaof(self) -> Any:
        if self.rewrite is not None:
            return err("Background append only file rewriting already in progress")
        if self.rewriter.start():
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
        self.rewriter.cancel()  # a one-off rewrite does not collect records
        self.fd = fd
        self.file_size = os.fstat(fd).st_size
        self.written = self.synced = self.appended  # offsets only grow
        self.bus_seen = self.core.stats.bus_sent
        self.status.state = "wait-rewrite"
        if not self.rewriter.start():
            os.close(fd)
            self.fd = None
            self.status.state = "off"
            log.warning("Disque needs to enable the AOF but can't trigger a background AOF rewrite operation.")
            raise err("Unable to turn on AOF. Check server logs.")

    def _stop_aof(self) -> None:
        self.close()
        self.rewriter.cancel()
        self.status.state = "off"
        self.status.rewrite_scheduled = False

    def debug_loadaof(self) -> Any:
        """DEBUG LOADAOF: flush, empty the dataset, reload the file.  The
        flush does not log DELJOB records (the upstream defect of spec/commands.md §12 item 5, fixed)."""
        if self.status.state == "on":
            self.flush(force=True)
            self.datasync_quietly()
        saved, self.status.state = self.status.state, "off"
        try:
            self.core.flush_all()
            for _ in self.loader.steps(self.path):
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
            self.rewriter.cancel()
        if status.state == "on" or rewrite_aof:
            if status.state == "on":
                log.info("Calling fsync() on the AOF file.")
                self.flush(force=True)
            try:
                self.rewriter.write_clean_snapshot()
            except OSError as e:
                log.warning("Error writing the shutdown snapshot of the AOF: %s", e.strerror)
                return False
            self._exit_now()
        return True

    def write_clean_snapshot(self) -> int:
        return self.rewriter.write_clean_snapshot()

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
