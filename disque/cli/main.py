"""`disque`: the command-line client, what redis-cli is to Redis.

Theory of operation: one click group, `cli`, is the command table of both
the one-shot commands and the prompt.  Its global options (`-h/-p/-a`, TLS,
the output mode, `--cluster/--local`) make a `Session`; they may follow the
subcommand too (`CommandGroup.hoist` moves them in front of it before click
parses the line).  The next word picks a subcommand by its
exact lowercase name (`qstat`, `show`, `jscan`, `top`, `export`, `help`,
...), and any other word is a server command sent as typed (`disque ADDJOB q
body 0`, or `disque JSCAN 0 COUNT 10` for one raw page).  Without a command,
a prompt (`prompt.py`) reads lines, splits them like redis-cli and runs each
through `dispatch`, the same lookup: what works as `disque [options] <line>`
works at the prompt (with the prompt's options, or a line's own), and `help <name>`
shows the same help as `disque <name> --help`.

`qlen`, `qstat`, `keys` and `top` are cluster-wide views by default (every node
HELLO lists, added up, `cluster.py`); `--local` narrows them to the node
connected to, and `qscan`, `jscan` and `export` widen with `--cluster`.
Server commands (QLEN, QSTAT) always answer what the node answers.

Output follows redis-cli: pretty (tables) on a terminal, bare values one per
line (`--raw`) when stdout is not one; `--no-raw` and `--json` choose.  Server
errors and connection failures end a command with their text on stderr and
exit status 1; at the prompt they are printed and the prompt goes on.

Start-up is kept short by importing late: the client library when a command
runs, rich only to print tables, prompt_toolkit only for the prompt, and a
`lazy` subcommand (`worker`) only when it is called.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import click

from disque.cli.session import DEFAULT_TIMEOUT, Failure, Session

# name: (arguments, summary), for `help`, completion and the prompt's hint line.
SERVER_COMMANDS: dict[str, tuple[str, str]] = {
    "ADDJOB": ("queue body ms-timeout [REPLICATE n] [DELAY sec] [RETRY sec] [TTL sec] [MAXLEN n] [ASYNC] [MAXATTEMPTS n [DEADLETTER queue]] [PRIORITY 0-9] [KEY key [DEDUP ms|ACTIVE]] [AFTER id ...] [ON-PARENT-FAIL fail|run|drop] [BATCH id]",
               "Add a job to a queue (MAXATTEMPTS: after n failed deliveries the job moves to its dead-letter queue, by default <queue>-dead; "
               "PRIORITY: higher is served first, default 5)"),
    "GETJOB": ("[NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM queue [queue ...]", "Fetch jobs, blocking until one is available"),
    "ACKJOB": ("id [RESULT bytes] [id [RESULT bytes] ...]", "Acknowledge jobs as processed, each with an optional result"),
    "RESULT": ("id", "The result a job was acknowledged with (nil: none kept here)"),
    "FASTACK": ("id [id ...]", "Acknowledge and delete jobs everywhere at once"),
    "NACK": ("id [id ...] [DELAY s] [ERROR type message [TRACEBACK text] [HOST host] [PID pid]]",
             "Put jobs back in the queue (after s seconds), counting a failed delivery (and saying why: SHOW and the dead letter show it)"),
    "WAITJOB": ("id [id ...] [TIMEOUT ms] [WITHRESULTS]", "Wait until jobs are acknowledged; reply how many were (and their results)"),
    "BATCH": ("NEW [ON-SUCCESS queue body] [ON-COMPLETE queue body] | SHOW id | CLOSE id",
              "Jobs counted together, with a callback job once they are done (see `batch --help`)"),
    "WORKING": ("id", "Postpone the next delivery of a job still being processed"),
    "ENQUEUE": ("id [id ...]", "Queue active jobs again"),
    "DEQUEUE": ("id [id ...]", "Take queued jobs out of their queue"),
    "DELJOB": ("id [id ...]", "Delete jobs from this node only"),
    "DEADLETTER": ("LIST|REQUEUE|DELETE queue [COUNT n] [FROM queue] [ERROR type] [SINCE ms] [UNTIL ms] [RATE n] | MOVES | STOP queue",
                   "This node's dead letters queued in queue: list them (with their last error), put them back into their own queues, or delete them"),
    "SHOW": ("id", "Everything this node knows about a job"),
    "JSCAN": ("[cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s ...] [REPLY id|all]", "Iterate over jobs"),
    "QLEN": ("queue", "Number of jobs queued on this node"),
    "QPEEK": ("queue count", "Look at the oldest (count > 0) or newest jobs without taking them"),
    "QSTAT": ("queue", "Statistics of a queue on this node"),
    "QKEYS": ("queue [COUNT n]", "The keys with jobs queued in a queue on this node, and the n busiest (see `keys --help`)"),
    "QSCAN": ("[cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n] [IMPORTRATE r]", "Iterate over queues"),
    "PAUSE": ("queue in|out|all|none|state|bcast ...", "Pause a queue for input and/or output"),
    "QSETTINGS": ("queue", "The queue's effective Kestrel settings"),
    "QADD": ("queue expire-sec contents [NOBLOCK]", "Add an event that every consumer group reads once (reply: its ID)"),
    "QGET": ("queue group [EX sec]", "Hand the group's next event to this consumer, to acknowledge within sec (default 30)"),
    "QACK": ("queue group id", "Acknowledge an event for a group"),
    "QNOTIFY": ("group timeout-sec [queue ...]", "Wait until QGET would return an event for the group; reply the queue"),
    "QFLUSH": ("queue", "Delete every event of a queue and every group's progress, on every node"),
    "QSTATUS": ("[queue ...] [GROUPS group ...]", "Per queue and group: total, inprogress, redo, done, available, consumers"),
    "QINFO": ("[queue ...] [GROUPS group ...]", "QSTATUS as one line of text per queue and group"),
    "QRPOP": ("queue [EX sec]", "okq: QGET as the group okq"),
    "QRPEEK": ("queue", "okq: the event QRPOP would return next, taking nothing"),
    "QLPEEK": ("queue", "okq: the newest live event, taking nothing"),
    "QREGISTER": ("[queue ...]", "okq: the queues of this connection's one-argument QNOTIFY"),
    "SCHEDULE": ("ADD name queue body EVERY ms|CRON expr [TZ zone] [ADDJOB options] | DEL | SHOW | PAUSE | RESUME name | LIST",
                 "Recurring jobs: a job added to a queue at every tick (see `schedule --help`)"),
    "QCONFIG": ("queue SET option value ... | queue GET | queue DEL | LIST",
                "A queue's cluster-wide limits: rate-limit n/s|m|h, concurrency n (see `qconfig --help`)"),
    "HELLO": ("", "This node and the cluster's nodes, with priorities"),
    "INFO": ("[section]", "Server information and statistics"),
    "PING": ("[message]", "Check the connection"),
    "ECHO": ("message", "Reply the message"),
    "SELECT": ("0", "Database 0, the only one (Redis compatibility)"),
    "AUTH": ("password", "Authenticate the connection"),
    "CLUSTER": ("MEET ip port | NODES | MYID | INFO | SAVECONFIG | FORGET id | RESET [SOFT|HARD] | LEAVING [yes|no]", "Cluster management"),
    "CONFIG": ("GET pattern | SET name value | RESETSTAT | REWRITE", "Read or change the configuration"),
    "CLIENT": ("LIST | KILL ... | GETNAME | SETNAME name | PAUSE ms | REPLY ON|OFF|SKIP", "Client connections"),
    "COMMAND": ("[INFO name ... | COUNT]", "The command table"),
    "DEBUG": ("FLUSHALL | LOADAOF | SLEEP sec | ERROR text | RESTART | ...", "Debugging helpers"),
    "BGREWRITEAOF": ("", "Rewrite the append only file in the background"),
    "SLOWLOG": ("GET [n] | LEN | RESET", "Slow command log"),
    "LATENCY": ("LATEST | DOCTOR | HISTORY event | GRAPH event | RESET [event ...]", "Latency monitor"),
    "MONITOR": ("", "Stream every command the server processes (Ctrl-C stops)"),
    "TIME": ("", "Server time"),
    "LOADJOB": ("serialized-job", "AOF-only record (refused from clients)"),
    "SHUTDOWN": ("[REWRITE-AOF]", "Stop the server"),
    "QUIT": ("", "Close the connection"),
}
PROMPT_ONLY = {"exit": "Leave the prompt (also quit, Ctrl-D)"}


class CommandGroup(click.Group):
    """Subcommands by their exact lowercase name or an alias; `lazy` ones
    (name: ("module:attribute", summary)) are imported when used; any other
    word is a server command, sent after `prefix`."""

    def __init__(self, *args: Any, prefix: tuple[str, ...] = (), aliases: dict[str, str] | None = None,
                 lazy: dict[str, tuple[str, str]] | None = None, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.prefix = prefix
        self.aliases = aliases or {}
        self.lazy = lazy or {}

    def subcommand(self, ctx: click.Context, name: str) -> click.Command | None:
        """The subcommand `name` names, or None for a server command."""
        name = self.aliases.get(name, name)
        if name in self.lazy and name not in self.commands:
            module, _, attribute = self.lazy[name][0].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self.subcommand(ctx, cmd_name) or server_command([*self.prefix, cmd_name])

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self.hoist(ctx, args) if ctx.parent is None else args)

    def hoist(self, ctx: click.Context, args: list[str]) -> list[str]:
        """`args` with the group's own options that follow the subcommand
        moved in front of it (`qstat q --json` as `--json qstat q`).  The
        subcommand's options win a name both have (`worker -v`); the words of
        a server command, and of check-aof, go as typed (a body may be `--raw`)."""
        ours = option_table(self.params)
        at = command_position(args, ours)
        command = self.subcommand(ctx, args[at]) if at < len(args) else None
        if command is None or command.context_settings.get("ignore_unknown_options"):
            return args
        theirs = option_table(command.params)
        moved: list[str] = []
        kept: list[str] = []
        rest = iter(args[at + 1 :])
        for word in rest:
            if word == "--":
                kept += [word, *rest]
                break
            for table, out in ((theirs, kept), (ours, moved)):
                option, inline = lookup(word, table)
                if option is not None:
                    out += [word, *itertools.islice(rest, 0 if inline or not takes_value(option) else 1)]
                    break
            else:
                kept.append(word)
        return [*args[:at], *moved, args[at], *kept]

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def summaries(self, limit: int = 60) -> list[tuple[str, str]]:
        """(name, one-line help) of every subcommand, importing no lazy one."""
        stand_ins = {name: click.Command(name, help=summary) for name, (_, summary) in self.lazy.items() if name not in self.commands}
        return [(name, cmd.get_short_help_str(limit)) for name, cmd in sorted({**self.commands, **stand_ins}.items())]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        with formatter.section("Commands"):
            formatter.write_dl(self.summaries(formatter.width - 6 - max(map(len, names), default=0)))

    def invoke(self, ctx: click.Context) -> Any:
        from disque.client import DisqueConnectionError, DisqueReplyError

        try:
            return super().invoke(ctx)
        except (DisqueReplyError, DisqueConnectionError) as e:
            raise Failure(str(e)) from e
        finally:
            if ctx.parent is None and isinstance(ctx.obj, Session):
                ctx.obj.close()


def option_table(params: list[click.Parameter]) -> dict[str, click.Option]:
    return {name: p for p in params if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}


def takes_value(option: click.Option) -> bool:
    return not option.is_flag and not option.count


def lookup(word: str, table: dict[str, click.Option]) -> tuple[click.Option | None, bool]:
    """The option `word` names in `table`, and whether it carries its value (`--port=7712`, `-p7712`)."""
    if word in table:
        return table[word], False
    if word.startswith("--"):
        return table.get(word.partition("=")[0]) if "=" in word else None, True
    option = table.get(word[:2]) if word.startswith("-") and len(word) > 2 else None
    return (option, True) if option is not None and takes_value(option) else (None, False)


def command_position(args: list[str], options: dict[str, click.Option]) -> int:
    """Where the command word is in `args`, after the options in `options` (len(args): there is none)."""
    at = 0
    while at < len(args) and args[at].startswith("-") and args[at] != "-":
        if args[at] == "--":
            return len(args)
        option, inline = lookup(args[at], options)
        at += 2 if option is not None and takes_value(option) and not inline else 1
    return at


def server_command(words: list[str]) -> click.Command:
    @click.command(name=words[-1], context_settings={"ignore_unknown_options": True, "help_option_names": []})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_obj
    def send(session: Session, args: tuple[str, ...]) -> None:
        session.run([*words, *args])

    return send


def print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        from disque.version import describe

        click.echo(describe("disque"))
        ctx.exit()


HELP = """Run one Disque COMMAND and print the reply, or open a prompt when none is given.

