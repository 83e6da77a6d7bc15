"""RESP for clients: the request parser (the encoder is encoder.py).

Theory of operation
-------------------
`RequestParser` is a sans-IO decoder in the style of h11: the connection task
`feed()`s the bytes it receives, then calls `next_command()` until it returns
None.  Each call yields one request as a non-empty argv of bytes, or raises
`ProtocolError`; the server then sends `encode(error)` and closes, and the
parser stays dead.  A request whose first byte is `*` is a multibulk array;
anything else is an inline line, split like a shell.

hiredis's C reader builds the multibulk argvs.  It is a reply parser, more
lenient than upstream's request reader (every RESP3 type, any count or
length), so the parser keeps a copy of the input it hands to hiredis and
re-reads it with upstream's rules (`_resync`) when hiredis fails, returns
something that is not an argv, or runs out of data in the middle of a
request.  The re-reading raises upstream's exact error, or finds that the
request hiredis is on is an inline line or an ignored `*<count <= 0>` header;
then hiredis is dropped and parsing goes on from there.  A chunk of complete
requests costs one `gets()` and a type check per request.

hiredis does not tell how far it has read, so the re-reading starts from an
anchor: a request boundary, or a point in the pending request up to which the
input was already checked, plus the number of requests returned since.  Once
hiredis has read 1 KiB it discards what it has read; when that happens right
after a request, the size it keeps shows where that request ended and the
anchor moves there.  The copy and each re-reading stay around 1 KiB.

Between multibulk requests the parser is idle: it splits inline lines itself
and checks the `*<count>` line of a multibulk request before handing the
input to hiredis, in slices that grow with what hiredis holds, so that
dropping hiredis wastes little.  The reader is a fresh one, or the previous
one when it ended cleanly on a request boundary after a small input (a lone
request per read is the common case, and creating a reader costs more than
parsing it).

Where replies differ from upstream Disque (its Redis 3 request reader):

* Elements sent as `+text`, `(n` or `=n` are read by hiredis as strings, and
  the request runs with them as arguments; upstream replies `expected '$',
  got '+'`.  We do too when the request is re-read: a later request in the
  same stretch of input is malformed, or is cut at the end of a read.
* Multibulk lines must end in CRLF, as hiredis requires; upstream skips
  whatever byte follows the CR.
* `expected '$', got 'c'` is reported as soon as the byte arrives; upstream
  waits for the end of its line.
* An inline line ends at LF and is split up to its first NUL.  Upstream finds
  the LF with strchr, so a line holding a NUL never ends, and after a bare LF
  it drops the first byte of the next request.

"""

from __future__ import annotations

from disque.core.config import split_args_bytes
import re
from typing import Any, Final

import hiredis

from disque.protocols.base import ProtocolError

QUERY_BUFFER_LIMIT: Final = 1 << 30  # the server closes a client holding more, with no reply
INLINE_MAX: Final = 64 * 1024  # longest inline request, count line or length line
MAX_MULTIBULK: Final = 1024 * 1024  # most arguments in a request
MAX_BULK: Final = 512 * 1024 * 1024  # longest argument
_FEED_MIN: Final = 4096  # smallest slice handed to hiredis

# (Final: the compiled build reads them as constants, not module attributes)
_STAR: Final = 42  # ord("*")
_DOLLAR: Final = 36  # ord("$")
_INT64 = re.compile(rb"-?[1-9][0-9]{0,18}|0")  # upstream's string2ll syntax
_COUNT_LINE = re.compile(rb"\*([1-9][0-9]{0,5})\r\n")  # the usual lines, within limits
_BULK_LINE = re.compile(rb"\$(0|[1-9][0-9]{0,7})\r\n")


