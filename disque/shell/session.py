"""Client sessions: the one runner every transport shares.

Theory of operation: a transport (tcp.py's epoll loop, the TLS tasks of
server.py, the simulation's in-memory clients) owns sockets and nothing
else.  It hands what a connection receives to `Sessions.received`, asks
`Sessions.run` to execute the complete requests, and writes what `run`
queued in `Conn.out`, reporting what it wrote with `Sessions.sent`.  The
runner does the rest, once for all of them:

* read: the connection's front end parses (`Conn.parser`), with the query
  buffer limit;
* run: each complete request goes through `NodeCore.handle_command` with
  the front end's command table, until the client blocks or the input is
  used up; the reply is encoded by the same front end.  One exception to
  "blocks": while an ADDJOB waits for its replicas, the pipeline goes on
  with the requests the front end says may overlap it (more ADDJOBs), so
  their REPLJOBs travel together.  Each such waiting ADDJOB holds a place
  in the output (`Conn.slots`): what comes after it waits there until its
  answer arrives, so the client reads its answers in the order it asked.
  Any other request waits (`Conn.next`) until no ADDJOB is waiting;
* apply effects: not here but in the node's dispatcher (dispatch.py), which
  the runner calls after every run: it queues replies for other clients (a
  blocked GETJOB served by someone's ADDJOB) here (`queue`), and those
  clients resume their own pipelines (`run_commands`) and are `kick`ed;
* unauthenticated input: with `requirepass`, a client that has not
  authenticated is closed once its unfinished request is over
  UNAUTHENTICATED_REQUEST_MAX bytes, so it cannot make the node buffer
  more than that (plus one read) before it proves it knows the password;
* output limits: a client whose unsent output is past `OUTPUT_PAUSE`
  bytes runs nothing more until the transport has written it (its next
  requests wait in the parser, and the transport does not read meanwhile),
  so one read of pipelined requests can neither make the node hold more
  than about that much for it nor keep the loop busy for long; and
  `client-output-buffer-limit` closes a client whose pending output is over
  it;
* AOF hold: not here but in the transport, which asks `AofFile.hold` before
  writing (a reply may only leave once the records it follows are safe);
* input in the memory account: what a connection's parser still holds
  after a run (an unfinished request: a large SET or ADDJOB on its way) is
  counted in the node's used_memory (`count_input`), so that maxmemory sees
  client buffers too.

The network counters of INFO (bytes in and out, refused connections) are
the runner's: they are the shell's business, not the core's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

from disque.core.config import Config
from disque.core.errors import misconf
from disque.core.node import NodeCore
from disque.core.settings import Settings
from disque.core.types import BLOCKED, SILENT, Connection
from disque.protocols.base import FrontEnd, ProtocolError
from disque.shell.security import output_limit_exceeded

log = logging.getLogger("disque")

# Unsent output past which a client's pipelined requests wait (a single
# reply may be larger: it is never split).
OUTPUT_PAUSE = 1 << 20
# Largest unfinished request a client that has not authenticated (with
# `requirepass`) may send, as Redis caps them: it can only say AUTH or HELLO.
UNAUTHENTICATED_REQUEST_MAX = 16 * 1024


@mypyc_attr(allow_interpreted_subclasses=True)  # TLS and simulated connections subclass it in Python
class Conn:
    """A client connection as the runner sees it.  `out` holds encoded
    replies not yet written; `out_size` counts their bytes (and those being
    sent).  A transport implements `kick` (replies were queued by someone
    else's command: send them once the AOF allows) and `abort` (the output
    was dropped: close as soon as possible)."""

    __slots__ = (
        "client", "front", "parser", "out", "out_size", "soft_since", "closing", "held", "slots", "next", "input_counted"
    )  # fmt: skip

    def __init__(self, client: Connection, front: FrontEnd) -> None:
        self.client = client
        self.front = front  # the protocol this connection speaks
        self.parser = front.new_parser()
        self.out: list[bytes | memoryview] = []
        self.out_size = 0  # bytes in `out` plus those being sent
        self.soft_since: float | None = None  # when the soft output limit was first exceeded
        self.closing = False  # run nothing more; close once `out` is written
        self.held = False  # requests wait for `out` to be written (OUTPUT_PAUSE): run again then
        # Waiting ADDJOBs the pipeline went past, in order: job ID -> [answer
        # or None, the output queued after it].
        self.slots: dict[bytes, list[Any]] = {}
        self.next: Any = None  # a request parsed, that waits for the ADDJOBs before it
        self.input_counted = 0  # the parser's bytes counted in the node's used_memory (`Sessions.count_input`)

    def fill(self, job_id: bytes, data: bytes) -> bool:
        """The answer of a waiting ADDJOB with a place; False if it has none
        (it was the last request run: its answer simply goes next)."""
        slots = self.slots
        if job_id not in slots:
            return False
        slots[job_id][0] = data
        for first, (answer, after) in list(slots.items()):  # release the answered places at the head
            if answer is None:
                break
            del slots[first]
            self.out.append(answer)
            self.out.extend(after)
        return True

    def refuse(self, reason: str) -> None:
        """The AOF records the queued replies follow cannot be written for
        now (`AofFile.failed` gave `reason`): each reply is answered with
        -MISCONF instead.  The commands took effect (their records are
        written once the disk has room): for the client, as after a
        timeout, they may or may not have."""
        error = self.front.encode(misconf(reason), self.client.proto)
        out = self.out
        for i, reply in enumerate(out):  # one entry per reply; a memoryview is output being sent already
            if reply and not isinstance(reply, memoryview):
                self.out_size += len(error) - len(reply)
                out[i] = error

    def kick(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class Effects(Protocol):
    """The node's effect dispatcher (shell/dispatch.py), as the runner calls it."""

    def apply(self, current: Conn | None) -> None: ...


