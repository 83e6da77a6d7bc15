"""The trio cluster bus: the bus listener and the outgoing links.

Theory of operation: the bus moves frames and decides nothing.  The core says
which outgoing links it wants (`core.bus_links()`: link key -> (ip, bus
port)); a cron every 100 ms connects the missing ones and closes those whose
key disappeared or whose address changed.  Each outgoing link is one task:
connect (with a timeout, from the first bind address if any), report
`link_connected`, then read frames and hand them to `core.handle_frames(key=)`
until EOF, an I/O error, a bad frame or a `DropLink`; the task then reports
`link_closed` and ends.  The next cron starts a new task if the key is still
wanted.  Connection attempts of a key are spaced by a backoff of 1, 2, 4, 8
and at most 10 cron ticks (100 ms .. 1 s), reset by a successful connect.

Incoming connections are only read from, except for the answers the core
sends back on them (`Answer`, e.g. PONG to PING/MEET).  Each gets an int id
passed to `core.handle_frames(conn=)` with the peer and local IPs of the socket.
An incoming connection is *unidentified* until it has sent one valid frame
(a node's first frame is its PING or MEET): it must do so within
IDENTIFY_TIMEOUT, its first frame may not declare more than
FIRST_FRAME_MAX bytes, and at most UNIDENTIFIED_MAX such connections are
open at once; others are closed (logged, rate-limited, and counted).
Without a cluster secret or bus TLS, *bus protected mode*
(`cluster-protected-mode yes`, the default) also refuses connections from
addresses that are neither loopback nor those of nodes the core knows or
was told to MEET (`core.bus_links()`).

Every connection, either way, is a `wire.Link`: a stream and a queue of
encoded frames, so a slow peer only ever delays itself.  The per-frame work
(encoding onto a peer's queue, batching REPLJOBs and GOTJOBs, writing,
reading and decoding, handing the frames of one read to the core and
draining once) is shell/wire.py's `Wires`, compiled with the core; `Bus`
keeps the connections' lives.  Once a plain TCP connection is set up, its
socket is served by the client loop's epoll set (the reactor, tcp.py)
rather than by tasks: the frames of every peer and the client requests of
one wake-up are read together, and the frames they produce leave in one
write per peer at the end of the wake-up (`Wires.flush`), the rest when the
socket is writable again.  A TLS connection keeps a reader and a writer
task.  A peer whose queue grows past `max_queue` bytes is not reading and
is dropped, as is a peer that sends a malformed or oversized frame (logged,
rate-limited), and one whose frames or task raise anything unexpected:
every connection has its error boundary, so a bug costs that link, never
the node.
Every close resets the connection, so frames still in the kernel are dropped
rather than delivered after a partition heals (`_reset_on_close`).

After every core call the bus runs `drain()`, which applies the effects the
call produced (the node's dispatcher, dispatch.py); the frames of one read
are all handed to the core first and drained once, so the replies, AOF
records and frames they cause go out in one batch.  Applying effects never calls
the core back: closing a link only cancels its task, which reports later.

Security (`disque.shell.security.Security`, optional): before a connection carries
any frame, either way, it is secured in two layers, each only when
configured.  With `tls-cluster yes` the TCP stream is wrapped in a mutual TLS
`SSLStream`; with a cluster secret the `auth.AuthLink` handshake runs on top,
and every frame is then sealed (MAC + sequence number) on send and verified
on receipt.  A peer that fails either, or sends a frame that does not verify,
is closed, logged (rate-limited) and counted in `security.stats`; an
outgoing link that fails counts as a failed connection attempt (backoff, and
`link_closed(failed=True)`), and the core never hears of the frames.  A
connection is `ready` (frames may be queued on it) only once secured.
"""

from __future__ import annotations

import os

import ipaddress
import logging
import socket
import struct
import traceback
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

import trio

from disque.cluster.auth import AuthError, AuthLink
from disque.cluster.codec import MAX_FRAME, FrameDecoder, frame_limit
from disque.cluster.messages import Header, Message
from disque.shell.security import Security, bus_protected_mode_refuses
from disque.shell.wire import READ_SIZE, AuthDecoder, Link, Reactor, Wires

log = logging.getLogger("disque")

