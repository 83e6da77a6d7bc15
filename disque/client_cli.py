"""`disque`: the command-line client, what redis-cli is to Redis.

Theory of operation: click parses the global options (`-h/-p/-a`,
`--tls/--cacert/--cert/--key`, `--json/--raw`) and dispatches on the next word.  A lowercase helper name
(`qstat`, `show`, `jscan`, `top`, `export`, ...) runs that helper; any other
word starts a server command sent as typed (`disque ADDJOB q body 0`, or
`disque JSCAN 0 COUNT 10` for one raw page).  Without a command, a
prompt_toolkit prompt reads lines, splits them like redis-cli
(`config.split_args`) and sends them; lines piped in are run the same way.

For every reply, `parse_reply` picks a typed view from the command name
(SHOW, QSTAT, HELLO, INFO, CLUSTER NODES/INFO, GETJOB, QPEEK, JSCAN, QSCAN)
and `Session.output` prints it: as a rich table or key/value block
(`render`), as JSON with `--json`, or as bare values, one per line, with
`--raw`; a reply with no better view prints the redis-cli way.  Server errors and connection failures end the command
with their text on stderr and exit status 1; in the prompt they are printed
and the prompt goes on.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import IO, Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from disque.client import (
    Client,
    DisqueConnectionError,
    DisqueReplyError,
    Hello,
    Job,
    JobInfo,
    QueueStats,
    parse_info,
)
from disque.config import split_args
from disque.worker import worker_command

# name: (arguments, summary), for `help`, completion and the prompt's hint line.
COMMANDS: dict[str, tuple[str, str]] = {
    "ADDJOB": ("queue body ms-timeout [REPLICATE n] [DELAY sec] [RETRY sec] [TTL sec] [MAXLEN n] [ASYNC]", "Add a job to a queue"),
    "GETJOB": ("[NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM queue [queue ...]", "Fetch jobs, blocking until one is available"),
    "ACKJOB": ("id [id ...]", "Acknowledge jobs as processed"),
    "FASTACK": ("id [id ...]", "Acknowledge and delete jobs everywhere at once"),
    "NACK": ("id [id ...]", "Put jobs back in the queue, counting a failed delivery"),
    "WORKING": ("id", "Postpone the next delivery of a job still being processed"),
    "ENQUEUE": ("id [id ...]", "Queue active jobs again"),
    "DEQUEUE": ("id [id ...]", "Take queued jobs out of their queue"),
    "DELJOB": ("id [id ...]", "Delete jobs from this node only"),
    "SHOW": ("id", "Everything this node knows about a job"),
    "JSCAN": ("[cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s ...] [REPLY id|all]", "Iterate over jobs"),
    "QLEN": ("queue", "Number of queued jobs"),
    "QPEEK": ("queue count", "Look at the oldest (count > 0) or newest jobs without taking them"),
    "QSTAT": ("queue", "Queue statistics"),
    "QSCAN": ("[cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n] [IMPORTRATE r]", "Iterate over queues"),
    "PAUSE": ("queue in|out|all|none|state|bcast ...", "Pause a queue for input and/or output"),
    "HELLO": ("", "This node and the cluster's nodes, with priorities"),
    "INFO": ("[section]", "Server information and statistics"),
    "PING": ("[message]", "Check the connection"),
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
PROMPT_WORDS = {"help": ("[command]", "Show the syntax of a command, or list them all"), "exit": ("", "Leave the prompt")}


class Failure(click.ClickException):
    """A server error or connection failure: its text on stderr, exit status 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(self.message, err=True)


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Piped output is not cut at 80 columns: job IDs alone take 48.
    width = None if stream.isatty() or "COLUMNS" in os.environ else 200
    return Console(file=stream, width=width, highlight=False, stderr=stderr)


# --------------------------------------------------------------------------
# Turning replies into views


