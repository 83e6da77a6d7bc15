"""The node's effect dispatcher: where the core's effects are carried out.

Theory of operation: every core entry point leaves effects behind
(`NodeCore.take_effects`: replies to other clients, bus messages, AOF
records, links and clients to close).  Whoever called the core (the session
runner after a client's requests, the bus after a peer's frames, the
deadline loop after a tick, the AOF after loading) calls `apply` once, and
the dispatcher hands each effect to the port that performs it: client
replies and closes to the session runner (`Sessions`), bus messages to the
bus (`BusPort`), records to the AOF (`AofPort`).  A client a reply
unblocked resumes its pipeline at once, which may leave more effects: the
loop runs until none is left.  Then nodes.conf is written if the cluster
changed, the AOF buffer is flushed (records reach the file before any reply
can be sent), and the clients other than the caller's are `kick`ed to send
what they were given.

The server builds the dispatcher first and plugs its ports in once they
exist (`plug`): the bus and the session runner call back into it, so one of
them must be bound after the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from disque.cluster.messages import Message
from disque.core.effects import Answer, AofAppend, CloseClient, DropLink, Reply, Send
from disque.core.node import NodeCore
from disque.core.types import SILENT
from disque.shell.session import Conn, Sessions


class BusPort(Protocol):
    """What the dispatcher asks of the bus (shell/bus.py)."""

    def send(self, key: int, msg: Message) -> None: ...
    def answer(self, conn: int, msg: Message) -> None: ...
    def drop_link(self, key: int) -> None: ...


class AofPort(Protocol):
    """What the dispatcher asks of the AOF writer (shell/aof_writer.py)."""

    def append(self, record: bytes, sync: bool = False) -> None: ...
    def flush(self, current: object = None) -> None: ...


class _Nowhere:
    """The ports of a dispatcher not plugged in yet (and of a node without a
    bus or an AOF): effects for them are dropped."""

    def send(self, key: int, msg: Message) -> None:
        pass

    def answer(self, conn: int, msg: Message) -> None:
        pass

    def drop_link(self, key: int) -> None:
        pass

    def append(self, record: bytes, sync: bool = False) -> None:
        pass

    def flush(self, current: object = None) -> None:
        pass


class Dispatcher:
    """The one place a node's effects are carried out."""

    def __init__(self, core: NodeCore, save_conf: Callable[[], None]) -> None:
        self.core = core
        self.save_conf = save_conf  # nodes.conf changed: write it (it exits the node if it cannot)
        self.clients: Sessions | None = None
        nowhere = _Nowhere()
        self.bus: BusPort = nowhere
        self.aof: AofPort = nowhere

    def plug(self, clients: Sessions, bus: BusPort, aof: AofPort) -> None:
        """Connect the ports, once they exist."""
        self.clients, self.bus, self.aof = clients, bus, aof

    def drain(self) -> None:
        """`apply` for a caller that answers no client itself (the bus, the
        deadline loop, the AOF's loading)."""
        self.apply(None)

    def apply(self, current: Conn | None) -> None:
        """Carry out the effects of the last core entry point; `current` is
        the connection whose commands ran, which the caller answers itself."""
        core, clients, bus = self.core, self.clients, self.bus
        assert clients is not None, "plug() first"
        conns = clients.conns
        touched: dict[Conn, None] = {}
        while effects := core.take_effects():
            for effect in effects:
                kind = type(effect)
                if kind is Reply:
                    conn = conns.get(effect.client_id)
                    if conn is not None:
                        data = b"" if effect.value is SILENT else conn.front.encode(effect.value, conn.client.proto)
                        if effect.slot is not None and conn.fill(effect.slot, data):
                            clients.count_queued(conn, len(data))
                        elif data:
                            clients.queue(conn, data)
                        touched[conn] = None
                elif kind is CloseClient:
                    conn = conns.get(effect.client_id)
                    if conn is not None:
                        conn.closing = True
                        touched[conn] = None
                elif kind is Send:
                    bus.send(effect.key, effect.msg)
                elif kind is Answer:
                    bus.answer(effect.conn, effect.msg)
                elif kind is DropLink:
                    bus.drop_link(effect.key)
                elif kind is AofAppend:
                    self.aof.append(effect.record, effect.sync)
            for conn in touched:  # an unblocked client resumes its pipeline
                clients.run_commands(conn)
        if core.conf_dirty():
            self.save_conf()
        self.aof.flush(current)  # records reach the file before any reply is sent
        for conn in touched:
            if conn is not current:
                conn.kick()
