"""The bus's per-frame work, without trio: compiled with the core (mypyc).

Theory of operation: shell/bus.py owns the connections' lives (listening,
connecting, the handshakes, the tasks and their cancel scopes); this module
owns what happens for every frame once a connection carries them, so that
the work a replicated job costs on the bus runs as native code.  A `Link` is
one connection's state: its frame decoder and `LinkCodec`, its queue of
encoded frames and the bytes waiting in it, the batch of REPLJOBs or GOTJOBs
not encoded yet, and while the client loop (the reactor, tcp.py) serves its
socket, its fd there.  The trio objects a `Link` carries (its stream, its
cancel scopes, the event that wakes its writer task) are bus.py's, held
here untyped and only used to cancel or wake.

`Wires` holds every peer of a node, outgoing (`links`, by link key) and
incoming (`conns`, by connection id), and carries out the core's bus
effects: `send`, `answer` and `drop_link` (the dispatcher's bus port).  A
message is encoded onto its peer's queue at once with the core's current
header, except the REPLJOBs and GOTJOBs for a peer that reads the positional
form: those of a kind in a row wait in `batch` and leave as one REPLJOBS or
GOTJOBS body when the peer is written or a message of another kind for it
follows (a replica gets the copies of one step in one frame, and answers
them with one).  A reactor-served peer with frames to write is `unflushed`
until the reactor's end of wake-up (`flush`): the frames of one wake-up
leave in one write per peer, the rest when the socket is writable again
(`ready`).  A peer whose queue grows past `max_queue` bytes is not reading
and is closed.

`received` hands every frame of one read to the core as one step
(`peer.deliver`), then applies their effects once (`drain`); a bad frame
closes the peer after the frames before it are handled, and any unexpected
exception closes it too: a bug costs that connection, never the node.
"""

from __future__ import annotations

import os
import select
import traceback
from collections.abc import Callable
from typing import Any, Final, Protocol

from disque.cluster.auth import AuthError, AuthLink
from disque.cluster.codec import MAX_FRAME, FrameDecoder, FrameError, LinkCodec, length_prefix
from disque.cluster.messages import GotJob, GotJobs, Header, Message, ReplJob, ReplJobs

READ_SIZE: Final = 64 * 1024
IOV_MAX: Final = 1024  # the buffers one writev takes (Linux's UIO_MAXIOV)
_EPOLLIN: Final = select.EPOLLIN
_EPOLLOUT: Final = select.EPOLLOUT
_EPOLL_READ: Final = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP

Frames = list[tuple[Header, Message]]


class Reactor(Protocol):
    """The epoll loop that serves plain sockets (TcpClients)."""

    def watch(self, fd: int, handler: Callable[[int], None]) -> None: ...
    def want(self, fd: int, mask: int) -> None: ...
    def unwatch(self, fd: int) -> None: ...
    def wake(self) -> None: ...


class AuthDecoder(FrameDecoder):
    """A FrameDecoder over an authenticated link: the AuthLink frames and
    verifies, the link's codec decodes."""

    def __init__(self, auth: AuthLink, codec: LinkCodec) -> None:
        super().__init__(MAX_FRAME, codec)
        self.auth = auth

    def feed(self, data: bytes) -> None:
        self.auth.receive_data(data)

    def next_frame(self) -> tuple[Header, Message] | None:
        while (body := self.auth.next_body()) is not None:
            decoded = self.codec.decode(body)
            if decoded is not None:  # None: unknown version, skipped
                return decoded
        return None


def _ignore(frames: Frames) -> None:
    pass