COMMAND is one of the subcommands below (lowercase) or any server command,
sent as typed: `disque ADDJOB q body 0`.  The prompt takes the same lines
(`help` lists them, `help NAME` explains one).

Output is drawn as tables on a terminal and bare, one value per line, when
piped (as redis-cli does); --raw, --no-raw and --json choose.

\b
The options above go before or after the subcommand (`disque qstat q
--json`); after a server command its words go as typed.

\b
qlen, qstat, keys and top add up the figures of every node the connected one lists
in HELLO; --local shows the connected node's alone.  qscan, jscan and export
show the connected node's jobs unless --cluster is given: then a job held
by several nodes is listed once (the record of the node that has it furthest
along: acked, queued, active, wait-repl).  Nodes that cannot be reached are
named on stderr and the exit status is 1.  Server commands (QLEN, QSTAT,
...) answer what the connected node answers."""


@click.group("disque", cls=CommandGroup, aliases={"scanjobs": "jscan"}, invoke_without_command=True, help=HELP,
             lazy={"worker": ("disque.client.worker:worker_command", "Run the handlers of MODULE:APP (a disque.client.worker.App), CONCURRENCY jobs at a time, until SIGTERM or SIGINT.")},
             context_settings={"help_option_names": ["--help"]}, subcommand_metavar="[COMMAND ARGS...]")  # fmt: skip
@click.option("-h", "--host", default="127.0.0.1", show_default=True, help="Server host.")
@click.option("-p", "--port", default=7711, show_default=True, type=int, help="Server port.")
@click.option("-a", "--password", default=None, envvar="DISQUE_AUTH", help="Password (AUTH); also read from $DISQUE_AUTH.")
@click.option("--tls", is_flag=True, help="Connect over TLS (to the node's tls-port).")
@click.option("--cacert", type=click.Path(exists=True, dir_okay=False), help="CA certificate that signed the server's (default: the system's).")
@click.option("--cert", type=click.Path(exists=True, dir_okay=False), help="Client certificate, for tls-auth-clients yes/optional.")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), help="Private key of --cert.")
@click.option("--json", "mode", flag_value="json", help="Print replies as JSON.")
@click.option("--raw", "mode", flag_value="raw", help="Print bare reply values, one per line (the default when stdout is not a terminal).")
@click.option("--no-raw", "mode", flag_value="pretty", help="Print tables even when stdout is not a terminal.")
@click.option("--cluster/--local", default=None, help="Every node's figures, or the connected node's, for the subcommands that take this option.")
@click.option("--full", is_flag=True, help="Print whole job bodies in tables (cut at 200 bytes, with their size, by default).")
@click.option("-t", "--timeout", default=DEFAULT_TIMEOUT, show_default=True, type=click.FloatRange(0),
              help="Seconds to wait to connect and for each reply (0: forever); GETJOB, ADDJOB, WAITJOB, QNOTIFY and MONITOR wait as long as they ask.")  # fmt: skip
@click.option("-v", "--version", is_flag=True, expose_value=False, is_eager=True, callback=print_version, help="Print the version and the git revision.")
@click.pass_context
def cli(ctx: click.Context, host: str, port: int, password: str | None, tls: bool, cacert: str | None,
        cert: str | None, key: str | None, mode: str | None, cluster: bool | None, full: bool, timeout: float) -> None:  # fmt: skip
    if (cacert or cert or key) and not tls:
        raise click.UsageError("--cacert, --cert and --key need --tls")
    if cluster is not None and ctx.invoked_subcommand is not None:
        command = cli.get_command(ctx, ctx.invoked_subcommand)
        if command is None or "cluster" not in {p.name for p in command.params}:
            raise click.UsageError(f"--cluster and --local apply to {', '.join(SCOPED)}, not to {ctx.invoked_subcommand}")
    options = {"tls": True, "tls_ca_cert": cacert, "tls_cert": cert, "tls_key": key} if tls else {}
    ctx.obj = Session(host, port, password, mode or ("pretty" if sys.stdout.isatty() else "raw"), options, cluster, full=full, timeout=timeout)
    if ctx.invoked_subcommand is None:
        from disque.cli.prompt import prompt_loop, script_loop

        (prompt_loop if sys.stdin.isatty() else script_loop)(ctx)


SCOPED = ("qlen", "qstat", "keys", "top", "qscan", "jscan", "export")  # the views that take --cluster/--local


def scope_option(wide: bool, merge: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    default = "--cluster" if wide else "--local"
    return click.option("--cluster/--local", default=None,
                        help=f"Every node HELLO lists ({merge}), or the connected node alone; default {default}.")  # fmt: skip


GROUP_FIGURES = ("total", "inprogress", "redo", "done", "available", "consumers")


def group_rows(client: Any, queues: list[str]) -> list[dict[str, Any]]:
    """QSTATUS as one row per queue and consumer group (all queues when none given)."""
    rows = []
    for queue, groups in client.execute_command("QSTATUS", *queues):
        for group, figures in zip(groups[::2], groups[1::2]):
            rows.append({"queue": queue.decode(errors="replace"), "group": group.decode(errors="replace"),
                         **dict(zip(GROUP_FIGURES, figures[1::2]))})  # fmt: skip
    return rows


def show_groups(session: Session, rows: list[dict[str, Any]]) -> None:
    session.output("groups", rows, raw=["\t".join(map(str, r.values())) for r in rows])


@cli.command()
@click.argument("queue")
@scope_option(True, "the jobs queued on each add up")
@click.pass_obj
def qlen(session: Session, queue: str, cluster: bool | None) -> None:
    """The number of jobs queued in QUEUE, over the cluster: a job is queued on one node at a time."""
    if not session.wide(cluster, default=True):
        session.run(["QLEN", queue])
        return
    found = per_node(session, lambda c: c.qlen(queue))
    output_sum(session, queue, "len", found)


def output_sum(session: Session, queue: str, field: str, found: list[tuple[str, str, int]]) -> None:
    """A count added up over the nodes `per_node` found, with each node's."""
    total = sum(n for _, _, n in found)
    if session.mode == "json":
        session.output("plain", {"queue": queue, field: total, "nodes": [{"node": n, "address": a, field: k} for n, a, k in found]})
    else:
        session.output("by-node", {"total": {"queue": queue, field: total}, "nodes": [(n, a, {field: k}) for n, a, k in found]}, raw=total)
    session.check_nodes()


