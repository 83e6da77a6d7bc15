"""The client epoll loop serving other sockets (`TcpClients.watch`), in
process with a real Server: an event of a socket taken out earlier in the
same wake-up is ignored, and `wake` from another task runs `after_pass`."""

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
