"""Kestrel's command table over the core (spec/kestrel.md §2-§4, §8).

Theory of operation: each request value of the parser maps to a handler
that runs through `NodeCore.execute`, so AUTH, OOM, MISCONF and LOADING
checks, statistics, MONITOR and the slow log apply as for RESP.  Handlers
return either finished reply bytes or the core's own results, which
`encode` turns into Kestrel's lines: a job ID (an ADDJOB done) is STORED,
GETJOB's entries are VALUE ... END, its nil is END, -MAXLEN and -TOOLARGE
are NOT_STORED, -NOAUTH is `CLIENT_ERROR unauthenticated`, any other error
is SERVER_ERROR <message>; a SET the parser swallowed for being over
memcache-max-item-size is memcached's `SERVER_ERROR object too large for
cache`.  The VALUE line names the bare queue, as Kestrel does, or the key as
sent with `memcache-value-key echo`.  A SET waits for its replicas as ADDJOB
does, and pipelined SETs replicate together (`overlaps`).

Authentication (`memcache-auth password`, the default, while requirepass is
set): memcached's ASCII authentication.  A client that has not
authenticated sends `<user> <password>` as the data of a SET (any key; the
user is `default`), answered STORED, or `CLIENT_ERROR authentication
failure`, even with `noreply`, as memcached does.  It runs as the command
`auth` through `NodeCore.authenticate`, the path of RESP's AUTH, so failures
are counted and slowed down alike; any other command before it is refused
by `execute` (-NOAUTH) and the connection stays open.

Choices (README, "Kestrel clients"): a SET with no expiry lives ITEM_TTL;
its replication level is ADDJOB's default and it waits at most
SET_TIMEOUT_MS for it; FLUSH, DELETE and a full queue's discards take jobs
away cluster-wide, as FASTACK; FLUSH_EXPIRED finds nothing, since jobs
expire on a timer; VERSION gives disque's version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from disque.core import errors
from disque.core.errors import DisqueError
from disque.core.items import ITEM_TTL, OpenReadMismatch
from disque.core.types import BLOCKED, SILENT, Command, Connection, Status
from disque.store.job_options import JobOptions
from disque.protocols.memcache import encoder as reply
from disque.protocols.memcache.parser import (
    Delete, DumpConfig, DumpStats, Flush, FlushAll, FlushAllExpired, FlushExpired, Get, Quit, Reload, Set,
    SetTooLarge, Shutdown, Stats, Version, expiry_ms,
)  # fmt: skip
from disque import __version__

if TYPE_CHECKING:
    from disque.core.node import NodeCore

SET_TIMEOUT_MS = 5000  # how long a SET waits for its replicas (then SERVER_ERROR NOREPL ...)
# error code -> its memcache line (any other error: SERVER_ERROR <message>)
ERROR_LINES = {
    "MAXLEN": reply.NOT_STORED, "TOOLARGE": reply.NOT_STORED,
    "NOAUTH": reply.UNAUTHENTICATED, "WRONGPASS": reply.AUTH_FAILURE,
}  # fmt: skip


def run(node: NodeCore, client: Connection, request: Any) -> Any:
    """The front end's command table (base.FrontEnd.run)."""
    kind = type(request)
    if kind is Quit:
        node.out.close_client(client)
        return SILENT
    if kind is Set and not client.authenticated and node.config.requirepass:
        return node.execute(client, Command("auth", 0, "l", lambda n, c, argv: _auth(n, c, request)), [b"auth"])
    name, flags, handler = TABLE[kind]
    cmd = Command(name, 0, flags, lambda n, c, argv: handler(n, c, request))
    result = node.execute(client, cmd, [name.encode(), getattr(request, "queue", b"")])
    if getattr(request, "noreply", False):  # memcache's noreply: as CLIENT REPLY SKIP for this request
        if result is BLOCKED:
            client.mute_next = True
        else:
            result = SILENT
    return result


def encode(value: Any, proto: int = 2) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, Status):
        return reply.STORED
    assert isinstance(value, DisqueError), value  # what the handlers and the core's deferred answers give
    return ERROR_LINES.get(value.code) or reply.server_error(str(value))


def overlaps(request: Any) -> bool:
    return type(request) is Set


def _fatal(node: NodeCore, client: Connection) -> bytes:
    """ERROR, then the connection closes (spec §1.1): the request contradicts
    the connection's open read (a fetch over it, or a close or abort naming
    another queue), and Kestrel ends such a connection; closing it puts the
    read back at the head (§3.4)."""
    node.out.close_client(client)
    return reply.ERROR


# ---------------------------------------------------------------- items


