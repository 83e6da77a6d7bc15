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


# The two the node makes most write their own __init__: the compiled build
# keeps a generated one interpreted (docs/performance.md, "The compiled core").
@dataclass(slots=True, init=False)
class Reply:
    """A reply value (resp types) for a client that is not the caller."""

    client_id: int
    value: Any
    slot: bytes | None  # the answer of ADDJOB <slot> waiting for its replicas (the session keeps its place)

    def __init__(self, client_id: int, value: Any, slot: bytes | None = None) -> None:
        self.client_id = client_id
        self.value = value
        self.slot = slot


@dataclass(slots=True, init=False)
class Send:
    """A bus message on our outgoing link `key` (dropped if not connected)."""

    key: int
    msg: Any

    def __init__(self, key: int, msg: Any) -> None:
        self.key = key
        self.msg = msg


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
