"""The trio shell of a node: listeners, client connections, the deadline pass.

This module performs the I/O the core asks for and nothing else.  Plain TCP
clients are served by one task over an epoll set (tcp.py); a TLS
client has a task of its own.  Either way a chunk read from a client goes to
the session runner (session.py), which runs its requests and carries out
the effects; all the replies go out with one send (pipelining), once the
AOF records they depend on are safe.  The node's one timer (a timerfd in
the client loop's epoll set, timer.py) fires at `NodeCore.next_deadline()`
and runs `tick()` (the deadline pass).  `Host` services (process
statistics, config rewrite, shutdown) are methods of `Server`.

What a configuration leaves off is not imported: the HTTP port (metrics,
dashboard) and the memcache front end load with their ports, TLS and the
cluster secret's cryptography when configured (an idle node's RSS,
docs/performance.md "Scale").
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import trio

from disque.core import config as cfg
from disque.shell.segments import Segments
from disque.shell.config_file import read_config, write_config_file
from disque.shell.bus import CLUSTER_PORT_INCR, Bus
from disque.cluster.codec import frame_limit
from disque.cluster.membership import Membership
from disque.shell.nodes_file import NodesFile
from disque.core.errors import DisqueError, err
from disque.shell.dispatch import Dispatcher
from disque.shell.gc_freeze import GcFreezer
from disque.shell.heap_trim import map_large_blocks, trim_after_spills
from disque.shell.session import Conn, Sessions
from disque.core.types import Connection, Status
from disque.core.node import NodeCore
from disque.protocols.base import FrontEnd
from disque.protocols.resp.front import RESP
from disque.protocols.resp.encoder import encode_error
from disque.shell.security import DENIED, Security, announced_port, is_loopback, protected_mode_refuses
from disque.shell.aof_file import AofFile
from disque.shell.clock import NodeClock
from disque.shell.timer import Timer
from disque.version import Revision, revision
from disque.shell.tcp import READ_SIZE, Refusal, TcpClients, format_addr

log = logging.getLogger("disque")

TLS_HANDSHAKE_TIMEOUT = 10.0  # seconds a new TLS client has to complete its handshake
SHELL_CRON_MS = 100  # the bus links' and the AOF's cron


def rss_bytes() -> int:
    """The resident set size of this process (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


MAXCLIENTS = "max number of clients reached"
# The memcache port's line for a refused client (RESP clients get upstream's DENIED).
LOOPBACK_ONLY = (
    "DENIED the memcache port only accepts loopback clients while protected mode is on, "
    "or requirepass is set with memcache-auth loopback"
)


class TlsConn(Conn):
    """A tls-port client: a trio stream and a task of its own."""

    __slots__ = ("stream", "send_lock", "scope", "server")

    def __init__(self, client: Connection, stream: trio.abc.Stream, server: Server, front: FrontEnd = RESP) -> None:
        super().__init__(client, front)
        self.stream = stream
        self.send_lock = trio.Lock()
        self.scope = trio.CancelScope()
        self.server = server

    def kick(self) -> None:
        if self.server.nursery is not None:
            self.server.nursery.start_soon(self.server.flush_tls, self)

    def abort(self) -> None:
        self.scope.cancel()


def _peer(stream: trio.SocketStream, local: bool = False) -> str:
    try:
        return format_addr(stream.socket.getsockname() if local else stream.socket.getpeername())
    except OSError:
        return ":0"


class Server:
    def __init__(self, config: cfg.Config) -> None:
        self.config = config
        self.clock = NodeClock()
        rng = random.Random()
        self.security = Security(config)  # SecurityError: the node cannot start
        # nodes.conf is locked and loaded before anything else, so the node keeps
        # its ID and peers and no second process runs on it (spec/cluster.md §12.1)
        self.nodes_file = NodesFile(config.cluster_config_file)
        text = self.nodes_file.read()
        membership = None
        if text.strip():
            membership = Membership.from_conf(text, announced_port(config), rng=rng, now=self.clock.now_ms())
            log.info("Node configuration loaded, I'm %s", membership.my_id)
        node_id = membership.my_id if membership else secrets.token_hex(20)
        # Read-behind's body segments, beside the AOF (a cache of it: emptied here).
        self.bodies = Segments(os.path.abspath(config.appendfilename + ".bodies")) if config.read_behind != "no" else None
        self.core = NodeCore(
            config, node_id, clock=self.clock, rng=rng, host=self, membership=membership, bodies=self.bodies
        )
        # The fixed cost of the process (interpreter, modules, empty node): maxmemory bounds the data
        # on top of it, INFO shows both (used_memory_startup, used_memory; docs/running.md).
        self.startup_rss = rss_bytes()
        if 0 < config.maxmemory < 1 << 20:  # as upstream
            log.warning("WARNING: You specified a maxmemory value that is less than 1MB (current value is %d bytes). "
                        "Are you sure this is what you really want?", config.maxmemory)  # fmt: skip
        if membership is None:
            self.save_cluster_config(fsync=True)
            log.info("No cluster configuration found, I'm %s", node_id)
        self.nursery: trio.Nursery | None = None
        self.timer = Timer()  # the deadline pass's, served by the client loop
        self._timer_at = 0  # clock ms the timer is armed for
        self._next_cron = 0  # clock ms of the shell's next cron
        self.gc_freezer = GcFreezer(now_ms=self.clock.now_ms())
        self.shutdown_requested = trio.Event()
        self.ports: list[int] = []
        # The node's one effect dispatcher: its ports (the session runner, the bus,
        # the AOF) call back into it, so they are plugged in once they all exist.
        self.dispatch = Dispatcher(self.core, self._conf_changed)
        self.bus = Bus(
            self.core,
            self.dispatch.drain,
            port=announced_port(config) + CLUSTER_PORT_INCR,
            bind=config.bind,
            backlog=config.tcp_backlog,
            # Any frame a peer may send: a job of the largest max-job-size, whatever this
            # node's (a node set lower must not refuse, and so close in a loop, a peer's job).
            max_frame=frame_limit(cfg.MAX_JOB_SIZE_MAX),
            max_queue=2 * frame_limit(config.max_job_size),
            security=self.security,
        )
        self.aof_file = AofFile(self.core, config, self, self.dispatch.drain)
        self.sessions = Sessions(self.core, config, self.dispatch, self._output_limit_closed)
        self.dispatch.plug(self.sessions, self.bus.wires, self.aof_file)
        # Plain bus sockets share the client loop (`Bus.run`): it writes their frames after each wake-up.
        self.tcp = TcpClients(self.sessions, self.aof_file, self.clock, self.refusal, after_pass=self.bus.wires.flush)

    # ------------------------------------------------------------ lifecycle

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        # Signals first: a SIGTERM or Ctrl-C once a port listens is a clean shutdown,
        # even before the task that handles them has run (they wait in the receiver).
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            # Bind before the nursery: an OSError then reaches the caller unwrapped.
            listeners = await self._open_listeners()
            tls_listeners = await self._open_listeners(self.config.tls_port)
            memcache_listeners = await self._open_listeners(self.config.memcache_port)
            memcache_tls_listeners = await self._open_listeners(self.config.memcache_tls_port)
            http_listeners = await self._open_listeners(self.config.metrics_port)
            if announced_port(self.config):
                await self.bus.listen()
            if self.bodies is not None:  # jobs will move to disk and back (shell/heap_trim.py)
                map_large_blocks()
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self.ports = [ln.socket.getsockname()[1] for ln in listeners]
                for listener in listeners:
                    self.tcp.listen(socket.socket(fileno=listener.socket.detach()))
                self.tcp.watch(self.timer.fd, self._timer_fired)
                self.timer.arm(0)
                trusted = self.config.memcache_auth == "loopback"  # else they authenticate (memcached's ASCII auth)
                if memcache_listeners or memcache_tls_listeners:
                    from disque.protocols.memcache.front import memcache_front

                    memcache = memcache_front(self.config)
                for listener in memcache_listeners:
                    self.tcp.listen(socket.socket(fileno=listener.socket.detach()), memcache, self.memcache_refusal, trusted)
                if memcache_listeners:
                    log.info("Ready to accept memcache (Kestrel) connections on port %s", self.config.memcache_port)
                nursery.start_soon(self.tcp.run)
                for listener in tls_listeners:
                    nursery.start_soon(trio.serve_listeners, self._handle_tls_client, [listener])
                if tls_listeners:
                    log.info("Ready to accept TLS connections on port %s", self.config.tls_port)
                for listener in memcache_tls_listeners:
                    memcache_tls = partial(self._handle_tls_client, front=memcache, refusal=self.memcache_refusal, trusted=trusted)
                    nursery.start_soon(trio.serve_listeners, memcache_tls, [listener])
                if memcache_tls_listeners:
                    log.info("Ready to accept memcache (Kestrel) TLS connections on port %s", self.config.memcache_tls_port)
                if http_listeners:
                    from disque.shell.http import HttpPort  # h11, prometheus_client

                    http = HttpPort(self.core, self.sessions, lambda: self.config.requirepass, self.startup_rss)
                    nursery.start_soon(http.serve, http_listeners)
                    log.info("Serving metrics and the dashboard on http port %s", self.config.metrics_port)
                if announced_port(self.config):
                    nursery.start_soon(self.bus.run, False, self.tcp)  # its cron runs in the deadline pass
                nursery.start_soon(self._signals, signals)
                nursery.start_soon(self.aof_file.run)  # loads the AOF, then its cron
                if self.bodies is not None:
                    nursery.start_soon(trim_after_spills, self.core)
                log.info("Ready to accept connections on port %s", self.ports[0] if self.ports else 0)
                task_status.started(self)
                await self.shutdown_requested.wait()
                self.flush_all_nowait()
                log.warning("Disque is now ready to exit, bye bye...")
                nursery.cancel_scope.cancel()
            self.timer.close()

    async def _open_listeners(self, port: int | None = None) -> list[trio.SocketListener]:
        port = self.config.port if port is None else port
        if not port:
            return []
        hosts = self.config.bind or [None]
        listeners: list[trio.SocketListener] = []
        for host in hosts:
            listeners += await trio.open_tcp_listeners(port, host=host, backlog=self.config.tcp_backlog)
        return listeners

    async def _signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
            if self.shutdown_requested.is_set() and signum == signal.SIGINT:
                log.warning("You insist... exiting now.")
                os._exit(1)
            log.warning("Received %s scheduling shutdown...", name)
            if not self.shutdown(False):
                log.warning("SIGTERM received but errors trying to shut down the server, check the logs for more information")

    def _timer_fired(self, events: int) -> None:
        if self.timer.fired():  # else a readiness left from before a re-arm
            try:
                self._deadline_pass()
            finally:
                self._arm()

    def _deadline_pass(self) -> None:
        """What the node's one timer runs: the core's tick, and the shell's
        100 ms cron (the bus links, the AOF, the collector's freezes).  Both run in a wake-up of the
        client loop, so the frames they send leave at its end (no wake-up of
        their own) and no trio timer expires (each is a cancellation, which
        for an idle node was most of its CPU).  During CLIENT PAUSE the core
        is not ticked; the shell's cron goes on."""
        core, now = self.core, self.clock.now_ms()
        if not core.pause_left(now):
            core.tick()
            self.dispatch.drain()
        # Half a period early: the shell's cron rides on the core's 100 ms
        # cron rather than waking the node a millisecond before or after it.
        if now >= self._next_cron - SHELL_CRON_MS // 2:
            self._next_cron = now + SHELL_CRON_MS
            self.bus.follow(self.config.max_job_size)
            self.bus.cron()
            if self.aof_file.started:
                self.aof_file.cron()
            self.gc_freezer.tick(now)

    def _arm(self) -> None:
        """Arm the timer for the next deadline.  The core's 100 ms cron is
        always among them when it is ticked, so the shell's cron needs a
        deadline of its own only during CLIENT PAUSE."""
        core, now = self.core, self.clock.now_ms()
        paused = core.pause_left(now)
        self._timer_at = min(self._next_cron, now + paused) if paused else core.next_deadline()
        self.timer.arm(self._timer_at - now)

    # ------------------------------------------------------------ clients

    async def _handle_tls_client(
        self, tcp: trio.SocketStream, front: FrontEnd = RESP, refusal: Refusal | None = None, trusted: bool = False
    ) -> None:
        """A client of a TLS port (tls-port, or memcache-tls-port for `front`
        the memcache front end, with its `refusal` and `trusted` as for the plain port)."""
        ctx = self.security.tls.clients
        assert ctx is not None
        stream = trio.SSLStream(tcp, ctx, server_side=True)
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as e:
            self.security.stats.tls_client_handshake_failures += 1
            why = e.__cause__ or e
            self.security.log("tls", logging.INFO, "Error accepting a TLS client connection from %s: %s",
                              _peer(tcp), getattr(why, "reason", None) or str(why) or "handshake timed out")  # fmt: skip
            await trio.aclose_forcefully(tcp)
            return
        try:
            peer_ip = str(tcp.socket.getpeername()[0])
        except OSError:
            peer_ip = ""
        refused = (refusal or self.refusal)(peer_ip, _peer(tcp))
        if refused is not None:
            with trio.move_on_after(1):
                await stream.send_all(refused)
            await trio.aclose_forcefully(stream)
            return
        sessions = self.sessions
        conn = TlsConn(sessions.new_client(_peer(tcp), _peer(tcp, local=True), tcp.socket.fileno()), stream, self, front)
        conn.client.authenticated = trusted
        sessions.opened(conn)
        try:
            with conn.scope:
                await self._tls_client_loop(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            sessions.gone(conn)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)  # a close_notify could wait forever on a client that does not read

    async def _tls_client_loop(self, conn: TlsConn) -> None:
        sessions = self.sessions
        stream = conn.stream
        while not conn.closing:
            data = await stream.receive_some(READ_SIZE)
            if not data or not sessions.received(conn, data):
                return
            pause = self.core.pause_left(self.clock.now_ms())
            if pause:
                await trio.sleep(pause / 1000)
            sessions.run(conn)
            await self.flush_tls(conn)
            while conn.held and not conn.closing:  # the rest of a pipeline held for its output
                sessions.run(conn)
                await self.flush_tls(conn)

    async def flush_tls(self, conn: TlsConn) -> None:
        refused = await self.aof_file.barrier(conn)
        async with conn.send_lock:
            if refused is not None:  # the AOF's disk is full: -MISCONF now rather than wait for it
                conn.refuse(refused)
            if conn.out:
                data = b"".join(conn.out)
                conn.out.clear()
                try:
                    await conn.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    conn.closing = True
                self.sessions.sent(conn, len(data))
            if conn.closing:
                conn.scope.cancel()

    # ------------------------------------------------------------ clients (both transports)

    def refusal(self, peer_ip: str, peer: str) -> bytes | None:
        """What to tell a new client before closing it, if it is refused:
        maxclients, protected mode."""
        why = self._refused(peer_ip, peer, needs_auth=True)
        return None if why is None else encode_error(MAXCLIENTS) if why == MAXCLIENTS else DENIED

    def memcache_refusal(self, peer_ip: str, peer: str) -> bytes | None:
        """The rules of the client port (its clients authenticate with
        memcached's ASCII auth); with `memcache-auth loopback`, while a
        password is set, loopback clients only, which start authenticated."""
        why = self._refused(peer_ip, peer, needs_auth=self.config.memcache_auth != "loopback")
        from disque.protocols.memcache.encoder import server_error

        return None if why is None else server_error(why)

    def _refused(self, peer_ip: str, peer: str, needs_auth: bool) -> str | None:
        """Why a new client is turned away (counted and logged), or None.
        A protocol without AUTH (`needs_auth` false) takes only loopback
        clients while a password is set."""
        config = self.config
        if len(self.sessions.conns) >= config.maxclients:
            self.sessions.rejected += 1
            return MAXCLIENTS
        if protected_mode_refuses(config.protected_mode, config.requirepass, peer_ip) or (
            not needs_auth and config.requirepass and not is_loopback(peer_ip)
        ):
            self.security.stats.protected_mode_refused_clients += 1
            self.security.log("protected", logging.INFO, "Protected mode: refused the client %s", peer)
            return LOOPBACK_ONLY
        return None

    def reload_queue_config(self) -> None:
        """Kestrel's RELOAD: read the queue settings of the config file again."""
        path = self.config.config_file
        if path is None:
            return
        fresh = cfg.Config(self.config.dir)
        try:
            cfg.parse_config_text(read_config(path, self.config.dir), fresh, read=read_config)
        except cfg.ConfigError as e:
            raise err(f"Reloading the config file: {e}") from None
        self.config.queue_config = fresh.queue_config

    def _conf_changed(self) -> None:
        try:
            self.save_cluster_config(fsync=False)
        except OSError as e:
            log.warning("Fatal: can't update cluster config file: %s", e.strerror)
            os._exit(1)

    def _output_limit_closed(self) -> None:
        self.security.stats.output_limit_closed_clients += 1

    def flush_all_nowait(self) -> None:
        """Best effort before exiting: write pending replies without waiting
        (plain TCP clients only: a TLS write may need to wait)."""
        self.tcp.flush_all_nowait()

    # ------------------------------------------------------------ Host services

    def wake(self, at_ms: int) -> None:
        """A client blocked until `at_ms` (a memcache `get q/t=30`), sooner
        than the deadline pass runs: it runs then instead."""
        if at_ms < self._timer_at:
            self._timer_at = at_ms
            self.timer.arm(at_ms - self.clock.now_ms())

    def process_info(self) -> dict[str, Any]:
        times = os.times()
        rss = rss_bytes()
        uname = os.uname()
        rev = revision() or Revision("00000000", False)
        return {
            "pid": os.getpid(),
            "git_sha1": rev.sha,
            "git_dirty": int(rev.dirty),
            "arch_bits": 64 if sys.maxsize > 2**32 else 32,
            "rss": rss,
            "rss_startup": self.startup_rss,
            "os": f"{uname.sysname} {uname.release} {uname.machine}",
            "executable": os.path.abspath(sys.argv[0]),
            "used_cpu_sys": times.system,
            "used_cpu_user": times.user,
            "used_cpu_sys_children": times.children_system,
            "used_cpu_user_children": times.children_user,
            "security": self.security.info_fields(self.bus.auth_links()) + [("auth_failures", self.core.stats.auth_failures)],
            **self.sessions.info_fields(),
        }

    def rewrite_config(self) -> None:
        path = self.config.config_file
        assert path is not None
        try:
            with open(path, encoding="utf-8") as f:
                old = f.read()
            write_config_file(path, cfg.rewrite_config_text(old, self.config))
        except OSError as e:
            raise err(f"Rewriting config file: {e.strerror}") from None
        log.info("CONFIG REWRITE executed with success.")

    def apply_config(self, changed: list[str]) -> None:
        self.security.apply_config(changed, self._may_change_secret)
        if "dir" in changed:
            try:
                os.chdir(self.config.dir)
            except OSError as e:
                self.config.dir = os.getcwd()  # CONFIG GET dir reports the real cwd
                raise err(f"Changing directory: {e.strerror}") from None
        self.aof_file.apply_config(changed)

    def _may_change_secret(self) -> bool:
        """CONFIG SET cluster-secret is a start-up operation: allowed while the
        node knows no other node and has no bus connection (docs/security.md)."""
        return len(self.core.membership.nodes) == 1 and not self.bus.links and not self.bus.conns

    def shutdown(self, rewrite_aof: bool) -> bool:
        log.warning("User requested shutdown...")
        if not self.aof_file.prepare_shutdown(rewrite_aof):  # exits itself after a snapshot
            return False
        self.shutdown_requested.set()
        return True

    def reset_stats(self) -> None:
        self.security.stats.reset()
        self.sessions.reset_stats()

    def save_cluster_config(self, fsync: bool) -> None:
        self.nodes_file.save(self.core.cluster_conf(), fsync)

    def bgrewriteaof(self) -> Any:
        return self.aof_file.bgrewriteaof()

    def debug(self, sub: str, args: list[bytes]) -> Any:
        if sub == "sleep":
            time.sleep(float(args[0]))  # blocks the whole server, by design
            return Status(b"OK")
        if sub == "loadaof":
            return self.aof_file.debug_loadaof()
        if sub == "aof-fault":
            self.aof_file.inject_fault(None if args[0] == b"off" else args[0].decode())
            return Status(b"OK")
        if sub in ("segfault", "assert", "oom"):
            log.warning("DEBUG %s: crashing the server on request", sub)
            os.abort()
        if sub in ("restart", "crash-and-recover"):
            delay = int(args[0]) if args else 0
            if sub == "restart" and self.config.config_file:
                self.rewrite_config()
            if sub == "restart" and self.aof_file.status.state == "on":
                self.aof_file.flush(force=True)
                try:
                    self.aof_file.write_clean_snapshot()
                except OSError as e:
                    log.warning("Error writing the AOF snapshot before restarting: %s", e.strerror)
                    return err("failed to restart the server. Check server logs.")
            time.sleep(delay / 1000)
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
        return DisqueError("ERR")