@dataclass(frozen=True)
class ClusterNode:
    """One line of CLUSTER NODES."""

    id: str
    address: str
    flags: list[str]
    ping_sent: int
    pong_received: int
    link: str

    @classmethod
    def parse_all(cls, text: bytes) -> list[ClusterNode]:
        rows = [line.split() for line in text.decode("utf-8", "replace").splitlines() if line.strip()]
        return [cls(r[0], r[1], r[2].split(","), int(r[3]), int(r[4]), r[5]) for r in rows]


def _fields(text: bytes) -> dict[str, str]:
    return {k: v for k, _, v in (line.partition(":") for line in text.decode("utf-8", "replace").splitlines()) if k}


def parse_reply(words: list[str], reply: Any) -> tuple[str, Any]:
    """(view kind, value) for a command's reply; ("plain", reply) when there is no better view."""
    name = words[0].upper()
    sub = words[1].upper() if len(words) > 1 else ""
    if isinstance(reply, list):
        if name == "SHOW":
            return "record", JobInfo.from_reply(reply)
        if name == "QSTAT":
            return "record", QueueStats.from_reply(reply)
        if name == "HELLO":
            return "hello", Hello.from_reply(reply)
        if name in ("GETJOB", "QPEEK"):
            return "jobs", [Job.from_entry(entry) for entry in reply]
        if name in ("JSCAN", "QSCAN") and len(reply) == 2:
            cursor, items = reply
            if name == "QSCAN":
                return "scan", {"cursor": _text(cursor), "queues": [_text(q) for q in items]}
            jobs = [JobInfo.from_reply(i) if isinstance(i, list) else _text(i) for i in items]
            return "scan", {"cursor": _text(cursor), "jobs": jobs}
    if isinstance(reply, bytes):
        if name == "INFO":
            return "info", parse_info(reply)
        if name == "CLUSTER" and sub == "NODES":
            return "nodes", ClusterNode.parse_all(reply)
        if name == "CLUSTER" and sub == "INFO":
            return "record", _fields(reply)
    return "plain", reply


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if value is None:
        return "(nil)"
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value) or "(empty)"
    return str(value)


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


def raw_lines(reply: Any) -> Iterator[bytes]:
    """redis-cli --raw: every value on its own line, arrays flattened."""
    if isinstance(reply, list):
        for item in reply:
            yield from raw_lines(item)
    else:
        yield b"" if reply is None else reply if isinstance(reply, bytes) else str(reply).encode()


def plain_lines(reply: Any) -> list[str]:
    """The redis-cli listing: `(integer) 1`, `(nil)`, numbered nested arrays."""
    if isinstance(reply, list):
        if not reply:
            return ["(empty array)"]
        lines = []
        width = len(str(len(reply)))
        for n, item in enumerate(reply, 1):
            head = f"{n:>{width}}) "
            sub = plain_lines(item)
            lines.append(head + sub[0])
            lines += [" " * len(head) + s for s in sub[1:]]
        return lines
    if isinstance(reply, int):
        return [f"(integer) {reply}"]
    return _text(reply).splitlines() or [""]


def kv_block(values: Any) -> Group:
    if dataclasses.is_dataclass(values):
        values = {f.name.replace("_", "-"): getattr(values, f.name) for f in dataclasses.fields(values)}
    width = max(map(len, values), default=0)
    return Group(*(Text.assemble((key.ljust(width), "bold cyan"), "  ", _text(value)) for key, value in values.items()))


def titled(title: str, table: Table) -> Group:
    return Group(Text(title, style="bold"), table)


def jobs_table(jobs: list[Job]) -> Group:
    counters = any(j.nacks is not None for j in jobs)
    table = Table()
    for name in ("queue", "id", "body", *(("nacks", "redelivered") if counters else ())):
        table.add_column(name, no_wrap=name not in ("queue", "body"), overflow="fold")
    for j in jobs:
        extra = (str(j.nacks), str(j.additional_deliveries)) if counters else ()
        table.add_row(Text(j.queue), j.id, Text(_text(j.body)), *extra)
    return titled(f"{len(jobs)} job(s)", table)


