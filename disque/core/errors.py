"""Errors that travel to clients as RESP error replies.

Theory of operation: every failure a client can see is a `DisqueError` carrying
its RESP prefix (`ERR`, `NOREPL`, `BADID`, ...) and the message text of the
spec's error catalogue (spec/commands.md §10).  Command handlers raise them; the
dispatcher turns them into `-PREFIX message` replies.  The catalogue below holds
the fixed texts so that every module quotes them identically.

Errors are values: each entry of the catalogue is a factory, and every raise
creates a fresh error.  A raised exception keeps its traceback, and with it
every frame and argument of the request that failed; one shared instance
raised again and again would chain them all and never let go.  Two errors
are equal when they read the same on the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial


class DisqueError(Exception):
    """A client-visible error: `-<code> <message>`."""

    __slots__ = ("code", "message")

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code} {self.message}" if self.message else self.code

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DisqueError):
            return NotImplemented
        return (self.code, self.message) == (other.code, other.message)

    def __hash__(self) -> int:
        return hash((self.code, self.message))

    def wire(self) -> bytes:
        """The error line without the leading '-' and trailing CRLF."""
        text = str(self).replace("\r", " ").replace("\n", " ")
        return text.encode("utf-8", "surrogateescape")

    def detach(self) -> DisqueError:
        """This error as a reply value: without what raising attached to it
        (traceback, cause, context), it keeps no request alive."""
        self.__traceback__ = self.__cause__ = self.__context__ = None
        return self


def err(message: str) -> DisqueError:
    return DisqueError("ERR", message)


def _fixed(code: str, message: str) -> Callable[[], DisqueError]:
    return partial(DisqueError, code, message)


# The catalogue's fixed texts: `raise errors.syntax()`.
syntax = _fixed("ERR", "syntax error")
not_integer = _fixed("ERR", "value is not an integer or out of range")
timeout_not_int = _fixed("ERR", "timeout is not an integer or out of range")
timeout_negative = _fixed("ERR", "timeout is negative")
bad_cursor = _fixed("ERR", "invalid cursor or option name")
badid = _fixed("BADID", "Invalid Job ID format.")
nojob = _fixed("NOJOB", "Job not known in the context of this node.")
toolate = _fixed(
    "TOOLATE", "Half of job TTL already elapsed, you are no longer allowed to postpone the next delivery."
)
noauth = _fixed("NOAUTH", "Authentication required.")
auth_refused = _fixed("ERR", "too many wrong passwords from this address, try again later")
oom = _fixed("OOM", "command not allowed when used memory > 'maxmemory'.")
loading = _fixed("LOADING", "Disque is loading the dataset in memory")
leaving = _fixed("LEAVING", "This node is leaving the cluster, please connect to a different one")
paused = _fixed("PAUSED", "Queue paused in input, try later")
maxlen = _fixed("MAXLEN", "Queue is already longer than the specified MAXLEN count")
queue_full = _fixed("MAXLEN", "Queue is full (its max_items or max_size setting)")
too_large = _fixed("TOOLARGE", "Job body is larger than the queue's max_item_size setting")
norepl_reach = _fixed("NOREPL", "Not enough reachable nodes for the requested replication level")
norepl_zones = _fixed("NOREPL", "Not enough reachable zones for the requested ZONES level")
norepl_timeout = _fixed("NOREPL", "Timeout reached before replicating to the requested number of nodes")
norepl_removed = _fixed("NOREPL", "job removed (expired?) before the requested replication level was achieved")


def noreply_reason(reason: str) -> DisqueError:
    return DisqueError(
        "NOREPL",
        "Not enough reachable nodes for the requested replication level, since I'm unable "
        f"to hold a copy of the message for the following reason: {reason}",
    )


def job_too_large(size: int, limit: int) -> DisqueError:
    return err(f"Job body of {size} bytes is larger than max-job-size ({limit} bytes)")


def wrong_arity(name: str) -> DisqueError:
    return err(f"wrong number of arguments for '{name}' command")


def unknown_command(name: str) -> DisqueError:
    return err(f"unknown command '{name}'")


def misconf(strerror: str, what: str = "writing to the AOF file") -> DisqueError:
    return DisqueError("MISCONF", f"Errors {what}: {strerror}")
