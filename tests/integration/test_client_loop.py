"""The client epoll loop, in process with a real Server: serving other
sockets (`TcpClients.watch`), an event of a socket taken out earlier in the
same wake-up is ignored, and `wake` from another task runs `after_pass`;
an exception while serving one client closes that client only."""

from __future__ import annotations

import socket

import trio

from disque.core.config import Config
from disque.shell.server import Server


async def test_a_socket_unwatched_by_an_earlier_event_of_the_batch_is_skipped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nodes.conf
    tcp = Server(Config()).tcp
    a, a_peer = socket.socketpair()
    b, b_peer = socket.socketpair()
    seen: list[str] = []
    passes = 0

    def on_a(events: int) -> None:
        seen.append("a")
        a.recv(10)
        tcp.unwatch(b.fileno())  # e.g. a DropLink produced by a's frames
        tcp.unwatch(a.fileno())

    def on_b(events: int) -> None:
        seen.append("b")
        b.recv(10)
        tcp.unwatch(b.fileno())
        tcp.unwatch(a.fileno())

    def after_pass() -> None:
        nonlocal passes
        passes += 1

    tcp.watch(a.fileno(), on_a)
    tcp.watch(b.fileno(), on_b)
    tcp.after_pass = after_pass
    a_peer.send(b"x")
    b_peer.send(b"y")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tcp.run)
            while not seen:
                await trio.sleep(0.01)
            tcp.wake()  # from another task: one more pass runs
            while passes < 2:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        for s in (a, a_peer, b, b_peer):
            s.close()
    assert len(seen) == 1 and not tcp.watched  # the second event of the batch was stale: skipped, no crash


class _Broken:
    """A parser that fails as a bug would: an unexpected exception."""

    def feed(self, data: bytes) -> None:
        raise RuntimeError("a bug in this connection's parser")

    def buffered(self) -> int:
        return 0


async def test_an_exception_serving_one_client_closes_that_client_only(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # nodes.conf
    server = Server(Config())
    tcp, sessions = server.tcp, server.sessions
    pairs = [socket.socketpair() for _ in range(2)]
    conns = []
    for ours, _ in pairs:
        ours.setblocking(False)
        conns.append(tcp.add(ours, "127.0.0.1:1", "127.0.0.1:2", trusted=True))
    conns[0].parser = _Broken()
    (_, broken_peer), (_, good_peer) = pairs
    broken_peer.setblocking(False)
    good_peer.setblocking(False)

    async def reply(peer: socket.socket) -> bytes:
        with trio.fail_after(10):
            while True:
                try:
                    return peer.recv(100)
                except BlockingIOError:
                    await trio.sleep(0.01)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tcp.run)
            broken_peer.send(b"PING\r\n")
            good_peer.send(b"PING\r\n")
            assert await reply(broken_peer) == b""  # closed
            assert await reply(good_peer) == b"+PONG\r\n"
            good_peer.send(b"PING\r\n")  # the loop goes on
            assert await reply(good_peer) == b"+PONG\r\n"
            nursery.cancel_scope.cancel()
    finally:
        for ours, peer in pairs:
            ours.close()
            peer.close()
    assert conns[0].gone and not conns[1].gone
    assert conns[0].client.id not in sessions.conns  # the core forgot it
    assert "a bug in this connection's parser" in caplog.text
