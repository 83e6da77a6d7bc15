"""The wire side of the client, with no I/O: `encode_command` builds RESP
requests (text as UTF-8 with surrogateescape, so any byte string round-trips),
the small parsers every reply goes through, the two errors a caller sees, and
node addresses (`host:port`, `[v6]:port` or a pair).
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any, TypeVar

from disque.core.errors import DisqueError
from disque.store.failure import LIMITS

Address = tuple[str, int]
Arg = str | bytes | int | float
T = TypeVar("T")

DEFAULT_ADDRESS: Address = ("127.0.0.1", 7711)


class DisqueReplyError(DisqueError):
    """An error reply: `code` is its first word (ERR, NOREPL, PAUSED, ...)."""

    @classmethod
    def from_line(cls, line: str) -> DisqueReplyError:
        code, _, message = line.partition(" ")
        return cls(code, message)


class ReplicationTimeout(DisqueReplyError):
    """ADDJOB's NOREPL at its timeout: the job did not get its synchronous
    copies in time and was deleted everywhere (adding it again is safe)."""


class DisqueConnectionError(ConnectionError):
    """No node could be reached, or a connection broke; the text names the address."""


# --------------------------------------------------------------------------
# Wire format


def _to_bytes(arg: Arg) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode("utf-8", "surrogateescape")
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return str(arg).encode()
    raise TypeError(f"cannot send {type(arg).__name__} as a command argument")


def encode_command(args: Sequence[Arg]) -> bytes:
    parts = [_to_bytes(a) for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def _text(value: bytes | None) -> Any:
    return None if value is None else value.decode("utf-8", "surrogateescape")


def _pairs(reply: Sequence[Any]) -> dict[str, Any]:
    """A flat key/value array as a dict with Python names (`jobs-in` -> `jobs_in`)."""
    return {_text(reply[i]).replace("-", "_"): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def _build(cls: type[T], reply: Sequence[Any], texts: Iterable[str] = (), text_lists: Iterable[str] = ()) -> T:
    values = _pairs(reply)
    for name in texts:
        if name in values:  # (a field the reply leaves out takes its default)
            values[name] = _text(values[name])
    for name in text_lists:
        if name in values:
            values[name] = [_text(v) for v in values[name]]
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in values.items() if k in known})


def parse_info(reply: bytes) -> dict[str, dict[str, str]]:
    """INFO text as {section title: {field: value}}."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in _text(reply).splitlines():
        if line.startswith("#"):
            current = sections.setdefault(line[1:].strip(), {})
        elif ":" in line:
            key, _, value = line.partition(":")
            current[key] = value
    return sections


def _options(flags: Iterable[tuple[str, bool]] = (), **values: Arg | None) -> list[Arg]:
    """`NAME value` for every value given, then `FLAG` for every flag set."""
    out: list[Arg] = []
    for name, value in values.items():
        if value is not None:
            out += [name.upper(), value]
    return out + [flag for flag, on in flags if on]


def failure_args(error: BaseException) -> list[Arg]:
    """NACK's ERROR options for `error` (docs/commands.md): its type
    (qualified unless a builtin), message and traceback, this host and
    process, each cut to the node's size rule; a traceback too long keeps
    its end, where the innermost frames and the exception are."""
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    trace = "".join(traceback.format_exception(error)).encode("utf-8", "surrogateescape")
    if len(trace) > (limit := LIMITS["traceback"]):
        trace = b"...\n" + trace[len(trace) - limit + 4 :]
    fields = {"type": name.encode(), "message": str(error).encode("utf-8", "surrogateescape"), "host": socket.gethostname().encode()}
    cut = {k: v[: LIMITS[k]] for k, v in fields.items()}
    return ["ERROR", cut["type"], cut["message"], "TRACEBACK", trace, "HOST", cut["host"], "PID", os.getpid()]


def parse_addresses(nodes: str | Address | Iterable[str | Address]) -> list[Address]:
    """One node (`"host:port"` or a pair) or several."""
    if isinstance(nodes, str) or (isinstance(nodes, tuple) and len(nodes) == 2 and isinstance(nodes[1], int)):
        return [parse_address(nodes)]  # type: ignore[arg-type]
    return [parse_address(n) for n in nodes]  # type: ignore[union-attr]


def parse_address(spec: str | Address) -> Address:
    """`host:port`, `[v6]:port` or a (host, port) pair."""
    if isinstance(spec, tuple):
        return (spec[0], int(spec[1]))
    host, _, port = spec.rpartition(":")
    return (host.strip("[]") or DEFAULT_ADDRESS[0], int(port))


def format_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connection_name(role: str, tag: object) -> str:
    """`<role>:<host>:<pid>:<tag>`, the `name=` of a long-lived connection
    (a worker's slot, a Dramatiq consumer), so that CLIENT LIST and the
    dashboard tell which process holds it; characters CLIENT SETNAME
    refuses (outside ! to ~) become `_`."""
    name = f"{role}:{socket.gethostname()}:{os.getpid()}:{tag}"
    return "".join(c if "!" <= c <= "~" else "_" for c in name)