def job_infos_table(jobs: list[JobInfo]) -> Group:
    table = Table()
    for name in ("id", "queue", "state", "ttl", "retry", "nacks", "redelivered", "body"):
        table.add_column(name, no_wrap=name not in ("queue", "body"), overflow="fold")
    for j in jobs:
        table.add_row(j.id, Text(_text(j.queue)), j.state, str(j.ttl), str(j.retry), str(j.nacks), str(j.additional_deliveries), Text(_text(j.body)))
    return titled(f"{len(jobs)} job(s)", table)


def names_table(title: str, rows: Iterable[Iterable[Any]], columns: Iterable[str]) -> Group:
    table = Table()
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(Text(_text(v)) for v in row))
    return titled(title, table)


def render(kind: str, value: Any) -> RenderableType:
    if kind == "record":
        return kv_block(value)
    if kind == "hello":
        table = Table()
        for name in ("node", "address", "priority", ""):
            table.add_column(name, no_wrap=True)
        for n in value.nodes:
            table.add_row(n.id, f"{n.host}:{n.port}", str(n.priority), "(this node)" if n.id == value.node_id else "")
        return titled(f"HELLO v{value.version}, connected to {value.node_id}", table)
    if kind == "info":
        return Group(*(part for title, fields in value.items() for part in (Text(f"# {title}", style="bold"), kv_block(fields), Text(""))))
    if kind == "nodes":
        table = Table()
        for name in ("id", "address", "flags", "ping-sent", "pong-received", "link"):
            table.add_column(name, no_wrap=name in ("id", "address"), overflow="fold")
        for n in value:
            table.add_row(n.id, n.address, ",".join(n.flags), str(n.ping_sent), str(n.pong_received), n.link)
        return titled(f"{len(value)} node(s)", table)
    if kind == "jobs":
        return jobs_table(value)
    if kind == "job-infos":  # JobInfo records, or bare IDs
        if value and isinstance(value[0], JobInfo):
            return job_infos_table(value)
        return names_table(f"{len(value)} job(s)", ([i] for i in value), ["id"])
    if kind == "queues":  # names, or {"queue": name, "len": n} rows
        rows = [q if isinstance(q, dict) else {"queue": q} for q in value]
        return names_table(f"{len(rows)} queue(s)", (r.values() for r in rows), list(rows[0]) if rows else ["queue"])
    if kind == "scan":
        items = value.get("queues", value.get("jobs"))
        return Group(Text(f"cursor: {value['cursor']}"), render("queues" if "queues" in value else "job-infos", items))
    return Text("\n".join(plain_lines(value)))


# --------------------------------------------------------------------------
# The session: one connection, one output mode


@dataclass
class Session:
    host: str
    port: int
    password: str | None
    mode: str  # pretty | json | raw
    tls: dict[str, Any] = field(default_factory=dict)  # Client's tls, tls_ca_cert, tls_cert, tls_key
    _client: Client | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"

    def client(self) -> Client:
        if self._client is None:
            self._client = Client((self.host, self.port), password=self.password, failover=False, **self.tls)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def run(self, words: list[str]) -> None:
        """Send one server command and print its reply."""
        if [w.upper() for w in words] == ["MONITOR"]:
            self.monitor()
            return
        reply = self.client().execute_command(*words)
        if words[0].upper() == "AUTH":  # a reconnection authenticates the same way
            self.client().password = self.password = words[1]
        self.output(*parse_reply(words, reply), raw=reply)

    def monitor(self) -> None:
        """Print the node's MONITOR lines as they come, until Ctrl-C; the
        connection, a monitor's from then on, is closed afterwards."""
        try:
            lines = self.client().monitor()
            for line in chain(["OK"], lines):  # OK as redis-cli prints it: watching from here on
                click.echo(json.dumps(line, ensure_ascii=False) if self.mode == "json" else line)
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def output(self, kind: str, value: Any, raw: Any = None) -> None:
        """Print a view: rendered, as JSON, or bare (`raw`, by default `value`)."""
        if self.mode == "json":
            click.echo(json.dumps(jsonable(value), ensure_ascii=False))
        elif self.mode == "raw":
            for line in raw_lines(value if raw is None else raw):
                click.echo(line)
        else:
            _console().print(render(kind, value))