class RequestParser:
    """Turns the bytes of one client connection into argvs."""

    __slots__ = ("_buf", "_reader", "_spare", "_fed", "_held", "_skip", "_left", "_returned", "_error")

    def __init__(self) -> None:
        # Idle (no reader): _buf holds the unparsed input.  With a reader:
        # _buf is the input from the anchor on, of which hiredis got _fed bytes.
        self._buf = bytearray()
        self._reader: hiredis.Reader | None = None
        self._spare: hiredis.Reader | None = None  # idle: a reader to use again (see _restart)
        self._fed = 0
        self._held = 0  # size of hiredis's buffer when last looked at
        # The anchor: payload bytes still to pass, elements left in the request
        # there, requests returned since.
        self._skip = 0
        self._left = 0
        self._returned = 0
        self._error: str | None = None  # set: the parser is dead, and this is why

    def feed(self, data: bytes) -> None:
        """Take received bytes (dropped once the parser is dead)."""
        if self._error is None:
            self._buf += data

    def buffered(self) -> int:
        """Bytes received and not yet returned as requests (approximately,
        within the 1 KiB hiredis keeps of consumed input)."""
        if self._reader is None:
            return len(self._buf)
        return self._reader.len() + len(self._buf) - self._fed

    def next_command(self) -> list[bytes] | None:
        """The next request, or None until more data is fed."""
        if self._error is not None:
            raise ProtocolError(self._error)  # a new one: a raised error keeps the frames it crossed
        buf = self._buf
        try:
            while True:
                reader = self._reader
                if reader is None:
                    if not buf:
                        return None
                    if buf[0] != _STAR:
                        argv = self._inline()
                        if argv is None:
                            return None
                        if argv:
                            return argv
                        continue
                    # not a count of one digit (checked here, cheaper than the regex), nor the usual count line: check it
                    if not (len(buf) > 3 and 49 <= buf[1] <= 57 and buf[2] == 13 and buf[3] == 10) and _COUNT_LINE.match(buf) is None:
                        header = _count_line(buf, 0)
                        if header is None:
                            return None
                        count, end = header
                        if count <= 0:
                            del buf[:end]
                            continue
                    reader = self._spare
                    if reader is None:
                        reader = hiredis.Reader()
                    self._reader, self._spare = reader, None
                    size = len(buf)
                    if size <= _FEED_MIN:  # the usual read: one slice (what _feed_more does, inline)
                        self._held = reader.len() + size  # a spare still holds what it consumed
                        reader.feed(buf)  # type: ignore[arg-type]  # hiredis takes any buffer
                        self._fed = size
                    else:
                        self._fed, self._held = 0, reader.len()
                        self._feed_more()
                reply: Any  # hiredis's reply: an argv, False (incomplete) or any other RESP value
                try:
                    reply = reader.gets()
                except Exception:  # ProtocolError; MemoryError, TypeError on absurd nesting
                    reply = None  # re-read below
                if type(reply) is list and 0 < len(reply) <= MAX_MULTIBULK and _all_bytes(reply):
                    if not reader.has_data():  # hiredis read all it got: a request boundary
                        pos = self._fed  # _restart(pos, reader), inline: the usual end of a request
                        del buf[:pos]
                        self._fed = self._skip = self._left = self._returned = 0
                        self._reader = None
                        self._spare = reader if pos <= _FEED_MIN else None
                    else:
                        self._returned += 1
                        kept = reader.len()
                        if kept < self._held:  # hiredis just discarded its input up to here
                            self._held = kept
                            self._move_anchor(self._fed - kept, 0, 0, 0)
                    return reply
                if reply is not False:
                    self._resync(failed=True)
                    continue
                self._held = reader.len()
                if self._fed < len(buf):
                    self._feed_more()
                elif not self._resync(failed=False):
                    return None
        except ProtocolError as exc:
            self._error = exc.message
            self._buf = bytearray()
            self._reader = None
            raise

    def _feed_more(self) -> None:
        # Slices grow with what hiredis holds, so a restart wastes little.
        size = min(len(self._buf) - self._fed, max(_FEED_MIN, self._fed))
        reader = self._reader
        assert reader is not None
        reader.feed(self._buf, self._fed, size)  # type: ignore[arg-type]  # hiredis takes any buffer
        self._fed += size
        self._held += size

    def _move_anchor(self, pos: int, skip: int, left: int, returned: int) -> None:
        del self._buf[:pos]
        self._fed -= pos
        self._skip, self._left, self._returned = skip, left, returned

    def _restart(self, pos: int, done: hiredis.Reader | None = None) -> None:
        """Drop hiredis and go idle at `pos`, a request boundary.  `done`, a
        reader that consumed all its input there, is kept for the next
        request if it was handed at most _FEED_MIN bytes since the anchor
        (what it keeps stays small); a reader that failed or holds part of a
        request never is."""
        self._move_anchor(pos, 0, 0, 0)
        self._reader = None
        self._spare = done if pos <= _FEED_MIN else None

    def _resync(self, failed: bool) -> bool:
        """Re-read from the anchor with upstream's rules.

        Raises upstream's error, if any.  Returns True after a restart at the
        request hiredis is on, when upstream would read it as inline or
        ignore it.  Otherwise hiredis waits for data (`failed` is False): the
        anchor moves to the first element not complete yet and this returns
        False.
        """
        buf = self._buf
        size = len(buf)
        pos, skip, left, todo = 0, self._skip, self._left, self._returned
        while todo >= 0:
            if skip:  # inside a payload
                if skip > size - pos:
                    skip -= size - pos
                    pos = size
                    break
                pos += skip
                skip = 0
                if not left:
                    todo -= 1  # a request ends here
            elif left:
                bulk = _bulk_line(buf, pos)
                if bulk is None:
                    break
                length, pos = bulk
                skip = length + 2
                left -= 1
            else:  # at a request boundary; anything but `*` starts an inline line
                header = _count_line(buf, pos) if buf[pos : pos + 1] == b"*" else (0, pos)
                if header is None:
                    break
                left, end = header
                if left <= 0:
                    self._restart(pos)
                    return True
                pos = end
        if failed or todo < 0:  # pragma: no cover - hiredis rejected what upstream accepts
            raise ProtocolError("Protocol error: invalid bulk length")
        self._move_anchor(pos, skip, left, todo)
        return False

    def _inline(self) -> list[bytes] | None:
        """Consume one inline line; None while it is incomplete."""
        buf = self._buf
        eol = buf.find(b"\n")
        if eol < 0:
            if len(buf) > INLINE_MAX:
                raise ProtocolError("Protocol error: too big inline request")
            return None
        line = bytes(buf[: eol - 1 if eol and buf[eol - 1] == 13 else eol])
        del buf[: eol + 1]
        try:
            args = split_args_bytes(line)
        except ValueError:
            raise ProtocolError("Protocol error: unbalanced quotes in request") from None
        return [arg for arg in args if arg]


