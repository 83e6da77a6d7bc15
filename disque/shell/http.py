"""The HTTP port (`metrics-port`): Prometheus metrics and the dashboard.

Theory of operation: one trio task per HTTP connection, parsed with h11,
one request at a time (keep-alive).  Routes (HEAD answers as GET, without
the body):

* `GET /metrics`: Prometheus text exposition, rendered by prometheus_client
  from the core's figures (`core.figures`) plus the process collector (CPU,
  RSS, file descriptors);
* `GET /`, `GET /static/<file>`: the dashboard, static files shipped in the
  package (`disque/shell/web/`), no build step;
* `GET /api/overview`: this node's figures as JSON, with its consumer
  groups, schedules, clients (CLIENT LIST's fields), dead-letter queues, memory and
  read-behind state;
* `GET /api/cluster`: every node's overview (what the dashboard polls):
  this node's, and the others' asked over their HTTP ports
  (shell/dashboard.py), shared for CACHE_SECONDS;
* `GET /api/history`: this node's per-queue rate history, the last hour in
  10 s slots (core/rate_history.py); `GET /api/cluster/history`: every
  node's, added up (shared for HISTORY_SECONDS);
* `GET /api/jobs/<id>`: SHOW of one job as JSON, asked of the other nodes
  when this one does not know it (`?local`: this one only), with the node;
* `POST /api/queues/<name>/pause` with `{"state": "in"|"out"|"all"|"none"}`:
  PAUSE ... BCAST;
* `POST /api/deadletters/<queue>/requeue` and `.../delete` with
  `{"scope": "cluster"|"node"}` (default cluster) and optional filters
  (`from`, `error`, `since`, `until`: DEADLETTER's), `count` and `rate` (at
  most that many a second on each node): DEADLETTER REQUEUE or DELETE here,
  in batches, then the same request to every other node's HTTP port with
  scope `node`; the answer says how many each node requeued or deleted, or
  its error;
* `GET /api/deadletters/<queue>?from=&error=&since=&until=&count=`: the
  dead letters (DEADLETTER LIST) of every node (`scope=node`: this one),
  oldest first, each with its node and its last error.

The POSTs need, with `requirepass` set, the same password, sent as
`Authorization: Bearer <password>` (or HTTP basic auth, any user name),
checked by the core's own AUTH before the body is looked at; the requeue
hands the same header to the other nodes.  With or without a password they
need a same-origin JSON request (`_cross_site`: `Content-Type:
application/json`, and an `Origin`, when sent, naming the `Host`), else 403:
another site's page open in a browser cannot pause a queue or requeue dead
letters (docs/security.md).

What one client can cost is bounded:

* at most MAX_CONNECTIONS connections at once (the next ones are answered
  503 and closed, counted with the refused connections);
* REQUEST_TIMEOUT to send a whole request (an idle keep-alive connection
  too) and MAX_REQUEST bytes of head or body; WRITE_TIMEOUT to take a whole
  response, or the connection is closed.  A response is one bytes object
  handed to the socket without a copy, and the metrics and overview are the
  same object for every client, so a client that does not read holds no
  memory of its own;
* the figures are read from the core on the event loop (capped: at most
  MAX_QUEUE_SERIES queues in detail, the longest, MAX_GROUP_SERIES
  consumer groups, with totals for the rest, and the TOP_KEYS busiest keys
  of at most MAX_KEY_QUEUES queues, core/figures.py), rendered (Prometheus text and
  JSON) in a worker thread so that the loop is not held meanwhile, and the
  result is shared by every request for CACHE_SECONDS, or 20 times what
  the last rendering took if that is longer (the port spends at most about
  1/20 of the time on it); concurrent requests wait for the one rendering;
* the cluster views ask the other nodes at most once per CACHE_SECONDS
  (HISTORY_SECONDS for the history), whoever asks, each peer within its
  timeout and byte cap (shell/dashboard.py); a job unknown here and a
  requeue ask them once per request;
* every connection has an error boundary: an unexpected exception is logged
  (rate-limited), answered 500 when a response can still be sent, and costs
  that connection, never the node.

Commands (SHOW, AUTH, PAUSE, DEADLETTER) run through the core's ordinary entry
(`handle_command` with the RESP command table) on a client of their own,
registered with the session runner for the time of the request and bearing
the connection's address, so that a late AUTH answer reaches it and wrong
passwords count against the address as on any port (core/auth_throttle.py);
they wait while CLIENT PAUSE is on, as a client's commands do.  Their effects
(a PAUSE broadcast) go through the session runner, so the HTTP port adds no
second way into the core.
"""

from __future__ import annotations