def per_node(session: Session, call: Callable[[Any], Any]) -> list[tuple[str, str, Any]]:
    """(node ID, address, what `call` returned) for every node that answered."""
    from disque.client import format_address

    return [(node.id, format_address(node.address), result) for node, result in session.each_node(call)]


@cli.command()
@click.argument("queue")
@scope_option(True, "lengths and counters add up, one row per node follows")
@click.option("--groups", is_flag=True, help="The queue's consumer groups (QSTATUS) instead of its jobs.")
@click.pass_obj
def qstat(session: Session, queue: str, cluster: bool | None, groups: bool) -> None:
    """Statistics of a queue, added up over the cluster's nodes."""
    if groups:  # every holder of an event has its groups' progress: one node's view
        show_groups(session, group_rows(session.client(), [queue]))
        return
    if not session.wide(cluster, default=True):
        session.run(["QSTAT", queue])
        return
    from disque.cli.cluster import merge_stats
    from disque.cli.views import jsonable, record_fields

    answered = per_node(session, lambda c: c.qstat(queue))
    found = [(n, a, stats) for n, a, stats in answered if stats is not None]
    total = merge_stats([stats for _, _, stats in found]) if found else None
    if total is None or session.mode == "json":
        session.output("plain", total and {**jsonable(total), "nodes": [{"node": n, "address": a, **jsonable(s)} for n, a, s in found]})
    else:  # --raw: the merged record, as QSTAT prints it
        session.output("by-node", {"total": total, "nodes": found, "asked": len(answered)}, raw=[v for item in record_fields(total).items() for v in item])
    session.check_nodes()