def _all_bytes(reply: list[Any]) -> bool:
    """Whether every element is a bulk string (hiredis gives other types for the others)."""
    for arg in reply:
        if type(arg) is not bytes:
            return False
    return True


def _int64(buf: bytearray, start: int, end: int) -> int | None:
    """buf[start:end] as upstream's string2ll reads it, or None."""
    if _INT64.fullmatch(buf, start, end) is None:
        return None
    value = int(buf[start:end])
    return value if -(1 << 63) <= value < 1 << 63 else None


def _count_line(buf: bytearray, pos: int) -> tuple[int, int] | None:
    """Check the `*<count>` line at pos: (count, end of line), or None if cut."""
    usual = _COUNT_LINE.match(buf, pos)
    if usual is not None:
        return int(usual[1]), usual.end()
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        if len(buf) - pos > INLINE_MAX:
            raise ProtocolError("Protocol error: too big mbulk count string")
        return None
    count = _int64(buf, pos + 1, eol)
    if count is None or count > MAX_MULTIBULK:
        raise ProtocolError("Protocol error: invalid multibulk length")
    return count, eol + 2


def _bulk_line(buf: bytearray, pos: int) -> tuple[int, int] | None:
    """Check the `$<length>` line at pos: (length, end of line), or None if cut."""
    usual = _BULK_LINE.match(buf, pos)
    if usual is not None:
        return int(usual[1]), usual.end()
    if pos == len(buf):
        return None
    if buf[pos] != _DOLLAR:
        got = bytes(buf[pos : pos + 1]).decode("utf-8", "surrogateescape")
        raise ProtocolError(f"Protocol error: expected '$', got '{got}'")
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        if len(buf) - pos > INLINE_MAX:
            raise ProtocolError("Protocol error: too big bulk count string")
        return None
    length = _int64(buf, pos + 1, eol)
    if length is None or not 0 <= length <= MAX_BULK:
        raise ProtocolError("Protocol error: invalid bulk length")
    return length, eol + 2