class CommandGroup(click.Group):
    """Helpers by their exact lowercase name; any other word is a server command."""

    def __init__(self, *args: Any, prefix: tuple[str, ...] = (), aliases: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefix = prefix
        self.aliases = aliases or {}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name)) or server_command([*self.prefix, cmd_name])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (DisqueReplyError, DisqueConnectionError) as e:
            raise Failure(str(e)) from e
        finally:
            if ctx.parent is None and isinstance(ctx.obj, Session):
                ctx.obj.close()


def server_command(words: list[str]) -> click.Command:
    @click.command(name=words[-1], context_settings={"ignore_unknown_options": True, "help_option_names": []})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_obj
    def send(session: Session, args: tuple[str, ...]) -> None:
        session.run([*words, *args])

    return send


HELP = "Run one Disque COMMAND and print the reply, or open a prompt when none is given."


@click.group(cls=CommandGroup, aliases={"scanjobs": "jscan"}, invoke_without_command=True, help=HELP,
             context_settings={"help_option_names": ["--help"]}, subcommand_metavar="[COMMAND ARGS...]")  # fmt: skip
@click.option("-h", "--host", default="127.0.0.1", show_default=True, help="Server host.")
@click.option("-p", "--port", default=7711, show_default=True, type=int, help="Server port.")
@click.option("-a", "--password", default=None, envvar="DISQUE_AUTH", help="Password (AUTH); also read from $DISQUE_AUTH.")
@click.option("--tls", is_flag=True, help="Connect over TLS (to the node's tls-port).")
@click.option("--cacert", type=click.Path(exists=True, dir_okay=False), help="CA certificate that signed the server's (default: the system's).")
@click.option("--cert", type=click.Path(exists=True, dir_okay=False), help="Client certificate, for tls-auth-clients yes/optional.")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), help="Private key of --cert.")
@click.option("--json", "mode", flag_value="json", help="Print replies as JSON.")
@click.option("--raw", "mode", flag_value="raw", help="Print bare reply values, one per line.")
@click.pass_context
def cli(ctx: click.Context, host: str, port: int, password: str | None, tls: bool, cacert: str | None,
        cert: str | None, key: str | None, mode: str | None) -> None:  # fmt: skip
    if (cacert or cert or key) and not tls:
        raise click.UsageError("--cacert, --cert and --key need --tls")
    options = {"tls": True, "tls_ca_cert": cacert, "tls_cert": cert, "tls_key": key} if tls else {}
    ctx.obj = Session(host, port, password, mode or "pretty", options)
    if ctx.invoked_subcommand is None:
        (prompt_loop if sys.stdin.isatty() else script_loop)(ctx.obj)


@cli.command()
@click.argument("queue")
@click.pass_obj
def qstat(session: Session, queue: str) -> None:
    """Statistics of a queue."""
    session.run(["QSTAT", queue])


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
@click.pass_obj
def jscan(session: Session, queue: str | None, states: tuple[str, ...], count: int | None, busyloop: bool, ids: bool) -> None:
    """Every job (alias: scanjobs), following the cursor to the end."""
    jobs = list(session.client().jscan(queue, states, count=count, busyloop=busyloop, details=not ids))
    session.output("job-infos", jobs, raw=jobs if ids else [j.id for j in jobs])


