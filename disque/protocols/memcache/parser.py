"""Kestrel's memcache requests: a sans-IO parser (spec/kestrel.md §1-§3).

Theory of operation
-------------------
`Parser` works like h11: the connection `feed()`s what it receives, then
calls `next_request()` until it returns None (more bytes needed).  Each call
returns one request value (a frozen dataclass per command) or a
`BadRequest` value; it never raises.  A protocol error is fatal: the
connection writes `error.reply` and closes, and the parser keeps returning
the same error and drops anything fed after it.

A request is a line up to LF (a CR right before the LF is dropped), split
on every single space; empty tokens at the end are dropped, so `get  q`
names the empty queue and ` get q` has an empty command.  The command token
is case-insensitive, everything else case-sensitive.  SET is followed by a
data block of exactly `<bytes>` bytes and CRLF.  Extra tokens are ignored
(there is no multi-get), except a final `noreply` (see below).

Limits, so that a hostile client cannot make the parser hold memory without
bound: a line longer than `max_line` bytes is an error as soon as that many
bytes have come without an LF, and a SET announcing more than `max_data`
bytes (memcache-max-item-size, which the connection may change between two
feeds) is not buffered: as memcached 1.6 does, its block and the two bytes
after it are swallowed unchecked as they arrive, then the request comes out
as `SetTooLarge` (answered `SERVER_ERROR object too large for cache`) and the
connection goes on.  Whenever `next_request()` returns None, `buffered()` is
at most `max(max_line, max_data + 2)`.  The result never depends on how the
input was split into chunks.

Choices where Kestrel 1.2 is undefined or buggy (§1.1, §11), all replies
followed by a close:
* a non-integer `<flags>`, `<exptime>` or `t=`, a missing queue argument and
  a negative `<bytes>` get `CLIENT_ERROR` (1.2 left the connection hung);
  integers follow Java's `parseInt` (optional sign, 32 bits; `<flags>` may
  also be a memcache unsigned 32-bit value);
* a data block not followed by CRLF (it was shorter or longer than
  `<bytes>`) gets `CLIENT_ERROR` and nothing is stored; 1.2 skipped the two
  bytes unchecked and stored a truncated item;
* a queue name must be non-empty, hold no control byte and none of the
  reserved `/ ~ .` (2.x refuses them; `/` cannot occur in a GET, where it
  starts the options), and a `+` needs a non-empty parent before it and a
  non-empty child after it (§5): otherwise `CLIENT_ERROR`;
* `noreply` as the last token of SET, DELETE, FLUSH or FLUSH_ALL asks for no
  reply, as memcache clients (pymemcache by default) expect; 1.2 ignored it
  and replied anyway, which desynchronises such clients;
* QUIT (1.3.0) closes with no reply; `gets`, `add` and the 2.x commands stay
  unknown, as in 1.2.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from disque.protocols.memcache.encoder import CLIENT_ERROR, ERROR

MAX_LINE = 64 * 1024  # longest request line, CR included
MAX_DATA = 1 << 20  # largest SET data block buffered by default (memcache-max-item-size, memcached's -I)

INT32_MIN, INT32_MAX, UINT32_MAX = -(1 << 31), (1 << 31) - 1, (1 << 32) - 1
EXPTIME_RELATIVE_MAX = 1_000_000  # below this an exptime is relative seconds (§4.2)

_JAVA_INT = re.compile(rb"[+-]?[0-9]+")
_BAD_NAME_BYTE = re.compile(rb"[\x00-\x1f\x7f/~.]")
_NOREPLY = b"noreply"


# ------------------------------------------------------------------ values


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A malformed request: write `reply`, then close.  `reason` is for logs."""

    reply: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class GetOptions:
    """The `/option` suffixes of a GET key, already checked for validity."""

    open: bool = False
    close: bool = False
    abort: bool = False
    peek: bool = False
    timeout_ms: int = 0  # how long to wait for an item; 0 = no wait

    @property
    def fetches(self) -> bool:
        """Whether the GET takes (or peeks at) an item after closing or
        aborting (§3.2): yes unless it is an abort or a bare close."""
        return not self.abort and (self.open or not self.close)


@dataclass(frozen=True, slots=True)
class Get:
    queue: bytes  # the bare name, without the options
    options: GetOptions = GetOptions()
    key: bytes = field(default=b"", compare=False)  # as the client sent it, options included