@cli.command()
@click.argument("queue")
@click.option("--count", type=click.IntRange(1, 1000), default=10, show_default=True, help="The busiest keys to show (QKEYS ... COUNT on each node).")
@scope_option(True, "keys, jobs and each busy key's jobs add up")
@click.pass_obj
def keys(session: Session, queue: str, count: int, cluster: bool | None) -> None:
    """The keys with jobs queued in QUEUE (ADDJOB ... KEY), the keyed jobs,
    and the busiest keys, added up over the cluster's nodes (QKEYS on each):
    a key with jobs queued on two nodes counts once on each, and a busy
    key's jobs are those of the nodes where it is among the COUNT busiest."""

    def figures(client: Any) -> dict[str, Any]:
        found = client.qkeys(queue, count)
        return {"keys": found.keys, "jobs": found.jobs, "busiest": dict(found.busiest)}

    if session.wide(cluster, default=True):
        found = per_node(session, figures)
    else:
        client = session.client()
        found = [(client.hello().node_id, session.label, figures(client))]
    jobs: dict[str, int] = {}
    for _, _, f in found:
        for key, n in f["busiest"].items():
            jobs[key] = jobs.get(key, 0) + n
    busiest = [{"key": key, "jobs": n} for key, n in sorted(jobs.items(), key=lambda kv: (-kv[1], kv[0]))[:count]]
    total = {"queue": queue, "keys": sum(f["keys"] for _, _, f in found), "jobs": sum(f["jobs"] for _, _, f in found), "busiest": busiest}
    nodes = [{"node": n, "address": a, "keys": f["keys"], "jobs": f["jobs"]} for n, a, f in found]
    session.output("keys", {**total, "nodes": nodes}, raw=[total["keys"], total["jobs"], *(f"{b['key']}\t{b['jobs']}" for b in busiest)])
    session.check_nodes()


@cli.command()
@click.argument("job_id", metavar="ID")
@click.pass_obj
def show(session: Session, job_id: str) -> None:
    """Everything the node knows about a job."""
    session.run(["SHOW", job_id])


@cli.command()
@click.option("--queue", help="Only jobs of this queue.")
@click.option("--state", "states", multiple=True, type=click.Choice(["wait-repl", "active", "queued", "acked"]), help="Only jobs in this state (repeatable).")
@click.option("--count", type=int, help="Jobs per round trip (a hint).")
@click.option("--busyloop", is_flag=True, help="Scan everything in one call.")
@click.option("--ids", is_flag=True, help="Only the job IDs.")
@scope_option(False, "each job once, --state filtering on each node's own state")
@click.pass_obj
def jscan(session: Session, queue: str | None, states: tuple[str, ...], count: int | None, busyloop: bool, ids: bool, cluster: bool | None) -> None:
    """Every job (alias: scanjobs), following the cursor to the end."""

    def scan(client: Any) -> list[Any]:
        return list(client.jscan(queue, states, count=count, busyloop=busyloop, details=not ids))

    jobs = cluster_jobs(session, scan) if session.wide(cluster, default=False) else scan(session.client())
    session.output("job-infos", jobs, raw=jobs if ids else [j.id for j in jobs])
    session.check_nodes()


def cluster_jobs(session: Session, scan: Callable[[Any], list[Any]]) -> list[Any]:
    from disque.cli.cluster import merge_jobs

    return merge_jobs(jobs for _, jobs in session.each_node(scan))


@cli.command()
@click.option("--minlen", type=int, help="Only queues at least this long.")
@click.option("--maxlen", type=int, help="Only queues at most this long.")
@click.option("--import-rate", type=int, help="Only queues importing at least this many jobs/s.")
@click.option("--count", type=int, help="Queues per round trip (a hint).")
@click.option("--busyloop", is_flag=True, help="Scan everything in one call.")
@scope_option(False, "the lengths of a queue add up, and --minlen/--maxlen apply to the sum")
@click.pass_obj
def qscan(session: Session, minlen: int | None, maxlen: int | None, import_rate: int | None, count: int | None, busyloop: bool, cluster: bool | None) -> None:
    """Every queue with its length, following the cursor to the end."""
    if session.wide(cluster, default=False):
        from disque.cli.cluster import merge_lengths

        def lengths(client: Any) -> dict[str, int]:
            return {name: client.qlen(name) for name in set(client.qscan(import_rate=import_rate, count=count, busyloop=busyloop))}

        total = merge_lengths(found for _, found in session.each_node(lengths))
        rows = [{"queue": name, "len": n} for name, n in total.items() if (minlen is None or n >= minlen) and (maxlen is None or n <= maxlen)]
    else:
        client = session.client()
        names = sorted(set(client.qscan(minlen=minlen, maxlen=maxlen, import_rate=import_rate, count=count, busyloop=busyloop)))
        rows = [{"queue": name, "len": None if session.mode == "raw" else client.qlen(name)} for name in names]
    session.output("queues", rows, raw=[r["queue"] for r in rows])
    session.check_nodes()


@cli.group(cls=CommandGroup, prefix=("CLUSTER",))
def cluster() -> None:
    """Cluster commands (any other subcommand is sent as CLUSTER <it>)."""


@cluster.command()
@click.argument("host")
@click.argument("port", type=int)
@click.pass_obj
def meet(session: Session, host: str, port: int) -> None:
    """Join the node at HOST PORT into this node's cluster."""
    session.run(["CLUSTER", "MEET", host, str(port)])


@cluster.command()
@click.pass_obj
def nodes(session: Session) -> None:
    """The nodes this node knows, with their flags and link state."""
    session.run(["CLUSTER", "NODES"])


@cli.group(cls=CommandGroup, prefix=("DEADLETTER",), context_settings={"ignore_unknown_options": True})  # its words go to its subcommands
def deadletter() -> None:
    """Dead letters: jobs out of attempts (ADDJOB ... MAXATTEMPTS)."""


REQUEUE_BATCH = 1000  # dead letters per DEADLETTER REQUEUE: the node serves others between two


