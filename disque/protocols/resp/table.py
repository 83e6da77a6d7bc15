"""The RESP command table and the argument parsers its handlers share.

Theory of operation: `@command(name, arity, flags)` registers a handler in
`COMMANDS` (commands.py and admin.py hold the handlers; `commands.run` looks
requests up here).  The parsers read arguments exactly as spec/commands.md §1.2
says; each raises the spec's error.  Nothing here imports a handler module,
so both can import this one without a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from disque.core import errors
from disque.store import ids
from disque.core.errors import DisqueError
from disque.core.node import NodeCore
from disque.core.types import Command, Connection, Status

OK = Status(b"OK")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

Handler = Callable[[NodeCore, Connection, list[bytes]], Any]

COMMANDS: dict[bytes, Command] = {}

FLAG_WORDS = {"w": "write", "r": "readonly", "m": "denyoom", "a": "admin", "l": "loading", "F": "fast"}


def command(name: str, arity: int, flags: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        COMMANDS[name.encode()] = Command(name, arity, flags, fn)
        return fn

    return register


# ---------------------------------------------------------------- parsing


def parse_int(raw: bytes) -> int:
    """Strict int64 (spec/commands.md §1.2): optional sign, digits only; the empty
    string is 0 (upstream quirk).  ValueError otherwise."""
    if 0 < len(raw) < 19:  # the usual case, in the compiled build's native loop: no int() call
        value = 0
        for c in raw:
            if not 48 <= c <= 57:  # not an ASCII digit
                break
            value = value * 10 + c - 48
        else:
            return value
    digits = raw[1:] if raw[:1] in (b"-", b"+") else raw
    if raw and not digits.isdigit():
        raise ValueError(raw)
    digits = digits.lstrip(b"0")
    if len(digits) > 19:  # out of range; also keeps int() off huge strings
        raise ValueError(raw)
    value = int(digits or b"0")
    if raw[:1] == b"-":
        value = -value
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(raw)
    return value


def int_or(raw: bytes, error: Callable[[], DisqueError]) -> int:
    try:
        return parse_int(raw)
    except ValueError:
        raise error() from None


def parse_timeout(raw: bytes) -> int:
    try:
        value = parse_int(raw)
    except ValueError:
        raise errors.timeout_not_int() from None
    if value < 0:
        raise errors.timeout_negative()
    return value


def parse_cursor(raw: bytes) -> int:
    """A scan cursor as C strtoul reads it: an optional sign (`-` wraps
    around), decimal digits, nothing before or after.  No digits at all is 0;
    more than 64 bits is an error (ERANGE)."""
    signed = raw[:1] in (b"-", b"+")
    digits = raw[1:] if signed else raw
    if (digits and not digits.isdigit()) or (signed and not digits):
        raise errors.bad_cursor()
    digits = digits.lstrip(b"0")
    if len(digits) > 20:  # out of range; also keeps int() off huge strings
        raise errors.bad_cursor()
    value = int(digits or b"0")
    if value >> 64:
        raise errors.bad_cursor()
    return (-value) % (1 << 64) if raw[:1] == b"-" else value


def job_ids(argv: list[bytes]) -> list[bytes]:
    """Validate every ID before acting on any (spec/commands.md §2.3), so one
    bad ID means nothing is done."""
    for job_id in argv:
        if not ids.valid_id(job_id):
            raise errors.badid()
    return argv


def text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")
