"""bananaq's consumer-group commands on the RESP port (spec/bananaq.md §1-§5).

Theory of operation: each handler parses its arguments as bananaq does
(too few arguments: `-ERR insufficient arguments`; extra words ignored;
times are seconds as Go's ParseFloat reads them, its error text included)
and calls the core's consumer groups (core/groups.py).  Replies have
bananaq's shapes: QADD a bulk ID, QGET [id, body] or nil, QACK 0/1, QNOTIFY
a bulk queue name or nil, QSTATUS the nested array of §5.2, QINFO one line
per queue and group.  okq's commands that fit a log read by groups
(QRPOP, QRPEEK, QLPEEK, QREGISTER, and the short forms of QACK and QNOTIFY)
read as one group named "okq".
"""

from __future__ import annotations

import re
from typing import Any

from disque.core.errors import err
from disque.core.node import NodeCore
from disque.core.types import Connection
from disque.protocols.resp.table import OK, command

DEFAULT_EX_MS = 30_000  # QGET's ack window without EX
OKQ_GROUP = b"okq"  # the group okq's commands read as (okq had one set of consumers per queue)
MAX_WAIT_S = 10 * 365 * 86400  # longer times are taken as this (they could not be waited for anyway)
_FLOAT = re.compile(rb"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?").fullmatch


def _need(argv: list[bytes], count: int) -> None:
    if len(argv) <= count:
        raise err("insufficient arguments")


def _go_quote(raw: bytes) -> str:
    """Go's %q of a string, for the error texts bananaq passes through."""
    text = raw.decode("utf-8", "replace").replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else "\\x%02x" % ord(c) if ord(c) < 256 else c for c in text) + '"'


def parse_seconds(raw: bytes, base: float = 0.0) -> float:
    """Seconds as Go's strconv.ParseFloat reads them (its message on
    failure), less `base`, within MAX_WAIT_S either way."""
    if not _FLOAT(raw):
        raise err(f"strconv.ParseFloat: parsing {_go_quote(raw)}: invalid syntax")
    return max(-MAX_WAIT_S, min(float(raw) - base, MAX_WAIT_S))


def _expire_ms(node: NodeCore, raw: bytes) -> int:
    """QADD's lifetime in ms: seconds from now, or `@<unix seconds>`."""
    if not raw:
        raise err("empty expire string")
    if raw[:1] == b"@":
        return round(parse_seconds(raw[1:], node.now / 1000) * 1000)
    return round(parse_seconds(raw) * 1000)


@command("qadd", -1, "wm")
def cmd_qadd(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    _need(argv, 3)
    expire = _expire_ms(node, argv[2])
    noblock = len(argv) > 4 and argv[4].lower() == b"noblock"
    if expire <= 0:
        event = node.groups.expired_id()
        return OK if noblock else event
    return node.lifecycle.add_event(client, argv[1], argv[3], -(-expire // 1000), noblock)


def _ex_ms(argv: list[bytes], at: int) -> int:
    """`EX seconds` at argv[at] (absent, or EX without a value: the default)."""
    if len(argv) > at + 1 and argv[at].lower() == b"ex":
        seconds = parse_seconds(argv[at + 1])
        if seconds < 0:
            raise err(f"bad expires value: {argv[at + 1].decode('utf-8', 'replace')} < 0")
        return max(1, round(seconds * 1000)) if seconds else 0
    return DEFAULT_EX_MS


@command("qget", -1, "w")
def cmd_qget(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    _need(argv, 2)
    return node.groups.qget(client, argv[1], argv[2], _ex_ms(argv, 3))


@command("qack", -1, "w")
def cmd_qack(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """QACK queue group id; okq's QACK queue id (an ID is digits, a group
    name need not be) acknowledges for the okq group."""
    if len(argv) == 3 and argv[2].isdigit():
        argv = [argv[0], argv[1], OKQ_GROUP, argv[2]]
    _need(argv, 3)
    queue, group, raw = argv[1:4]
    if not raw.isdigit() or len(raw) > 40:
        raise err("invalid ID string")
    return node.groups.qack(client, queue, group, int(raw))


# okq's list commands where they fit a log read by groups: one group, "okq"


@command("qrpop", -1, "w")
def cmd_qrpop(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """QRPOP queue [EX seconds]: QGET queue okq [EX seconds]."""
    _need(argv, 1)
    return node.groups.qget(client, argv[1], OKQ_GROUP, _ex_ms(argv, 2))


@command("qrpeek", -1, "r")
def cmd_qrpeek(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """The event QRPOP would return next, left where it is."""
    _need(argv, 1)
    return node.groups.peek(argv[1], OKQ_GROUP, newest=False)


@command("qlpeek", -1, "r")
def cmd_qlpeek(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """The newest live event."""
    _need(argv, 1)
    return node.groups.peek(argv[1], OKQ_GROUP, newest=True)


@command("qregister", -1, "w")
def cmd_qregister(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """The queues okq's one-argument QNOTIFY waits on (none: deregister)."""
    client.registered = list(dict.fromkeys(argv[1:]))
    return OK


@command("qnotify", -1, "w")
def cmd_qnotify(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """QNOTIFY group timeout [queue ...]; okq's QNOTIFY timeout waits on the
    QREGISTERed queues for the okq group."""
    if len(argv) == 2 and _FLOAT(argv[1]):  # a timeout, not a group name
        argv = [argv[0], OKQ_GROUP, argv[1], *client.registered]
    _need(argv, 2)
    raw = argv[2]
    if not _FLOAT(raw):
        raise err(f"bad timeout value: strconv.ParseFloat: parsing {_go_quote(raw)}: invalid syntax")
    seconds = parse_seconds(raw)
    if seconds < 0:
        raise err(f"bad timeout value: {raw.decode()} < 0")
    return node.groups.qnotify(client, argv[1], round(seconds * 1000), argv[3:])


@command("qflush", -1, "w")
def cmd_qflush(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    _need(argv, 1)
    return node.blocking.in_slices(client, node.groups.qflush(argv[1]))


def _status_args(argv: list[bytes]) -> tuple[list[bytes], list[bytes] | None]:
    """Queues, then groups after the first GROUPS (None: not given)."""
    for i, arg in enumerate(argv[1:], 1):
        if arg.lower() == b"groups":
            return argv[1:i], argv[i + 1 :]
    return argv[1:], None


@command("qstatus", -1, "r")
def cmd_qstatus(node: NodeCore, client: Connection, argv: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for queue, _, groups in node.groups.status(*_status_args(argv)):
        flat: list[Any] = []
        for group, figures in groups:
            flat += [group, [x for pair in figures for x in pair]]
        out.append([queue, flat])
    return out


@command("qinfo", -1, "r")
def cmd_qinfo(node: NodeCore, client: Connection, argv: list[bytes]) -> list[bytes]:
    out = []
    for queue, total, groups in node.groups.status(*_status_args(argv)):
        if not groups:
            out.append(b"%s total:%d" % (queue, total))
        for group, figures in groups:
            out.append(b" ".join([queue, group] + [b"%s:%d" % pair for pair in figures]))
    return out
