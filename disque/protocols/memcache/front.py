"""Kestrel's memcache text protocol as a `FrontEnd` (spec/kestrel.md)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from disque.core.config import MEMCACHE_ITEM_SIZE_MAX
from disque.protocols.base import FrontEnd, ProtocolError
from disque.protocols.memcache import parser
from disque.protocols.memcache.commands import encode, overlaps, run
from disque.protocols.memcache.encoder import client_error


class Requests:
    """The parser as the session runner drives it: a malformed stream raises
    `ProtocolError` carrying the reply line (CLIENT_ERROR or ERROR).  Given
    the node's config, it reads memcache-max-item-size at each feed, so that
    CONFIG SET reaches the open connections too."""

    __slots__ = ("parser", "config")

    def __init__(self, config: Any = None) -> None:
        self.parser = parser.Parser()
        self.config = config

    def feed(self, data: bytes) -> None:
        if self.config is not None:
            self.parser.max_data = self.config.memcache_max_item_size
        self.parser.feed(data)

    def buffered(self) -> int:
        return self.parser.buffered()

    def next_command(self) -> Any:
        request = self.parser.next_request()
        if isinstance(request, parser.BadRequest):
            raise ProtocolError(request.reply.decode("latin-1"))
        return request


def encode_error(message: str) -> bytes:
    """The parser's reply line as it is; the session's own last words (an
    unauthenticated request too long) as a CLIENT_ERROR line."""
    if message.endswith("\r\n"):
        return message.encode("latin-1")
    return client_error(message)


# The parser holds at most a line or an item (memcache-max-item-size) and one read.
MEMCACHE = FrontEnd(
    "memcache", Requests, run, encode, encode_error, parser.MAX_LINE + MEMCACHE_ITEM_SIZE_MAX + 2, overlaps
)


def memcache_front(config: Any) -> FrontEnd:
    """The front end of a node's memcache listeners: its parsers follow `config`."""
    return replace(MEMCACHE, new_parser=partial(Requests, config))
