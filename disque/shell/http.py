"""The HTTP port (`metrics-port`): Prometheus metrics and the dashboard.

Theory of operation: one trio task per HTTP connection, parsed with h11,
one request at a time (keep-alive), each under a deadline so a slow client
only holds its own task.  Routes:

* `GET /metrics`: Prometheus text exposition, rendered by prometheus_client
  from the core's figures snapshot (`core.figures.node_figures`) plus the
  process collector (CPU, RSS, file descriptors);
* `GET /`, `GET /static/<file>`: the dashboard, static files shipped in the
  package (`disque/shell/web/`), no build step;
* `GET /api/overview`: the figures as JSON (what the dashboard polls);
* `GET /api/jobs/<id>`: SHOW of one job as JSON;
* `POST /api/queues/<name>/pause` with `{"state": "in"|"out"|"all"|"none"}`:
  PAUSE ... BCAST.  With `requirepass` set it needs the same password, sent
  as `Authorization: Bearer <password>` (or HTTP basic auth, any user name),
  and checked by the core's own AUTH.

Commands run through the core's ordinary entry (`handle_command` with the
RESP command table) on a client of their own, and their effects (a PAUSE
broadcast) through the session runner, so the HTTP port adds no second way
into the core.
"""

from __future__ import annotations

import base64
import json
import logging
from importlib import resources
from typing import Any

import h11
import trio
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from disque.core.errors import DisqueError
from disque.core.figures import node_figures
from disque.core.node import NodeCore
from disque.core.types import NIL_ARRAY, Map, Status
from disque.protocols.resp.front import RESP
from disque.shell.session import Sessions

log = logging.getLogger("disque")

REQUEST_TIMEOUT = 10.0  # seconds for a client to send a whole request
MAX_REQUEST = 64 * 1024
READ_SIZE = 16 * 1024
WEB = resources.files("disque.shell") / "web"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
PAUSE_STATES = ("in", "out", "all", "none")


