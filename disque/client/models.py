"""The typed results of the client's commands: frozen dataclasses built from
the replies (`Job` from GETJOB and QPEEK, `JobInfo` from SHOW, `QueueStats`
from QSTAT, `Hello` and its `NodeInfo`s from HELLO), and the converters the
command methods hand to `_Base._command`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from disque.client.protocol import Address, T, _build, _pairs, _text


@dataclass(frozen=True, slots=True)
class Job:
    """A job as GETJOB or QPEEK returns it; the counters are None when not asked for."""

    id: str
    queue: str
    body: bytes
    nacks: int | None = None
    additional_deliveries: int | None = None
    priority: int | None = None  # QPEEK's, for a job of another priority than the default (5)
    key: str | None = None  # ADDJOB KEY (docs/keys.md), None without one
    # The results of the jobs this one was added AFTER, by ID (None: kept by no one), for a worker's
    # handler registered with `parent_results=True`; None otherwise (`Client.parent_results`).
    parent_results: dict[str, bytes | None] | None = None

    @property
    def deliveries(self) -> int | None:
        """Deliveries so far, this one included, as Disque counts them (None without counters)."""
        if self.nacks is None or self.additional_deliveries is None:
            return None
        return self.nacks + self.additional_deliveries + 1

    @classmethod
    def from_entry(cls, entry: Sequence[Any]) -> Job:
        queue, job_id, body, *counters = entry
        pairs = _pairs(counters)
        if "key" in pairs:
            pairs["key"] = _text(pairs["key"])
        return cls(_text(job_id), _text(queue), body, **pairs)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """SHOW: everything a node knows about a job (times in s, `*_within` in ms)."""

    id: str
    queue: str | None
    state: str
    repl: int
    ttl: int
    ctime: int
    delay: int
    retry: int
    nacks: int
    additional_deliveries: int
    nodes_delivered: list[str]
    nodes_confirmed: list[str]
    next_requeue_within: int | None
    next_awake_within: int | None
    body: bytes | None
    priority: int = 5  # ADDJOB PRIORITY (SHOW gives it when it is not the default)
    dead_letter_of: str | None = None  # a dead letter's original job ID
    dead_letter_from: str | None = None  # ... and the queue it came from
    # The last failure a consumer reported (NACK ... ERROR); None without one.
    error_type: str | None = None
    error_message: str | None = None
    error_traceback: str | None = None
    error_host: str | None = None
    error_pid: int | None = None
    error_time: int | None = None  # unix ms when a node recorded it
    key: str | None = None  # ADDJOB KEY (docs/keys.md), None without one
    # ADDJOB ... AFTER (docs/workflows.md): every parent, and those still waited for; BATCH.
    after: list[str] = field(default_factory=list)
    waits_for: list[str] = field(default_factory=list)
    batch: str | None = None

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> JobInfo:
        texts = ("id", "queue", "state", "dead_letter_of", "dead_letter_from", "error_type", "error_message", "error_traceback", "error_host", "key", "batch")
        return _build(cls, reply, texts, ("nodes_delivered", "nodes_confirmed", "after", "waits_for"))


class JobHandle(str):
    """A job's ID as `add_job` returns it, which also reads the job's result
    through the client that added it, as Celery's AsyncResult does:
    `result` is RESULT (None while there is none), `wait(timeout)` blocks
    until the job is acknowledged and returns its result (WAITJOB ...
    WITHRESULTS; `TimeoutError` when it is not, in time).  With an
    `AsyncClient` both are awaited (`await handle.result`).  In every other
    way it is the ID string (a `str`; pickled, a plain one)."""

    client: Any

    def __new__(cls, job_id: str, client: Any) -> JobHandle:
        handle = super().__new__(cls, job_id)
        handle.client = client
        return handle

    @property
    def id(self) -> str:
        return str(self)

    @property
    def result(self) -> Any:
        return self.client.result(self.id)

    def wait(self, timeout: float | None = None) -> Any:
        """The result once the job is acknowledged, waiting `timeout` seconds at most (None: for ever)."""
        return self.client.wait_result(self.id, timeout_ms=None if timeout is None else max(1, round(timeout * 1000)))

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (self.id,))


@dataclass(frozen=True, slots=True)
class QueueStats:
    """QSTAT."""

    name: str
    len: int
    age: int
    idle: int
    blocked: int
    import_from: list[str]
    import_rate: int
    jobs_in: int
    jobs_out: int
    pause: str

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> QueueStats:
        return _build(cls, reply, ("name", "pause"), ("import_from",))


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """QKEYS: the keys with jobs queued in a queue on one node, its keyed
    jobs, and the busiest keys with their jobs, most first."""

    keys: int
    jobs: int
    busiest: list[tuple[str, int]]

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> QueueKeys:
        values = _pairs(reply)
        pairs = values["busiest"]
        return cls(values["keys"], values["jobs"], [(_text(pairs[i]), pairs[i + 1]) for i in range(0, len(pairs), 2)])


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    host: str  # empty while the node does not know its own address
    port: int
    priority: int  # 1 ok, 5 no link, 10 PFAIL, 100 FAIL or leaving

    @property
    def address(self) -> Address:
        return (self.host, self.port)


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    node_id: str
    nodes: list[NodeInfo]  # best priority first

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Hello:
        version, node_id, *entries = reply
        nodes = [NodeInfo(_text(i), _text(h), int(p), int(pr)) for i, h, p, pr, *_zone in entries]
        return cls(version, _text(node_id), sorted(nodes, key=lambda n: n.priority))

    def by_prefix(self, prefix: str) -> NodeInfo | None:
        return next((n for n in self.nodes if n.id.startswith(prefix)), None)


def _jobs(reply: list[Any] | None) -> list[Job]:
    return [Job.from_entry(entry) for entry in reply or ()]


def _optional(build: Callable[[Any], T]) -> Callable[[Any], T | None]:
    return lambda reply: None if reply is None else build(reply)


def _same(reply: Any) -> Any:
    return reply