import base64
import json
import logging
import traceback
from urllib.parse import parse_qs, quote, unquote_to_bytes, urlencode, urlsplit
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from importlib import resources
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import h11
import trio
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from disque.core import errors
from disque.core.errors import DisqueError
from disque.core.figures import TOP_KEYS, client_figures, dead_letter_figures, group_figures, node_figures
from disque.core.lifecycle import SLICE
from disque.core.node import NodeCore
from disque.core.rate_history import merge
from disque.core.types import BLOCKED, NIL_ARRAY, Map, Status
from disque.protocols.resp.front import RESP
from disque.shell.dashboard import History, Peers, Shared
from disque.shell.session import Conn, Sessions

log = logging.getLogger("disque")

REQUEST_TIMEOUT = 10.0  # seconds for a client to send a whole request
WRITE_TIMEOUT = 10.0  # seconds for a client to take a whole response
MAX_REQUEST = 64 * 1024
MAX_CONNECTIONS = 128  # HTTP connections open at once
READ_SIZE = 16 * 1024
CACHE_SECONDS = 1.0  # the figures are rendered at most this often ...
CACHE_FACTOR = 20  # ... or this many times what rendering them last took
MAX_QUEUE_SERIES = 1000  # queues with series of their own (the longest); totals for the rest
MAX_GROUP_SERIES = 1000  # consumer groups with series of their own
MAX_CLIENTS_SHOWN = 200  # clients in the overview (blocked ones first)
MAX_DEAD_LETTER_QUEUES = 100  # dead-letter queues in the overview ...
DEAD_LETTER_SAMPLE = 5  # ... with their oldest jobs
DEAD_LETTER_SECONDS = 5.0  # the dead-letter queues are looked for at most this often (a walk of every queue)
HISTORY_SECONDS = 5.0  # the cluster's rate history is gathered at most this often
REQUEUE_BATCH = SLICE  # dead letters per DEADLETTER REQUEUE: one slice, answered at once; the loop runs between two
REQUEUE_TIMEOUT = 60.0  # seconds for another node to requeue its dead letters
MAX_PACED = 3600  # dead letters a paced requeue or delete without a count is given the time for, at its rate
LOG_INTERVAL = 1.0  # seconds between two logged errors of the port
WEB = resources.files("disque.shell") / "web"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PAUSE_STATES = ("in", "out", "all", "none")
BUSY = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class Snapshot(NamedTuple):
    """What the core and the session runner said, as plain data: what a
    worker thread may render while the core goes on."""

    figures: dict[str, Any]
    groups: list[tuple[bytes, int, list[Any]]]
    groups_total: int
    events: tuple[int, int, int]  # added, handed out, acknowledged
    net: tuple[int, int, int]  # bytes in, bytes out, refused connections
    http_connections: int
    clients: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]]
    read_behind: list[tuple[str, Any]]
    rss_startup: int


# INFO federation's fields (core/federation.py): a counter (True) or a gauge each.
FEDERATION_METRICS = (
    ("needjobs_sent", "NEEDJOBS requests sent.", True),
    ("needjobs_received", "NEEDJOBS requests received.", True),
    ("jobs_exported", "Jobs handed to other nodes with YOURJOBS.", True),
    ("jobs_imported", "Jobs received from other nodes and queued here.", True),
    ("jobs_pushed_out", "Jobs pushed to nodes that announced waiting consumers (of jobs_exported).", True),
    ("jobs_pushed_in", "Jobs pushed here for waiting consumers and queued (of jobs_imported).", True),
    ("waiting_sent", "WAITING entries sent (a queue and its waiting consumers, to one node).", True),
    ("waiting_received", "WAITING entries received.", True),
    ("waiting_queues", "Queues whose blocked consumers this node announces.", False),
    ("waiting_peer_queues", "Announcements of other nodes' waiting consumers kept here (queue, node).", False),
    ("peers_without_waiting", "Linked nodes that do not read WAITING (an older version).", False),
)


class Rendered(NamedTuple):
    metrics: bytes
    overview: bytes