def _set(node: NodeCore, client: Connection, req: Set) -> Any:
    items = node.items
    items.cmd_set += 1
    items.refer(req.queue)
    now = node.now
    expiry = expiry_ms(req.exptime, now)
    if expiry and expiry <= now:
        return reply.STORED  # expired already: Kestrel stores it and drops it at once
    ttl = -(-(expiry - now) // 1000) if expiry else ITEM_TTL
    items.copy_to_children(client, req.queue, req.data, ttl)
    return node.lifecycle.add_job(client, req.queue, req.data, JobOptions(SET_TIMEOUT_MS, ttl=ttl))


def _auth(node: NodeCore, client: Connection, req: Set) -> Any:
    """The credentials SET: `default <password>` (another user never matches)."""
    user, _, password = req.data.partition(b" ")
    failure = DisqueError("WRONGPASS", "invalid username-password pair or user is disabled.")
    return node.gate.authenticate(client, password if user == b"default" else None, failure) or reply.STORED


def _set_too_large(node: NodeCore, client: Connection, req: SetTooLarge) -> bytes:
    node.items.cmd_set += 1
    return reply.TOO_LARGE


def _get(node: NodeCore, client: Connection, req: Get) -> Any:
    items, opts = node.items, req.options
    try:
        if opts.abort:
            items.abort(client, req.queue)
            return reply.END
        if opts.close:
            items.close(client, req.queue)
            if not opts.open:
                return reply.END
    except OpenReadMismatch:
        return _fatal(node, client)
    # Kestrel's VALUE line names the bare queue; `memcache-value-key echo` names
    # the key as sent, for clients that match the answer to the key they asked.
    key = req.key if node.config.memcache_value_key == "echo" and req.key else req.queue

    def answer(entry: list[Any] | None) -> bytes:
        return reply.END if entry is None else reply.value(key, entry[2])

    items.refer(req.queue)
    if opts.peek:
        items.cmd_peek += 1
        return items.peek(req.queue, answer)
    if client.open_read is not None:
        return _fatal(node, client)  # a fetch while a read is open (spec §3.2)
    items.cmd_get += 1
    return items.take(client, req.queue, opts.timeout_ms, opts.open, answer)


def _flush(node: NodeCore, client: Connection, req: Flush) -> bytes:
    node.items.refer(req.queue)
    node.items.flush(req.queue)
    return reply.END


def _delete(node: NodeCore, client: Connection, req: Delete) -> bytes:
    node.items.forget(req.queue)
    node.items.flush(req.queue)
    return reply.END


def _flush_all(node: NodeCore, client: Connection, req: FlushAll) -> bytes:
    for name in [q.name for q in node.queues.values()]:
        node.items.flush(name)
    return reply.FLUSHED_ALL


def _flush_expired(node: NodeCore, client: Connection, req: FlushExpired | FlushAllExpired) -> bytes:
    if type(req) is FlushExpired:
        node.items.refer(req.queue)
    return reply.count(0)  # jobs expire on a timer: nothing expired is left to drop


# ---------------------------------------------------------------- admin


def _version(node: NodeCore, client: Connection, req: Version) -> bytes:
    return reply.version(__version__)


def _shutdown(node: NodeCore, client: Connection, req: Shutdown) -> Any:
    if not node.host.shutdown(False):
        raise errors.err("Errors trying to SHUTDOWN. Check logs.")
    return SILENT


def _reload(node: NodeCore, client: Connection, req: Reload) -> bytes:
    node.host.reload_queue_config()
    return reply.RELOADED


def _stats(node: NodeCore, client: Connection, req: Stats) -> bytes:
    proc = node.host.process_info()
    figures = node.items.global_stats(__version__, node.start_ms, proc.get("net_in", 0), proc.get("net_out", 0))
    return reply.stats(figures, node.items.queue_stats())


def _dump_stats(node: NodeCore, client: Connection, req: DumpStats) -> bytes:
    return reply.dump_stats(node.items.queue_stats())


def _dump_config(node: NodeCore, client: Connection, req: DumpConfig) -> bytes:
    settings = node.config.queue_config.settings
    return reply.dump_config((name, settings(name)) for name in node.items.queue_names())


Handler = Callable[[Any, Connection, Any], Any]
# request type -> (name for statistics, MONITOR and the slow log; flags as RESP's; handler)
TABLE: dict[type, tuple[str, str, Handler]] = {
    Set: ("set", "wm", _set),
    SetTooLarge: ("set", "w", _set_too_large),
    Get: ("get", "w", _get),
    Delete: ("delete", "w", _delete),
    Flush: ("flush", "w", _flush),
    FlushAll: ("flush_all", "w", _flush_all),
    FlushExpired: ("flush_expired", "w", _flush_expired),
    FlushAllExpired: ("flush_all_expired", "w", _flush_expired),
    Version: ("version", "l", _version),
    Shutdown: ("shutdown", "al", _shutdown),
    Reload: ("reload", "a", _reload),
    Stats: ("stats", "l", _stats),
    DumpStats: ("dump_stats", "l", _dump_stats),
    DumpConfig: ("dump_config", "l", _dump_config),
}
