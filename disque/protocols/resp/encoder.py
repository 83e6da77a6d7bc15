"""RESP for clients: reply encoding.

`encode(value, proto)` turns a core result into RESP2 or RESP3 bytes:
`Status` (+text), int, bytes or str (bulk), list or tuple (array), `Map`,
None (nil bulk), `NIL_ARRAY` (nil array) and `DisqueError` (-CODE text).
The results are protocol-neutral (disque.core.types); only this module
knows how RESP writes them.
"""

from __future__ import annotations

from typing import Any

from disque.core.errors import DisqueError, err
from disque.core.types import NIL_ARRAY, Map, Status

# Length lines of the usual sizes, formatted once: a lookup costs a fifth of a `%`.
_CACHED = 1024
_BULK = [b"$%d\r\n" % n for n in range(_CACHED)]
_ARRAY = [b"*%d\r\n" % n for n in range(_CACHED)]


def encode(value: Any, proto: int = 2) -> bytes:
    """The wire form of a reply value for protocol version `proto` (2 or 3).

    TypeError for anything else, bool included: that is a bug in the caller.
    """
    kind = type(value)
    if kind is Status:
        return b"+%s\r\n" % value
    if kind is int:
        return b":%d\r\n" % value
    if kind is bytes:
        return b"$%d\r\n%s\r\n" % (len(value), value)
    out: list[bytes] = []
    _encode_into(out, value, proto == 3)
    return b"".join(out)


def encode_error(text: str) -> bytes:
    """`-ERR <text>` (CR and LF turned into spaces)."""
    return b"-%s\r\n" % err(text).wire()


def _encode_into(out: list[bytes], value: Any, resp3: bool) -> None:
    kind = type(value)
    if kind is list or kind is tuple:
        n = len(value)
        out.append(_ARRAY[n] if n < _CACHED else b"*%d\r\n" % n)
        for item in value:
            if type(item) is bytes:  # the common element: skip a call
                n = len(item)
                out += (_BULK[n] if n < _CACHED else b"$%d\r\n" % n, item, b"\r\n")
            else:
                _encode_into(out, item, resp3)
    elif kind is bytes:
        n = len(value)
        out += (_BULK[n] if n < _CACHED else b"$%d\r\n" % n, value, b"\r\n")
    elif kind is str:
        data = value.encode("utf-8", "surrogateescape")
        out += (b"$%d\r\n" % len(data), data, b"\r\n")
    elif kind is Status:
        out += (b"+", value, b"\r\n")
    elif value is None:
        out.append(b"_\r\n" if resp3 else b"$-1\r\n")
    elif value is NIL_ARRAY:
        out.append(b"_\r\n" if resp3 else b"*-1\r\n")
    elif kind is Map:
        pairs = len(value)
        out.append(b"%%%d\r\n" % pairs if resp3 else b"*%d\r\n" % (2 * pairs))
        for key, item in value:
            _encode_into(out, key, resp3)
            _encode_into(out, item, resp3)
    elif isinstance(value, DisqueError):
        out.append(b"-%s\r\n" % value.wire())
    elif isinstance(value, int) and not isinstance(value, bool):
        out.append(b":%d\r\n" % value)
    else:
        raise TypeError(f"no RESP encoding for {kind.__name__}")
