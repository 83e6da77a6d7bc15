"""Introspection and administration commands: INFO, CONFIG, CLIENT, HELLO,
DEBUG and CLUSTER.

Theory of operation: these commands read the node's state and format it in
the exact shapes of spec/commands.md §7-9; anything that touches the outside world
(the config file, the working directory, the process) is delegated to the
shell's `host`.  Handlers in `commands.py` call the functions here; nothing
here keeps state.
"""

from __future__ import annotations

import re
from typing import Any

from disque import __version__
from disque.core import errors
from disque.cluster.membership import flags_text, valid_address
from disque.cluster.messages import FAIL, LEAVING, MYSELF, PFAIL
from disque.core.config import ConfigError, config_get, config_set
from disque.core.errors import DisqueError, err
from disque.core.types import REPLY_OFF, REPLY_ON, REPLY_SKIP_NEXT, SILENT, Connection, Map, Status
from disque.core.memory import MEM_LEVELS
from disque.core.node import NodeCore
from disque.protocols.resp.table import COMMANDS, int_or, parse_int, parse_timeout

OK = Status(b"OK")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _strict_int(raw: bytes) -> int:
    """Strict int64 (spec/commands.md §1.2); ValueError otherwise."""
    return parse_int(raw)


# ---------------------------------------------------------------- INFO