class Sessions:
    """Every client connection of a node, and what runs their requests."""

    def __init__(
        self,
        core: NodeCore,
        config: Config,
        effects: Effects,
        on_output_limit: Callable[[], None] = lambda: None,
    ) -> None:
        self.core = core
        self.config: Any = config  # Config's attributes are its directives, set at run time
        self.settings: Settings = config.settings  # those every request reads, typed
        self.effects = effects  # carries out what the requests run caused
        self.on_output_limit = on_output_limit  # a client was closed by its output limit (INFO counts it)
        self.conns: dict[int, Conn] = {}  # by client id
        self.next_client_id = 0
        self.net_in = 0
        self.net_out = 0
        self.rejected = 0

    def new_client(self, addr: str, laddr: str = "", fd: int = -1) -> Connection:
        self.next_client_id += 1
        return self.core.connect(self.next_client_id, addr, laddr, fd)

    def opened(self, conn: Conn) -> None:
        self.conns[conn.client.id] = conn

    def gone(self, conn: Conn) -> None:
        """The transport closed `conn`: the core forgets its client."""
        del self.conns[conn.client.id]
        self.core.account(-conn.input_counted)
        self.core.disconnect(conn.client.id)
        self.effects.apply(None)

    def received(self, conn: Conn, data: bytes) -> bool:
        """Buffer what `conn` sent; False if it must be closed (its query
        buffer is over the limit)."""
        self.net_in += len(data)
        parser = conn.parser
        parser.feed(data)
        if parser.buffered() > conn.front.query_buffer_limit:
            log.warning("Closing client that reached max query buffer length")
            return False
        return True

    def run(self, conn: Conn) -> None:
        """Run what `conn` has buffered and carry out the effects; the caller
        writes `conn.out` (once the AOF allows), and runs it again once that
        is written if `conn.held`."""
        self.run_commands(conn)
        self.effects.apply(conn)
        self.count_input(conn)

    def count_input(self, conn: Conn) -> None:
        """Count what `conn`'s parser holds in the node's memory account, by
        its change since the last count (a pipeline read whole and run leaves
        nothing: no call)."""
        held = conn.parser.buffered()
        if held != conn.input_counted:
            self.core.account(held - conn.input_counted)
            conn.input_counted = held

    def run_commands(self, conn: Conn) -> None:
        """Execute buffered requests until the client blocks, none is left, or
        its unsent output is past OUTPUT_PAUSE (`conn.held`)."""
        core, client, parser, front = self.core, conn.client, conn.parser, conn.front
        run, encode = front.run, front.encode
        conn.held = False
        while not conn.closing and client.waiter is None:
            if conn.out_size > OUTPUT_PAUSE:
                conn.held = parser.buffered() > 0 or conn.next is not None
                return
            request, conn.next = conn.next, None
            if request is None:
                try:
                    request = parser.next_command()
                except ProtocolError as e:
                    self.queue(conn, front.encode_error(e.message))
                    conn.closing = True
                    return
                if request is None:
                    self._cap_unauthenticated(conn)
                    return
            if client.repl_jobs:  # an ADDJOB before this one waits for its replicas
                if not front.overlaps(request) or client.reply_mode or client.mute_next:
                    conn.next = request
                    return
                for job_id in client.repl_jobs:
                    conn.slots.setdefault(job_id, [None, []])
            reply = core.handle_command(client, request, run)
            if reply is BLOCKED:
                continue  # waiting for a key or a timeout (`client.waiter`: the loop ends), or for replicas
            if reply is not SILENT:
                self.queue(conn, encode(reply, client.proto))
            if client.closing:
                conn.closing = True  # QUIT, CLIENT KILL of itself: run nothing more
        if client.waiter is not None and not conn.closing:  # waiting (a late AUTH answer): no piling up input either
            self._cap_unauthenticated(conn)

    def _cap_unauthenticated(self, conn: Conn) -> None:
        """Close a client that has not authenticated (with requirepass) once
        the input it has not had run is over UNAUTHENTICATED_REQUEST_MAX."""
        client = conn.client
        # The parser is asked last: without requirepass this costs no Python call per request.
        if self.settings.requirepass and not client.authenticated and conn.parser.buffered() > UNAUTHENTICATED_REQUEST_MAX:
            log.warning("Closing unauthenticated client %s sending a request over %d bytes", client.addr, UNAUTHENTICATED_REQUEST_MAX)
            self.queue(conn, conn.front.encode_error("Protocol error: unauthenticated request too long"))
            conn.closing = True

    def queue(self, conn: Conn, data: bytes) -> None:
        if conn.slots:  # behind an ADDJOB still waiting for its answer
            next(reversed(conn.slots.values()))[1].append(data)
        else:
            conn.out.append(data)
        self.count_queued(conn, len(data))

    def count_queued(self, conn: Conn, size: int) -> None:
        conn.out_size += size
        hard, soft, _ = self.settings.client_output_buffer_limit
        if hard or soft:
            self.check_output(conn)

    def sent(self, conn: Conn, n: int) -> None:
        """The transport wrote `n` bytes of `conn.out`."""
        self.net_out += n
        conn.out_size -= n
        self.check_output(conn)

    def check_output(self, conn: Conn) -> None:
        """client-output-buffer-limit: close a client whose pending output is
        over the limits, dropping that output (logged, counted in INFO)."""
        limits = self.settings.client_output_buffer_limit
        if not (limits[0] or limits[1]) or conn.closing:
            return
        close, conn.soft_since = output_limit_exceeded(conn.out_size, limits, conn.soft_since, time.monotonic())
        if close:
            log.warning("Client id=%d addr=%s scheduled to be closed ASAP for overcoming of output buffer limits "
                        "(%d bytes pending).", conn.client.id, conn.client.addr, conn.out_size)  # fmt: skip
            self.on_output_limit()
            held = sum(len(answer or b"") + sum(map(len, after)) for answer, after in conn.slots.values())
            conn.out_size -= sum(map(len, conn.out)) + held
            conn.out.clear()
            conn.slots.clear()
            conn.closing = True
            conn.abort()

    def info_fields(self) -> dict[str, Any]:
        """What INFO needs from the sessions (Host.process_info)."""
        conns = self.conns.values()
        return {
            "net_in": self.net_in,
            "net_out": self.net_out,
            "rejected": self.rejected,
            "longest_output": max((len(c.out) for c in conns), default=0),
            "biggest_input": max((c.parser.buffered() for c in conns), default=0),
        }

    def reset_stats(self) -> None:
        self.net_in = self.net_out = self.rejected = 0
