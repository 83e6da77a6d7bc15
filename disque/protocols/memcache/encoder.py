"""Kestrel replies, byte for byte (spec/kestrel.md §2, §8).

Theory of operation
-------------------
Every reply is ASCII lines ending in CRLF.  Fixed replies are constants;
the others are built from protocol-neutral values: a queue name and an item
body for VALUE, mappings of counters for STATS and DUMP_STATS, a
`QueueSettings` per queue for DUMP_CONFIG.  Kestrel's field orders live here
alone; a field missing from a mapping is a KeyError (a bug in the caller),
never a silently shorter reply.  Free text (error messages, the version) has
CR and LF replaced by spaces so that it cannot break the line framing.

Choices where the spec leaves room:
* per-queue stats follow 1.3.0, the first version with `open_transactions`:
  `items` leaves open reads out and `open_transactions` follows `waiters`;
* DUMP_CONFIG prints `move_expired_to=<name>` or `move_expired_to=(none)`,
  the line 1.2 meant to print (it forgot the `=`), and, like 1.2, no
  `max_item_size` line;
* `DELETED` exists for 2.x-style replies; Kestrel 1.2 answers DELETE with
  `END`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from disque.store.queue_config import QueueSettings, format_value

STORED = b"STORED\r\n"
NOT_STORED = b"NOT_STORED\r\n"
DELETED = b"DELETED\r\n"
END = b"END\r\n"
ERROR = b"ERROR\r\n"
CLIENT_ERROR = b"CLIENT_ERROR\r\n"
FLUSHED_ALL = b"Flushed all queues.\r\n"
RELOADED = b"Reloaded config.\r\n"
TOO_LARGE = b"SERVER_ERROR object too large for cache\r\n"  # memcached's, for a SET over memcache-max-item-size
UNAUTHENTICATED = b"CLIENT_ERROR unauthenticated\r\n"  # memcached's, for a command before authentication
AUTH_FAILURE = b"CLIENT_ERROR authentication failure\r\n"  # memcached's, for wrong credentials

GLOBAL_STATS = (
    "uptime", "time", "version", "curr_items", "total_items", "bytes", "curr_connections",
    "total_connections", "cmd_get", "cmd_set", "cmd_peek", "get_hits", "get_misses",
    "bytes_read", "bytes_written",
)  # fmt: skip
QUEUE_STATS = (
    "items", "bytes", "total_items", "logsize", "expired_items", "mem_items", "mem_bytes",
    "age", "discarded", "waiters", "open_transactions",
)  # fmt: skip
CHILDREN = "children"  # a parent's extra field: its children's names, comma-separated
DUMP_CONFIG_FIELDS = (
    "max_items", "max_size", "max_age", "max_journal_size", "max_memory_size",
    "max_journal_overflow", "max_journal_size_absolute", "discard_old_when_full", "journal",
    "sync_journal",
)  # fmt: skip

_ENCODING = ("utf-8", "surrogateescape")


def _text(value: Any) -> bytes:
    """A stat or setting value: integers in decimal, booleans in lower case,
    a list of names joined by commas, bytes as they are."""
    if isinstance(value, (list, tuple)):
        return b",".join(value)
    return format_value(value).encode(*_ENCODING)


def _line(text: str) -> bytes:
    return text.replace("\r", " ").replace("\n", " ").encode(*_ENCODING)


def value(key: bytes, data: bytes) -> bytes:
    """A fetched item: its key (Kestrel's: the bare queue name), flags 0, the body, END."""
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(data), data)


def client_error(message: str = "") -> bytes:
    return b"CLIENT_ERROR %s\r\n" % _line(message) if message else CLIENT_ERROR


def server_error(message: str) -> bytes:
    return b"SERVER_ERROR %s\r\n" % _line(message)


def version(text: str) -> bytes:
    return b"VERSION %s\r\n" % _line(text)


def count(n: int) -> bytes:
    """FLUSH_EXPIRED and FLUSH_ALL_EXPIRED: a bare decimal line."""
    return b"%d\r\n" % n


def _queue_fields(fields: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    out = [(name, _text(fields[name])) for name in QUEUE_STATS]
    if CHILDREN in fields:
        out.append((CHILDREN, _text(fields[CHILDREN])))
    return out


def stats(global_stats: Mapping[str, Any], queues: Iterable[tuple[bytes, Mapping[str, Any]]]) -> bytes:
    """STATS: the global lines, then each queue's, then END."""
    out = [b"STAT %s %s\r\n" % (name.encode(), _text(global_stats[name])) for name in GLOBAL_STATS]
    for queue, fields in queues:
        for name, text in _queue_fields(fields):
            out.append(b"STAT queue_%s_%s %s\r\n" % (queue, name.encode(), text))
    out.append(END)
    return b"".join(out)


def _blocks(blocks: Iterable[tuple[bytes, list[tuple[str, bytes]]]]) -> bytes:
    """Kestrel's dump layout: `queue '<name>' {` blocks joined by CRLF,
    then CRLF END CRLF (so no queue at all gives an empty line and END)."""
    rendered = [
        b"queue '%s' {\r\n%s}" % (queue, b"".join(b"  %s=%s\r\n" % (k.encode(), v) for k, v in lines))
        for queue, lines in blocks
    ]
    return b"\r\n".join(rendered) + b"\r\n" + END


def dump_stats(queues: Iterable[tuple[bytes, Mapping[str, Any]]]) -> bytes:
    return _blocks((queue, _queue_fields(fields)) for queue, fields in queues)


def dump_config(queues: Iterable[tuple[bytes, QueueSettings]]) -> bytes:
    """DUMP_CONFIG: each queue's effective settings (a child shows its parent's)."""
    return _blocks(
        (
            queue,
            [(name, _text(getattr(settings, name))) for name in DUMP_CONFIG_FIELDS]
            + [("move_expired_to", settings.move_expired_to or b"(none)")],
        )
        for queue, settings in queues
    )