def dead_letter_filters(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that select dead letters (DEADLETTER's FROM, ERROR, SINCE, UNTIL)."""
    for option in reversed((
        click.option("--from", "origin", metavar="QUEUE", help="Only those that came from QUEUE."),
        click.option("--error", metavar="TYPE", help="Only those whose last failure is of TYPE (ValueError, app.Timeout)."),
        click.option("--since", metavar="AGE", help="Only those moved within the last AGE (90s, 5m, 1h, 1d)."),
        click.option("--until", metavar="AGE", help="Only those moved more than AGE ago."),
    )):  # fmt: skip
        command = option(command)
    return command


def filter_words(origin: str | None, error: str | None, since: str | None, until: str | None) -> list[Any]:
    """DEADLETTER's filter options; the ages counted back from this machine's clock."""
    words: list[Any] = []
    if origin is not None:
        words += ["FROM", origin]
    if error is not None:
        words += ["ERROR", error]
    if since is not None or until is not None:
        from disque.client.worker import parse_period

        now = int(time.time() * 1000)
        for word, age in (("SINCE", since), ("UNTIL", until)):
            if age is not None:
                try:
                    words += [word, max(0, now - parse_period(age))]
                except ValueError as e:
                    raise click.BadParameter(str(e), param_hint=f"--{word.lower()}") from None
    return words


def dead_letter_batches(verb: str, queue: str, count: int | None, filters: list[Any], rate: int | None) -> Callable[[Any], int]:
    """DEADLETTER <verb> on one node's client, in batches until none is left
    (or `count`), at most `rate` a second."""

    def run(client: Any) -> int:
        done = 0
        size = rate or REQUEUE_BATCH
        while count is None or done < count:
            batch = size if count is None else min(size, count - done)
            started = time.monotonic()
            moved = client.execute_command("DEADLETTER", verb, queue, "COUNT", batch, *filters)
            done += moved
            if moved < batch:
                break
            if rate:
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        return done

    return run


def dead_letter_bulk(session: Session, verb: str, field: str, queue: str, count: int | None, cluster: bool | None, words: list[Any], rate: int | None) -> None:
    run = dead_letter_batches(verb, queue, count, words, rate)
    if session.wide(cluster, default=True):
        found = per_node(session, run)
    else:
        client = session.client()
        found = [(client.hello().node_id, session.label, run(client))]
    output_sum(session, queue, field, found)


def bulk_options(merge: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The arguments and options of `deadletter requeue` and `delete`."""

    def apply(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed((
            click.argument("queue"),
            click.option("--count", type=click.IntRange(min=1), help="At most this many on each node (default: all)."),
            dead_letter_filters,
            click.option("--rate", type=click.IntRange(min=1), help="At most this many a second on each node (default: as fast as it goes)."),
            scope_option(True, merge),
            click.pass_obj,
        )):  # fmt: skip
            command = option(command)
        return command

    return apply


@deadletter.command()
@bulk_options("DEADLETTER REQUEUE on each, how many each requeued")
def requeue(session: Session, queue: str, count: int | None, cluster: bool | None, rate: int | None, **filters: Any) -> None:
    """Put the dead letters queued in QUEUE back into the queues they came from,
    as new jobs with fresh attempt counts (DEADLETTER REQUEUE on every node)."""
    dead_letter_bulk(session, "REQUEUE", "requeued", queue, count, cluster, filter_words(**filters), rate)


@deadletter.command()
@bulk_options("DEADLETTER DELETE on each, how many each deleted")
def delete(session: Session, queue: str, count: int | None, cluster: bool | None, rate: int | None, **filters: Any) -> None:
    """Delete the dead letters queued in QUEUE, on every node that holds a copy
    (DEADLETTER DELETE on every node)."""
    dead_letter_bulk(session, "DELETE", "deleted", queue, count, cluster, filter_words(**filters), rate)


@deadletter.command("list")
@click.argument("queue")
@click.option("--count", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many from each node.")
@dead_letter_filters
@scope_option(True, "DEADLETTER LIST on each, one row per dead letter")
@click.pass_obj
def list_dead_letters(session: Session, queue: str, count: int, cluster: bool | None, **filters: Any) -> None:
    """The dead letters queued in QUEUE, oldest first, each with why it failed
    (its last error), where it came from and when it was moved."""
    from disque.cli.views import dead_letter_rows

    words = ["DEADLETTER", "LIST", queue, "COUNT", count, *filter_words(**filters)]
    if session.wide(cluster, default=True):
        found = per_node(session, lambda client: client.execute_command(*words))
    else:
        client = session.client()
        found = [(client.hello().node_id, session.label, client.execute_command(*words))]
    rows = dead_letter_rows(found)
    session.output("dead-letters", rows, raw=[r["id"] for r in rows])
    session.check_nodes()


# --------------------------------------------------------------------------
# qconfig (docs/limits.md)


@cli.group(cls=CommandGroup, prefix=("QCONFIG",), context_settings={"ignore_unknown_options": True})
def qconfig() -> None:
    """Queues' cluster-wide limits (QCONFIG): how many jobs a queue hands
    to consumers per second, minute or hour, and how many may be out at
    once, over the whole cluster.  Limits are cluster state: a change made
    on one node reaches every node."""


@qconfig.command("set")
@click.argument("queue")
@click.option("--rate", help="Jobs handed out per period, cluster-wide: 100/s, 20/m, 500/h (none: no limit).")
@click.option("--concurrency", help="Jobs out with consumers at once, cluster-wide (0 or none: no limit).")
@click.option("--rate-per-key", help="The same per key of a keyed job.")
@click.option("--concurrency-per-key", help="The same per key of a keyed job.")
@click.pass_obj
def qconfig_set(session: Session, queue: str, rate: str | None, concurrency: str | None, rate_per_key: str | None,
                concurrency_per_key: str | None) -> None:  # fmt: skip
    """Set QUEUE's limits (the options not given keep their value)."""
    words = [
        w for option, value in (("rate-limit", rate), ("concurrency", concurrency), ("rate-limit-per-key", rate_per_key),
                                ("concurrency-per-key", concurrency_per_key))
        if value is not None for w in (option, value)
    ]  # fmt: skip
    if not words:
        raise click.UsageError("give at least one of --rate, --concurrency, --rate-per-key, --concurrency-per-key")
    session.run(["QCONFIG", queue, "SET", *words])


def as_map(reply: Any) -> dict[Any, Any]:
    """A map reply: a dict in RESP3, a flat [key, value, ...] array in RESP2."""
    return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))


def limits_row(queue: Any, reply: Any) -> dict[str, Any]:
    from disque.cli.views import text

    show = as_map(reply)
    return {"queue": text(queue), **{text(k): (text(v) if isinstance(v, bytes) else v) for k, v in show.items()}}


@qconfig.command("get")
@click.argument("queue")
@click.pass_obj
def qconfig_get(session: Session, queue: str) -> None:
    """QUEUE's limits and this node's use of them: jobs out, its lease, how long consumers waited."""
    row = limits_row(queue, session.client().execute_command("QCONFIG", queue, "GET"))
    session.output("record", row, raw=[v for item in row.items() for v in item])


@qconfig.command("list")
@click.pass_obj
def qconfig_list(session: Session) -> None:
    """Every limited queue, with its limits and this node's use of them."""
    client = session.client()
    rows = [limits_row(q, client.execute_command("QCONFIG", q, "GET")) for q in client.execute_command("QCONFIG", "LIST")]
    session.output("limits", rows, raw=[r["queue"] for r in rows])


@qconfig.command("del")
@click.argument("queue")
@click.pass_obj
def qconfig_del(session: Session, queue: str) -> None:
    """Remove every limit of QUEUE, everywhere (1; 0 if it had none)."""
    session.run(["QCONFIG", queue, "DEL"])
# batch (docs/workflows.md)


@cli.group(cls=CommandGroup, prefix=("BATCH",), context_settings={"ignore_unknown_options": True})
def batch() -> None:
    """Batches: `batch new [ON-SUCCESS queue body] [ON-COMPLETE queue body]`
    (its ID), `batch show ID`, `batch close ID`; jobs join with ADDJOB ...
    BATCH ID, and the callback job is added once the batch is closed and its
    jobs are done (BATCH)."""


@batch.command("show")
@click.argument("batch_id")
@click.pass_obj
def batch_show(session: Session, batch_id: str) -> None:
    """BATCH SHOW: the batch's jobs (pending, done, failed), its callbacks,
    which were fired and their job IDs."""
    session.run(["BATCH", "SHOW", batch_id])


# --------------------------------------------------------------------------
# schedule (docs/schedules.md)


@cli.group(cls=CommandGroup, prefix=("SCHEDULE",), context_settings={"ignore_unknown_options": True})
def schedule() -> None:
    """Recurring jobs: a job added to a queue at every tick of a period or a
    cron expression (SCHEDULE).  Schedules are cluster state: any node lists
    them all, and a change made on one reaches every node."""


@schedule.command("add")
@click.argument("name")
@click.argument("queue")
@click.argument("body")
@click.option("--every", help="Period between ticks: 250ms, 90s, 5m, 1h, 1d (ticks at its multiples since the epoch).")
@click.option("--cron", "cron_expr", metavar="EXPR", help='A 5-field cron expression ("0 3 * * *").')
@click.option("--tz", help="The zone of --cron (default UTC), e.g. Europe/Paris.")
@click.option("--ttl", type=int, help="Each job's TTL, seconds.")
@click.option("--retry", type=int, help="Each job's RETRY, seconds (0: at most once).")
@click.option("--replicate", type=int, help="Copies of each job.")
@click.option("--delay", type=int, help="Each job's DELAY, seconds.")
@click.option("--maxlen", type=int, help="No job while the queue holds this many.")
@click.option("--max-attempts", type=int, help="Deliveries before a job goes to its dead-letter queue.")
@click.option("--dead-letter", help="That dead-letter queue (default <queue>-dead).")
@click.pass_obj
def schedule_add(session: Session, name: str, queue: str, body: str, every: str | None, cron_expr: str | None,
                 tz: str | None, **options: Any) -> None:  # fmt: skip
    """Add the schedule NAME (or replace its definition): BODY into QUEUE at
    every tick of --every or --cron."""
    if (every is None) == (cron_expr is None):
        raise click.UsageError("give one of --every and --cron")
    if every is not None:
        from disque.client.worker import parse_period

        try:
            when = ["EVERY", str(parse_period(every))]
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--every") from None
    else:
        when = ["CRON", cron_expr, *(["TZ", tz] if tz else [])]
    words = [w for option, value in options.items() if value is not None for w in (option.replace("_", "").upper(), str(value))]
    session.run(["SCHEDULE", "ADD", name, queue, body, *when, *words])  # type: ignore[list-item]


def schedule_rows(client: Any) -> list[dict[str, Any]]:
    """SCHEDULE SHOW of every schedule SCHEDULE LIST names, as rows."""
    rows = []
    for name in client.execute_command("SCHEDULE", "LIST"):
        reply = client.execute_command("SCHEDULE", "SHOW", name)
        if reply is not None:  # deleted meanwhile
            rows.append(schedule_row(reply))
    return rows


def schedule_row(reply: Any) -> dict[str, Any]:
    from disque.cli.views import text

    show = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))
    fields = {text(k): v for k, v in show.items()}
    when = f"every {fields['every']} ms" if fields["every"] else text(fields["cron"]) + (f" {text(fields['tz'])}" if fields["tz"] else "")
    return {
        "name": text(fields["name"]), "queue": text(fields["queue"]), "when": when, "paused": bool(fields["paused"]),
        "options": " ".join(text(w) for w in fields["options"]),
        "last-tick": _when(fields["last-tick"]), "last-node": text(fields["last-node"] or b"")[:8],
        "next-tick": _when(fields["next-tick"]),
        **consumers([fields]),
    }  # fmt: skip