def _human(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{int(n)}B" if unit == "B" else f"{n:.2f}{unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def _section_server(node: NodeCore, proc: dict[str, Any]) -> list[tuple[str, Any]]:
    uptime = (node.now - node.start_ms) // 1000
    return [
        ("disque_version", __version__),
        ("disque_git_sha1", proc["git_sha1"]),
        ("disque_git_dirty", proc["git_dirty"]),
        ("disque_build_id", "0"),
        ("os", proc["os"]),
        ("arch_bits", proc["arch_bits"]),
        ("multiplexing_api", "trio"),
        ("gcc_version", "0.0.0"),
        ("process_id", proc["pid"]),
        ("run_id", node.run_id),
        ("tcp_port", node.config.port),
        ("zone", node.membership.myself.zone),  # docs/zones.md
        ("uptime_in_seconds", uptime),
        ("uptime_in_days", uptime // 86400),
        ("hz", node.config.hz),
        ("executable", proc["executable"]),
        ("config_file", node.config.config_file or ""),
    ]


def _section_clients(node: NodeCore, proc: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("connected_clients", len(node.clients)),
        ("client_longest_output_list", proc.get("longest_output", 0)),
        ("client_biggest_input_buf", proc.get("biggest_input", 0)),
        ("blocked_clients", node.blocking.count()),
    ]


def _section_memory(node: NodeCore, proc: dict[str, Any]) -> list[tuple[str, Any]]:
    """used_memory: the data (what maxmemory bounds); used_memory_startup:
    the RSS of the idle process, the fixed part outside it (docs/running.md)."""
    used, rss, startup, limit = node.memory.used, proc["rss"], proc["rss_startup"], node.config.maxmemory
    level = node.memory.level()
    return [
        ("used_memory", used),
        ("used_memory_human", _human(used)),
        ("used_memory_rss", rss),
        ("used_memory_startup", startup),
        ("used_memory_retained", node.memory.retained),  # in used_memory: what jobs moved to disk left
        ("used_memory_peak", node.memory.peak),
        ("used_memory_peak_human", _human(node.memory.peak)),
        ("mem_fragmentation_ratio", f"{rss / (startup + used):.2f}"),
        ("mem_allocator", "pymalloc"),
        ("maxmemory", limit),
        ("maxmemory_human", _human(limit)),
        ("maxmemory_policy", node.config.maxmemory_policy),
        ("mem_level", level),
        ("mem_level_name", MEM_LEVELS[level]),
    ]


def _section_persistence(node: NodeCore, proc: dict[str, Any]) -> list[tuple[str, Any]]:
    return node.aof.info_fields(node.loading)


def _section_stats(node: NodeCore, proc: dict[str, Any]) -> list[tuple[str, Any]]:
    s = node.stats
    return [
        ("total_connections_received", s.connections),
        ("total_commands_processed", s.commands),
        ("instantaneous_ops_per_sec", proc.get("ops_per_sec", 0)),
        ("total_net_input_bytes", proc.get("net_in", 0)),
        ("total_net_output_bytes", proc.get("net_out", 0)),
        ("instantaneous_input_kbps", f"{proc.get('input_kbps', 0.0):.2f}"),
        ("instantaneous_output_kbps", f"{proc.get('output_kbps', 0.0):.2f}"),
        ("rejected_connections", proc.get("rejected", 0)),
        ("latest_fork_usec", 0),
    ]


def _section_cpu(node: NodeCore, proc: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, f"{proc[k]:.2f}") for k in ("used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children")]


def _section_commandstats(node: NodeCore, proc: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for cmd in COMMANDS.values():
        calls = node.stats.calls.get(cmd.name)
        if calls and calls[0]:
            out.append((f"cmdstat_{cmd.name}", f"calls={calls[0]},usec={calls[1]},usec_per_call={calls[1] / calls[0]:.2f}"))
    return out


SECTIONS = {
    "server": ("Server", _section_server),
    "clients": ("Clients", _section_clients),
    "memory": ("Memory", _section_memory),
    "jobs": ("Jobs", lambda node, proc: [("registered_jobs", len(node.jobs))]),
    "queues": ("Queues", lambda node, proc: [("registered_queues", len(node.queues))]),
    "persistence": ("Persistence", _section_persistence),
    "stats": ("Stats", _section_stats),
    "cpu": ("CPU", _section_cpu),
    # Protections and their counters (docs/security.md); filled by the shell.
    "security": ("Security", lambda node, proc: proc.get("security", [])),
    "commandstats": ("Commandstats", _section_commandstats),
    # The memcache front end's counters (docs/kestrel.md); per queue: QSTAT, or STATS on the memcache port.
    "kestrel": ("Kestrel", lambda node, proc: node.items.info_fields()),
    # Consumer groups (docs/consumer-groups.md); per queue and group: QSTATUS.
    "groups": ("Groups", lambda node, proc: node.groups.info_fields()),
    # Jobs moving between nodes (docs/cluster.md): NEEDJOBS/YOURJOBS and WAITING.
    "federation": ("Federation", lambda node, proc: node.federation.info_fields()),
    # Recurring jobs (docs/schedules.md); per schedule: SCHEDULE SHOW.
    "schedules": ("Schedules", lambda node, proc: node.schedules.info_fields()),
    # Keyed jobs' deduplication (docs/keys.md): holds, producers waiting for a key's home, hits.
    "keys": ("Keys", lambda node, proc: node.keys.info_fields()),
    # Queues' cluster-wide limits (docs/limits.md); per queue: QCONFIG <queue> GET.
    "limits": ("Limits", lambda node, proc: node.limits.info_fields()),
    # Jobs that wait for jobs, and results (docs/workflows.md).
    "workflows": ("Workflows", lambda node, proc: node.deps.info_fields() + node.batches.info_fields()),
    # Queues larger than memory (docs/read-behind.md); off: `read_behind:no` only.
    "read-behind": ("Read-behind", lambda node, proc: node.read_behind.info_fields()),
}
EXTRA = (  # shown by INFO <section> and INFO all only
    "security", "commandstats", "kestrel", "groups", "read-behind", "federation", "schedules", "keys", "limits", "workflows",
)  # fmt: skip


def info(node: NodeCore, section: str) -> bytes:
    if section in ("default", "all"):
        # The default sections are upstream's; Security is shown by INFO security and INFO all.
        names = [n for n in SECTIONS if section == "all" or n not in EXTRA]
    elif section in SECTIONS:
        names = [section]
    else:
        return b""
    proc = node.host.process_info()
    blocks = []
    for name in names:
        title, fields = SECTIONS[name]
        lines = [f"# {title}"] + [f"{k}:{v}" for k, v in fields(node, proc)]
        blocks.append("\r\n".join(lines) + "\r\n")
    return "\r\n".join(blocks).encode()


# ---------------------------------------------------------------- CONFIG


def config_command(node: NodeCore, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    wanted = {b"get": 3, b"set": 4, b"resetstat": 2, b"rewrite": 2}.get(sub)
    if wanted is None:
        raise err("CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE")
    if len(argv) != wanted:
        raise err(f"Wrong number of arguments for CONFIG {_text(argv[1])}")
    if sub == b"get":
        return Map(config_get(node.config, _text(argv[2])))
    if sub == b"set":
        try:
            changed = config_set(node.config, _text(argv[2]), _text(argv[3]))
        except ConfigError as e:
            raise err(str(e)) from None
        node.host.apply_config(changed)
        return OK
    if sub == b"resetstat":
        stats = node.stats
        stats.connections = stats.commands = 0
        stats.calls.clear()
        node.host.reset_stats()
        return OK
    if not node.config.config_file:
        raise err("The server is running without a config file")
    node.host.rewrite_config()
    return OK


# ---------------------------------------------------------------- CLIENT

def client_line(node: NodeCore, c: Connection) -> str:
    now = node.now
    return (
        f"id={c.id} addr={c.addr} fd={c.fd} name={_text(c.name)} age={(now - c.ctime) // 1000} "
        f"idle={(now - c.last) // 1000} flags={'b' if c.waiter or c.repl_jobs else 'N'} qbuf=0 qbuf-free=0 "
        f"obl=0 oll=0 omem=0 events=r cmd={c.last_cmd}\n"
    )


def _kill_filters(node: NodeCore, me: Connection, args: list[bytes]) -> int:
    if len(args) % 2:
        raise errors.syntax()
    targets = list(node.clients.values())
    skipme = True
    for key, value in zip(args[::2], args[1::2]):
        key = key.lower()
        if key == b"id":
            try:
                wanted = _strict_int(value)
            except ValueError:
                raise errors.syntax() from None
            targets = [c for c in targets if c.id == wanted]
        elif key == b"type":
            if value.lower() != b"normal":
                raise err(f"Unknown client type '{_text(value)}'")
        elif key == b"addr":
            targets = [c for c in targets if c.addr == _text(value)]
        elif key == b"skipme" and value.lower() in (b"yes", b"no"):
            skipme = value.lower() == b"yes"
        else:
            raise errors.syntax()
    killed = 0
    for c in targets:
        if c is not me or not skipme:
            node.out.close_client(c)
            killed += 1
    return killed


def client_command(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    args = argv[2:]
    if sub == b"list" and not args:
        return "".join(client_line(node, c) for c in node.clients.values()).encode()
    if sub == b"getname" and not args:
        return client.name or None
    if sub == b"setname" and len(args) == 1:
        if any(ch < 33 or ch > 126 for ch in args[0]):
            raise err("Client names cannot contain spaces, newlines or special characters.")
        client.name = args[0]
        return OK
    if sub == b"id" and not args:
        return client.id
    if sub == b"setinfo" and len(args) == 2:
        attr = args[0].lower()
        if attr not in (b"lib-name", b"lib-ver"):
            raise err(f"Unrecognized option '{_text(args[0])}'")
        setattr(client, "lib_name" if attr == b"lib-name" else "lib_ver", args[1])
        return OK
    if sub == b"kill" and len(args) == 1:
        for c in node.clients.values():
            if c.addr == _text(args[0]):
                node.out.close_client(c)
                return OK
        raise err("No such client")
    if sub == b"kill" and args:
        return _kill_filters(node, client, args)
    if sub == b"pause" and len(args) == 1:

        node.client_pause_until = node.now + parse_timeout(args[0])
        return OK
    if sub == b"reply" and len(args) == 1:
        mode = args[0].lower()
        if mode == b"on":
            client.reply_mode = REPLY_ON
            return OK
        if mode in (b"off", b"skip"):
            client.reply_mode = REPLY_OFF if mode == b"off" else REPLY_SKIP_NEXT
            return SILENT
    raise err("Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME connection-name)")


# ---------------------------------------------------------------- HELLO


def priority(node: NodeCore, n: Any) -> int:
    prio = 1
    if not n.flags & MYSELF and not n.link:
        prio = 5
    if n.flags & PFAIL:
        prio = 10
    if n.flags & (FAIL | LEAVING):
        prio = 100
    return prio


def hello(node: NodeCore) -> list[Any]:
    out: list[Any] = [1, node.membership.my_id]
    for n in node.membership.nodes.values():
        entry = [n.id, n.ip, str(n.port).encode(), str(priority(node, n)).encode()]
        if n.zone:  # a fifth item, for zoned nodes only (docs/zones.md)
            entry.append(n.zone)
        out.append(entry)
    return out


def redis_hello(node: NodeCore, client: Connection, args: list[bytes]) -> Any:
    """The Redis 6+ handshake: HELLO protover [AUTH user pass] [SETNAME name]."""
    try:
        proto = _strict_int(args[0])
    except ValueError:
        raise err("Protocol version is not an integer or out of range") from None
    if proto not in (2, 3):
        raise DisqueError("NOPROTO", "unsupported protocol version")
    i, name, delay = 1, None, 0
    try:
        while i < len(args):
            opt = args[i].lower()
            if opt == b"auth" and i + 2 < len(args):
                wrong = DisqueError("WRONGPASS", "invalid username-password pair or user is disabled.")
                if not node.config.requirepass:
                    raise wrong
                delay = node.gate.check_password(client, args[i + 2] if args[i + 1] == b"default" else None)
                if not client.authenticated:
                    raise wrong
                i += 3
            elif opt == b"setname" and i + 1 < len(args):
                name = args[i + 1]
                i += 2
            else:
                raise err(f"Syntax error in HELLO option '{_text(args[i])}'")
        if node.config.requirepass and not client.authenticated:
            raise errors.noauth()
        if name is not None:
            client_command(node, client, [b"client", b"setname", name])
        client.proto = proto
        reply: Any = Map(
            [
                (b"server", b"disque"),
                (b"version", __version__.encode()),
                (b"proto", proto),
                (b"id", client.id),
                (b"mode", b"cluster"),
                (b"role", b"master"),
                (b"modules", []),
                (b"node-id", node.membership.my_id.encode()),
            ]
        )
    except DisqueError as e:  # after a password whose answer waits, so does whatever follows it
        reply = e
    return node.blocking.answer_late(client, delay, reply)


# ---------------------------------------------------------------- DEBUG


MAX_SLEEP_S = 1 << 31  # longer sleeps overflow the platform's time_t
_STRTOD = re.compile(rb"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _sleep_seconds(raw: bytes) -> float:
    """DEBUG SLEEP's argument as C strtod reads it: the longest numeric
    prefix, 0 when there is none; NaN and negative times sleep 0."""
    match = _STRTOD.match(raw)
    seconds = float(match[0]) if match else 0.0
    return min(seconds, MAX_SLEEP_S) if seconds > 0 else 0.0


def debug_command(node: NodeCore, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    args = argv[2:]
    if sub == b"flushall" and not args:
        node.flush_all()
        return OK
    if sub == b"error" and len(args) == 1:
        return DisqueError(_text(args[0]))
    if sub == b"structsize" and not args:
        from disque.store.job import Job

        return f"job:{Job.__basicsize__}\r\n".encode()
    if sub == b"sleep" and len(args) == 1:
        return node.host.debug("sleep", [str(_sleep_seconds(args[0])).encode()])
    if sub in (b"restart", b"crash-and-recover") and len(args) <= 1:
        if args:

            # A negative delay means none; a huge one waits (almost) forever.
            delay = min(max(0, int_or(args[0], errors.not_integer)), MAX_SLEEP_S * 1000)
            args = [str(delay).encode()]
        return node.host.debug(_text(sub), args)
    if sub in (b"loadaof", b"segfault", b"assert", b"oom") and not args:
        return node.host.debug(_text(sub), args)
    if sub == b"aof-fault" and len(args) == 1 and args[0].lower() in (b"write", b"fsync", b"off"):
        return node.host.debug("aof-fault", [args[0].lower()])  # this project: EIO on the AOF's next write or fsync
    raise err(f"Unknown DEBUG subcommand or wrong number of arguments for '{_text(argv[1])}'")


# ---------------------------------------------------------------- CLUSTER

def node_line(node: NodeCore, n: Any) -> str:
    link = "connected" if n.link or n.flags & MYSELF else "disconnected"
    zone = f" zone={n.zone}" if n.zone else ""  # an extra last field, for zoned nodes only (docs/zones.md)
    return f"{n.id} {n.ip}:{n.port} {flags_text(n.flags)} {n.ping_sent} {n.pong_received} {link}{zone}\n"


def cluster_info(node: NodeCore) -> bytes:
    c = node.membership
    lines = [
        "cluster_state:ok",
        f"cluster_known_nodes:{len(c.nodes)}",
        f"cluster_reachable_nodes:{len(c.reachable())}",
        f"cluster_size:{c.size()}",
        f"cluster_stats_messages_sent:{node.stats.bus_sent}",
        f"cluster_stats_messages_received:{node.stats.bus_received}",
    ]
    if c.zoned:  # docs/zones.md: this node's zone counted
        lines.append(f"cluster_reachable_zones:{len(c.reachable_zones(include_me=True))}")
    return ("\r\n".join(lines) + "\r\n").encode()


def cluster_command(node: NodeCore, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    args = argv[2:]
    if sub == b"myid" and not args:
        return node.membership.my_id.encode()
    if sub == b"nodes" and not args:
        return "".join(node_line(node, n) for n in node.membership.nodes.values()).encode()
    if sub == b"info" and not args:
        return cluster_info(node)
    if sub == b"leaving" and not args:
        return Status(b"yes" if node.membership.leaving else b"no")
    if sub == b"leaving" and len(args) == 1:
        value = args[0].lower()
        if value not in (b"yes", b"no"):
            raise err("Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")
        node.membership.set_leaving(value == b"yes")
        return OK
    if sub == b"meet" and len(args) == 2:
        ip, port_text = _text(args[0]), _text(args[1])
        try:
            port = _strict_int(args[1])
        except ValueError:
            raise err(f"Invalid TCP port specified: {port_text}") from None
        if not valid_address(ip, port):
            raise err(f"Invalid node address specified: {ip}:{port_text}")
        node.membership.meet(ip, port)
        return OK
    if sub == b"forget" and len(args) == 1:
        node_id = _text(args[0])
        if len(node_id) != 40:
            raise err("Invalid node identifier")
        if node_id == node.membership.my_id:
            raise err("I tried hard but I can't forget myself...")
        if node_id not in node.membership.nodes:
            raise err(f"Unknown node {node_id}")
        node.membership.forget(node_id)
        return OK
    if sub == b"reset" and len(args) <= 1:
        mode = args[0].lower() if args else b"soft"
        if mode not in (b"soft", b"hard"):
            raise errors.syntax()
        node.reset(hard=mode == b"hard")
        _save_conf(node)
        return OK
    if sub == b"saveconfig" and not args:
        _save_conf(node)
        return OK
    raise err("Wrong CLUSTER subcommand or number of arguments")


def _save_conf(node: NodeCore) -> None:
    try:
        node.host.save_cluster_config(fsync=True)
    except OSError as e:
        raise err(f"error saving the cluster node config: {e.strerror}") from None