class NodeCollector:
    """The node's figures as Prometheus metric families (read at each scrape)."""

    def __init__(self, core: NodeCore, sessions: Sessions) -> None:
        self.core = core
        self.sessions = sessions

    def collect(self) -> list[Metric]:
        fig = node_figures(self.core)
        out: list[Metric] = []

        def gauge(name: str, doc: str, value: float) -> None:
            out.append(GaugeMetricFamily(f"disque_{name}", doc, value=value))

        def counter(name: str, doc: str, value: float) -> None:
            out.append(CounterMetricFamily(f"disque_{name}", doc, value=value))

        jobs = GaugeMetricFamily("disque_jobs", "Jobs known to this node, by state.", labels=["state"])
        for state, count in fig["jobs"].items():
            jobs.add_metric([state], count)
        out.append(jobs)
        gauge("used_memory_bytes", "The node's estimate of its dataset size (INFO used_memory).", fig["used_memory"])
        gauge("peak_memory_bytes", "The largest used_memory seen.", fig["peak_memory"])
        gauge("connected_clients", "Client connections open.", fig["clients"])
        gauge("blocked_clients", "Clients blocked in GETJOB or waiting for replication.", fig["blocked_clients"])
        counter("connections_received", "Client connections accepted.", fig["connections_received"])
        counter("commands_processed", "Commands executed.", fig["commands_processed"])
        counter("net_input_bytes", "Bytes read from clients.", self.sessions.net_in)
        counter("net_output_bytes", "Bytes written to clients.", self.sessions.net_out)
        counter("rejected_connections", "Connections refused (maxclients).", self.sessions.rejected)
        counter("auth_failures", "Wrong passwords sent with AUTH or HELLO.", fig["auth_failures"])
        counter("bus_messages_sent", "Cluster bus messages sent.", fig["bus_sent"])
        counter("bus_messages_received", "Cluster bus messages received.", fig["bus_received"])
        nodes = GaugeMetricFamily(
            "disque_cluster_node", "Nodes this node knows: 1, labelled with their flags.", labels=["node_id", "addr", "flags"]
        )
        links = GaugeMetricFamily("disque_bus_link_up", "1 when the bus link to the node is connected.", labels=["node_id", "addr"])
        for peer in fig["nodes"]:
            nodes.add_metric([peer["id"], peer["addr"], peer["flags"]], 1)
            if not peer["myself"]:
                links.add_metric([peer["id"], peer["addr"]], int(peer["link"]))
        out += [nodes, links]
        aof = fig["aof"]
        gauge("aof_enabled", "1 when the AOF is on.", aof["aof_enabled"])
        gauge("aof_rewrite_in_progress", "1 while an AOF rewrite runs.", aof["aof_rewrite_in_progress"])
        gauge("aof_last_write_ok", "0 after a failed AOF write (MISCONF).", int(aof["aof_last_write_status"] == "ok"))
        gauge("aof_current_size_bytes", "Size of the AOF.", aof.get("aof_current_size", 0))
        counter("aof_delayed_fsync", "Writes made while an everysec fsync was late.", aof.get("aof_delayed_fsync", 0))
        repl, fed = fig["replication"], fig["federation"]
        gauge("replication_pending", "Jobs waiting for their synchronous replication.", repl["pending"])
        counter("replication_achieved", "Synchronous replications that reached their level.", repl["achieved"])
        counter("replication_aborted", "Synchronous replications given up.", repl["aborted"])
        counter("federation_needjobs_sent", "NEEDJOBS requests sent.", fed["needjobs_sent"])
        counter("federation_jobs_exported", "Jobs handed to other nodes with YOURJOBS.", fed["jobs_exported"])
        counter("federation_jobs_imported", "Jobs received from other nodes and queued here.", fed["jobs_imported"])
        out += self._commands(fig["commands"])
        out += self._queues(fig["queues"])
        groups = self.core.groups
        counter("events_added", "Consumer-group events added here (QADD).", groups.added)
        counter("events_handed_out", "Events this node handed to a group (QGET, claims, NEEDEVENT).", groups.handed)
        counter("events_acked", "Events a group acknowledged, decided here.", groups.acked)
        out += self._groups(groups.status([], None))
        return out

    @staticmethod
    def _groups(status: list[tuple[bytes, int, list[Any]]]) -> list[Metric]:
        """QSTATUS's figures per queue and consumer group."""
        labels = ["queue", "group"]
        families = {
            name: GaugeMetricFamily(f"disque_group_{name}", doc, labels=labels)
            for name, doc in (
                ("total", "Live events of the queue, as this node sees them."),
                ("inprogress", "Events held by a consumer of the group, deadline not passed."),
                ("redo", "Events whose deadline passed without QACK."),
                ("done", "Events the group acknowledged."),
                ("available", "Events the group was never handed."),
                ("consumers", "Connections waiting in QNOTIFY for the group and queue."),
            )
        }  # fmt: skip
        for queue, _, groups in status:
            for group, figures in groups:
                for key, value in figures:
                    families[key.decode()].add_metric([queue.decode(errors="replace"), group.decode(errors="replace")], value)
        return list(families.values())

    @staticmethod
    def _commands(commands: dict[str, list[int]]) -> list[Metric]:
        calls = CounterMetricFamily("disque_command_calls", "Calls of each command.", labels=["command"])
        latency = HistogramMetricFamily(
            "disque_command_duration_seconds", "Time spent executing each command.", labels=["command"]
        )
        for name, counts in sorted(commands.items()):
            calls.add_metric([name], counts[0])
            buckets, cumulative = [], 0
            for i, count in enumerate(counts[2:-1]):
                cumulative += count
                buckets.append((f"{(1 << i) / 1e6:g}", cumulative))
            buckets.append(("+Inf", counts[0]))
            latency.add_metric([name], buckets, sum_value=counts[1] / 1e6)
        return [calls, latency]

    @staticmethod
    def _queues(queues: list[dict[str, Any]]) -> list[Metric]:
        families = {
            "len": GaugeMetricFamily("disque_queue_length", "Jobs queued.", labels=["queue"]),
            "jobs_in": CounterMetricFamily("disque_queue_jobs_in", "Jobs queued here since the queue was created.", labels=["queue"]),
            "jobs_out": CounterMetricFamily("disque_queue_jobs_out", "Jobs delivered from here.", labels=["queue"]),
            "blocked": GaugeMetricFamily("disque_queue_blocked_clients", "Clients blocked on the queue.", labels=["queue"]),
            "nacks": CounterMetricFamily("disque_queue_nacks", "Jobs queued again by NACK.", labels=["queue"]),
            "redeliveries": CounterMetricFamily(
                "disque_queue_additional_deliveries", "Jobs queued again by their retry timer.", labels=["queue"]
            ),
            "dead_lettered": CounterMetricFamily(
                "disque_queue_dead_lettered", "Jobs moved to their dead-letter queue (MAXATTEMPTS).", labels=["queue"]
            ),
            "import_rate": GaugeMetricFamily(
                "disque_queue_import_rate", "Jobs per second imported from other nodes.", labels=["queue"]
            ),
        }
        age = GaugeMetricFamily("disque_queue_oldest_job_age_seconds", "Age of the oldest queued job.", labels=["queue"])
        paused = GaugeMetricFamily("disque_queue_paused", "Pause state (in, out, all) of paused queues.", labels=["queue", "pause"])
        for q in queues:
            for key, family in families.items():
                family.add_metric([q["name"]], q[key])
            age.add_metric([q["name"]], q["oldest_age_ms"] / 1000)
            if q["pause"] != "none":
                paused.add_metric([q["name"], q["pause"]], 1)
        return [*families.values(), age, paused]