CLUSTER_PORT_INCR = 10000  # bus port = client port + 10000
CRON_PERIOD = 0.1  # seconds between link reconciliations
MAX_BACKOFF_TICKS = 10  # reconnect attempts of a failing key: at most every second
CONNECT_TIMEOUT = 1.0  # seconds; a hung connect counts as a failed one
# A peer that stops reading is dropped once this many bytes wait for it: room
# for a largest frame behind a backlog of as much again.
MAX_QUEUE = 2 * MAX_FRAME
LOG_INTERVAL = 1.0  # seconds between two logged link errors
HANDSHAKE_TIMEOUT = 3.0  # seconds for the TLS and secret handshakes of a new connection
WILDCARDS = ("0.0.0.0", "::")
IDENTIFY_TIMEOUT = 5.0  # seconds an incoming connection has to send its first valid frame
FIRST_FRAME_MAX = 64 * 1024  # largest first frame (a PING or MEET is a few KB)
UNIDENTIFIED_MAX = 128  # incoming connections open at once that have not sent a valid frame
ABORT_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets


class BusCore(Protocol):
    """The core's entry points the bus calls (NodeCore's)."""

    def header(self) -> Header: ...
    def bus_links(self) -> dict[int, tuple[str, int]]: ...
    def link_connected(self, key: int) -> None: ...
    def link_closed(self, key: int, connect_failed: bool) -> None: ...
    def handle_frames(
        self, frames: Iterable[tuple[Header, Message]], *, key: int | None = None, conn: int | None = None,
        peer_ip: str = "", local_ip: str = "",
    ) -> None: ...  # fmt: skip


class _Retry:
    __slots__ = ("next_tick", "delay")

    def __init__(self) -> None:
        self.next_tick = 0  # earliest cron tick of the next connection attempt
        self.delay = 1  # ticks between attempts


def _reset_on_close(stream: trio.abc.Stream) -> None:
    """Make closing `stream` discard what the kernel has not sent yet.

    A plain close leaves an orphaned socket that retransmits its backlog for
    minutes: a link dropped during a partition would deliver its frames after
    the heal, describing a past state (a REPLJOB of a job acknowledged since,
    whose DELJOB went nowhere).  Bus messages are best effort, so losing them
    is safe; delivering them late is not."""
    sock = getattr(stream, "socket", None) or getattr(getattr(stream, "transport_stream", None), "socket", None)
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, ABORT_ON_CLOSE)
        except OSError:
            pass  # already closed or reset: nothing is pending


def _host(addr: tuple[Any, ...]) -> str:
    """The IP of a socket address: scope id removed, IPv4-mapped IPv6 unwrapped."""
    ip = addr[0].partition("%")[0]
    mapped = ipaddress.ip_address(ip).ipv4_mapped if ":" in ip else None
    return str(mapped) if mapped else ip