def consumers(views: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether anyone takes a schedule's jobs, from SCHEDULE SHOW's queue
    fields of one node or of each node: `jobs` queued, and `consumer` (who
    waits, or when a job was last taken); `stalled` when two jobs or more
    wait, nobody waits for them and none was taken since the oldest was made
    (the schedule's worker is gone: docs/schedules.md)."""
    jobs = sum(v.get("queue-len", 0) for v in views)
    waiting = sum(v.get("queue-waiting", 0) for v in views)
    fetched = max((v["queue-fetched"] for v in views if v.get("queue-fetched")), default=None)
    oldest = min((v["queue-oldest"] for v in views if v.get("queue-oldest")), default=None)
    stalled = jobs >= 2 and not waiting and (fetched is None or (oldest is not None and fetched < oldest))
    if waiting:
        consumer = f"{waiting} waiting"
    elif stalled:
        consumer = "NONE: jobs pile up, " + (f"last taken {_when(fetched)}" if fetched else "none ever taken")
    else:
        consumer = f"last taken {_when(fetched)}" if fetched else ""
    return {"jobs": jobs, "consumer": consumer, "stalled": stalled}


def _when(ms: int | None) -> str:
    """A tick's time, UTC, to the millisecond ("" for none)."""
    from datetime import datetime, timezone

    return "" if not ms else datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


@schedule.command("list")
@click.pass_obj
def schedule_list(session: Session) -> None:
    """Every schedule: its queue, its ticks, whether it is paused, the latest
    tick known fired (and the node that fired it), the next one, and whether
    anyone takes its jobs (every node's queue: the jobs waiting, who waits or
    when one was last taken; NONE when they pile up with nobody taking them)."""
    from disque.cli.views import text

    rows = schedule_rows(session.client())
    views: dict[str, list[dict[str, Any]]] = {}
    for _, _, replies in per_node(session, lambda client: [client.execute_command("SCHEDULE", "SHOW", r["name"]) for r in rows]):
        for row, reply in zip(rows, replies, strict=True):
            if reply is not None:
                show = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))
                views.setdefault(row["name"], []).append({text(k): v for k, v in show.items()})
    for row in rows:
        row |= consumers(views.get(row["name"], []))
    session.output("schedules", rows, raw=[r["name"] for r in rows])
    session.check_nodes()


