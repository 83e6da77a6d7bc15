"""The seam every client protocol plugs into.

Theory of operation: a front end is three things over the one core.  Its
parser turns the bytes of a connection into requests (`feed(data)`, then
`next_command()` until it returns None; a malformed stream raises the
parser's `ProtocolError`, which `encode_error` writes before the session
closes).  Its command table, `run(core, client, request)`, answers what is
the protocol's own business and hands every command to
`NodeCore.handle_command` -> `run` -> `NodeCore.execute` (the checks all
protocols share, the handler, statistics).  Its encoder turns the core's
protocol-neutral results (disque.core.types) into bytes.  The session loop in
the shell only ever calls these, so a new protocol is a new `FrontEnd` and a
listener, not a new loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from disque.core.errors import DisqueError


class ProtocolError(DisqueError):
    """A malformed stream: the parser is dead; `message` is what the front
    end's `encode_error` writes before the session closes."""

    def __init__(self, message: str) -> None:
        super().__init__("ERR", message)


@dataclass(frozen=True, slots=True)
class FrontEnd:
    name: str
    new_parser: Callable[[], Any]  # a parser for one connection
    run: Callable[[Any, Any, Any], Any]  # (NodeCore, Connection, request) -> result
    encode: Callable[[Any, int], bytes]  # (result, protocol version) -> bytes
    encode_error: Callable[[str], bytes]  # a protocol error's last words
    query_buffer_limit: int  # the session closes a client whose unparsed input is larger
    # Requests that may run while an earlier one of the same connection waits
    # for its job's replicas (pipelined ADDJOBs replicate together; their
    # answers still leave in order).
    overlaps: Callable[[Any], bool] = lambda request: False