def _peer(addr: tuple[str, int], label: str, stream: trio.abc.Stream | None = None) -> Link:
    return Link(addr, label, trio.CancelScope(), trio.CancelScope(), trio.Event(), stream)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Bus:
    """Listener, outgoing links and the link cron of one node.

    `await listen()` binds the listeners (OSError if it cannot), then `run()`
    serves until cancelled.  `send`, `answer` and `drop_link` carry out the
    core's `Send`, `Answer` and `DropLink` effects; they never block.
    """

    def __init__(
        self,
        core: BusCore,
        drain: Callable[[], None],
        *,
        port: int,
        bind: Sequence[str] = (),
        backlog: int = 511,
        connect_timeout: float = CONNECT_TIMEOUT,
        max_frame: int = MAX_FRAME,
        max_queue: int = MAX_QUEUE,
        security: Security | None = None,
    ) -> None:
        self.core = core
        self.security = security  # disque.shell.security.Security, or None: no TLS, no secret
        self.drain = drain
        self.port = port
        self.bind = list(bind)
        # Outgoing links leave from the first bind address, unless it is a wildcard.
        self.source = self.bind[0] if self.bind and self.bind[0] not in WILDCARDS else None
        self.backlog = backlog
        self.connect_timeout = connect_timeout
        self.max_frame = max_frame
        self.max_queue = max_queue
        self.listeners: list[trio.SocketListener] = []
        # The frames of every connection; the dispatcher's bus port.
        self.wires = Wires(core.header, drain, self._warn, self._auth_failed, max_frame, max_queue)
        self.links = self.wires.links  # outgoing, connecting or connected
        self.conns = self.wires.conns  # incoming
        self._retry: dict[int, _Retry] = {}
        self._settled: dict[int, tuple[str, int]] | None = None  # the wanted links, once all are up
        self._tick = 0
        self._next_conn = 0
        self._nursery: trio.Nursery | None = None
        self._log_at = float("-inf")
        self._log_skipped = 0

    # ------------------------------------------------------------ lifecycle

    async def listen(self) -> None:
        listeners: list[trio.SocketListener] = []
        try:
            for host in self.bind or [None]:
                listeners += await trio.open_tcp_listeners(self.port, host=host, backlog=self.backlog)
        except OSError as e:
            where = _hostport(host or "*", self.port)
            log.warning("Creating cluster bus TCP listening socket %s: %s", where, e.strerror)
            for listener in listeners:
                await listener.aclose()
            raise
        self.listeners = listeners

    async def run(self, own_cron: bool = True, reactor: Reactor | None = None) -> None:
        """Serve until cancelled.  With `own_cron` false the caller runs
        `cron()` every CRON_PERIOD (the server's deadline pass does: one
        timer for the node instead of one per task, as every timer that
        expires costs a trio cancellation).  With a `reactor` (the client
        loop, which then calls `flush` after each of its wake-ups) plain
        connections are served there; otherwise by tasks, as TLS ones are."""
        self.wires.reactor = reactor
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.listeners:
                nursery.start_soon(trio.serve_listeners, self._serve_conn, self.listeners)
            while own_cron:
                self.cron()
                await trio.sleep(CRON_PERIOD)
            await trio.sleep_forever()

    def follow(self, max_job_size: int) -> None:
        """The queue of a peer not reading follows `max-job-size` (CONFIG
        SET): room for two of the biggest frames this node may send."""
        self.max_queue = self.wires.max_queue = 2 * frame_limit(max_job_size)

    def cron(self) -> None:
        """Reconcile the links with those the core wants (once running)."""
        if self._nursery is not None:
            self._reconcile()
            self._tick += 1

    # ------------------------------------------------------------ effects

    def send(self, key: int, msg: Message) -> None:
        self.wires.send(key, msg)

    def answer(self, conn: int, msg: Message) -> None:
        self.wires.answer(conn, msg)

    def drop_link(self, key: int) -> None:
        self.wires.drop_link(key)

    def auth_links(self) -> tuple[int, int]:
        """(authenticated connections open, those using the previous secret)."""
        peers = [p for p in (*self.links.values(), *self.conns.values()) if p.auth is not None and not p.closed]
        return len(peers), sum(1 for p in peers if p.auth and p.auth.secret and p.auth.secret.previous)

    # ------------------------------------------------------------ outgoing links

    def _reconcile(self) -> None:
        wanted: dict[int, tuple[str, int]] = self.core.bus_links()
        self.drain()
        if wanted is self._settled:  # the same links wanted, all up, and none ended since
            return
        for key, link in self.links.items():
            if wanted.get(key) != link.addr:
                link.close()  # its task ends and frees the key; the next cron reconnects
        for key in self._retry.keys() - wanted.keys():
            del self._retry[key]
        assert self._nursery is not None
        for key, addr in wanted.items():
            retry = self._retry.setdefault(key, _Retry())
            if key in self.links or self._tick < retry.next_tick:
                continue
            retry.next_tick = self._tick + retry.delay
            link = self.links[key] = _peer(addr, f"bus link to {_hostport(*addr)}")
            self._nursery.start_soon(self._run_link, key, link)
        # The core keeps its dict of wanted links until a node is added,
        # deleted or moves: until then, or until a link ends, there is
        # nothing to do, and the cron does not walk every link ten times a
        # second.
        up = len(self.links) == len(wanted) and all(link.ready and not link.closed and k in wanted for k, link in self.links.items())
        self._settled = wanted if up else None

    async def _run_link(self, key: int, link: Link) -> None:
        core = self.core
        failed = False
        try:
            with link.scope:
                try:
                    with trio.fail_after(self.connect_timeout):
                        link.stream = await trio.open_tcp_stream(*link.addr, local_address=self.source)
                except (OSError, trio.TooSlowError) as e:
                    log.debug("Connecting %s failed: %s", link.label, str(e) or "timeout")
                    failed = True
                    if retry := self._retry.get(key):
                        retry.delay = min(retry.delay * 2, MAX_BACKOFF_TICKS)
                    return
                if not await self._secure(link, initiator=True):
                    failed = True
                    if retry := self._retry.get(key):
                        retry.delay = min(retry.delay * 2, MAX_BACKOFF_TICKS)
                    return
                if retry := self._retry.get(key):
                    retry.delay = 1
                link.ready = True
                self._call(core.link_connected, key)
                await self._session(link, partial(core.handle_frames, key=key))
        except Exception:  # a bug costs this link, not the node
            self._warn("Closing %s: %s", link.label, traceback.format_exc().rstrip())
        finally:
            self._settled = None
            if self.links.get(key) is link:
                del self.links[key]
            if failed or link.stream is not None:
                self._call(core.link_closed, key, failed)
            if link.stream is not None:
                _reset_on_close(link.stream)
                await trio.aclose_forcefully(link.stream)

    # ------------------------------------------------------------ incoming connections

    async def _serve_conn(self, stream: trio.SocketStream) -> None:
        try:
            peer_addr, local_addr = stream.socket.getpeername(), stream.socket.getsockname()
        except OSError:
            return  # reset before we looked at it
        label = f"bus connection from {_hostport(*peer_addr[:2])}"
        peer_ip = _host(peer_addr)
        sec = self.security
        wires = self.wires
        if wires.unidentified >= UNIDENTIFIED_MAX:
            self._refuse(stream, "cluster_unidentified_closed", "Refusing %s: %d connections have not identified yet", label, wires.unidentified)
            return
        if sec is not None and bus_protected_mode_refuses(sec.config, sec.keyring is not None or sec.bus_tls, peer_ip, self._known_ips):
            self._refuse(stream, "cluster_protected_mode_refused",
                         "Refusing %s: not a known node, and the bus has no cluster-secret (cluster-protected-mode)", label)  # fmt: skip
            return
        self._next_conn += 1
        conn = self._next_conn
        peer = _peer(peer_addr[:2], label, stream)
        peer.identified = False
        wires.unidentified += 1
        self.conns[conn] = peer
        deliver = partial(self.core.handle_frames, conn=conn, peer_ip=peer_ip, local_ip=_host(local_addr))
        try:
            with peer.scope:
                if await self._secure(peer, initiator=False):
                    peer.ready = True
                    await self._session(peer, deliver)
        except Exception:  # a bug costs this connection, not the node
            self._warn("Closing %s: %s", label, traceback.format_exc().rstrip())
        finally:
            if not peer.identified:
                wires.unidentified -= 1
            del self.conns[conn]
            _reset_on_close(stream)  # serve_listeners closes it

    def _known_ips(self) -> set[str]:
        return {ip for ip, _ in self.core.bus_links().values()}

    def _refuse(self, stream: trio.SocketStream, counter: str, fmt: str, *args: Any) -> None:
        self._count(counter, fmt, *args)
        _reset_on_close(stream)

    def _count(self, counter: str, fmt: str, *args: Any) -> None:
        """Count a refused or closed connection (INFO security) and log it."""
        if self.security is not None:
            stats = self.security.stats
            setattr(stats, counter, getattr(stats, counter) + 1)
        self._warn(fmt, *args)

    # ------------------------------------------------------------ both directions

    async def _secure(self, peer: Link, initiator: bool) -> bool:
        """TLS, then the secret handshake, as configured.  False when the peer
        fails either (logged and counted): the caller closes the connection."""
        sec = self.security
        if sec is None or (sec.keyring is None and not sec.bus_tls):
            return True
        assert peer.stream is not None
        stage = "TLS"
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                if sec.bus_tls:
                    ctx = sec.tls.bus_client if initiator else sec.tls.bus_server
                    ssl_stream = trio.SSLStream(peer.stream, ctx, server_side=not initiator)
                    await ssl_stream.do_handshake()
                    peer.stream = ssl_stream
                if sec.keyring is not None:
                    stage = "authentication"
                    auth = AuthLink(sec.keyring, initiator=initiator, random=os.urandom, max_frame=self.max_frame)
                    await self._authenticate(peer.stream, auth)
                    peer.auth = auth
                    sec.stats.cluster_auth_handshakes_ok += 1
                    if auth.secret is not None and auth.secret.previous:
                        log.info("%s authenticated with cluster-secret-previous", peer.label)
            return True
        except AuthError as e:
            sec.count_auth_error(e.kind)
            sec.log("bus-auth-" + e.kind, logging.WARNING, "Refusing %s: %s", peer.label, e.reason)
        except trio.TooSlowError:
            self._count_stage(stage)
            sec.log("bus-auth-timeout", logging.WARNING, "Refusing %s: %s handshake timed out", peer.label, stage)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            self._count_stage(stage)
            why = e.__cause__ or e
            sec.log("bus-auth-closed", logging.WARNING, "Refusing %s: %s handshake failed: %s", peer.label, stage,
                    getattr(why, "reason", None) or str(why) or "connection closed")  # fmt: skip
        return False

    def _count_stage(self, stage: str) -> None:
        assert self.security is not None  # a handshake ran: there is a security setup
        stats = self.security.stats
        if stage == "TLS":
            stats.tls_cluster_handshake_failures += 1
        else:
            stats.cluster_auth_handshakes_failed += 1

    @staticmethod
    async def _authenticate(stream: trio.abc.Stream, auth: AuthLink) -> None:
        """Run the secret handshake; frames that follow it stay buffered in `auth`."""
        while True:
            if out := auth.data_to_send():
                await stream.send_all(out)
            if auth.established:
                return
            data = await stream.receive_some(READ_SIZE)
            if not data:
                raise AuthError("handshake", "the peer closed the connection during the handshake")
            auth.receive_data(data)
            auth.handshake_step()

    async def _session(self, peer: Link, deliver: Callable[[list[tuple[Header, Message]]], None]) -> None:
        """Read and write `peer` until either side fails; runs in `peer.scope`.

        A plain TCP connection is served by the reactor: its socket joins the
        epoll set of the client loop, so frames of every peer and the client
        requests of one wake-up are read together, and what they produce is
        written once at the end of it (`flush`).  A TLS connection keeps a
        reader and a writer task."""
        assert peer.stream is not None
        if peer.auth is not None:
            peer.decoder = AuthDecoder(peer.auth, peer.codec)
        else:
            peer.decoder = FrameDecoder(self.max_frame if peer.identified else min(self.max_frame, FIRST_FRAME_MAX), peer.codec)
        peer.deliver = deliver
        # An unidentified connection has IDENTIFY_TIMEOUT to send a valid frame.
        peer.identify.deadline = trio.current_time() + IDENTIFY_TIMEOUT if not peer.identified else float("inf")
        sock = getattr(peer.stream, "socket", None)
        wires = self.wires
        with peer.identify:
            if wires.reactor is not None and sock is not None:
                peer.reactor, peer.fd = wires.reactor, sock.fileno()
                wires.reactor.watch(peer.fd, partial(wires.ready, peer))
                wires.unflushed[peer] = None  # what was queued since the connection was made
                wires.reactor.wake()
                try:
                    await trio.sleep_forever()  # until peer.close() cancels the scope
                finally:
                    peer.detach()
            else:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_loop, peer)
                    await self._read_loop(peer)
        if peer.identify.cancelled_caught:
            self._count("cluster_unidentified_closed", "Closing %s: no valid frame within %.0f s", peer.label, IDENTIFY_TIMEOUT)
        peer.close()

    def _auth_failed(self, peer: Link, error: AuthError) -> None:
        assert self.security is not None  # an AuthError: the link is authenticated
        self.security.count_auth_error(error.kind)
        self.security.log("bus-auth-" + error.kind, logging.WARNING, "Closing %s: %s", peer.label, error.reason)

    async def _read_loop(self, peer: Link) -> None:
        assert peer.stream is not None
        try:
            while not peer.closed and (data := await peer.stream.receive_some(READ_SIZE)):
                self.wires.received(peer, data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        peer.close()

    async def _write_loop(self, peer: Link) -> None:
        assert peer.stream is not None
        try:
            while True:
                await peer.wake.wait()
                peer.wake = trio.Event()
                if peer.batch:
                    self.wires.append_batch(peer)
                data = b"".join(peer.out)
                peer.out.clear()
                await peer.stream.send_all(data)
                peer.queued -= len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            peer.close()

    def flush(self) -> None:
        self.wires.flush()

    # ------------------------------------------------------------ helpers

    def _call(self, method: Callable[..., None], *args: Any) -> None:
        method(*args)
        self.drain()

    def _warn(self, fmt: str, *args: Any) -> None:
        """Log a link error, at most one per LOG_INTERVAL; count the others."""
        now = trio.current_time()
        if now < self._log_at + LOG_INTERVAL:
            self._log_skipped += 1
            return
        if self._log_skipped:
            fmt += " (%d similar messages suppressed)"
            args += (self._log_skipped,)
        log.warning(fmt, *args)
        self._log_at, self._log_skipped = now, 0
