"""A client connection as the shell sees it: what both transports share.

Theory of operation: the server feeds what a connection receives to its
`parser`, runs the complete requests, and queues the encoded replies in
`out`; `out_size` counts the bytes queued and not yet written (checked
against client-output-buffer-limit).  How the bytes reach the socket is up to
the transport: `TcpConn` (tcp.py) for plain TCP, `TlsConn`
(server.py) for the tls-port.  Each implements `kick` (replies were queued by
someone else's command: send them once the AOF allows) and `abort` (the
output was dropped: close as soon as possible).
"""

from __future__ import annotations

from disque.core.types import Client
from disque.protocols.base import FrontEnd


class Conn:
    __slots__ = ("client", "front", "parser", "out", "out_size", "soft_since", "closing")

    def __init__(self, client: Client, front: FrontEnd) -> None:
        self.client = client
        self.front = front  # the protocol this connection speaks
        self.parser = front.new_parser()
        self.out: list[bytes | memoryview] = []
        self.out_size = 0  # bytes in `out` plus those being sent
        self.soft_since: float | None = None  # when the soft output limit was first exceeded
        self.closing = False  # run nothing more; close once `out` is written

    def kick(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError
