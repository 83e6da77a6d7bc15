"""Records and markers shared by the whole core (a leaf: imports nothing of ours).

The shell implements `Clock` and `Host`; the front ends build `Connection`s and
encode the protocol-neutral results: `Status` (a short text answer), `Map`
(key/value pairs), `NIL_ARRAY` (no items, as opposed to `None`, no value),
`BLOCKED` (the answer comes later, as a `Reply` effect) and `SILENT` (no answer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mypy_extensions import mypyc_attr


class Clock(Protocol):
    def now_ms(self) -> int:
        """Unix time in ms (jobs' ctime, etime and timers)."""

    def since_us(self) -> int:
        """µs of a monotonic clock since the last `now_ms()` (a command's
        duration, timed from the reading of its step: one reading fewer)."""

    def wall_us(self) -> int:
        """Unix time in µs (TIME, MONITOR)."""


class Host(Protocol):
    """Synchronous services of the shell (I/O the core must not do itself)."""

    def process_info(self) -> dict[str, Any]: ...

    def rewrite_config(self) -> None: ...

    def change_dir(self, path: str) -> None: ...

    def shutdown(self, rewrite_aof: bool) -> bool: ...

    def reload_queue_config(self) -> None:
        """Kestrel's RELOAD: read the queue settings of the config file again; raises DisqueError."""

    def apply_config(self, changed: list[str]) -> None:
        """React to CONFIG SET (chdir, AOF on/off, ...); raises DisqueError."""

    def save_cluster_config(self, fsync: bool) -> None:
        """Write nodes.conf now; raises OSError."""

    def reset_stats(self) -> None:
        """CONFIG RESETSTAT: zero the shell's own counters (INFO security)."""

    def bgrewriteaof(self) -> Any: ...

    def debug(self, sub: str, args: list[bytes]) -> Any: ...

    def wake(self, at_ms: int) -> None:
        """A client blocked until `at_ms`, earlier than the last
        `next_deadline()`: the shell's deadline loop must run by then."""


class BodyStore(Protocol):
    """Where read-behind keeps job records (shell/segments.py): synchronous
    appends and positional reads of local files, called like the clock."""

    error: str | None  # why the last write failed (None: writes work)
    reads: int

    def append(self, qtime: int, payload: bytes) -> tuple[int, int]: ...  # (location, size)

    def read(self, loc: int, size: int) -> tuple[int, bytes]: ...  # (qtime, payload); OSError, SpillCorrupt

    def release(self, loc: int, size: int) -> None: ...

    def flush(self) -> None: ...

    def sparse(self) -> int | None: ...

    def segment_of(self, loc: int) -> int: ...

    def figures(self) -> dict[str, Any]: ...

    def hold(self) -> None: ...  # keep every segment as it is (a snapshot reads them) until `unhold`

    def unhold(self) -> None: ...


REPLY_ON, REPLY_OFF, REPLY_SKIP, REPLY_SKIP_NEXT = 0, 1, 2, 3
SILENT = object()  # handle_command result: write nothing


@dataclass(slots=True, eq=False)
class Connection:
    id: int
    fd: int = -1
    addr: str = ""
    laddr: str = ""
    name: bytes = b""
    authenticated: bool = False
    proto: int = 2  # the reply dialect its front end negotiated (RESP: HELLO 2|3); the runner hands it to the encoder
    ctime: int = 0
    last: int = 0
    last_cmd: str = "NULL"
    waiter: "Waiter | None" = None
    repl_jobs: dict[bytes, None] = field(default_factory=dict)  # its ADDJOBs waiting for replication, in order
    lib_name: bytes = b""
    lib_ver: bytes = b""
    reply_mode: int = 0  # REPLY_ON, REPLY_OFF or REPLY_SKIP (CLIENT REPLY)
    mute_next: bool = False  # a silenced command blocked: drop its reply when it comes
    open_read: tuple[bytes, bytes] | None = None  # (queue, job ID) of its reliable read (memcache GET /open)
    registered: list[bytes] = field(default_factory=list)  # the queues of its okq-style QNOTIFY (QREGISTER)
    closing: bool = False  # QUIT, CLIENT KILL, timeout: the shell closes it after its output

    def silence(self, reply: Any) -> Any:
        """Apply CLIENT REPLY OFF/SKIP to the reply of the current command."""
        if self.reply_mode == REPLY_SKIP_NEXT:
            self.reply_mode = REPLY_SKIP
            return reply
        if self.reply_mode == REPLY_SKIP:
            self.reply_mode = REPLY_ON
        if reply is BLOCKED:
            self.mute_next = True
            return reply
        return SILENT


@dataclass(slots=True, eq=False)
class Waiter:
    """A client blocked in GETJOB; or, with no queues, in WAITJOB (`jobs`),
    waiting for the late answer to an AUTH, or for a long command (`work`)."""

    client: Connection
    queues: tuple[bytes, ...]
    withcounters: bool
    deadline: int  # 0 = forever
    expiry: Any = None  # a late AUTH answer: the reply at the deadline
    jobs: set[bytes] | None = None  # WAITJOB: the IDs still neither acknowledged nor gone
    acked: int = 0  # WAITJOB: how many of its jobs were acknowledged so far
    results: tuple[bytes, ...] | None = None  # WAITJOB ... WITHRESULTS: the IDs whose results its reply lists
    take: Any = None  # a Kestrel GET (items.py): job served, or None at the deadline -> the reply
    work: Any = None  # a long command's rest (Blocking.in_slices): a generator, one slice per step

    def timeout_reply(self) -> Any:
        """The reply when the deadline passes (a WAITJOB's: Blocking.waited)."""
        return NIL_ARRAY if self.expiry is None else self.expiry


@dataclass(slots=True)
class Stats:
    connections: int = 0
    commands: int = 0
    bus_sent: int = 0
    bus_received: int = 0
    auth_failures: int = 0
    dead_lettered: int = 0  # jobs moved to a dead-letter queue (MAXATTEMPTS)
    calls: dict[str, list[int]] = field(default_factory=dict)  # name -> [calls, usec, *latency buckets (gate.py)]


BLOCKED = object()  # handle_command result: the client waits for a later Reply


@mypyc_attr(native_class=False)  # the compiled build cannot make a builtin's subclass native
class Status(bytes):
    """A status reply, `+text`; the text must hold no CR or LF."""

    __slots__ = ()


@mypyc_attr(native_class=False)
class Map(list):
    """A map reply: (key, value) pairs.  RESP2 sends a flat array k, v, k, v."""

    __slots__ = ()


class _NilArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NIL_ARRAY"


NIL_ARRAY = _NilArray()  # RESP2 `*-1`; None is the nil bulk `$-1`


@dataclass(frozen=True, slots=True)
class Command:
    """One entry of a front end's command table, as the core runs it."""

    name: str
    arity: int  # RESP's: n exactly, -n at least n (name included)
    flags: str  # w r m a l F (spec/commands.md §3)
    handler: Callable[[Any, Connection, list[bytes]], Any]  # (NodeCore, client, argv) -> result