class NodeCollector:
    """A snapshot's figures as Prometheus metric families."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> list[Metric]:
        snap = self.snapshot
        fig = snap.figures
        net_in, net_out, rejected = snap.net
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
        gauge("memory_level", "0 ok, 1 warning (over 75 % of maxmemory: new jobs are stored on other nodes only), "
              "2 oom (over 95 %: evicting, refusing what needs memory) (INFO mem_level).", fig["mem_level"])  # fmt: skip
        gauge("connected_clients", "Client connections open.", fig["clients"])
        gauge("blocked_clients", "Clients blocked in GETJOB or waiting for replication.", fig["blocked_clients"])
        counter("connections_received", "Client connections accepted.", fig["connections_received"])
        counter("commands_processed", "Commands executed.", fig["commands_processed"])
        counter("net_input_bytes", "Bytes read from clients.", net_in)
        counter("net_output_bytes", "Bytes written to clients.", net_out)
        counter("rejected_connections", "Connections refused (maxclients, and the HTTP port's limit).", rejected)
        gauge("http_connections", f"Connections open on this HTTP port (at most {MAX_CONNECTIONS}).", snap.http_connections)
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
        counter("aof_damaged_records", "Damaged AOF records skipped at the last load (checksum, framing).", aof.get("aof_damaged_records", 0))
        counter("aof_dropped_jobs", "Jobs whose AOF record was damaged, lost here at the last load.", aof.get("aof_dropped_jobs", 0))
        repl, fed = fig["replication"], fig["federation"]
        gauge("replication_pending", "Jobs waiting for their synchronous replication.", repl["pending"])
        counter("replication_achieved", "Synchronous replications that reached their level.", repl["achieved"])
        counter("replication_aborted", "Synchronous replications given up.", repl["aborted"])
        for key, doc, is_counter in FEDERATION_METRICS:
            (counter if is_counter else gauge)(f"federation_{key}", doc, fed[key])
        out += self._commands(fig["commands"])
        out += self._queues(fig["queues"])
        other = fig["other_queues"]
        gauge("queues", "Queues known to this node.", fig["queues_total"])
        gauge("other_queues", f"Queues without series of their own (beyond the {MAX_QUEUE_SERIES} longest).", other["count"])
        gauge("other_queues_length", "Jobs queued in the queues without series of their own.", other["len"])
        counter("other_queues_jobs_in", "Jobs queued in the queues without series of their own.", other["jobs_in"])
        counter("other_queues_jobs_out", "Jobs delivered from the queues without series of their own.", other["jobs_out"])
        gauge("other_queues_blocked_clients", "Clients blocked on the queues without series of their own.", other["blocked"])
        added, handed, acked = snap.events
        counter("events_added", "Consumer-group events added here (QADD).", added)
        counter("events_handed_out", "Events this node handed to a group (QGET, claims, NEEDEVENT).", handed)
        counter("events_acked", "Events a group acknowledged, decided here.", acked)
        gauge("consumer_groups", f"Consumer groups known (series of their own for the first {MAX_GROUP_SERIES}).", snap.groups_total)
        out += self._groups(snap.groups)
        sched = fig["schedules"]  # INFO schedules (docs/schedules.md)
        gauge("schedules", "Schedules known (recurring jobs).", sched["schedules"])
        gauge("schedules_paused", "Schedules paused.", sched["schedules_paused"])
        counter("schedule_ticks_fired", "Ticks whose job this node added.", sched["schedule_ticks_fired"])
        counter("schedule_ticks_late", "Ticks added a grace or more after their time (a fallback, a catch-up).",
                sched["schedule_ticks_late"])  # fmt: skip
        counter("schedule_ticks_collapsed", "Ticks made here and on another node, their copies merged.",
                sched["schedule_ticks_collapsed"])  # fmt: skip
        counter("schedule_ticks_refused", "Ticks whose job ADDJOB refused (a full or paused queue, memory).",
                sched["schedule_ticks_refused"])  # fmt: skip
        counter("schedule_records_dropped", "Schedule records from the bus or the AOF that broke a rule, dropped alone.",
                sched["schedule_records_dropped"])  # fmt: skip
        keys = fig["keys"]  # INFO keys (docs/keys.md)
        gauge("keys_held", "Keys held by a job here (DEDUP), as their home or a standby.", keys["keys_held"])
        gauge("keys_waiting", "ADDJOBs waiting for their key's home to answer.", keys["keys_waiting"])
        counter("dedup_hits", "ADDJOB ... DEDUP answered with the ID of the job holding the key (nothing added).", keys["dedup_hits"])
        counter("dedup_granted", "ADDJOB ... DEDUP whose job holds its key.", keys["dedup_granted"])
        counter("dedup_unconfirmed", "ADDJOB ... DEDUP added without a hold: the key's home did not answer in time.",
                keys["dedup_unconfirmed"])  # fmt: skip
        counter("dedup_released", "Holds ended early: a DEDUP ACTIVE job acknowledged, or an ADDJOB that failed.", keys["dedup_released"])
        counter("debounce_superseded", "DEBOUNCE jobs deleted at their key's home, a later one of the key granted.", keys["debounce_superseded"])
        counter("key_records_dropped", "Key records from the bus or the AOF that broke a rule, dropped alone.", keys["key_records_dropped"])
        out += self._keys(fig["key_list"])
        lim = fig["limits"]  # INFO limits (docs/limits.md)
        gauge("limited_queues", "Queues with a cluster-wide rate or concurrency limit.", lim["limited_queues"])
        counter("limit_records_dropped", "Limits records from the bus or the AOF that broke a rule, dropped alone.",
                lim["limit_records_dropped"])  # fmt: skip
        out += self._limits(fig["limit_list"])
        flows = fig["workflows"]  # INFO workflows (docs/workflows.md)
        gauge("jobs_held", "Jobs held here until their parents are acknowledged (ADDJOB ... AFTER).", flows["jobs_held"])
        counter("jobs_released", "Held jobs whose last parent was acknowledged here.", flows["jobs_released"])
        counter("parents_failed", "Parents that expired or were dead-lettered with a child held here.", flows["parents_failed"])
        gauge("results_kept", "Results of acknowledged jobs kept (ACKJOB ... RESULT).", flows["results_kept"])
        gauge("results_bytes", "Bytes of the results kept.", flows["results_bytes"])
        gauge("batches", "Batches known (BATCH NEW).", flows["batches"])
        counter("batch_callbacks_fired", "Batch callbacks this node added, as the batch's home.", flows["batch_callbacks_fired"])
        counter("batch_records_dropped", "Batch records from the bus or the AOF that broke a rule, dropped alone.",
                flows["batch_records_dropped"])  # fmt: skip
        return out

    @staticmethod
    def _limits(rows: list[dict[str, Any]]) -> list[Metric]:
        """Each limited queue: its limits, this node's share and use of them, how long consumers waited on them."""
        families = {
            "concurrency": GaugeMetricFamily("disque_limit_concurrency", "The queue's concurrency limit (0: none).", labels=["queue"]),
            "rate_per_second": GaugeMetricFamily("disque_limit_rate_per_second", "The queue's rate limit (0: none).", labels=["queue"]),
            "out": GaugeMetricFamily("disque_limit_jobs_out", "Jobs this node handed out that are still out.", labels=["queue"]),
            "lease": GaugeMetricFamily("disque_limit_lease", "The concurrency share this node holds.", labels=["queue"]),
            "handed": CounterMetricFamily("disque_limit_jobs_handed", "Jobs this node handed out within the limits.", labels=["queue"]),
            "waiting": GaugeMetricFamily("disque_limit_waiting", "1 while consumers here wait on the limit.", labels=["queue"]),
            "waited_seconds": CounterMetricFamily(
                "disque_limit_waited_seconds", "Time consumers here waited on the limit, in all.", labels=["queue"]
            ),
        }
        for row in rows:
            for key, family in families.items():
                family.add_metric([row["queue"]], row[key])
        return list(families.values())

    @staticmethod
    def _keys(rows: list[dict[str, Any]]) -> list[Metric]:
        """The queues with keyed jobs queued here (at most MAX_KEY_QUEUES): their keys, and their TOP_KEYS busiest."""
        keys = GaugeMetricFamily("disque_queue_keys", "Keys with jobs queued here in the queue (ADDJOB ... KEY).", labels=["queue"])
        jobs = GaugeMetricFamily("disque_queue_keyed_jobs", "Keyed jobs queued here in the queue.", labels=["queue"])
        busiest = GaugeMetricFamily(
            "disque_queue_key_jobs", f"Jobs queued here of each of the queue's {TOP_KEYS} busiest keys.", labels=["queue", "key"]
        )
        for row in rows:
            keys.add_metric([row["queue"]], row["keys"])
            jobs.add_metric([row["queue"]], row["jobs"])
            for key, n in row["busiest"]:
                busiest.add_metric([row["queue"], key], n)
        return [keys, jobs, busiest]

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


