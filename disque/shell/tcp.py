"""Plain TCP clients: one task serves them all through a private epoll set.

Theory of operation
-------------------
A trio task per client pays a task switch and a wait registration for every
read, which costs more than running a small command.  Instead the listening
sockets and every plain TCP client socket sit in one `select.epoll` set, and
one task (`TcpClients.run`) waits for that set with
`trio.lowlevel.wait_readable`, so it lives inside the trio run like any other
task.  When it wakes it accepts, reads, runs and answers every ready socket
with non-blocking `accept`/`recv`/`send` calls, then waits again.

A read hands the chunk to the session runner (session.py), which parses it,
runs every complete request and carries out the effects; the replies go out
with one `send`.  Each connection is in one of three
modes, which decide its epoll mask:

* reading (EPOLLIN): no output pending.
* writing (EPOLLOUT): the kernel took only part of the output; the rest goes
  when the socket becomes writable.  The client is not read meanwhile: one
  that does not read its replies must not make the node run (and buffer)
  more of its requests.  A pipeline the runner held at its output limit
  (`Conn.held`) goes on once the output is written, one slice per turn of
  the loop (`resume`), so that other clients are served in between.
* parked (no events): the replies follow AOF records that are not safe yet
  (`AofFile.hold`); `AofFile.when_safe` calls back and the output is sent.
  If those records cannot be written (the AOF's disk is full), each reply
  held is answered with -MISCONF instead (`_refuse`), at once.

Replies for other clients (a blocked GETJOB served, MONITOR lines) are sent
at once by `kick`.  A connection is closed by this task only, when it handles
an event of that socket, so that nothing is closed under a caller's feet:
code elsewhere (CLIENT KILL, `timeout`, output limits) marks it `closing`,
and once its output is written (or dropped) adds it to `doomed` and wakes the
task through an eventfd in the epoll set.  The core forgets a client before
its socket is closed, as with a TLS client.  A batch of events may hold one that is
stale by the time it is handled (the socket changed mode meanwhile): the
handler goes by the mode, and a recv or send that finds nothing to do is
harmless.

Other sockets can be served here too (`watch`): the plain cluster bus
connections (bus.py), whose handler reads them as they become ready.  After
every wake-up, `after_pass` runs (the bus writes the frames the wake-up
produced, one write per peer); code outside this task that has work for it
calls `wake`.  CLIENT PAUSE does not stop the loop: clients read meanwhile
wait in `paused` and run once it is over, while the bus goes on.

TLS clients (tls-port) keep a trio stream and a task each (server.py).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from disque.core.types import Clock, Connection
from disque.protocols.base import FrontEnd
from disque.protocols.resp.front import RESP
from disque.shell.session import Conn, Sessions

if TYPE_CHECKING:
    from disque.shell.aof_file import AofFile

log = logging.getLogger("disque")

Refusal = Callable[[str, str], "bytes | None"]  # (peer IP, peer address) -> last words for a refused client, or None

READ_SIZE = 64 * 1024
MAX_EVENTS = 512
ACCEPT_BATCH = 64  # connections accepted per wake-up, so that clients already in get served
ACCEPT_PAUSE = 0.1  # seconds without accepting after running out of file descriptors
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP = select.EPOLLIN, select.EPOLLOUT, select.EPOLLERR, select.EPOLLHUP


def _nothing() -> None:
    pass


def format_addr(addr: Any) -> str:
    host = addr[0]
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"


class TcpConn(Conn):
    __slots__ = ("sock", "fd", "tcp", "mask", "hold", "parked", "gone")

    def __init__(self, client: Connection, sock: socket.socket, tcp: TcpClients, front: FrontEnd = RESP) -> None:
        super().__init__(client, front)
        self.sock = sock
        self.fd = sock.fileno()
        self.tcp = tcp
        self.mask = EPOLLIN
        self.hold = 0  # the AOF offset the output waits for while parked
        self.parked = False
        self.gone = False

    def kick(self) -> None:
        self.tcp.kick(self)

    def abort(self) -> None:
        self.tcp.shut(self)


class TcpClients:
    def __init__(
        self, sessions: Sessions, aof: AofFile, clock: Clock, refusal: Refusal, after_pass: Callable[[], None] = _nothing
    ) -> None:
        self.sessions = sessions
        self.core = sessions.core
        self.aof = aof
        self.clock = clock
        self.refusal = refusal  # what to tell a client refused at accept (maxclients, protected mode)
        self.epoll = select.epoll()
        self.conns: dict[int, TcpConn] = {}  # by fd
        self.listeners: dict[int, tuple[socket.socket, FrontEnd, Refusal, bool]] = {}  # by fd
        self.paused: dict[TcpConn, None] = {}  # read during CLIENT PAUSE, to run after it
        self.resume: list[TcpConn] = []  # held (session.OUTPUT_PAUSE) and written since: run the rest
        self.doomed: list[TcpConn] = []  # to close, asked for outside this task
        self.watched: dict[int, Callable[[int], None]] = {}  # other sockets served here (the bus): fd -> handler
        self.after_pass = after_pass  # runs once every event of a wake-up is handled
        self.in_pass = False
        self.woken = False
        # Readable when `doomed` is not empty or `after_pass` has work from outside this task.
        self.wakeup = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.epoll.register(self.wakeup, EPOLLIN)

    def watch(self, fd: int, handler: Callable[[int], None]) -> None:
        """Serve a socket of another kind here: `handler(events)` runs when
        it is ready (EPOLLIN, and EPOLLOUT once asked for with `want`)."""
        self.watched[fd] = handler
        self.epoll.register(fd, EPOLLIN)

    def want(self, fd: int, mask: int) -> None:
        self.epoll.modify(fd, mask)

    def unwatch(self, fd: int) -> None:
        if self.watched.pop(fd, None) is not None:
            self.epoll.unregister(fd)

    def wake(self) -> None:
        """Make sure `after_pass` runs soon: at the end of this wake-up, or
        of the next one, which this starts."""
        if not self.in_pass and not self.woken:
            self.woken = True
            os.eventfd_write(self.wakeup, 1)

    def listen(
        self, sock: socket.socket, front: FrontEnd = RESP, refusal: Refusal | None = None, trusted: bool = False
    ) -> None:
        """Serve clients of `front` accepted on `sock`; `refusal` (default:
        the server's) may turn one away, and `trusted` clients start
        authenticated (a protocol with no AUTH, on a listener whose refusal
        keeps strangers out)."""
        sock.setblocking(False)
        self.listeners[sock.fileno()] = (sock, front, refusal or self.refusal, trusted)
        self.epoll.register(sock.fileno(), EPOLLIN)

    async def run(self) -> None:
        epoll, conns = self.epoll, self.conns
        try:
            while True:
                if self.resume:  # runnable work left: poll without sleeping
                    await trio.lowlevel.checkpoint()
                elif self.paused:  # CLIENT PAUSE: the bus goes on; wake up at its end at the latest
                    with trio.move_on_after(self.core.pause_left(self.clock.now_ms()) / 1000):
                        await trio.lowlevel.wait_readable(epoll)
                else:
                    await trio.lowlevel.wait_readable(epoll)
                self.in_pass = True
                for fd, events in epoll.poll(0, MAX_EVENTS):
                    conn = conns.get(fd)
                    try:
                        if conn is None:
                            if fd == self.wakeup:
                                self._woken()
                            elif fd in self.watched:
                                self.watched[fd](events)
                            elif fd in self.listeners:
                                await self._accept(*self.listeners[fd])
                            # else: a bus socket taken out by an earlier event of this batch (a dropped link)
                        elif conn.mask & EPOLLIN:
                            self._read(conn)
                        elif conn.parked:
                            if events & (EPOLLERR | EPOLLHUP):  # the output cannot go anywhere
                                self._close(conn)
                        else:
                            self._send(conn)
                            if conn.closing and not conn.out:
                                self._close(conn)
                    except Exception:
                        self._failed(conn)
                if self.paused and not self.core.pause_left(self.clock.now_ms()):
                    self._run_paused()
                if self.resume:  # one more slice of each held pipeline, after everyone else
                    resume, self.resume = self.resume, []
                    for conn in resume:
                        if not conn.gone:
                            self._run_guarded(conn)
                self.in_pass = False
                self.after_pass()
        finally:
            for conn in list(conns.values()):
                conn.sock.close()
            for sock, *_ in self.listeners.values():
                sock.close()
            epoll.close()
            os.close(self.wakeup)

    # ------------------------------------------------------------ accepting

    async def _accept(self, listener: socket.socket, front: FrontEnd, refusal: Refusal, trusted: bool) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    continue  # the peer gave up while queued (ECONNABORTED, ...)
                log.warning("Accepting a client connection: %s", e.strerror)
                self.epoll.unregister(listener.fileno())
                await trio.sleep(ACCEPT_PAUSE)  # nothing is served meanwhile, as nothing can be
                self.epoll.register(listener.fileno(), EPOLLIN)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = format_addr(addr)
            refused = refusal(str(addr[0]), peer)
            if refused is not None:
                try:
                    sock.send(refused)
                except OSError:
                    pass
                sock.close()
                continue
            try:
                local = format_addr(sock.getsockname())
            except OSError:
                local = ":0"
            self.add(sock, peer, local, front, trusted)

    def add(self, sock: socket.socket, peer: str, local: str, front: FrontEnd = RESP, trusted: bool = False) -> TcpConn:
        """A connected, non-blocking socket becomes a client of this loop."""
        conn = TcpConn(self.sessions.new_client(peer, local, sock.fileno()), sock, self, front)
        conn.client.authenticated = trusted
        self.sessions.opened(conn)
        self.conns[conn.fd] = conn
        self.epoll.register(conn.fd, EPOLLIN)
        return conn

    # ------------------------------------------------------------ reading

    def _failed(self, conn: TcpConn | None) -> None:
        """The error boundary of one socket: an unexpected exception while
        serving it is logged, and costs that client its connection (its
        unsent output with it), never the loop or the node."""
        log.exception("Error serving %s", f"client id={conn.client.id} addr={conn.client.addr}" if conn else "a socket")
        if conn is not None and not conn.gone:
            conn.out.clear()
            self._close(conn)

    def _run_guarded(self, conn: TcpConn) -> None:
        try:
            self._run(conn)
        except Exception:
            self._failed(conn)

    def _read(self, conn: TcpConn) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data or not self.sessions.received(conn, data):
            self._close(conn)
            return
        core = self.core
        if core.client_pause_until and core.pause_left(self.clock.now_ms()):  # no clock read unless paused once
            self.paused[conn] = None
            return
        self._run(conn)

    def _run(self, conn: TcpConn) -> None:
        self.sessions.run(conn)
        aof = self.aof
        # hold() answers 0 without an open AOF once it has dropped the entry for conn: no Python call then
        hold = aof.hold(conn) if aof.fd is not None or aof.targets else 0
        if hold:
            self._park(conn, hold)
        elif conn.out:
            self._send(conn)
        if conn.closing and not conn.out and not conn.parked:
            self._close(conn)

    def _run_paused(self) -> None:
        """CLIENT PAUSE is over: clients read meanwhile run their requests
        (until then they are read, not run; the bus sockets are served)."""
        paused, self.paused = self.paused, {}
        for conn in paused:
            if not conn.gone:
                self._run_guarded(conn)

    # ------------------------------------------------------------ writing

    def set_mask(self, conn: TcpConn, mask: int) -> None:
        if conn.mask != mask and not conn.gone:
            conn.mask = mask
            self.epoll.modify(conn.fd, mask)

    def _send(self, conn: TcpConn) -> None:
        """Write what the kernel takes of the output, then pick the mode."""
        out = conn.out
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            try:
                sent = conn.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:  # the peer is gone: its output with it
                out.clear()
                conn.out_size = 0
                conn.closing = True
                sent = -1
            if sent >= 0:
                if sent == len(data):
                    out.clear()
                else:
                    out[:] = (memoryview(data)[sent:],)
                self.sessions.sent(conn, sent)
        if out:
            self.set_mask(conn, EPOLLOUT)
        elif conn.closing:
            self.shut(conn)
        else:
            self.set_mask(conn, EPOLLIN)
            if conn.held:
                conn.held = False
                self.resume.append(conn)

    def shut(self, conn: TcpConn) -> None:
        """Have the task close `conn` (its output is written or dropped)."""
        if not self.doomed:
            os.eventfd_write(self.wakeup, 1)
        self.doomed.append(conn)

    def _woken(self) -> None:
        os.eventfd_read(self.wakeup)
        self.woken = False
        doomed, self.doomed = self.doomed, []
        for conn in doomed:
            if not conn.gone:
                self._close(conn)

    def kick(self, conn: TcpConn) -> None:
        """Send what other clients' commands queued for `conn`."""
        if conn.gone:
            return
        hold = self.aof.hold()
        if hold or conn.parked:
            self._park(conn, hold)
        else:
            self._send(conn)

    def _park(self, conn: TcpConn, hold: int) -> None:
        if hold > conn.hold:
            conn.hold = hold
        if self.aof.failed(conn.hold) is not None:
            self._refuse(conn)
        elif not conn.parked:
            conn.parked = True
            self.set_mask(conn, 0)
            self.aof.when_safe(conn.hold, lambda: self._unpark(conn), lambda: self._refuse(conn))

    def _refuse(self, conn: TcpConn) -> None:
        """The records the held output follows cannot be written for now:
        each reply held is answered with -MISCONF instead (`Conn.refuse`)."""
        reason = None if conn.gone else self.aof.failed(conn.hold)
        if reason is None:  # a callback of an earlier park, answered since
            return
        conn.refuse(reason)
        conn.parked = False
        conn.hold = 0
        self._send(conn)

    def _unpark(self, conn: TcpConn) -> None:
        if conn.gone:
            return
        if not self.aof.safe(conn.hold):  # more output queued meanwhile, behind later records
            self.aof.when_safe(conn.hold, lambda: self._unpark(conn))
            return
        conn.parked = False
        conn.hold = 0
        self._send(conn)

    # ------------------------------------------------------------ closing

    def _close(self, conn: TcpConn) -> None:
        conn.gone = True
        del self.conns[conn.fd]
        self.epoll.unregister(conn.fd)
        conn.sock.close()
        self.sessions.gone(conn)

    def flush_all_nowait(self) -> None:
        """Best effort before exiting: write pending replies without waiting."""
        for conn in self.conns.values():
            if conn.out:
                try:
                    conn.sock.send(b"".join(conn.out))
                except OSError:
                    pass
                conn.out.clear()
