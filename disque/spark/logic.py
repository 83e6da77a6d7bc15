"""Decisions of the Spark connector, with no I/O and no Spark import.

Everything here is plain data and pure functions, so it is unit-tested
without a SparkSession or a server (tests/inprocess/test_spark_logic.py):

* option parsing for the writers (`WriteOptions`) and readers (`ReadOptions`);
* the streaming offset (`Offset`): a sequence number plus the IDs of the jobs
  the batch ending at it took with GETJOB, grouped by the node that delivered
  them, so that a replayed batch can be rebuilt and acknowledged;
* `AckLedger`: which batches were acknowledged already, so ACKs sent both from
  `latestOffset(start)` and from `commit(end)` go out once per reader;
* `Budget`: the job count `Trigger.AvailableNow` is allowed to read;
* `event_key` / `event_of`: how an offset names an event read as a consumer
  group (option `group`: QGET ... EX, QACK on commit);
* how rows become job bodies (`Body`), how a batch is split into partitions
  (`split`), and the ADDJOB / ENQUEUE / ACKJOB argument lists (`addjob_args`,
  `chunks`).
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_NODES = "127.0.0.1:7711"
DEFAULT_TTL = 86400  # the server's default TTL, in seconds
DEFAULT_MAX_JOBS_PER_TRIGGER = 1000
DEFAULT_NUM_PARTITIONS = 2
DEFAULT_POLL_TIMEOUT_MS = 100
DEFAULT_GROUP_ACK_TIMEOUT = 300  # seconds: a consumer group's events stay in progress this long per batch
COMMAND_CHUNK = 1000  # IDs per ENQUEUE / ACKJOB, commands per pipelined round trip
OFFSET_VERSION = 1

# The rows every reader produces, in this order (`ctime` is null in streams:
# GETJOB does not return it).
COLUMNS = ("queue", "id", "body", "nacks", "additional_deliveries", "ctime")
SCHEMA = "queue string, id string, body binary, nacks long, additional_deliveries long, ctime timestamp"


class OptionError(ValueError):
    """An option has a wrong value, or a required one is missing."""


# --------------------------------------------------------------------------
# Options


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Spark passes a case-insensitive dict; plain dicts (tests) are matched case-insensitively too."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name!r} must be >= {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"option {name!r} must be true or false, got {raw!r}")


def _names(raw: str | None) -> list[str]:
    return [part.strip() for part in (raw or "").split(",") if part.strip()]


def parse_nodes(options: Mapping[str, str]) -> list[str]:
    """`nodes` ("host:port,host:port"), default 127.0.0.1:7711."""
    nodes = _names(_get(options, "nodes") or DEFAULT_NODES)
    for node in nodes:
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise OptionError(f"option 'nodes': {node!r} is not host:port")
    return nodes


@dataclass(frozen=True)
class WriteOptions:
    """What the batch and streaming writers need, parsed once on the driver."""

    nodes: list[str]
    queue: str | None  # the default queue
    queue_column: str | None  # route each row by this column
    body_column: str | None  # None: the row as JSON
    replicate: int | None
    minrepl: int | None
    retry: int | None
    ttl: int | None
    delay: int | None
    maxlen: int | None
    asynchronous: bool
    timeout_ms: int
    transactional: bool
    password: str | None
    checkpoint: str | None = None  # streaming sinks: the query's checkpoint location
    max_job_size: int = 64 << 20  # the nodes' max-job-size: a bigger row is refused before it is sent

    @classmethod
    def parse(cls, options: Mapping[str, str], columns: Sequence[str]) -> WriteOptions:
        queue = _get(options, "queue") or None
        queue_column = _get(options, "queueColumn") or None
        if queue_column is not None and queue_column not in columns:
            raise OptionError(f"option 'queueColumn': no column {queue_column!r} in {list(columns)}")
        if queue is None and queue_column is None:
            raise OptionError("set option 'queue' (or 'queueColumn' to route rows to several queues)")
        body_column = _get(options, "bodyColumn")
        if body_column is None:
            body_column = "body" if "body" in columns else None
        elif body_column == "":
            body_column = None  # explicitly: serialize whole rows
        elif body_column not in columns:
            raise OptionError(f"option 'bodyColumn': no column {body_column!r} in {list(columns)}")
        ttl = _int(options, "ttl", None, 1)
        delay = _int(options, "delay", None, 0)
        if ttl is not None and delay is not None and delay >= ttl:
            raise OptionError(f"option 'delay' ({delay}) must be smaller than 'ttl' ({ttl})")
        replicate = _int(options, "replicate", None, 1)
        retry = _int(options, "retry", None, 0)
        if retry == 0 and replicate != 1:
            raise OptionError("retry 0 (at-most-once) needs replicate 1")
        return cls(
            nodes=parse_nodes(options),
            queue=queue,
            queue_column=queue_column,
            body_column=body_column,
            replicate=replicate,
            minrepl=_int(options, "minrepl", None, 1),
            retry=retry,
            ttl=ttl,
            delay=delay,
            maxlen=_int(options, "maxlen", None, 1),
            asynchronous=_bool(options, "async", False),
            timeout_ms=_int(options, "timeout", 5000, 0) or 0,
            transactional=_bool(options, "transactional", True),
            password=_get(options, "password") or None,
            checkpoint=_get(options, "checkpointLocation") or None,
            max_job_size=_int(options, "maxJobSize", 64 << 20, 1) or 0,
        )

    @property
    def hold_delay(self) -> int | None:
        """The DELAY that keeps a job out of its queue until the write commits.

        None when the write cannot be held: not transactional, a user DELAY
        (then the job shows up after that delay whatever happens; abort still
        removes it), or a TTL too short to hold anything."""
        if not self.transactional or self.delay is not None:
            return None
        hold = (self.ttl or DEFAULT_TTL) - 1
        return hold if hold >= 1 else None

    def needs_working(self, cluster_size: int) -> bool:
        """WORKING before ENQUEUE at commit, so that replicas postpone their
        requeue by RETRY (they were told DELAY+RETRY, i.e. never): without it a
        committed job whose node then fails would wait on replicas until TTL."""
        return cluster_size > 1 and self.replicate != 1 and self.retry != 0


def addjob_args(opts: WriteOptions, queue: str, body: bytes, delay: int | None) -> list[Any]:
    """ADDJOB queue body timeout [REPLICATE n] [MINREPL m] [DELAY s] [RETRY s] [TTL s] [MAXLEN n] [ASYNC];
    a body over `maxJobSize` fails the write before anything is sent."""
    if len(body) > opts.max_job_size:
        raise ValueError(f"Job body of {len(body)} bytes is larger than max-job-size ({opts.max_job_size} bytes): not sent")
    args: list[Any] = ["ADDJOB", queue, body, opts.timeout_ms]
    for name, value in (("REPLICATE", opts.replicate), ("MINREPL", opts.minrepl), ("DELAY", delay),
                        ("RETRY", opts.retry), ("TTL", opts.ttl), ("MAXLEN", opts.maxlen)):  # fmt: skip
        if value is not None:
            args += [name, value]
    if opts.asynchronous:
        args.append("ASYNC")
    return args


@dataclass(frozen=True)
class ReadOptions:
    nodes: list[str]
    queues: list[str]  # batch reads: empty means every queue
    max_jobs_per_trigger: int
    num_partitions: int
    poll_timeout_ms: int
    discover: bool  # every node of the cluster (HELLO), not only those in `nodes`
    password: str | None
    group: str | None = None  # streams: read the queues' events as this consumer group (QGET/QACK)
    group_ack_timeout: int = DEFAULT_GROUP_ACK_TIMEOUT  # QGET's EX: seconds before an unacknowledged event is redo
    text_bodies: bool = False  # option bodies=string: the body column as UTF-8 text

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> ReadOptions:
        queues = _names(_get(options, "queues")) or _names(_get(options, "queue"))
        if streaming and not queues:
            raise OptionError("set option 'queues' (comma-separated) to consume from")
        group = _get(options, "group") or None
        if group is not None and not streaming:
            raise OptionError("option 'group' is for streaming reads (readStream)")
        return cls(
            group=group,
            group_ack_timeout=_int(options, "groupAckTimeout", DEFAULT_GROUP_ACK_TIMEOUT, 1) or 1,
            nodes=parse_nodes(options),
            queues=list(dict.fromkeys(queues)),
            max_jobs_per_trigger=_int(options, "maxJobsPerTrigger", DEFAULT_MAX_JOBS_PER_TRIGGER, 1) or 1,
            num_partitions=_int(options, "numPartitions", DEFAULT_NUM_PARTITIONS, 1) or 1,
            poll_timeout_ms=_int(options, "pollTimeout", DEFAULT_POLL_TIMEOUT_MS, 0) or 0,
            discover=_bool(options, "discover", True),
            password=_get(options, "password") or None,
            text_bodies=text_bodies(options),
        )

    def body(self, raw: bytes | None) -> bytes | str | None:
        """A job's body as the `body` column holds it (invalid UTF-8 as U+FFFD with bodies=string)."""
        return raw.decode("utf-8", "replace") if self.text_bodies and raw is not None else raw