@dataclass(frozen=True, slots=True)
class Set:
    queue: bytes
    flags: int  # checked, then ignored (Kestrel does not keep it)
    exptime: int  # the token's value; `expiry_ms` gives the expiry
    data: bytes
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class SetTooLarge:
    """A SET whose data block exceeded the parser's `max_data`; the block was
    read and discarded, with the two bytes after it."""

    queue: bytes
    size: int
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    queue: bytes
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class Flush:
    queue: bytes
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class FlushExpired:
    queue: bytes


@dataclass(frozen=True, slots=True)
class FlushAll:
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class FlushAllExpired:
    pass


@dataclass(frozen=True, slots=True)
class Version:
    pass


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class Reload:
    pass


@dataclass(frozen=True, slots=True)
class Stats:
    pass


@dataclass(frozen=True, slots=True)
class DumpStats:
    pass


@dataclass(frozen=True, slots=True)
class DumpConfig:
    pass


@dataclass(frozen=True, slots=True)
class Quit:
    pass


Request = (
    Get | Set | SetTooLarge | Delete | Flush | FlushExpired | FlushAll | FlushAllExpired | Version
    | Shutdown | Reload | Stats | DumpStats | DumpConfig | Quit
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _SetHeader:
    """A SET line whose data block is still to come."""

    queue: bytes
    flags: int
    exptime: int
    size: int
    noreply: bool


# ------------------------------------------------------------------ expiry


def expiry_ms(exptime: int, now_ms: int) -> int:
    """A SET's absolute expiry in ms, 0 = never (§4.2): an exptime below
    1,000,000 is relative seconds, from there on absolute Unix seconds (in 64
    bits, unlike 1.2); a negative one is relative, so already expired, and is
    kept from landing on 0.  Kestrel's threshold, not memcached's 30 days."""
    if exptime == 0:
        return 0
    if exptime >= EXPTIME_RELATIVE_MAX:
        return exptime * 1000
    return max(now_ms + exptime * 1000, 1)


# ------------------------------------------------------------------ tokens


def _java_int(token: bytes, low: int = INT32_MIN, high: int = INT32_MAX) -> int | None:
    if _JAVA_INT.fullmatch(token) is None:
        return None
    n = int(token)
    return n if low <= n <= high else None


def _bad_name(name: bytes) -> str | None:
    """Why `name` cannot be a queue name, or None if it can."""
    if not name:
        return "empty queue name"
    if _BAD_NAME_BYTE.search(name):
        return "queue name with a control byte or one of '/', '~', '.'"
    parent, plus, child = name.partition(b"+")
    if plus and not (parent and child):
        return "fanout queue name without a parent or a child"
    return None


def _noreply(tokens: list[bytes], required: int) -> bool:
    return len(tokens) > required and tokens[-1] == _NOREPLY


def _client_error(reason: str) -> BadRequest:
    return BadRequest(CLIENT_ERROR, reason)


def parse_get_key(key: bytes) -> Get | BadRequest:
    """`<queue>[/<option>...]`, checked in Kestrel's order (§3.1)."""
    queue, *pieces = key.split(b"/")
    opened = closed = aborted = peeked = False
    timeout = 0
    for piece in pieces:
        if piece == b"open":
            opened = True
        elif piece == b"close":
            closed = True
        elif piece == b"abort":
            aborted = True
        elif piece == b"peek":
            peeked = True
        elif piece.startswith(b"t="):
            t = _java_int(piece[2:])
            if t is None:
                return _client_error("timeout is not an integer")
            timeout = max(t, 0)  # the last one wins; negative means no wait
        # anything else, empty pieces included, is ignored
    if not queue:
        return _client_error("empty queue name")
    if (peeked or aborted) and (opened or closed):
        return _client_error("peek or abort combined with open or close")
    if peeked and aborted:
        return _client_error("peek combined with abort")
    reason = _bad_name(queue)
    if reason is not None:
        return _client_error(reason)
    return Get(queue, GetOptions(opened, closed, aborted, peeked, timeout), key)


def _get(tokens: list[bytes]) -> Get | BadRequest:
    if len(tokens) < 2:
        return _client_error("missing queue name")
    return parse_get_key(tokens[1])


def _set(tokens: list[bytes]) -> _SetHeader | BadRequest:
    if len(tokens) < 5:
        return _client_error("set needs a queue, flags, exptime and a byte count")
    size = _java_int(tokens[4])
    if size is None:
        return BadRequest(ERROR, "byte count is not an integer")
    if size < 0:
        return _client_error("negative byte count")
    flags = _java_int(tokens[2], high=UINT32_MAX)
    exptime = _java_int(tokens[3])
    if flags is None or exptime is None:
        return _client_error("flags or exptime is not an integer")
    reason = _bad_name(tokens[1])
    if reason is not None:
        return _client_error(reason)
    return _SetHeader(tokens[1], flags, exptime, size, _noreply(tokens, 5))


_Command = Callable[[list[bytes]], "Request | _SetHeader | BadRequest"]  # a command line's parser


def _queue_command(make: Callable[[bytes, bool], Request]) -> _Command:
    """A command whose one argument is a queue name, with an optional `noreply`."""

    def parse(tokens: list[bytes]) -> Request | BadRequest:
        if len(tokens) < 2:
            return _client_error("missing queue name")
        reason = _bad_name(tokens[1])
        if reason is not None:
            return _client_error(reason)
        return make(tokens[1], _noreply(tokens, 2))

    return parse


_COMMANDS: dict[bytes, _Command] = {
    b"GET": _get,
    b"SET": _set,
    b"DELETE": _queue_command(Delete),
    b"FLUSH": _queue_command(Flush),
    b"FLUSH_EXPIRED": _queue_command(lambda queue, noreply: FlushExpired(queue)),
    b"FLUSH_ALL": lambda tokens: FlushAll(_noreply(tokens, 1)),
    b"FLUSH_ALL_EXPIRED": lambda tokens: FlushAllExpired(),
    b"VERSION": lambda tokens: Version(),
    b"SHUTDOWN": lambda tokens: Shutdown(),
    b"RELOAD": lambda tokens: Reload(),
    b"STATS": lambda tokens: Stats(),
    b"DUMP_STATS": lambda tokens: DumpStats(),
    b"DUMP_CONFIG": lambda tokens: DumpConfig(),
    b"QUIT": lambda tokens: Quit(),
}


def _parse_line(line: bytes) -> Request | _SetHeader | BadRequest:
    """One request line, without its LF (a trailing CR is dropped here)."""
    if line.endswith(b"\r"):
        line = line[:-1]
    tokens = line.split(b" ")
    while tokens and not tokens[-1]:
        tokens.pop()
    command = _COMMANDS.get(tokens[0].upper()) if tokens else None
    if command is None:
        return _client_error("unknown command")
    return command(tokens)


# ------------------------------------------------------------------ parser


class Parser:
    """Turns the bytes of one memcache connection into request values."""

    __slots__ = ("max_line", "max_data", "_buf", "_scan", "_set", "_skip", "_error")

    def __init__(self, max_line: int = MAX_LINE, max_data: int = MAX_DATA) -> None:
        self.max_line = max_line
        self.max_data = max_data
        self._buf = bytearray()
        self._scan = 0  # bytes of the pending line already searched for LF
        self._set: _SetHeader | None = None  # reading this SET's data block
        self._skip = 0  # bytes of an oversized data block (and its CRLF) still to swallow
        self._error: BadRequest | None = None

    def feed(self, data: bytes) -> None:
        """Take received bytes (dropped once the parser has failed)."""
        if self._error is None:
            self._buf += data

    def buffered(self) -> int:
        """Bytes received and not yet consumed."""
        return len(self._buf)

    def next_request(self) -> Request | BadRequest | None:
        """The next request, the protocol error, or None until more data."""
        if self._error is not None:
            return self._error
        if self._set is not None:
            return self._data_block(self._set)
        buf = self._buf
        lf = buf.find(b"\n", self._scan)
        if lf < 0:
            if len(buf) > self.max_line:
                return self._fail(_client_error("request line too long"))
            self._scan = len(buf)
            return None
        if lf > self.max_line:
            return self._fail(_client_error("request line too long"))
        result = _parse_line(bytes(buf[:lf]))
        del buf[: lf + 1]
        self._scan = 0
        if isinstance(result, BadRequest):
            return self._fail(result)
        if isinstance(result, _SetHeader):
            self._set = result
            if result.size > self.max_data:
                self._skip = result.size + 2
            return self._data_block(result)
        return result

    def _data_block(self, header: _SetHeader) -> Set | SetTooLarge | BadRequest | None:
        buf = self._buf
        if self._skip:  # too large: swallowed, never buffered
            dropped = min(self._skip, len(buf))
            del buf[:dropped]
            self._skip -= dropped
            if self._skip:
                return None
            self._set = None
            return SetTooLarge(header.queue, header.size, header.noreply)
        size = header.size
        if len(buf) < size + 2:
            return None
        if buf[size : size + 2] != b"\r\n":
            return self._fail(_client_error("data block not followed by CRLF"))
        data = bytes(buf[:size])
        del buf[: size + 2]
        self._set = None
        return Set(header.queue, header.flags, header.exptime, data, header.noreply)

    def _fail(self, error: BadRequest) -> BadRequest:
        self._error = error
        self._buf = bytearray()
        return error