@cli.command()
@click.option("--minlen", type=int, help="Only queues at least this long.")
@click.option("--maxlen", type=int, help="Only queues at most this long.")
@click.option("--import-rate", type=int, help="Only queues importing at least this many jobs/s.")
@click.option("--count", type=int, help="Queues per round trip (a hint).")
@click.option("--busyloop", is_flag=True, help="Scan everything in one call.")
@click.pass_obj
def qscan(session: Session, minlen: int | None, maxlen: int | None, import_rate: int | None, count: int | None, busyloop: bool) -> None:
    """Every queue with its length, following the cursor to the end."""
    client = session.client()
    names = sorted(set(client.qscan(minlen=minlen, maxlen=maxlen, import_rate=import_rate, count=count, busyloop=busyloop)))
    rows = names if session.mode == "raw" else [{"queue": name, "len": client.qlen(name)} for name in names]
    session.output("queues", rows)


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


# --------------------------------------------------------------------------
# top


@dataclass
class QueueRates:
    """Turns successive QSTATs into jobs/s in and out (None until two samples)."""

    last: dict[str, tuple[float, QueueStats]] = field(default_factory=dict)

    def update(self, stats: list[QueueStats], now: float) -> list[dict[str, Any]]:
        rows = []
        for s in stats:
            rate_in = rate_out = None
            if s.name in self.last:
                then, old = self.last[s.name]
                elapsed = max(now - then, 1e-9)
                rate_in = round((s.jobs_in - old.jobs_in) / elapsed, 1)
                rate_out = round((s.jobs_out - old.jobs_out) / elapsed, 1)
            rows.append({"queue": s.name, "len": s.len, "in_per_sec": rate_in, "out_per_sec": rate_out, "blocked": s.blocked, "pause": s.pause})
        self.last = {s.name: (now, s) for s in stats}
        return rows


def top_table(label: str, rows: list[dict[str, Any]], interval: float) -> Group:
    table = Table()
    for name in ("queue", "len", "in/s", "out/s", "blocked", "pause"):
        table.add_column(name, justify="left" if name in ("queue", "pause") else "right")
    for r in rows:
        rates = ["-" if r[k] is None else f"{r[k]:g}" for k in ("in_per_sec", "out_per_sec")]
        table.add_row(Text(r["queue"]), str(r["len"]), *rates, str(r["blocked"]), r["pause"])
    return titled(f"{label}  {len(rows)} queue(s)  {time.strftime('%H:%M:%S')}  every {interval:g}s", table)


@cli.command()
@click.option("--interval", default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("-n", "--iterations", default=0, help="Stop after N refreshes (0: until Ctrl-C).")
@click.pass_obj
def top(session: Session, interval: float, iterations: int) -> None:
    """Live view of the queues: length, jobs in/out per second, blocked clients."""
    client = session.client()
    rates = QueueRates()

    def sample() -> list[dict[str, Any]]:
        names = sorted(set(client.qscan(busyloop=True)))
        stats = [s for s in map(client.qstat, names) if s is not None]
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

    console = _console()
    try:
        if session.mode == "pretty" and console.is_terminal:
            with Live(console=console, auto_refresh=False) as live:
                for rows in frames():
                    live.update(top_table(session.label, rows, interval), refresh=True)
            return
        for rows in frames():  # piped: one table, JSON array or block of tab-separated lines per refresh
            if session.mode == "pretty":
                console.print(top_table(session.label, rows, interval))
            else:
                session.output("plain", rows, raw=["\t".join("-" if v is None else str(v) for v in r.values()) for r in rows])
    except KeyboardInterrupt:
        pass


# --------------------------------------------------------------------------
# export / import


@contextmanager
def progress(label: str, total: int | None) -> Iterator[Callable[[], None]]:
    console = _console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)


def export_record(job: JobInfo) -> dict[str, Any]:
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
@click.pass_obj
def export_jobs(session: Session, queue: str, file: IO[str], states: tuple[str, ...]) -> None:
    """Write the jobs of QUEUE to FILE as JSON lines (`-` for stdout); the jobs stay queued."""
    client = session.client()
    total = client.qlen(queue) if set(states) == {"queued"} else None
    count = 0
    with progress(f"exporting {queue}", total) as advance:
        for job in client.jscan(queue, states, details=True):
            file.write(json.dumps(export_record(job), ensure_ascii=False) + "\n")
            count += 1
            advance()
    click.echo(f"exported {count} job(s) from {queue}", err=True)