def text_bodies(options: Mapping[str, str]) -> bool:
    """Option `bodies`: "binary" (the default, like Kafka's value) or "string"."""
    value = (_get(options, "bodies") or "binary").lower()
    if value not in ("binary", "string"):
        raise OptionError(f"option 'bodies' must be 'binary' or 'string', not {value!r}")
    return value == "string"


def read_schema(options: Mapping[str, str]) -> str:
    """The rows a reader returns: `SCHEMA`, with a string body for bodies=string."""
    return SCHEMA.replace("body binary", "body string") if text_bodies(options) else SCHEMA


def projection(columns: Sequence[str]) -> list[int]:
    """Positions in `COLUMNS` of the columns a (user-given) schema asks for."""
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise OptionError(f"unknown column(s) {unknown}: a Disque source provides {list(COLUMNS)}")
    return [COLUMNS.index(c) for c in columns]


# --------------------------------------------------------------------------
# Job bodies


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"cannot serialize {type(value).__name__} as JSON")


def row_json(row: Mapping[str, Any]) -> bytes:
    """A row as compact JSON (binary as base64, times ISO 8601, decimals as strings)."""
    return json.dumps(row, default=_json_default, separators=(",", ":"), ensure_ascii=False).encode()


def body_bytes(value: Any, column: str) -> bytes:
    """The job body from a string or binary column value."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if value is None:
        raise ValueError(f"column {column!r} is null: a job needs a body")
    raise TypeError(f"column {column!r} must be string or binary, got {type(value).__name__}")


def row_queue(value: Any, default: str | None, column: str) -> str:
    if value is None or value == "":
        if default is None:
            raise ValueError(f"column {column!r} is null and no default 'queue' option is set")
        return default
    if not isinstance(value, str):
        raise TypeError(f"column {column!r} must be a string, got {type(value).__name__}")
    return value


def jobs_to_add(opts: WriteOptions, records: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, bytes]]:
    """(queue, body) for each record (a column-name -> value mapping)."""
    for record in records:
        queue = row_queue(record[opts.queue_column], opts.queue, opts.queue_column) if opts.queue_column else opts.queue
        assert queue is not None
        if opts.body_column is not None:
            body = body_bytes(record[opts.body_column], opts.body_column)
        else:
            body = row_json(record)
        yield queue, body


# --------------------------------------------------------------------------
# Streaming offsets


@dataclass(frozen=True)
class Offset:
    """The end of a micro-batch: its number and the jobs it took, by node.

    `jobs` maps "host:port" of the node that delivered them (where they are
    acknowledged, and where SHOW finds them first on replay) to job IDs."""

    seq: int = 0
    jobs: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"v": OFFSET_VERSION, "seq": self.seq, "jobs": {k: list(v) for k, v in self.jobs.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Offset:
        version = data.get("v", OFFSET_VERSION)
        if version != OFFSET_VERSION:
            raise ValueError(f"unknown Disque offset version {version!r}")
        jobs = data.get("jobs") or {}
        if not isinstance(jobs, Mapping) or not all(isinstance(v, list) for v in jobs.values()):
            raise ValueError(f"malformed Disque offset: {dict(data)!r}")
        return cls(int(data["seq"]), {str(k): [str(i) for i in v] for k, v in jobs.items()})

    @property
    def count(self) -> int:
        return sum(len(ids) for ids in self.jobs.values())

    def ids(self) -> list[str]:
        return [i for ids in self.jobs.values() for i in ids]

    def following(self, taken: Iterable[tuple[str, str]]) -> Offset:
        """The offset after this one for the (node, job ID) pairs just taken."""
        jobs: dict[str, list[str]] = {}
        for node, job_id in taken:
            jobs.setdefault(node, []).append(job_id)
        return Offset(self.seq + 1, jobs)


class AckLedger:
    """Which batch ends were acknowledged by this reader.

    A batch's jobs are ACKed once Spark has completed it: when Spark asks for
    `latestOffset(start)` (called only after the batch ending at `start`
    completed) or in `commit(end)`.  Both may name the same offset; sequence
    numbers only grow, so remembering the highest one acknowledged suffices."""

    def __init__(self) -> None:
        self.acked_seq = -1

    def due(self, offset: Offset) -> bool:
        return offset.seq > self.acked_seq and offset.count > 0

    def done(self, offset: Offset) -> None:
        self.acked_seq = max(self.acked_seq, offset.seq)


class Budget:
    """Trigger.AvailableNow: read at most what was queued when the query started."""

    def __init__(self, total: int | None = None) -> None:
        self.remaining = total  # None: unbounded

    def allow(self, wanted: int) -> int:
        return wanted if self.remaining is None else max(0, min(wanted, self.remaining))

    def spend(self, taken: int) -> None:
        if self.remaining is not None:
            self.remaining = max(0, self.remaining - taken)


@dataclass(frozen=True)
class Taken:
    """Jobs one `latestOffset` took: (node that delivered it, job ID) pairs and
    the rows Spark will see for them, in the same order."""

    jobs: list[tuple[str, str]]
    rows: list[tuple[Any, ...]]


class StreamBook:
    """The stream source's state between Spark's calls (in the source runner).

    I/O is injected: `take(n)` consumes up to n jobs (GETJOB) and `ack(offset)`
    acknowledges the jobs listed in an offset.  The rules:

    * `latest(start, n)`: the batch ending at `start` has completed, so its
      jobs are ACKed first; then up to n jobs are taken and become the next
      offset.  Nothing taken: `start` itself (no new batch).  Asked again with
      the same `start` (no batch ran in between): the same answer, no second
      GETJOB.
    * `plan(start, end)`: the rows taken for `end` when this reader took them,
      otherwise (a replay after a restart) the IDs in `end`, to be fetched
      again with SHOW.
    * `commit(end)`: ACK too (idempotent with `latest`).
    """

    def __init__(self, take: Callable[[int], Taken], ack: Callable[[Offset], None]) -> None:
        self._take = take
        self._ack = ack
        self.ledger = AckLedger()
        self.budget = Budget()
        self.batches: dict[int, tuple[Offset, list[tuple[Any, ...]]]] = {}  # seq -> (offset, rows taken)
        self.planned: tuple[str, dict[str, Any]] | None = None

    def latest(self, start: Mapping[str, Any], wanted: int) -> dict[str, Any]:
        begin = Offset.from_json(start)
        self.acknowledge(begin)
        key = json.dumps(start, sort_keys=True)
        if self.planned is not None and self.planned[0] == key:
            return self.planned[1]
        wanted = self.budget.allow(wanted)
        if wanted <= 0:
            return dict(start)
        taken = self._take(wanted)
        if not taken.jobs:
            return dict(start)
        self.budget.spend(len(taken.jobs))
        end = begin.following(taken.jobs)
        self.batches[end.seq] = (end, taken.rows)
        self.planned = (key, end.to_json())
        return self.planned[1]

    def plan(self, start: Mapping[str, Any], end: Mapping[str, Any], parts: int
             ) -> tuple[list[list[tuple[Any, ...]]], list[list[tuple[str, list[str]]]]]:  # fmt: skip
        """(row slices, []) for a batch taken here, ([], ID slices) for a replay."""
        first, last = Offset.from_json(start), Offset.from_json(end)
        if last.seq <= first.seq or not last.count:
            return [], []
        stored = self.batches.get(last.seq)
        if stored is not None and stored[0].jobs == last.jobs:
            return split(stored[1], parts), []
        return [], split_ids(last.jobs, parts)

    def commit(self, end: Mapping[str, Any]) -> None:
        self.acknowledge(Offset.from_json(end))

    def acknowledge(self, offset: Offset) -> None:
        if self.ledger.due(offset):
            self._ack(offset)
            self.ledger.done(offset)
        for seq in [s for s in self.batches if s <= offset.seq]:
            del self.batches[seq]


def event_key(queue: str, event_id: str) -> str:
    """How an offset names an event read as a consumer group: QACK needs its
    queue too (event IDs are digits, so the first "@" splits them)."""
    return f"{event_id}@{queue}"


def event_of(key: str) -> tuple[str, str]:
    """(queue, event ID) of an `event_key`."""
    event_id, _, queue = key.partition("@")
    return queue, event_id


def split(items: Sequence[T], parts: int) -> list[list[T]]:
    """`items` in at most `parts` contiguous, non-empty, near-equal slices."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            out.append(list(items[start:end]))
        start = end
    return out


