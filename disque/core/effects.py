"""What the core asks the shell to do.

Theory of operation: the core never performs I/O.  Entry points of
`NodeCore` return the reply of the command they ran and append everything
else to `NodeCore.effects`: replies to *other* clients (a blocked GETJOB
served by someone's ADDJOB), bus messages, AOF records, connections to
close.  The shell drains the list after every call and carries the effects
out in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply value (resp types) for a client that is not the caller."""

    client_id: int
    value: Any
    slot: bytes | None = None  # the answer of ADDJOB <slot> waiting for its replicas (the session keeps its place)


@dataclass(frozen=True, slots=True)
class Send:
    """A bus message on our outgoing link `key` (dropped if not connected)."""

    key: int
    msg: Any


@dataclass(frozen=True, slots=True)
class Answer:
    """A bus message on the incoming connection `conn` (a PONG)."""

    conn: int
    msg: Any


@dataclass(frozen=True, slots=True)
class DropLink:
    """Close our outgoing link `key`; it reconnects if still wanted."""

    key: int


@dataclass(frozen=True, slots=True)
class AofAppend:
    """An encoded AOF record (LOADJOB or DELJOB)."""

    record: bytes
    sync: bool = False  # its queue has `sync_journal`: fsynced before any reply that follows it


@dataclass(frozen=True, slots=True)
class CloseClient:
    """Close a client connection once its pending output is written."""

    client_id: int
