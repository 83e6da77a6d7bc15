"""Per-queue limits: Kestrel's queue options, their defaults and overrides.

Theory of operation
-------------------
Kestrel gives every queue a set of limits (spec/kestrel.md §6).  Here they
are a `QueueSettings`, a frozen record whose field defaults are Kestrel's.
A `QueueConfig` holds what the config file changed: `queue-defaults
<option> <value> ...` overrides the defaults of every queue, `queue <name>
<option> <value> ...` those of one queue (later lines win, option by
option).  `settings(name)` is a queue's effective record: Kestrel's
defaults, then `queue-defaults`, then the queue's own lines.  A fanout child
(`parent+child`, split at the first `+`) takes its parent's record and
cannot have lines of its own, as in Kestrel 1.x.

This module lives in the store, not in the memcache front end, because the
limits bind every client: an ADDJOB into a full queue is refused (or drops
the oldest job) exactly as a memcache SET is.  It models and parses only;
the core enforces the limits, with the two helpers `full` and `expiry`.

Effective records are computed when the configuration changes, one per
configured queue, so `settings()` is a dict lookup that never grows with the
names clients invent.  `directives()` gives the lines back for CONFIG
REWRITE, in a form that parses to the same configuration.

Values: sizes are bytes and `max_age` milliseconds, written as plain
non-negative integers; booleans are `true|false|yes|no|on|off` (any case);
option names are Kestrel's, any case, with `-` accepted for `_`;
`move_expired_to ""` means none.  Names and values are config-file text
(`str`, surrogate-escaped bytes); queue names are `bytes`, as in the core.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
BAD_ARITY = "Bad directive or wrong number of arguments"

_NUMBER = re.compile(r"[0-9]+")
_PRIORITIES = frozenset("0123456789")
_BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


class QueueConfigError(ValueError):
    """A bad `queue` / `queue-defaults` line; `str()` is the message to report."""


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """One queue's effective limits; field order is Kestrel's table."""

    max_items: int = INT32_MAX
    max_size: int = INT64_MAX  # bytes of queued item data
    max_item_size: int = INT64_MAX
    max_age: int = 0  # ms, 0 = no cap
    discard_old_when_full: bool = False
    journal: bool = True
    sync_journal: bool = False
    max_journal_size: int = 16 * 1024 * 1024
    max_journal_overflow: int = 10
    max_memory_size: int = 128 * 1024 * 1024
    max_journal_size_absolute: int = INT64_MAX
    move_expired_to: bytes | None = None
    priority: int = 5  # not Kestrel's: the priority of a job added without one (docs/priorities.md)

    def full(self, items: int, nbytes: int) -> bool:
        """Whether a queue holding `items` items of `nbytes` bytes takes no
        more (Kestrel tests the sizes before the new item is added)."""
        return items >= self.max_items or nbytes >= self.max_size

    def expiry(self, item_expiry_ms: int, added_ms: int) -> int:
        """The effective expiry of an item added at `added_ms` (0 = never):
        its own expiry, capped by `max_age`."""
        if not self.max_age:
            return item_expiry_ms
        cap = added_ms + self.max_age
        return min(item_expiry_ms, cap) if item_expiry_ms else cap

    def pairs(self) -> list[tuple[str, str]]:
        """Every option with its value as config text, in table order."""
        return [(f.name, format_value(getattr(self, f.name))) for f in fields(self)]


def suggest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to a mistyped one, if any is close (for the
    errors of this module and of the server's directives, core/config.py)."""
    return next(iter(difflib.get_close_matches(name, known, n=1)), None)


DEFAULTS = QueueSettings()
OPTIONS = tuple(f.name for f in fields(QueueSettings))


def format_value(value: Any) -> str:
    """An option value as the config file and DUMP_CONFIG write it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _parse_value(option: str, text: str) -> Any:
    default = getattr(DEFAULTS, option)
    if isinstance(default, bool):
        value = _BOOLEANS.get(text.lower())
        if value is None:
            raise QueueConfigError(f"queue option '{option}' must be true, false, yes or no")
        return value
    if option == "move_expired_to":
        return text.encode("utf-8", "surrogateescape") or None
    if option == "priority":
        if text not in _PRIORITIES:
            raise QueueConfigError("queue option 'priority' must be an integer from 0 to 9")
        return int(text)
    if _NUMBER.fullmatch(text) is None or int(text) > INT64_MAX:
        raise QueueConfigError(f"queue option '{option}' must be an integer from 0 to {INT64_MAX}")
    return int(text)


def _parse_pairs(args: list[str]) -> dict[str, Any]:
    if not args or len(args) % 2:
        raise QueueConfigError(BAD_ARITY)
    out: dict[str, Any] = {}
    for i in range(0, len(args), 2):
        option = args[i].lower().replace("-", "_")
        if option not in OPTIONS:
            hint = suggest(option, OPTIONS)
            raise QueueConfigError(f"unknown queue option '{args[i]}'" + (f" (did you mean '{hint}'?)" if hint else ""))
        out[option] = _parse_value(option, args[i + 1])
    return out


def fanout_parent(name: bytes) -> bytes | None:
    """The parent of a fanout child (the text before the first `+`), or None."""
    parent, plus, _ = name.partition(b"+")
    return parent if plus else None


class QueueConfig:
    """The `queue-defaults` and `queue` lines of one configuration."""

    __slots__ = ("_defaults", "_queues", "_default", "_resolved")

    def __init__(self) -> None:
        self._defaults: dict[str, Any] = {}
        self._queues: dict[bytes, dict[str, Any]] = {}
        self._default = DEFAULTS
        self._resolved: dict[bytes, QueueSettings] = {}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QueueConfig):
            return NotImplemented
        return (self._defaults, self._queues) == (other._defaults, other._queues)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def set_defaults(self, args: list[str]) -> None:
        """Apply `queue-defaults <option> <value> [...]`."""
        self._defaults.update(_parse_pairs(args))
        self._default = replace(DEFAULTS, **self._defaults)
        self._resolved = {name: replace(self._default, **own) for name, own in self._queues.items()}

    def set_queue(self, args: list[str]) -> None:
        """Apply `queue <name> <option> <value> [...]`."""
        if not args:
            raise QueueConfigError(BAD_ARITY)
        name = args[0].encode("utf-8", "surrogateescape")
        if not name:
            raise QueueConfigError("the queue name is empty")
        parent = fanout_parent(name)
        if parent is not None:
            raise QueueConfigError(
                f"queue '{args[0]}' is a fanout child: it uses the settings of queue "
                f"'{parent.decode('utf-8', 'surrogateescape')}'"
            )
        changes = _parse_pairs(args[1:])  # nothing is kept from a bad line
        own = self._queues.setdefault(name, {})
        own.update(changes)
        self._resolved[name] = replace(self._default, **own)

    def settings(self, name: bytes) -> QueueSettings:
        """The effective settings of queue `name` (its parent's for a child).
        Asked by every ADDJOB and AOF record: without `queue` lines it is
        one test."""
        if not self._resolved:
            return self._default
        parent = fanout_parent(name)
        return self._resolved.get(name if parent is None else parent, self._default)

    def directives(self) -> list[list[str]]:
        """The lines that rebuild this configuration (directive name first)."""
        lines = []
        if self._defaults:
            lines.append(["queue-defaults", *_flatten(self._defaults)])
        for name, own in self._queues.items():
            lines.append(["queue", name.decode("utf-8", "surrogateescape"), *_flatten(own)])
        return lines


def _flatten(options: dict[str, Any]) -> list[str]:
    return [text for option, value in options.items() for text in (option, format_value(value))]