def split_ids(jobs: Mapping[str, Sequence[str]], parts: int) -> list[list[tuple[str, list[str]]]]:
    """An offset's (node, IDs) split into at most `parts` partitions of similar size."""
    pairs = [(node, job_id) for node, ids in jobs.items() for job_id in ids]
    out = []
    for piece in split(pairs, parts):
        grouped: dict[str, list[str]] = {}
        for node, job_id in piece:
            grouped.setdefault(node, []).append(job_id)
        out.append(list(grouped.items()))
    return out


def chunks(items: Sequence[T], size: int = COMMAND_CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def sink_marker_path(checkpoint: str | None) -> str | None:
    """Where a streaming sink records its last committed batch: inside the
    query's checkpoint, when that is a local directory (None otherwise)."""
    if not checkpoint:
        return None
    if checkpoint.startswith("file://"):
        checkpoint = checkpoint[len("file://") :]
    elif checkpoint.startswith("file:"):
        checkpoint = checkpoint[len("file:") :]
    elif "://" in checkpoint or not checkpoint.startswith("/"):
        return None  # a distributed file system, or relative to a directory we do not know
    return checkpoint.rstrip("/") + "/disque-sink/last-committed-batch"


def replayed(last_committed: int | None, batch_id: int) -> bool:
    """A sink batch already committed once (Spark replays the last batch when
    it stopped between our commit and its own commit log)."""
    return last_committed is not None and batch_id <= last_committed


def ctime_datetime(ctime_ns: int | None) -> _dt.datetime | None:
    """A job's ctime (ns since the epoch, SHOW/JSCAN) as an aware UTC datetime."""
    if not ctime_ns:
        return None
    seconds, ns = divmod(int(ctime_ns), 1_000_000_000)
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc) + _dt.timedelta(microseconds=ns // 1000)