@cli.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@click.option("--queue", help="Add every job to this queue instead of its recorded one.")
@click.option("--replicate", type=int, help="Replication factor (default: the server's, 1 for RETRY 0 jobs).")
@click.pass_obj
def import_jobs(session: Session, file: IO[str], queue: str | None, replicate: int | None) -> None:
    """Add the jobs of FILE (JSON lines, as written by export) with new IDs."""
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
    from disque.tls import keygen

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
        checker = importlib.import_module("disque.store.aof_check")
    except ModuleNotFoundError as e:
        if e.name != "disque.store.aof_check":
            raise
        raise Failure("check-aof is not available: this installation has no AOF checker (disque.store.aof_check)") from e
    click.get_current_context().exit(checker.main(list(args)))


# --------------------------------------------------------------------------
# The interactive prompt


def command_help(words: list[str]) -> str:
    if not words:
        return "\n".join(f"{name} {syntax}".rstrip() for name, (syntax, _) in COMMANDS.items())
    name = words[0].upper()
    if name not in COMMANDS:
        return f"No help for '{words[0]}'"
    syntax, summary = COMMANDS[name]
    return f"{name} {syntax}".rstrip() + f"\n  {summary}"


def prompt_loop(session: Session) -> None:
    # Imported here: prompt_toolkit alone would double the start-up time of one-shot commands.
    from prompt_toolkit import PromptSession
    from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.history import FileHistory, History, InMemoryHistory

    path = Path(os.environ.get("DISQUE_HISTFILE") or Path.home() / ".disque_history")
    try:
        path.touch()
        history: History = FileHistory(str(path))
    except OSError:
        history = InMemoryHistory()
    words = {**COMMANDS, **PROMPT_WORDS}
    # sentence=True: what precedes the cursor must prefix a name, so only the first word completes.
    completer = WordCompleter(list(words), ignore_case=True, sentence=True, meta_dict={k: v[0] for k, v in words.items()})
    prompt: PromptSession[str] = PromptSession(history=history, completer=completer, auto_suggest=AutoSuggestFromHistory(), complete_while_typing=False)

    def hint() -> str:
        name = (prompt.default_buffer.text.split() or [""])[0].upper()
        return f" {name} {COMMANDS[name][0]}" if name in COMMANDS else " help [command] | exit"

    while True:
        try:
            line = prompt.prompt(f"{session.label}> ", bottom_toolbar=hint)
        except KeyboardInterrupt:
            continue
        except EOFError:
            return
        if run_line(session, line) == "quit":
            return


def script_loop(session: Session) -> None:
    """Commands piped in, one per line: like the prompt, but exit status 1 if any failed."""
    outcomes = set()
    for line in sys.stdin:
        outcome = run_line(session, line)
        if outcome == "quit":
            break
        outcomes.add(outcome)
    if "error" in outcomes:
        click.get_current_context().exit(1)


def run_line(session: Session, line: str) -> str:
    """Run one typed line: "ok", "error", or "quit"."""
    try:
        words = split_args(line)
    except ValueError:
        click.echo("Invalid argument(s)", err=True)
        return "error"
    if not words:
        return "ok"
    if words[0].lower() in ("exit", "quit"):
        return "quit"
    if words[0].lower() == "help":
        click.echo(command_help(words[1:]))
        return "ok"
    try:
        session.run(words)
    except (DisqueReplyError, DisqueConnectionError) as e:
        click.echo(f"(error) {e}", err=True)
        return "error"
    return "ok"


cli.add_command(worker_command)  # `disque worker module:app`: disque/worker.py


def main() -> None:
    cli(prog_name="disque")


if __name__ == "__main__":
    main()