def render(snapshot: Snapshot) -> Rendered:
    """The Prometheus text and the overview JSON of a snapshot (in a worker thread)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(snapshot))  # type: ignore[arg-type]
    process = ProcessCollector(registry=None)
    registry.register(process)
    rss = next((s.value for f in process.collect() for s in f.samples if s.name == "process_resident_memory_bytes"), 0)
    overview = {
        **snapshot.figures,
        "groups": [
            {"queue": to_json(queue), "group": to_json(group), **{key.decode(): value for key, value in figures}}
            for queue, _, groups in snapshot.groups for group, figures in groups
        ],
        "groups_total": snapshot.groups_total,
        "clients_shown": snapshot.clients,
        "dead_letters": snapshot.dead_letters,
        "memory": {"used_memory_rss": int(rss), "used_memory_startup": snapshot.rss_startup},
        "read_behind": dict(snapshot.read_behind),
        "http_connections": snapshot.http_connections,
    }  # fmt: skip
    return Rendered(generate_latest(registry), json.dumps(overview, default=_plain).encode())


class RequestConn(Conn):
    """A request's client as the session runner sees it: `kick` says that
    a late answer (AUTH's) arrived."""

    __slots__ = ("answered",)

    def __init__(self, client: Any) -> None:
        super().__init__(client, RESP)
        self.answered = trio.Event()

    def kick(self) -> None:
        self.answered.set()

    abort = kick


class HttpPort:
    def __init__(self, core: NodeCore, sessions: Sessions, requirepass: Any, startup_rss: int = 0) -> None:
        self.core = core
        self.sessions = sessions
        self.requirepass = requirepass  # () -> the current password, or None
        self.open = 0  # connections
        self.rendered: Rendered | None = None
        self.rendered_at = float("-inf")
        self.max_age = CACHE_SECONDS
        self.rendering: trio.Event | None = None  # set when the rendering in progress ends
        self._log_at = float("-inf")
        self._log_skipped = 0
        self.startup_rss = startup_rss  # the process's RSS when it started (INFO used_memory_startup)
        self.dead_letters: tuple[float, list[dict[str, Any]]] = (float("-inf"), [])  # when found, what
        self.peers = Peers(core)
        self.history = History(core)
        self.cluster = Shared(self._gather, CACHE_SECONDS)
        self.cluster_history = Shared(self._gather_history, HISTORY_SECONDS)

    async def serve(self, listeners: list[trio.SocketListener]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sample_history)
            await trio.serve_listeners(self._connection, listeners)

    async def _sample_history(self) -> None:
        while True:
            try:
                await self.history.run()
            except Exception:  # a bug costs a sample, not the port
                self._log_error("Error sampling the rate history")
                await trio.sleep(self.history.history.slot_seconds)

    async def _connection(self, stream: trio.SocketStream) -> None:
        """One connection, behind its error boundary."""
        if self.open >= MAX_CONNECTIONS:
            self.sessions.rejected += 1
            with trio.move_on_after(1):
                await stream.send_all(BUSY)
            await trio.aclose_forcefully(stream)
            return
        self.open += 1
        try:
            await self._serve(stream)
        except (h11.ProtocolError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # a malformed request, a client too slow, or gone
        except Exception:  # a bug costs this connection, not the node
            self._log_error("Error serving an HTTP client")
        finally:
            self.open -= 1
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)
        peer, local = _addr(stream, local=False), _addr(stream, local=True)
        while True:
            with trio.fail_after(REQUEST_TIMEOUT):
                request, body = await self._read_request(stream, conn)
            if request is None:
                return
            method, target = request.method.decode(), request.target.decode("latin-1")
            try:
                status, ctype, payload = await self.respond(method, target, dict(request.headers), body, peer, local)
            except Exception:  # a bug costs this reply
                self._log_error(f"Error answering {method} {target[:200]!r}")
                status, ctype, payload = self._json(500, {"error": "internal error, check the server logs"})
            headers = [("content-type", ctype), ("content-length", str(len(payload))), ("cache-control", "no-store")]
            with trio.fail_after(WRITE_TIMEOUT):
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase)))
                if method != "HEAD":  # the same headers as GET, no body
                    for chunk in conn.send_with_data_passthrough(h11.Data(data=payload)):
                        await stream.send_all(chunk)  # not joined: `payload` may be shared by every client
                await stream.send_all(conn.send(h11.EndOfMessage()))
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

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

    def _log_error(self, what: str) -> None:
        """Log an unexpected exception with its traceback, at most one per LOG_INTERVAL."""
        now = trio.current_time()
        if now < self._log_at + LOG_INTERVAL:
            self._log_skipped += 1
            return
        skipped = f" ({self._log_skipped} similar errors not logged)" if self._log_skipped else ""
        log.error("%s%s: %s", what, skipped, traceback.format_exc().rstrip())  # the traceback in the line: the log shows messages only
        self._log_at, self._log_skipped = now, 0

    # ------------------------------------------------------------ routes

    async def respond(
        self, method: str, target: str, headers: dict[bytes, bytes], body: bytes, peer: str = "http", local: str = ""
    ) -> tuple[int, str, bytes]:
        path = target.split("?", 1)[0]
        if method in ("GET", "HEAD"):
            if path == "/metrics":
                return 200, METRICS_TYPE, (await self.figures()).metrics
            if path == "/api/overview":
                return 200, "application/json", (await self.figures()).overview
            if path == "/api/cluster":
                return 200, "application/json", await self.cluster.get()
            if path == "/api/history":
                return 200, "application/json", self.history.rendered
            if path == "/api/cluster/history":
                return 200, "application/json", await self.cluster_history.get()
            if path == "/":
                path = "/static/index.html"
            if path.startswith("/static/"):
                return self._static(path.removeprefix("/static/"))
            if path.startswith("/api/jobs/"):
                return await self._show(path.removeprefix("/api/jobs/"), target.endswith("?local"), peer, local)
        if method == "POST" and path.startswith("/api/queues/") and path.endswith("/pause"):
            return await self._pause(path.removeprefix("/api/queues/").removesuffix("/pause"), headers, body, peer, local)
        if path.startswith("/api/deadletters/"):
            name, _, verb = path.removeprefix("/api/deadletters/").partition("/")
            if method in ("GET", "HEAD") and not verb:
                return await self._dead_letters(unquote_to_bytes(name), target.partition("?")[2], peer, local)
            if method == "POST" and verb in ("requeue", "delete"):
                return await self._dead_letter_bulk(verb, unquote_to_bytes(name), headers, body, peer, local)
        return self._json(404, {"error": "not found"})

    async def _show(self, job_id: str, local_only: bool, peer: str, local: str) -> tuple[int, str, bytes]:
        """SHOW here; a job this node does not know is looked for on the others (`?local` asks this one only)."""
        async with self._client(peer, local) as conn:
            job = await self._command(conn, b"SHOW", job_id.encode())
        if isinstance(job, DisqueError):
            return self._json(400, {"error": str(job)})
        if job is None and not local_only:
            for answer in await self.peers.each("GET", f"/api/jobs/{quote(job_id, safe='')}?local"):
                if answer.status == 200 and isinstance(answer.value, dict) and answer.value.get("job"):
                    return self._json(200, {"job": answer.value["job"], "node": answer.peer.id})
        return self._json(200, {"job": to_json(job)} | ({"node": self.core.membership.my_id} if job is not None else {}))

    def _static(self, name: str) -> tuple[int, str, bytes]:
        file = WEB / name
        suffix = "." + name.rsplit(".", 1)[-1]
        if "/" in name or name.startswith(".") or suffix not in CONTENT_TYPES or not file.is_file():
            return self._json(404, {"error": "not found"})
        return 200, CONTENT_TYPES[suffix], file.read_bytes()

    async def _authorized(
        self, headers: dict[bytes, bytes], peer: str, local: str, act: Callable[[RequestConn], Awaitable[tuple[int, str, bytes]]]
    ) -> tuple[int, str, bytes]:  # fmt: skip
        """`act` on a client of the request once the password (with
        `requirepass`) is right, checked first so that nothing of the body
        is read for a client without it, and the request is a same-origin
        JSON one (`_cross_site`)."""
        password = _password(headers.get(b"authorization", b""))
        if self.requirepass() and password is None:
            return self._json(401, {"error": str(errors.noauth())})
        async with self._client(peer, local) as conn:
            if self.requirepass():
                reply = await self._command(conn, b"AUTH", password)  # type: ignore[arg-type]
                if isinstance(reply, DisqueError) or not conn.client.authenticated:
                    status = 429 if reply == errors.auth_refused() else 401
                    return self._json(status, {"error": str(reply) if isinstance(reply, DisqueError) else "ERR invalid password"})
            refusal = _cross_site(headers)
            if refusal:
                return self._json(403, {"error": refusal})
            return await act(conn)

    async def _pause(self, queue: str, headers: dict[bytes, bytes], body: bytes, peer: str, local: str) -> tuple[int, str, bytes]:
        async def pause(conn: RequestConn) -> tuple[int, str, bytes]:
            state = _body_field(body, "state", PAUSE_STATES)
            if state is None or not queue:
                return self._json(400, {"error": f"state must be one of {', '.join(PAUSE_STATES)}"})
            reply = await self._command(conn, b"PAUSE", queue.encode(), state.encode(), b"BCAST")
            if isinstance(reply, DisqueError):
                return self._json(400, {"error": str(reply)})
            return self._json(200, {"queue": queue, "pause": to_json(reply)})

        return await self._authorized(headers, peer, local, pause)

    async def _dead_letters(self, queue: bytes, query: str, peer: str, local: str) -> tuple[int, str, bytes]:
        """DEADLETTER LIST here with the query's filters (from, error, since,
        until, count), then on every other node unless `scope=node`: each
        dead letter with its node, the error first."""
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        options = _dead_letter_options(params, ("scope",))
        if isinstance(options, str) or params.get("scope", "cluster") not in ("cluster", "node") or not queue:
            return self._json(400, {"error": options if isinstance(options, str) else "scope must be cluster or node"})
        async with self._client(peer, local) as conn:
            reply = await self._command(conn, b"DEADLETTER", b"LIST", queue, *options)
        if isinstance(reply, DisqueError):
            return self._json(400, {"error": str(reply)})
        my_id = self.core.membership.my_id
        found = [{"node": my_id, **to_json(entry)} for entry in reply]
        nodes: list[dict[str, Any]] = [{"id": my_id}]
        if params.get("scope") != "node":
            target = f"/api/deadletters/{quote(queue, safe='')}?{urlencode(params | {'scope': 'node'})}"
            for answer in await self.peers.each("GET", target):
                value = answer.value if isinstance(answer.value, dict) else {}
                if answer.status == 200 and isinstance(value.get("dead_letters"), list):
                    found += value["dead_letters"]
                    nodes.append({"id": answer.peer.id})
                else:
                    nodes.append({"id": answer.peer.id, "error": answer.error or str(value.get("error", answer.status))})
        found.sort(key=lambda e: e.get("dead-lettered-at", 0))
        return self._json(200, {"queue": to_json(queue), "dead_letters": found, "nodes": nodes})

    async def _dead_letter_bulk(
        self, verb: str, queue: bytes, headers: dict[bytes, bytes], body: bytes, peer: str, local: str
    ) -> tuple[int, str, bytes]:  # fmt: skip
        """DEADLETTER REQUEUE or DELETE here in batches (the loop runs between
        them; with `rate`, at most that many a second), then, for the cluster,
        on every other node through its HTTP port, all at once."""
        done_key = "requeued" if verb == "requeue" else "deleted"

        async def bulk(conn: RequestConn) -> tuple[int, str, bytes]:
            try:
                fields = json.loads(body or b"{}")
                assert isinstance(fields, dict)
            except (ValueError, AssertionError, RecursionError):
                return self._json(400, {"error": "the body must be a JSON object"})
            scope = fields.get("scope", "cluster")
            options = _dead_letter_options(fields, ("scope", "count", "rate"))
            limits = [fields.get(k) for k in ("count", "rate")]
            if scope not in ("cluster", "node") or not queue:
                return self._json(400, {"error": "scope must be cluster or node"})
            if isinstance(options, str) or not all(v is None or (type(v) is int and v > 0) for v in limits):
                return self._json(400, {"error": options if isinstance(options, str) else "count and rate must be positive integers"})
            count, rate = limits
            done, finished = 0, False
            while not finished and (count is None or done < count):
                started = trio.current_time()
                budget = rate or REQUEUE_BATCH  # this second's, with a rate
                if count is not None:
                    budget = min(budget, count - done)
                while budget and not finished:  # a batch at a time, each answered at once
                    batch = min(budget, REQUEUE_BATCH)
                    reply = await self._command(conn, b"DEADLETTER", verb.encode(), queue, b"COUNT", b"%d" % batch, *options)
                    if isinstance(reply, DisqueError):
                        return self._json(400, {"error": str(reply), done_key: done})
                    done += reply
                    budget -= reply
                    finished = reply < batch
                    await trio.sleep(0)
                if rate and not finished:
                    await trio.sleep_until(started + 1)
            self.dead_letters = (float("-inf"), [])  # looked for again at the next rendering ...
            self.rendered_at = float("-inf")  # ... which is the next request's
            nodes: list[dict[str, Any]] = [{"id": self.core.membership.my_id, done_key: done}]
            if scope == "cluster":
                forward: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)
                if b"authorization" in headers:
                    forward += (("authorization", headers[b"authorization"].decode("latin-1")),)
                target = f"/api/deadletters/{quote(queue, safe='')}/{verb}"
                paced = (count or MAX_PACED) / rate if rate else 0  # the time a paced peer may take
                request = json.dumps(fields | {"scope": "node"}).encode()
                for answer in await self.peers.each("POST", target, forward, request, REQUEUE_TIMEOUT + paced):
                    value = answer.value if isinstance(answer.value, dict) else {}
                    if answer.status == 200 and isinstance(value.get(done_key), int):
                        nodes.append({"id": answer.peer.id, done_key: value[done_key]})
                    else:
                        nodes.append({"id": answer.peer.id, "error": answer.error or str(value.get("error", answer.status))})
            total = sum(n.get(done_key, 0) for n in nodes)
            return self._json(200, {"queue": to_json(queue), done_key: total, "nodes": nodes})

        return await self._authorized(headers, peer, local, bulk)

    # ------------------------------------------------------------ commands

    @asynccontextmanager
    async def _client(self, peer: str, local: str) -> AsyncIterator[RequestConn]:
        """A client for one request's commands, known to the session runner meanwhile."""
        conn = RequestConn(self.sessions.new_client(peer, local))
        self.sessions.opened(conn)
        try:
            yield conn
        finally:
            self.sessions.gone(conn)

    async def _command(self, conn: RequestConn, *argv: bytes) -> Any:
        """Run one command as a connection would: once CLIENT PAUSE is over;
        a late answer (AUTH's) is waited for (then the reply is BLOCKED: the
        client's state says the outcome)."""
        core = self.core
        while left := core.pause_left(core.clock.now_ms()):
            await trio.sleep(left / 1000)
        reply = core.handle_command(conn.client, list(argv), RESP.run)
        self.sessions.effects.apply(conn)
        if reply is BLOCKED:
            await conn.answered.wait()
        return reply

    # ------------------------------------------------------------ figures

    async def figures(self) -> Rendered:
        """The metrics and the overview, rendered at most once per max_age
        and shared by every request meanwhile."""
        while True:
            if self.rendered is not None and trio.current_time() - self.rendered_at < self.max_age:
                return self.rendered
            if self.rendering is not None:
                await self.rendering.wait()
                continue
            self.rendering = done = trio.Event()
            start = trio.current_time()
            try:
                self.rendered = await trio.to_thread.run_sync(render, self.snapshot())
            finally:
                self.rendering = None
                done.set()
            self.rendered_at = now = trio.current_time()
            self.max_age = max(CACHE_SECONDS, CACHE_FACTOR * (now - start))

    def snapshot(self) -> Snapshot:
        """The figures, read on the event loop (the core is not thread-safe)."""
        core, sessions = self.core, self.sessions
        groups, total = group_figures(core, MAX_GROUP_SERIES)
        g = core.groups
        read_behind = core.read_behind.info_fields()
        if trio.current_time() - self.dead_letters[0] >= DEAD_LETTER_SECONDS:
            self.dead_letters = (trio.current_time(), dead_letter_figures(core, MAX_DEAD_LETTER_QUEUES, DEAD_LETTER_SAMPLE))
        return Snapshot(
            node_figures(core, MAX_QUEUE_SERIES), groups, total, (g.added, g.handed, g.acked),
            (sessions.net_in, sessions.net_out, sessions.rejected), self.open,
            client_figures(core, MAX_CLIENTS_SHOWN), self.dead_letters[1], read_behind, self.startup_rss,
        )  # fmt: skip

    # ------------------------------------------------------------ the cluster

    async def _gather(self) -> bytes:
        """Every node's overview: this one's, then the others' in the node table's order."""
        cluster = self.core.membership
        mine = (await self.figures()).overview
        answers = await self.peers.each("GET", "/api/overview")
        nodes: list[dict[str, Any]] = [{"id": cluster.my_id, "myself": True, "http": f":{self.core.config.metrics_port}"}]
        for answer in answers:
            entry = {"id": answer.peer.id, "myself": False, "http": f"{answer.peer.host}:{answer.peer.port}"}
            if answer.status == 200 and isinstance(answer.value, dict):
                entry["overview"] = answer.value
            else:
                entry["error"] = answer.error or f"HTTP {answer.status}"
            nodes.append(entry)

        def dump() -> bytes:
            nodes[0]["overview"] = json.loads(mine)
            return json.dumps({"nodes": nodes}).encode()

        return await trio.to_thread.run_sync(dump)

    async def _gather_history(self) -> bytes:
        """Every node's rate history added up; the nodes that gave none are listed with their error."""
        answers = await self.peers.each("GET", "/api/history")
        mine = self.history.rendered

        def dump() -> bytes:
            total = json.loads(mine)
            nodes: list[dict[str, Any]] = [{"id": self.core.membership.my_id}]
            for answer in answers:
                try:
                    if answer.status != 200:
                        raise ValueError(answer.error or f"HTTP {answer.status}")
                    total = merge([total, answer.value])
                    nodes.append({"id": answer.peer.id})
                except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:  # a peer's answer of another shape
                    nodes.append({"id": answer.peer.id, "error": str(e) or type(e).__name__})
            return json.dumps({"history": total, "nodes": nodes}).encode()

        return await trio.to_thread.run_sync(dump)

    @staticmethod
    def _json(status: int, value: Any) -> tuple[int, str, bytes]:
        return status, "application/json", json.dumps(value, default=_plain).encode()