def to_json(value: Any) -> Any:
    """A core reply as JSON: maps as objects, bytes as text."""
    if isinstance(value, Map):
        return {to_json(k): to_json(v) for k, v in value}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if value is NIL_ARRAY:
        return None
    return value


class HttpPort:
    def __init__(self, core: NodeCore, sessions: Sessions, requirepass: Any) -> None:
        self.core = core
        self.sessions = sessions
        self.requirepass = requirepass  # () -> the current password, or None
        self.registry = CollectorRegistry()
        self.registry.register(NodeCollector(core, sessions))  # type: ignore[arg-type]
        self.registry.register(ProcessCollector(registry=None))

    async def serve(self, listeners: list[trio.SocketListener]) -> None:
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)
        try:
            while True:
                with trio.fail_after(REQUEST_TIMEOUT):
                    request, body = await self._read_request(stream, conn)
                if request is None:
                    return
                status, ctype, payload = self.respond(request.method.decode(), request.target.decode(), dict(request.headers), body)
                headers = [("content-type", ctype), ("content-length", str(len(payload))), ("cache-control", "no-store")]
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
                await stream.send_all(conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage()))
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    @staticmethod
    async def _read_request(stream: trio.SocketStream, conn: h11.Connection) -> tuple[Any, bytes]:
        request, body = None, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(READ_SIZE))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_REQUEST:
                    raise h11.RemoteProtocolError("request body too large")
            elif isinstance(event, h11.EndOfMessage):
                return request, body
            else:  # ConnectionClosed
                return None, b""

    # ------------------------------------------------------------ routes

    def respond(self, method: str, target: str, headers: dict[bytes, bytes], body: bytes) -> tuple[int, str, bytes]:
        path = target.split("?", 1)[0]
        if method == "GET":
            if path == "/metrics":
                return 200, "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry)
            if path == "/":
                path = "/static/index.html"
            if path.startswith("/static/"):
                return self._static(path.removeprefix("/static/"))
            if path == "/api/overview":
                return self._json(200, node_figures(self.core))
            if path.startswith("/api/jobs/"):
                job = self.run(b"SHOW", path.removeprefix("/api/jobs/").encode())
                if isinstance(job, DisqueError):
                    return self._json(400, {"error": str(job)})
                return self._json(200, {"job": to_json(job)})
        if method == "POST" and path.startswith("/api/queues/") and path.endswith("/pause"):
            return self._pause(path.removeprefix("/api/queues/").removesuffix("/pause"), headers, body)
        return self._json(404, {"error": "not found"})

    def _static(self, name: str) -> tuple[int, str, bytes]:
        file = WEB / name
        suffix = "." + name.rsplit(".", 1)[-1]
        if "/" in name or name.startswith(".") or suffix not in CONTENT_TYPES or not file.is_file():
            return self._json(404, {"error": "not found"})
        return 200, CONTENT_TYPES[suffix], file.read_bytes()

    def _pause(self, queue: str, headers: dict[bytes, bytes], body: bytes) -> tuple[int, str, bytes]:
        try:
            state = json.loads(body or b"{}").get("state")
        except (ValueError, AttributeError):
            state = None
        if state not in PAUSE_STATES or not queue:
            return self._json(400, {"error": f"state must be one of {', '.join(PAUSE_STATES)}"})
        password = _password(headers.get(b"authorization", b""))
        reply = self.run(b"PAUSE", queue.encode(), state.encode(), b"BCAST", password=password)
        if isinstance(reply, DisqueError):
            status = 401 if reply.code in ("NOAUTH", "WRONGPASS") or "password" in reply.message else 400
            return self._json(status, {"error": str(reply)})
        return self._json(200, {"queue": queue, "pause": to_json(reply)})

    def run(self, *argv: bytes, password: bytes | None = None) -> Any:
        """One command on a client of its own, as a connection would run it."""
        sessions, core = self.sessions, self.core
        client = sessions.new_client("http", "http")
        try:
            if self.requirepass() and password is not None:
                core.handle_command(client, [b"AUTH", password], RESP.run)
            reply = core.handle_command(client, list(argv), RESP.run)
        finally:
            core.disconnect(client.id)
            sessions.apply_effects(None)
        return reply

    @staticmethod
    def _json(status: int, value: Any) -> tuple[int, str, bytes]:
        return status, "application/json", json.dumps(value, default=_plain).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, Status | bytes):
        return bytes(value).decode("utf-8", "backslashreplace")
    raise TypeError(type(value).__name__)


def _password(authorization: bytes) -> bytes | None:
    scheme, _, credentials = authorization.partition(b" ")
    if scheme.lower() == b"bearer":
        return credentials.strip()
    if scheme.lower() == b"basic":
        try:
            return base64.b64decode(credentials.strip(), validate=True).partition(b":")[2]
        except ValueError:
            return None
    return None