class Link:
    """One bus connection: its stream, its queue of frames, its cancel scope,
    and while the reactor serves it, its socket's fd there."""

    def __init__(self, addr: tuple[str, int], label: str, scope: Any, identify: Any, wake: Any, stream: Any = None) -> None:
        self.addr = addr
        self.label = label
        self.stream: Any = stream  # None until an outgoing link is connected; an SSLStream with tls-cluster
        self.ready = False  # connected and secured: frames may be queued
        self.auth: AuthLink | None = None  # set once the secret handshake succeeded
        self.out: list[bytes | memoryview] = []
        self.queued = 0  # bytes accepted and not yet handed to the kernel
        self.wake: Any = wake  # a trio.Event: wakes the writer task of a task-served peer
        self.scope: Any = scope  # the trio.CancelScope of the peer's task
        self.closed = False
        self.identified = True  # incoming connections: False until their first valid frame
        self.reactor: Reactor | None = None
        self.fd = -1  # >= 0 while the reactor serves the socket
        self.writing = False  # the reactor waits for the socket to take the rest of `out`
        self.codec = LinkCodec()  # the frame bodies of this connection, both ways
        self.batch: list[Message] = []  # REPLJOBs or GOTJOBs to send in one body (positional form) ...
        self.batch_kind: tuple[type, bool] = (GotJob, False)  # ... of this type and `noreply`
        self.decoder = FrameDecoder(MAX_FRAME, self.codec)
        self.deliver: Callable[[Frames], None] = _ignore
        self.identify: Any = identify  # the trio.CancelScope of an unidentified connection's deadline

    def close(self) -> None:
        self.closed = True
        self.detach()
        self.scope.cancel()

    def detach(self) -> None:
        """Take the socket out of the reactor (before the task closes it, so
        that the fd is still ours)."""
        if self.fd >= 0:
            assert self.reactor is not None
            self.reactor.unwatch(self.fd)
            self.fd = -1


