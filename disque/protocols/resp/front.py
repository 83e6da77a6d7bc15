"""RESP2/RESP3, the Disque (and Redis) client protocol, as a `FrontEnd`."""

from __future__ import annotations

from disque.protocols.base import FrontEnd
from disque.protocols.resp.commands import run
from disque.protocols.resp.encoder import encode, encode_error
from disque.protocols.resp.parser import QUERY_BUFFER_LIMIT, RequestParser


def _is_addjob(request: list[bytes]) -> bool:
    return len(request[0]) == 6 and request[0].lower() == b"addjob"


RESP = FrontEnd("resp", RequestParser, run, encode, encode_error, QUERY_BUFFER_LIMIT, _is_addjob)
