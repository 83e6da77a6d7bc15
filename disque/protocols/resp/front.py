"""RESP2/RESP3, the Disque (and Redis) client protocol, as a `FrontEnd`."""

from __future__ import annotations

from disque.protocols.base import FrontEnd
from disque.protocols.resp.commands import run
from disque.protocols.resp.encoder import encode, encode_error
from disque.protocols.resp.parser import QUERY_BUFFER_LIMIT, RequestParser

RESP = FrontEnd("resp", RequestParser, run, encode, encode_error, QUERY_BUFFER_LIMIT)
