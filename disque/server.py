"""The trio shell of a node: listeners, client connections, the deadline loop.

This module performs the I/O the core asks for and nothing else.  One task per
client reads a chunk, feeds every complete request of it to the core, and
writes all the replies with one send (pipelining).  Replies the core produces
for *other* clients (a blocked GETJOB served by someone's ADDJOB) are appended
to those clients' output and flushed by a short task.  A single loop sleeps
until `NodeCore.next_deadline()` and calls `tick()`.  `Host` services (process
statistics, config rewrite, shutdown) are methods of `Server`.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import signal
import sys
import time
from typing import Any

import trio

from disque import config as cfg
from disque.cluster.bus import CLUSTER_PORT_INCR, Bus
from disque.cluster.membership import Membership
from disque.cluster.nodes_file import NodesFile
from disque.effects import Answer, AofAppend, CloseClient, DropLink, Reply, Send
from disque.errors import DisqueError, err
from disque.node import BLOCKED, SILENT, Client, NodeCore
from disque.resp import QUERY_BUFFER_LIMIT, ProtocolError, RequestParser, Status, encode, encode_error

log = logging.getLogger("disque")

READ_SIZE = 64 * 1024


class RealClock:
    @staticmethod
    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    @staticmethod
    def now_us() -> int:
        return time.perf_counter_ns() // 1000

    @staticmethod
    def wall_us() -> int:
        return time.time_ns() // 1000


class Conn:
    __slots__ = ("stream", "client", "parser", "out", "closing", "send_lock", "scope")

    def __init__(self, stream: trio.SocketStream, client: Client) -> None:
        self.stream = stream
        self.client = client
        self.parser = RequestParser()
        self.out: list[bytes] = []
        self.closing = False
        self.send_lock = trio.Lock()
        self.scope = trio.CancelScope()


def _peer(stream: trio.SocketStream, local: bool = False) -> str:
    try:
        addr = stream.socket.getsockname() if local else stream.socket.getpeername()
    except OSError:
        return ":0"
    host = addr[0]
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"


class Server:
    def __init__(self, config: cfg.Config) -> None:
        self.config = config
        self.clock = RealClock()
        rng = random.Random()
        # nodes.conf is locked and loaded before anything else (cluster.md §12.1)
        self.nodes_file = NodesFile(config.cluster_config_file)
        text = self.nodes_file.read()
        membership = None
        if text.strip():
            membership = Membership.from_conf(text, config.port, rng=rng, now=self.clock.now_ms())
            log.info("Node configuration loaded, I'm %s", membership.my_id)
        node_id = membership.my_id if membership else secrets.token_hex(20)
        self.core = NodeCore(config, node_id, clock=self.clock, rng=rng, host=self, membership=membership)
        if membership is None:
            self.save_cluster_config(fsync=True)
            log.info("No cluster configuration found, I'm %s", node_id)
        self.conns: dict[int, Conn] = {}
        self.next_client_id = 0
        self.nursery: trio.Nursery | None = None
        self.shutdown_requested = trio.Event()
        self.ports: list[int] = []
        self.bus = Bus(
            self.core,
            lambda: self._apply_effects(None),
            port=config.port + CLUSTER_PORT_INCR,
            bind=config.bind,
            backlog=config.tcp_backlog,
        )

    # ------------------------------------------------------------ lifecycle

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        # Bind before the nursery: an OSError then reaches the caller unwrapped.
        listeners = await self._open_listeners()
        if self.config.port:
            await self.bus.listen()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self.ports = [ln.socket.getsockname()[1] for ln in listeners]
            for listener in listeners:
                nursery.start_soon(trio.serve_listeners, self._handle_client, [listener])
            if self.config.port:
                nursery.start_soon(self.bus.run)
            nursery.start_soon(self._deadline_loop)
            nursery.start_soon(self._signals)
            log.info("Ready to accept connections on port %s", self.ports[0] if self.ports else 0)
            task_status.started(self)
            await self.shutdown_requested.wait()
            self._flush_all_nowait()
            log.warning("Disque is now ready to exit, bye bye...")
            nursery.cancel_scope.cancel()

    async def _open_listeners(self) -> list[trio.SocketListener]:
        if not self.config.port:
            return []
        hosts = self.config.bind or [None]
        listeners: list[trio.SocketListener] = []
        for host in hosts:
            listeners += await trio.open_tcp_listeners(self.config.port, host=host, backlog=self.config.tcp_backlog)
        return listeners

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
                if self.shutdown_requested.is_set() and signum == signal.SIGINT:
                    log.warning("You insist... exiting now.")
                    os._exit(1)
                log.warning("Received %s scheduling shutdown...", name)
                if not self.shutdown(False):
                    log.warning("SIGTERM received but errors trying to shut down the server, check the logs for more information")

    async def _deadline_loop(self) -> None:
        core, clock = self.core, self.clock
        while True:
            wait_ms = core.next_deadline() - clock.now_ms()
            if wait_ms > 0:
                await trio.sleep(wait_ms / 1000)
            wait_until = core.client_pause_until - clock.now_ms()
            if wait_until > 0:
                await trio.sleep(wait_until / 1000)
            core.tick()
            self._apply_effects(None)

    # ------------------------------------------------------------ clients

    async def _handle_client(self, stream: trio.SocketStream) -> None:
        core = self.core
        if len(self.conns) >= self.config.maxclients:
            core.stats.rejected += 1
            with trio.move_on_after(1):
                await stream.send_all(encode_error("max number of clients reached"))
            await stream.aclose()
            return
        self.next_client_id += 1
        client = core.connect(self.next_client_id, _peer(stream), _peer(stream, local=True), stream.socket.fileno())
        conn = Conn(stream, client)
        self.conns[client.id] = conn
        try:
            with conn.scope:
                await self._client_loop(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            del self.conns[client.id]
            core.disconnect(client.id)
            self._apply_effects(None)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _client_loop(self, conn: Conn) -> None:
        stats = self.core.stats
        stream = conn.stream
        while not conn.closing:
            data = await stream.receive_some(READ_SIZE)
            if not data:
                return
            stats.net_in += len(data)
            conn.parser.feed(data)
            if conn.parser.buffered() > QUERY_BUFFER_LIMIT:
                log.warning("Closing client that reached max query buffer length")
                return
            pause = self.core.client_pause_until - self.clock.now_ms()
            if pause > 0:
                await trio.sleep(pause / 1000)
            self._run_commands(conn)
            self._apply_effects(conn)
            await self._flush(conn)

    def _run_commands(self, conn: Conn) -> None:
        """Execute buffered requests until the client blocks or none is left."""
        core, client, out, parser = self.core, conn.client, conn.out, conn.parser
        while not conn.closing and client.waiter is None and client.repl_job is None:
            try:
                argv = parser.next_command()
            except ProtocolError as e:
                out.append(encode_error(e.message))
                conn.closing = True
                return
            if argv is None:
                return
            reply = core.handle_command(client, argv)
            if reply is BLOCKED:
                return
            if reply is not SILENT:
                out.append(encode(reply, client.proto))
            if core.effects and CloseClient(client.id) in core.effects:
                conn.closing = True  # QUIT, CLIENT KILL of itself: run nothing more

    def _apply_effects(self, current: Conn | None) -> None:
        core = self.core
        touched: dict[Conn, None] = {}
        while core.effects:
            effects, core.effects = core.effects, []
            for effect in effects:
                kind = type(effect)
                if kind is Reply:
                    conn = self.conns.get(effect.client_id)
                    if conn is not None:
                        conn.out.append(encode(effect.value, conn.client.proto))
                        touched[conn] = None
                elif kind is CloseClient:
                    conn = self.conns.get(effect.client_id)
                    if conn is not None:
                        conn.closing = True
                        touched[conn] = None
                elif kind is Send:
                    self.bus.send(effect.key, effect.msg)
                elif kind is Answer:
                    self.bus.answer(effect.conn, effect.msg)
                elif kind is DropLink:
                    self.bus.drop_link(effect.key)
                elif kind is AofAppend:
                    self.aof_append(effect.record)
            for conn in touched:  # an unblocked client resumes its pipeline
                self._run_commands(conn)
        if core.cluster.dirty:
            try:
                self.save_cluster_config(fsync=False)
            except OSError as e:
                log.warning("Fatal: can't update cluster config file: %s", e.strerror)
                os._exit(1)
        for conn in touched:
            if conn is not current and self.nursery is not None:
                self.nursery.start_soon(self._flush, conn)

    async def _flush(self, conn: Conn) -> None:
        async with conn.send_lock:
            if conn.out:
                data = b"".join(conn.out)
                conn.out.clear()
                self.core.stats.net_out += len(data)
                try:
                    await conn.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    conn.closing = True
            if conn.closing:
                conn.scope.cancel()

    def _flush_all_nowait(self) -> None:
        """Best effort before exiting: write pending replies without waiting."""
        for conn in self.conns.values():
            if conn.out:
                try:
                    conn.stream.socket.send(b"".join(conn.out))
                except OSError:
                    pass
                conn.out.clear()

    # ------------------------------------------------------------ AOF hook

    def aof_append(self, record: bytes) -> None:
        """Overridden by the AOF writer."""

    # ------------------------------------------------------------ Host services

    def process_info(self) -> dict[str, Any]:
        times = os.times()
        try:
            with open("/proc/self/statm", "rb") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            rss = 0
        uname = os.uname()
        return {
            "pid": os.getpid(),
            "rss": rss,
            "os": f"{uname.sysname} {uname.release} {uname.machine}",
            "executable": os.path.abspath(sys.argv[0]),
            "used_cpu_sys": times.system,
            "used_cpu_user": times.user,
            "used_cpu_sys_children": times.children_system,
            "used_cpu_user_children": times.children_user,
            "longest_output": max((len(c.out) for c in self.conns.values()), default=0),
            "biggest_input": max((c.parser.buffered() for c in self.conns.values()), default=0),
        }

    def rewrite_config(self) -> None:
        path = self.config.config_file
        assert path is not None
        try:
            with open(path, encoding="utf-8") as f:
                old = f.read()
            cfg.write_config_file(path, cfg.rewrite_config_text(old, self.config))
        except OSError as e:
            raise err(f"Rewriting config file: {e.strerror}") from None
        log.info("CONFIG REWRITE executed with success.")

    def apply_config(self, changed: list[str]) -> None:
        if "dir" in changed:
            try:
                os.chdir(self.config.dir)
            except OSError as e:
                self.config.dir = os.getcwd()  # CONFIG GET dir reports the real cwd
                raise err(f"Changing directory: {e.strerror}") from None
        if "appendonly" in changed and self.config.appendonly:
            raise err("Unable to turn on AOF. Check server logs.")

    def shutdown(self, rewrite_aof: bool) -> bool:
        log.warning("User requested shutdown...")
        self.shutdown_requested.set()
        return True

    def save_cluster_config(self, fsync: bool) -> None:
        self.core.cluster.dirty = False
        self.nodes_file.save(self.core.cluster.to_conf(), fsync)

    def bgrewriteaof(self) -> Any:
        return DisqueError("ERR")

    def debug(self, sub: str, args: list[bytes]) -> Any:
        if sub == "sleep":
            time.sleep(float(args[0]))  # blocks the whole server, by design
            return Status(b"OK")
        if sub in ("segfault", "assert", "oom"):
            log.warning("DEBUG %s: crashing the server on request", sub)
            os.abort()
        if sub in ("restart", "crash-and-recover"):
            self.core.now = self.clock.now_ms()
            delay = int(args[0]) if args else 0
            if sub == "restart" and self.config.config_file:
                self.rewrite_config()
            time.sleep(delay / 1000)
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
        return DisqueError("ERR")
