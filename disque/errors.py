"""Errors that travel to clients as RESP error replies.

Theory of operation: every failure a client can see is a `DisqueError` carrying
its RESP prefix (`ERR`, `NOREPL`, `BADID`, ...) and the message text of the
spec's error catalogue (commands.md §10).  Command handlers raise them; the
dispatcher turns them into `-PREFIX message` replies.  The catalogue below holds
the fixed texts so that every module quotes them identically.
"""

from __future__ import annotations


class DisqueError(Exception):
    """A client-visible error: `-<code> <message>`."""

    __slots__ = ("code", "message")

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code} {self.message}" if self.message else self.code

    def wire(self) -> bytes:
        """The error line without the leading '-' and trailing CRLF."""
        text = str(self).replace("\r", " ").replace("\n", " ")
        return text.encode("utf-8", "surrogateescape")


def err(message: str) -> DisqueError:
    return DisqueError("ERR", message)


# Fixed texts from the catalogue, shared by every module that raises them.
SYNTAX = err("syntax error")
NOT_INTEGER = err("value is not an integer or out of range")
OUT_OF_RANGE = err("value is out of range")
TIMEOUT_NOT_INT = err("timeout is not an integer or out of range")
TIMEOUT_NEGATIVE = err("timeout is negative")
BAD_CURSOR = err("invalid cursor or option name")
BADID = DisqueError("BADID", "Invalid Job ID format.")
NOJOB = DisqueError("NOJOB", "Job not known in the context of this node.")
TOOLATE = DisqueError(
    "TOOLATE",
    "Half of job TTL already elapsed, you are no longer allowed to postpone the next delivery.",
)
NOAUTH = DisqueError("NOAUTH", "Authentication required.")
OOM = DisqueError("OOM", "command not allowed when used memory > 'maxmemory'.")
LOADING = DisqueError("LOADING", "Disque is loading the dataset in memory")
LEAVING = DisqueError("LEAVING", "This node is leaving the cluster, please connect to a different one")
PAUSED = DisqueError("PAUSED", "Queue paused in input, try later")
MAXLEN = DisqueError("MAXLEN", "Queue is already longer than the specified MAXLEN count")
NOREPL_REACH = DisqueError("NOREPL", "Not enough reachable nodes for the requested replication level")
NOREPL_TIMEOUT = DisqueError(
    "NOREPL", "Timeout reached before replicating to the requested number of nodes"
)
NOREPL_REMOVED = DisqueError(
    "NOREPL", "job removed (expired?) before the requested replication level was achieved"
)


def noreply_reason(reason: str) -> DisqueError:
    return DisqueError(
        "NOREPL",
        "Not enough reachable nodes for the requested replication level, since I'm unable "
        f"to hold a copy of the message for the following reason: {reason}",
    )


def wrong_arity(name: str) -> DisqueError:
    return err(f"wrong number of arguments for '{name}' command")


def unknown_command(name: str) -> DisqueError:
    return err(f"unknown command '{name}'")


def misconf(strerror: str) -> DisqueError:
    return DisqueError("MISCONF", f"Errors writing to the AOF file: {strerror}")
