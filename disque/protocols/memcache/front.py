"""Kestrel's memcache text protocol as a `FrontEnd` (spec/kestrel.md)."""

from __future__ import annotations

from typing import Any

from disque.protocols.base import FrontEnd, ProtocolError
from disque.protocols.memcache import parser
from disque.protocols.memcache.commands import encode, overlaps, run


class Requests:
    """The parser as the session runner drives it: a malformed stream raises
    `ProtocolError` carrying the reply line (CLIENT_ERROR or ERROR)."""

    __slots__ = ("parser",)

    def __init__(self) -> None:
        self.parser = parser.Parser()

    def feed(self, data: bytes) -> None:
        self.parser.feed(data)

    def buffered(self) -> int:
        return self.parser.buffered()

    def next_command(self) -> Any:
        request = self.parser.next_request()
        if isinstance(request, parser.ProtocolError):
            raise ProtocolError(request.reply.decode("latin-1"))
        return request


def encode_error(message: str) -> bytes:
    return message.encode("latin-1")


MEMCACHE = FrontEnd(
    "memcache", Requests, run, encode, encode_error, parser.MAX_LINE + parser.MAX_DATA + 2, overlaps
)