def _addr(stream: trio.SocketStream, local: bool) -> str:
    try:
        host, port = (stream.socket.getsockname() if local else stream.socket.getpeername())[:2]
    except OSError:
        return "?:0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _body_field(body: bytes, name: str, allowed: tuple[str, ...], default: str | None = None) -> str | None:
    """The field `name` of a JSON object body (`default` when the body or
    the field is missing), or None when it is not one of `allowed`."""
    try:
        value = json.loads(body or b"{}").get(name, default)
    except (ValueError, AttributeError, RecursionError):  # not JSON, not an object, nested too deep
        return None
    return value if value in allowed else None


def _dead_letter_options(fields: dict[str, Any], theirs: tuple[str, ...]) -> list[bytes] | str:
    """DEADLETTER's words for the filters (from, error, since, until) and a
    count in a JSON body or a query string, or what is wrong; the fields in
    `theirs` are the caller's."""
    words: list[bytes] = []
    for key, value in fields.items():
        if key in theirs:
            continue
        if key in ("from", "error"):
            if not (isinstance(value, str) and value):
                return f"{key} must be a name"
        elif key in ("since", "until", "count"):
            if not str(value).isdigit():
                return f"{key} must be a non-negative integer"
        else:
            return f"unknown field {key!r}"
        words += [key.upper().encode(), str(value).encode()]
    return words
def _cross_site(headers: dict[bytes, bytes]) -> str:
    """Why a state-changing request may come from another site's page ("":
    it cannot).  A page may POST `text/plain` or a form anywhere without
    asking first; a JSON POST to another origin needs a CORS preflight this
    port never grants.  So: `Content-Type: application/json`, and an
    `Origin` (browsers send it with every POST) naming this host and port."""
    media = headers.get(b"content-type", b"").partition(b";")[0].strip().lower()
    if media != b"application/json":
        return "a state-changing request must be Content-Type: application/json"
    origin = headers.get(b"origin")
    if origin is None:  # not a browser's (curl, a script, a peer node forwarding a requeue)
        return ""
    try:
        netloc = urlsplit(origin.decode("latin-1")).netloc
    except ValueError:  # ("http://[x": not an address)
        netloc = ""
    if not netloc or netloc.lower() != headers.get(b"host", b"").decode("latin-1").lower():
        return "a state-changing request must come from the dashboard's own origin"
    return ""


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