class Wires:
    """The frames of every bus connection of a node, both ways."""

    def __init__(
        self,
        header: Callable[[], Header],
        drain: Callable[[], None],
        warn: Callable[..., None],
        auth_failed: Callable[[Link, AuthError], None],
        max_frame: int,
        max_queue: int,
    ) -> None:
        self.header = header  # the core's current header, for frames encoded now
        self.drain = drain  # applies the effects of the core's last step
        self.warn = warn  # logs a link error (rate-limited)
        self.auth_failed = auth_failed  # counts and logs a frame that failed authentication
        self.max_frame = max_frame
        self.max_queue = max_queue
        self.links: dict[int, Link] = {}  # outgoing, connecting or connected
        self.conns: dict[int, Link] = {}  # incoming
        self.unidentified = 0  # incoming connections open without a valid frame yet
        self.reactor: Reactor | None = None  # the loop plain connections are served by
        self.unflushed: dict[Link, None] = {}  # reactor-served peers with frames to write
        self._last_batch: list[Message] = []  # the last REPLJOBs batched ...
        self._last_repljobs: Message | None = None  # ... and their REPLJOBS

    # ------------------------------------------------------------ effects

    def send(self, key: int, msg: Message) -> None:
        self.push(self.links.get(key), msg)

    def answer(self, conn: int, msg: Message) -> None:
        self.push(self.conns.get(conn), msg)

    def drop_link(self, key: int) -> None:
        link = self.links.get(key)
        if link is not None:
            link.close()

    def push(self, peer: Link | None, msg: Message) -> None:
        if peer is None or not peer.ready or peer.closed:
            return  # no link: dropped, as every bus message is best effort
        kind = type(msg)
        if (kind is ReplJob or kind is GotJob) and peer.codec.positional:
            batch_kind = (kind, isinstance(msg, ReplJob) and msg.noreply)
            if peer.batch and batch_kind != peer.batch_kind:
                self.append_batch(peer)
            peer.batch_kind = batch_kind
            peer.batch.append(msg)
        else:
            self._append(peer, msg)
        if peer.fd < 0:
            peer.wake.set()
        elif not peer.writing:
            if not self.unflushed:
                assert self.reactor is not None  # a peer has an fd only while the reactor serves it
                self.reactor.wake()
            self.unflushed[peer] = None
        if peer.queued > self.max_queue:
            self.warn("Closing %s: %d bytes queued, the peer is not reading", peer.label, peer.queued)
            peer.close()

    def _append(self, peer: Link, msg: Message) -> None:
        """Encode `msg` onto `peer.out`, after the batch waiting."""
        if peer.batch:
            self.append_batch(peer)
        if peer.auth is None:  # the prefix apart: a big job's body is written as it is, never copied into a frame
            parts = peer.codec.encode_parts(self.header(), msg)
            size = sum([len(part) for part in parts])
            peer.out.append(length_prefix(size))
            peer.out.extend(parts)
            peer.queued += size + 4
        else:
            frame = peer.auth.seal(peer.codec.encode(self.header(), msg))
            peer.out.append(frame)
            peer.queued += len(frame)

    def append_batch(self, peer: Link) -> None:
        batch = peer.batch
        peer.batch = []
        msg: Message
        if len(batch) == 1:
            msg = batch[0]
        elif peer.batch_kind[0] is GotJob:
            msg = GotJobs(tuple([m.id for m in batch if isinstance(m, GotJob)]))
        else:
            # The replicas of a job get the same REPLJOBs in a row: the same
            # message, so that the codec packs its body once for all of them.
            last, repljobs = self._last_batch, self._last_repljobs
            if repljobs is None or len(last) != len(batch) or any(a is not b for a, b in zip(last, batch)):
                repljobs = ReplJobs(tuple([m.job for m in batch if isinstance(m, ReplJob)]), peer.batch_kind[1])
                self._last_batch, self._last_repljobs = batch, repljobs
            msg = repljobs
        self._append(peer, msg)

    # ------------------------------------------------------------ the reactor's side

    def ready(self, peer: Link, events: int) -> None:
        """The reactor saw `peer`'s socket ready."""
        if events & _EPOLLOUT:
            self.write(peer)
        if events & _EPOLL_READ and peer.fd >= 0:
            try:
                data = os.read(peer.fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if data:
                self.received(peer, data)
            else:
                peer.close()

    def flush(self) -> None:
        """Write the frames queued for reactor-served peers (the reactor
        calls this at the end of every wake-up)."""
        unflushed = self.unflushed
        self.unflushed = {}
        for peer in unflushed:
            self.write(peer)

    def write(self, peer: Link) -> None:
        """Write what the kernel takes of `peer.out`; wait for the socket to
        become writable for the rest."""
        if peer.fd < 0:
            return
        if peer.batch:
            self.append_batch(peer)
        out = peer.out
        if out:
            try:  # the buffers as they are (a job's body among them): no copy of a big one per write
                sent = os.writev(peer.fd, out[:IOV_MAX])
            except BlockingIOError:
                sent = 0
            except OSError:
                peer.close()
                return
            peer.queued -= sent
            done = 0
            while done < len(out) and sent >= len(out[done]):
                sent -= len(out[done])
                done += 1
            del out[:done]
            if sent:
                out[0] = memoryview(out[0])[sent:]
        if bool(out) != peer.writing:
            peer.writing = bool(out)
            assert peer.reactor is not None  # the peer has an fd
            peer.reactor.want(peer.fd, _EPOLLIN | _EPOLLOUT if out else _EPOLLIN)

    # ------------------------------------------------------------ reading

    def received(self, peer: Link, data: bytes) -> None:
        """Hand every frame of `data` to the core as one step, then apply
        their effects once.  A bad frame closes the peer (logged) after the
        frames before it are handled; so does any unexpected exception (a
        bug costs that connection, not the node)."""
        try:
            self._receive(peer, data)
        except Exception:
            self.warn("Closing %s: error handling its frames: %s", peer.label, traceback.format_exc().rstrip())
            peer.close()

    def _receive(self, peer: Link, data: bytes) -> None:
        frames: Frames = []
        error: FrameError | AuthError | None = None
        decoder = peer.decoder
        try:
            decoder.feed(data)
            while not peer.closed and (frame := decoder.next_frame()) is not None:
                if not peer.identified:
                    peer.identified = True
                    self.unidentified -= 1
                    decoder.max_frame = self.max_frame
                    peer.identify.deadline = float("inf")
                frames.append(frame)
        except (FrameError, AuthError) as e:
            error = e
        try:
            if frames:
                peer.deliver(frames)
        finally:
            self.drain()
        if isinstance(error, FrameError):
            self.warn("Closing %s: %s", peer.label, error.reason)
            peer.close()
        elif error is not None:
            self.auth_failed(peer, error)
            peer.close()
