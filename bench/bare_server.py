"""The least any Python RESP server pays per request: the single-node
benchmark's reference for what Python itself costs.

One process, one epoll loop, non-blocking sockets, hiredis parsing, and a
fixed 48-byte status reply (the size of an ADDJOB reply) to every request:
no command logic at all.  Usage: python bench/bare_server.py PORT.
"""

from __future__ import annotations

import select
import socket
import sys

import hiredis

REPLY = b"+" + b"D" * 48 + b"\r\n"


def serve(port: int) -> None:
    listener = socket.create_server(("127.0.0.1", port), backlog=512)
    listener.setblocking(False)
    epoll = select.epoll()
    epoll.register(listener.fileno(), select.EPOLLIN)
    conns: dict[int, tuple[socket.socket, hiredis.Reader]] = {}
    while True:
        for fd, _ in epoll.poll():
            if fd == listener.fileno():
                sock, _ = listener.accept()
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns[sock.fileno()] = (sock, hiredis.Reader())
                epoll.register(sock.fileno(), select.EPOLLIN)
                continue
            sock, reader = conns[fd]
            data = sock.recv(65536)
            if not data:
                epoll.unregister(fd)
                del conns[fd]
                sock.close()
                continue
            reader.feed(data)
            replies = 0
            while reader.gets() is not False:
                replies += 1
            sock.sendall(REPLY * replies)  # the benchmark's client reads everything: never blocks for long


if __name__ == "__main__":
    serve(int(sys.argv[1]))