@schedule.command("show")
@click.argument("name")
@click.pass_obj
def schedule_show(session: Session, name: str) -> None:
    """One schedule's definition, latest tick and next tick."""
    reply = session.client().execute_command("SCHEDULE", "SHOW", name)
    if reply is None:
        raise Failure(f"no such schedule: {name}")
    row = schedule_row(reply)
    session.output("record", row, raw=[v for item in row.items() for v in item])


@schedule.command("del")
@click.argument("name")
@click.pass_obj
def schedule_del(session: Session, name: str) -> None:
    """Delete a schedule everywhere (1; 0 if there was none); its jobs stay."""
    session.run(["SCHEDULE", "DEL", name])


@schedule.command("pause")
@click.argument("name")
@click.pass_obj
def schedule_pause(session: Session, name: str) -> None:
    """Stop a schedule's ticks everywhere until it is resumed."""
    session.run(["SCHEDULE", "PAUSE", name])


@schedule.command("resume")
@click.argument("name")
@click.pass_obj
def schedule_resume(session: Session, name: str) -> None:
    """Let a paused schedule's ticks fire again."""
    session.run(["SCHEDULE", "RESUME", name])


SCHEDULE_FIGURES = ("schedule_ticks_fired", "schedule_ticks_late", "schedule_ticks_collapsed", "schedule_ticks_refused")


@schedule.command("stats")
@scope_option(True, "the tick counters of INFO schedules add up, one row per node follows")
@click.pass_obj
def schedule_stats(session: Session, cluster: bool | None) -> None:
    """Ticks fired (jobs added), late (by a node next in line, or caught up),
    collapsed (made on two nodes and merged) and refused, over the cluster."""

    def figures(client: Any) -> dict[str, int]:
        info = client.info("schedules").get("Schedules", {})
        return {name.removeprefix("schedule_ticks_"): int(info.get(name, 0)) for name in SCHEDULE_FIGURES}

    if session.wide(cluster, default=True):
        found = per_node(session, figures)
    else:
        client = session.client()
        found = [(client.hello().node_id, session.label, figures(client))]
    total = {name: sum(f[name] for _, _, f in found) for name in (n.removeprefix("schedule_ticks_") for n in SCHEDULE_FIGURES)}
    if session.mode == "json":
        session.output("plain", {**total, "nodes": [{"node": n, "address": a, **f} for n, a, f in found]})
    else:
        session.output("by-node", {"total": total, "nodes": found}, raw=[v for item in total.items() for v in item])
    session.check_nodes()


# --------------------------------------------------------------------------
# top


def queue_stats(client: Any) -> list[Any]:
    """QSTAT of every queue of a node."""
    return [s for s in map(client.qstat, sorted(set(client.qscan(busyloop=True)))) if s is not None]


