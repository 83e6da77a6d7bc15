"""The typed results of the client's commands: frozen dataclasses built from
the replies (`Job` from GETJOB and QPEEK, `JobInfo` from SHOW, `QueueStats`
from QSTAT, `Hello` and its `NodeInfo`s from HELLO), and the converters the
command methods hand to `_Base._command`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> JobInfo:
        texts = ("id", "queue", "state", "dead_letter_of", "dead_letter_from", "error_type", "error_message", "error_traceback", "error_host", "key")
        return _build(cls, reply, texts, ("nodes_delivered", "nodes_confirmed"))


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
