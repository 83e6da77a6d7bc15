"""What one run of `disque` (a one-shot command, or a whole prompt) works
with: the node it talks to, the output mode, and for the cluster-wide views
(`qlen`, `qstat`, `top`; the others with `--cluster`) a connection to every
other node.  Every connection has a timeout (`--timeout`, seconds): a node
that accepts connections but never answers (stopped, overloaded) fails
like one that is down, and a cluster-wide view names it.  The commands that
wait by design (GETJOB, ADDJOB, WAITJOB, QNOTIFY, MONITOR) typed as such
wait on a connection of their own, as long as they ask.

Theory of operation: `Session.client()` connects lazily, so `--help` and
`--version` never load the client library; `each_node` asks the connected
node HELLO and calls a function on every node listed (connecting to each
once per session), reporting on stderr the nodes that fail and remembering
them until `check_nodes`, which turns them into exit status 1 after the
merged view is printed.  `output` prints a view in the session's mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from disque.cli.views import jsonable, parse_reply, raw_lines

if TYPE_CHECKING:
    from disque.client import Client, NodeInfo

T = TypeVar("T")

DEFAULT_TIMEOUT = 5.0  # seconds (--timeout)
WAITING = frozenset({"GETJOB", "ADDJOB", "WAITJOB", "QNOTIFY", "MONITOR"})  # the commands that wait by design


class Failure(click.ClickException):
    """A server error or connection failure: its text on stderr, exit status 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(self.message, err=True)


@dataclass
class Session:
    host: str
    port: int
    password: str | None
    mode: str  # pretty | json | raw
    tls: dict[str, Any] = field(default_factory=dict)  # Client's tls, tls_ca_cert, tls_cert, tls_key
    cluster: bool | None = None  # --cluster (True) or --local (False) given before the subcommand
    full: bool = False  # --full: whole job bodies in the tables
    failed_nodes: list[str] = field(default_factory=list)  # since the last check_nodes
    timeout: float = DEFAULT_TIMEOUT  # seconds to connect and for each reply (0: none)
    _clients: dict[tuple[str, int, bool], Client] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"

    def client(self, address: tuple[str, int] | None = None, waits: bool = False) -> Client:
        """The connection to `address` (by default the node given with -h/-p);
        `waits`: one whose replies may take as long as the command asks."""
        from disque.client import Client

        host, port = address or (self.host, self.port)
        key = (host, port, waits)
        if key not in self._clients:
            limit = self.timeout or None
            self._clients[key] = Client(
                (host, port), password=self.password, failover=False, connect_timeout=limit,
                socket_timeout=None if waits else limit, **self.tls,
            )  # fmt: skip
        return self._clients[key]

    def wide(self, own: bool | None, default: bool) -> bool:
        """Whether a view spans the cluster: its own --cluster/--local, else
        the one given before the subcommand, else the view's default."""
        return default if own is None and self.cluster is None else own if own is not None else bool(self.cluster)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def each_node(self, call: Callable[[Client], T]) -> list[tuple[NodeInfo, T]]:
        """`call` on every node HELLO lists (this one included), in HELLO's order,
        leaving out (and reporting) those that cannot be reached or answer an error."""
        from disque.client import DisqueConnectionError, DisqueReplyError, format_address

        results = []
        for node in self.client().hello().nodes:
            address = (node.host or self.host, node.port)
            try:
                results.append((node, call(self.client(address))))
            except (DisqueConnectionError, DisqueReplyError) as e:
                self.failed_nodes.append(node.id)
                click.echo(f"node {node.id} at {format_address(address)}: {e}", err=True)
        return results

    def check_nodes(self) -> None:
        """Exit status 1 (once the view is printed) if a node was left out of it."""
        failed, self.failed_nodes = self.failed_nodes, []
        if failed:
            raise Failure(f"{len(set(failed))} node(s) left out of the view")

    def run(self, words: list[str]) -> None:
        """Send one server command and print its reply."""
        if [w.upper() for w in words] == ["MONITOR"]:
            self.monitor()
            return
        reply = self.client(waits=words[0].upper() in WAITING).execute_command(*words)
        if words[0].upper() == "AUTH":  # a reconnection authenticates the same way
            self.password = words[1]
            for client in self._clients.values():
                client.password = words[1]
        self.output(*parse_reply(words, reply), raw=reply)

    def monitor(self) -> None:
        """Print the node's MONITOR lines as they come, until Ctrl-C; the
        connection, a monitor's from then on, is closed afterwards."""
        import json

        try:
            lines = self.client(waits=True).monitor()
            for line in chain(["OK"], lines):  # OK as redis-cli prints it: watching from here on
                click.echo(json.dumps(line, ensure_ascii=False) if self.mode == "json" else line)
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def output(self, kind: str, value: Any, raw: Any = None) -> None:
        """Print a view: rendered, as JSON, or bare (`raw`, by default `value`)."""
        if self.mode == "json":
            import json

            click.echo(json.dumps(jsonable(value), ensure_ascii=False))
        elif self.mode == "raw":
            for line in raw_lines(value if raw is None else raw):
                click.echo(line)
        else:
            from disque.cli.pretty import show

            show(kind, value, self.full)