@cli.command()
@click.option("--interval", default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("-n", "--iterations", default=0, help="Stop after N refreshes (0: until Ctrl-C).")
@scope_option(True, "a queue's lengths, counters and rates add up")
@click.option("--groups", is_flag=True, help="The consumer groups of every queue (QSTATUS) instead of the job queues.")
@click.pass_obj
def top(session: Session, interval: float, iterations: int, cluster: bool | None, groups: bool) -> None:
    """Live view of the queues over the cluster: length, jobs in/out per second, blocked clients."""
    from disque.cli.cluster import QueueRates, merge_queues

    rates = QueueRates()
    cluster = session.wide(cluster, default=not groups)  # a group's progress is on every holder of its events: one node's view

    def sample() -> list[dict[str, Any]]:
        if groups:
            return group_rows(session.client(), [])
        if cluster:
            stats = merge_queues(s for _, node_stats in session.each_node(queue_stats) for s in node_stats)
        else:
            stats = queue_stats(session.client())
        return rates.update(stats, time.monotonic())

    def frames() -> Iterator[list[dict[str, Any]]]:
        n = 0
        while True:
            started = time.monotonic()
            yield sample()
            n += 1
            if n == iterations:
                return
            time.sleep(max(0.0, started + interval - time.monotonic()))

    label = f"cluster via {session.label}" if cluster else session.label
    try:
        if session.mode == "pretty":
            from disque.cli.pretty import top_screen

            top_screen(label, frames(), interval, groups)
        else:  # one JSON array or block of tab-separated lines per refresh
            for rows in frames():
                session.output("plain", rows, raw=["\t".join("-" if v is None else str(v) for v in r.values()) for r in rows])
    except KeyboardInterrupt:
        pass
    session.check_nodes()


# --------------------------------------------------------------------------
# export / import


@contextmanager
def progress(label: str, total: int | None) -> Iterator[Callable[[], None]]:
    """A progress bar on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        yield lambda: None
        return
    from disque.cli.pretty import progress_bar

    with progress_bar(label, total) as advance:
        yield advance


def export_record(job: Any) -> dict[str, Any]:
    import base64

    record: dict[str, Any] = {"id": job.id, "queue": job.queue}
    body = job.body or b""
    try:
        record["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(body).decode("ascii")
    record.update(ttl=job.ttl, retry=job.retry, repl=job.repl, nacks=job.nacks, additional_deliveries=job.additional_deliveries)
    return record


@cli.command("export")
@click.argument("queue")
@click.argument("file", type=click.File("w", encoding="utf-8"))
@click.option("--state", "states", multiple=True, default=["queued"], show_default=True,
              type=click.Choice(["wait-repl", "active", "queued", "acked"]), help="Job states to export (repeatable).")  # fmt: skip
@scope_option(False, "each job once")
@click.pass_obj
def export_jobs(session: Session, queue: str, file: IO[str], states: tuple[str, ...], cluster: bool | None) -> None:
    """Write the jobs of QUEUE to FILE as JSON lines (`-` for stdout); the jobs stay queued."""
    import json

    jobs: Any
    if session.wide(cluster, default=False):
        jobs = cluster_jobs(session, lambda c: list(c.jscan(queue, states, details=True)))
        total = len(jobs)
    else:
        client = session.client()
        total = client.qlen(queue) if set(states) == {"queued"} else None
        jobs = client.jscan(queue, states, details=True)
    count = 0
    with progress(f"exporting {queue}", total) as advance:
        for job in jobs:
            file.write(json.dumps(export_record(job), ensure_ascii=False) + "\n")
            count += 1
            advance()
    click.echo(f"exported {count} job(s) from {queue}", err=True)
    session.check_nodes()


@cli.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@click.option("--queue", help="Add every job to this queue instead of its recorded one.")
@click.option("--replicate", type=int, help="Replication factor (default: the server's, 1 for RETRY 0 jobs).")
@click.pass_obj
def import_jobs(session: Session, file: IO[str], queue: str | None, replicate: int | None) -> None:
    """Add the jobs of FILE (JSON lines, as written by export) with new IDs."""
    import base64
    import json

    client = session.client()
    lines = file.readlines()
    count = 0
    with progress("importing", len(lines)) as advance:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                    body = record["body"].encode() if "body" in record else base64.b64decode(record["body_base64"])
                    ttl, retry = record.get("ttl"), record.get("retry")  # absent: the server's defaults
                    client.add_job(queue or record["queue"], body, ttl=None if ttl is None else max(1, int(ttl)), retry=retry,
                                   replicate=replicate or (1 if retry == 0 else None))  # fmt: skip
                except (ValueError, KeyError, TypeError) as e:
                    raise Failure(f"{file.name}:{number}: not a job record ({e}); {count} job(s) imported before it") from e
                count += 1
            advance()
    click.echo(f"imported {count} job(s)", err=True)


@cli.command("tls-keygen")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--host", "hosts", multiple=True, default=["localhost", "127.0.0.1", "::1"], show_default=True,
              help="Name or IP address the node certificate is valid for (repeatable).")  # fmt: skip
@click.option("--days", default=365, show_default=True, help="Validity of the certificates.")
def tls_keygen(directory: str, hosts: tuple[str, ...], days: int) -> None:
    """Create a throwaway CA and node and client certificates in DIRECTORY (development and tests only)."""
    from pathlib import Path

    from disque.shell.tls import keygen

    paths = keygen(directory, hosts, days)
    for name in sorted(paths):
        click.echo(f"wrote {paths[name]}", err=True)
    d = Path(directory).resolve()
    click.echo(f"# node configuration\ntls-port 7711\nport 0\ntls-cert-file {d / 'node.crt'}\n"
               f"tls-key-file {d / 'node.key'}\ntls-ca-cert-file {d / 'ca.crt'}\ntls-cluster yes\n"
               f"# client\n# disque --tls --cacert {d / 'ca.crt'} --cert {d / 'client.crt'} --key {d / 'client.key'} PING")  # fmt: skip


@cli.command("check-aof", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def check_aof(args: tuple[str, ...]) -> None:
    """Check (and optionally fix) an append only file; options as disque-check-aof."""
    try:
        checker = importlib.import_module("disque.cli.check_aof")
    except ModuleNotFoundError as e:
        if e.name != "disque.cli.check_aof":
            raise
        raise Failure("check-aof is not available: this installation has no AOF checker (disque.cli.check_aof)") from e
    click.get_current_context().exit(checker.main(list(args)))


# --------------------------------------------------------------------------
# help, clear, and running a line of the prompt


@cli.command("help")
@click.argument("words", nargs=-1)
@click.pass_context
def help_command(ctx: click.Context, words: tuple[str, ...]) -> None:
    """The syntax of a subcommand or server command, or a list of them all."""
    click.echo(help_text(ctx.find_root(), list(words)))


@cli.command()
def clear() -> None:
    """Clear the screen."""
    click.clear()


def help_text(root: click.Context, words: list[str]) -> str:
    if not words:
        lines = ["Subcommands (help NAME for their options):"]
        lines += [f"  {name:<12} {summary}" for name, summary in cli.summaries()]
        lines += ["", "Server commands (sent as typed):"]
        lines += [f"  {name} {syntax}".rstrip() for name, (syntax, _) in SERVER_COMMANDS.items()]
        return "\n".join(lines)
    parts = []
    command = subcommand_path(root, words)
    if command is not None:
        parts.append(command.get_help(click.Context(command, info_name=" ".join(words), parent=root)))
    name = words[0].upper()
    if name in SERVER_COMMANDS:
        syntax, summary = SERVER_COMMANDS[name]
        parts.append(f"{name} {syntax}".rstrip() + f"\n  {summary}")
    return "\n\n".join(parts) or f"No help for '{' '.join(words)}'"


def subcommand_path(root: click.Context, words: list[str]) -> click.Command | None:
    """The subcommand that `words` (`cluster meet`) name, if they all name one."""
    command: click.Command | None = cli
    for word in words:
        command = command.subcommand(root, word.lower()) if isinstance(command, CommandGroup) else None
    return command


def synopsis(root: click.Context, name: str) -> str | None:
    """One line on what `name` takes, for the prompt's hint line."""
    command = cli.subcommand(root, name)
    if command is not None:
        pieces = []
        for param in command.params:
            if isinstance(param, click.Argument):
                pieces.append(param.human_readable_name + ("..." if param.nargs == -1 else ""))
            elif param.name != "help" and (record := param.get_help_record(root)) is not None:
                pieces.append(f"[{record[0].split(', ')[-1]}]")
        return f"{name} {' '.join(pieces)}".rstrip()
    if name.upper() in SERVER_COMMANDS:
        return f"{name.upper()} {SERVER_COMMANDS[name.upper()][0]}".rstrip()
    return None


def completions() -> dict[str, str]:
    """Every word a prompt line can start with, and what it is; a subcommand
    (`qstat`) stands for the server command of the same name (QSTAT)."""
    subcommands = dict(cli.summaries())
    server = {name: syntax for name, (syntax, _) in SERVER_COMMANDS.items() if name.lower() not in subcommands}
    return {**server, **subcommands, **PROMPT_ONLY}


def dispatch(root: click.Context, words: list[str]) -> None:
    """Run one command line (already split) as `disque` would: in the
    prompt's session, or, when the line has options of `disque` itself
    (`--json qstat q`, `qlen q -p 7712`), in a session of its own that takes
    the prompt's options for those the line leaves out."""
    words = cli.hoist(root, words)
    if words[0].startswith("-"):
        if command_position(words, option_table(cli.params)) == len(words):
            raise click.UsageError("a command must follow the options")
        session: Session = root.obj
        defaults = {**root.params, "host": session.host, "port": session.port, "password": session.password}
        with cli.make_context("disque", words, default_map=defaults) as ctx:
            cli.invoke(ctx)
        return
    name, *args = words
    command = cli.get_command(root, name)
    assert command is not None  # any word names a subcommand or a server command
    with command.make_context(name, args, parent=root) as ctx:
        command.invoke(ctx)


def main() -> None:
    cli(prog_name="disque")
