"""`DisqueDataSource`: Disque as a Spark (4.x) Python data source, name "disque".

Where each callback runs matters (none runs in the user's driver Python):
planner workers build readers and plan batch reads; one long-lived runner per
streaming query calls `latestOffset`/`partitions`/`commit`; executors call
`read` and `write`; short-lived workers call the writers' `commit`/`abort`.
Objects are pickled between them, so connections are opened lazily, inside
those calls, through `disque.spark._io`.

Writes are transactional: `write` adds every job with a DELAY that keeps it
out of its queue (TTL - 1 s), `commit` ENQUEUEs the IDs (after WORKING, so
that replicas requeue it after RETRY as usual), `abort` ACKs them.  A failed
or retried task therefore leaves no visible job behind.  A streaming sink
also records its last committed batch in the query's checkpoint (when it is
local): a batch Spark replays after a crash between our commit and its own
commit log is discarded instead of being queued twice.

The stream consumes with GETJOB (NOHANG on every node of the cluster, then
a short blocking poll) in `latestOffset`; the IDs taken go into the offset,
grouped by the node that delivered them.  They are ACKed there once Spark
has completed the batch, i.e. in the next `latestOffset(start)` (Spark calls
it only after the batch ending at `start` completed) and in `commit(end)`.
A replayed batch is rebuilt from the IDs in its offset with SHOW.  The
bookkeeping itself is `disque.spark.logic.StreamBook` (no I/O, unit-tested).

With option `group`, the stream reads the queues' events as that consumer
group (docs/consumer-groups.md): QGET ... EX groupAckTimeout on every node
instead of GETJOB, QACK of the batch's events instead of ACKJOB.  An event
cannot be fetched by its ID, so a replayed batch reads nothing: its events
come back as redo once their ack timeout passes (at-least-once).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from disque.client import DisqueConnectionError, Job
from disque.spark import _io
from disque.spark.logic import (
    Budget,
    Offset,
    OptionError,
    ReadOptions,
    StreamBook,
    Taken,
    WriteOptions,
    addjob_args,
    ctime_datetime,
    event_key,
    event_of,
    jobs_to_add,
    projection,
    read_schema,
    replayed,
    sink_marker_path,
)

log = logging.getLogger("disque.spark")

GETJOB_CHUNK = 10_000  # jobs per GETJOB
READ_ALL_CAP = 1_000_000  # jobs per batch when Spark asks for everything available


class DisqueDataSource(DataSource):
    """Read, consume and produce Disque jobs.

    Rows read: queue string, id string, body binary (string with option
    bodies=string), nacks long, additional_deliveries long, ctime timestamp
    (null when streaming)."""

    @classmethod
    def name(cls) -> str:
        return "disque"

    def schema(self) -> str:
        return read_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return DisqueBatchReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DisqueStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DisqueBatchWriter:
        if overwrite:
            raise OptionError("a Disque queue cannot be overwritten: write with mode('append')")
        return DisqueBatchWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DisqueStreamWriter:
        return DisqueStreamWriter(dict(self.options), schema)


def _project(columns: list[int], record: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(record[i] for i in columns)


# --------------------------------------------------------------------------
# Batch read: a snapshot of queued jobs, nothing consumed


@dataclass
class NodeScan(InputPartition):
    """JSCAN of one node (for these queues; empty: all of them)."""

    address: str
    queues: list[str]

    def __post_init__(self) -> None:
        super().__init__(self.address)


class DisqueBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = ReadOptions.parse(options, streaming=False)
        self.columns = projection(schema.fieldNames())

    def partitions(self) -> Sequence[InputPartition]:
        nodes = _io.discover(self.opts.nodes, self.opts.password) if self.opts.discover else self.opts.nodes
        return [NodeScan(address, self.opts.queues) for address in nodes]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, NodeScan)
        with _io.Conn(partition.address, self.opts.password) as conn:
            for queue in partition.queues or [None]:
                for job in _io.jscan(conn, queue):
                    record = (job.queue, job.id, self.opts.body(job.body), job.nacks, job.additional_deliveries, ctime_datetime(job.ctime))
                    yield _project(self.columns, record)


# --------------------------------------------------------------------------
# Streaming read: GETJOB per micro-batch, ACK after the batch completed


@dataclass
class TakenJobs(InputPartition):
    """Jobs the source runner took with GETJOB, shipped with the partition."""

    rows: list[tuple[Any, ...]]

    def __post_init__(self) -> None:
        super().__init__(len(self.rows))


@dataclass
class ReplayJobs(InputPartition):
    """A replayed batch: IDs by node, bodies fetched again with SHOW."""

    jobs: list[tuple[str, list[str]]]
    cluster: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(sum(len(ids) for _, ids in self.jobs))


class DisqueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = ReadOptions.parse(options, streaming=True)
        self.columns = projection(schema.fieldNames())
        self._setup()

    def _setup(self) -> None:
        self._conns: dict[str, _io.Conn] = {}
        self._cluster: list[str] | None = None
        self._turn = 0
        self._book = StreamBook(self._take, self._ack)

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "columns": self.columns}  # no connection, no bookkeeping

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts, self.columns = state["opts"], state["columns"]
        self._setup()

    # -- I/O of the source runner: one connection per node, kept between calls

    def _nodes(self) -> list[str]:
        if self._cluster is None:
            self._cluster = _io.discover(self.opts.nodes, self.opts.password) if self.opts.discover else list(self.opts.nodes)
        return self._cluster

    def _connection(self, address: str) -> _io.Conn:
        conn = self._conns.get(address)
        if conn is None:
            timeout = self.opts.poll_timeout_ms / 1000 + 30
            conn = self._conns[address] = _io.Conn(address, self.opts.password, socket_timeout=timeout)
        return conn

    def _drop(self, address: str) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()
        self._cluster = None  # look the cluster up again: a node may have left

    def _take(self, wanted: int) -> Taken:
        """GETJOB NOHANG on every node in turn until `wanted` jobs or all are
        empty; when none had any, wait up to pollTimeout on one of them (the
        node then also asks the others for jobs: federation)."""
        nodes = self._nodes()
        self._turn = (self._turn + 1) % len(nodes)
        order = nodes[self._turn :] + nodes[: self._turn]
        jobs: list[tuple[str, Any]] = []
        failures: list[str] = []
        for address in order:
            if len(jobs) >= wanted:
                break
            self._getjobs(address, wanted, 0, jobs, failures)
        if not jobs and self.opts.poll_timeout_ms > 0 and len(failures) < len(order):
            address = next(a for a in order if a in self._conns)
            self._getjobs(address, wanted, self.opts.poll_timeout_ms, jobs, failures)
        if not jobs and len(failures) >= len(order):
            raise DisqueConnectionError("no Disque node reachable (" + "; ".join(failures) + ")")
        shown = (lambda key: event_of(key)[1]) if self.opts.group is not None else (lambda job_id: job_id)  # rows: the event ID
        rows = [_project(self.columns, (j.queue, shown(j.id), self.opts.body(j.body), j.nacks, j.additional_deliveries, None)) for _, j in jobs]
        return Taken([(address, j.id) for address, j in jobs], rows)

    def _getjobs(self, address: str, wanted: int, wait_ms: int, out: list[tuple[str, Any]], failures: list[str]) -> None:
        try:
            conn = self._connection(address)
            if self.opts.group is not None:  # events: no wait (QGET answers at once)
                for queue in self.opts.queues:
                    while len(out) < wanted:
                        count = min(wanted - len(out), GETJOB_CHUNK)
                        got = _io.get_events(conn, queue, self.opts.group, count, self.opts.group_ack_timeout)
                        out += [(conn.address, Job(event_key(queue, event), queue, body)) for event, body in got]
                        if len(got) < count:
                            break
                return
            while len(out) < wanted:
                count = min(wanted - len(out), GETJOB_CHUNK)
                got = _io.get_jobs(conn, self.opts.queues, count, wait_ms)
                out += [(conn.address, job) for job in got]
                wait_ms = 0
                if len(got) < count:
                    return
        except DisqueConnectionError as e:  # jobs taken before the failure stay in `out`
            failures.append(str(e))
            self._drop(address)

    def _ack(self, offset: Offset) -> None:
        if self.opts.group is None:
            _io.ack_where_held(offset.jobs, self._nodes(), self.opts.password)
        else:
            events = {address: [event_of(key) for key in keys] for address, keys in offset.jobs.items()}
            _io.ack_events(events, self._nodes(), self.opts.group, self.opts.password)

    # -- Spark's calls

    def initialOffset(self) -> dict[str, Any]:
        return Offset().to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_jobs_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """The budget: jobs queued on every node; or the events the group
        could read, as the node that sees most of them counts them (every
        holder of an event has its progress)."""
        counts = []
        for address in self._nodes():
            try:
                conn = self._connection(address)
                if self.opts.group is None:
                    counts.append(_io.qlen(conn, self.opts.queues))
                else:
                    counts.append(_io.group_backlog(conn, self.opts.queues, self.opts.group))
            except DisqueConnectionError as e:
                log.warning("availableNow: %s", e)
                self._drop(address)
        self._book.budget = Budget(sum(counts) if self.opts.group is None else max(counts, default=0))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if isinstance(limit, ReadMaxRows):
            wanted = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            wanted = READ_ALL_CAP
        else:
            wanted = self.opts.max_jobs_per_trigger
        return self._book.latest(start, wanted)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        rows, replay = self._book.plan(start, end, self.opts.num_partitions)
        if rows:
            return [TakenJobs(part) for part in rows]
        cluster = self._nodes() if replay else []
        return [ReplayJobs(part, cluster) for part in replay]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if isinstance(partition, TakenJobs):
            return iter(partition.rows)
        assert isinstance(partition, ReplayJobs)
        return self._replay(partition)

    def _replay(self, partition: ReplayJobs) -> Iterator[tuple[Any, ...]]:
        if self.opts.group is not None:  # events cannot be fetched by ID: they come back as redo
            log.warning("a replayed batch of consumer group %r: its events are read again once their ack timeout passes", self.opts.group)
            return
        for address, ids in partition.jobs:
            found = {}
            for candidate in [address] + [a for a in partition.cluster if a != address]:
                missing = [i for i in ids if i not in found]
                if not missing:
                    break
                try:
                    with _io.Conn(candidate, self.opts.password) as conn:
                        infos = _io.show(conn, missing)
                except DisqueConnectionError as e:
                    log.warning("replaying a batch: %s", e)
                    continue
                found.update({i.id: i for i in infos if i is not None and i.body is not None})
            for job_id in ids:
                job = found.get(job_id)
                if job is None:
                    log.warning("job %s of a replayed batch is gone (acknowledged or expired)", job_id)
                    continue
                yield _project(self.columns, (job.queue, job.id, self.opts.body(job.body), job.nacks, job.additional_deliveries, None))

    def commit(self, end: dict[str, Any]) -> None:
        self._book.commit(end)

    def stop(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


# --------------------------------------------------------------------------
# Writes: ADDJOB held back by a DELAY, ENQUEUE on commit, ACKJOB on abort


@dataclass
class DisqueCommitMessage(WriterCommitMessage):
    address: str  # the node the jobs were added on
    ids: list[str]
    cluster: list[str]  # every node, for failing over at commit/abort
    held: bool  # added with a holding DELAY: commit must ENQUEUE them
    working: bool  # send WORKING before ENQUEUE (replicas exist)


def _write(opts: WriteOptions, batches: Iterator[Any]) -> DisqueCommitMessage:
    conn = _io.connect_any(opts.nodes, opts.password)
    added: list[str] = []
    try:
        cluster = _io.cluster_addresses(conn)
        hold = opts.hold_delay
        delay = hold if hold is not None else opts.delay
        wanted = [c for c in (opts.queue_column, opts.body_column) if c is not None]
        for batch in batches:
            if not batch.num_rows:
                continue
            records = batch.select(wanted).to_pylist() if opts.body_column is not None else batch.to_pylist()
            commands = [addjob_args(opts, queue, body, delay) for queue, body in jobs_to_add(opts, records)]
            replies = conn.pipeline(commands, raise_errors=False)
            added += [r.decode() for r in replies if isinstance(r, bytes)]
            errors = [r for r in replies if not isinstance(r, bytes)]
            if errors:
                raise errors[0]
        return DisqueCommitMessage(conn.address, added, cluster, hold is not None, opts.needs_working(len(cluster)))
    except BaseException:
        if added:  # this attempt will not be committed: remove what it added
            try:
                conn.pipeline(_io.ack_commands(added))
            except Exception as e:  # noqa: BLE001 - the original error matters more
                log.warning("could not remove %d jobs of a failed write: %s", len(added), e)
        raise
    finally:
        conn.close()


def _messages(messages: list[WriterCommitMessage | None]) -> list[DisqueCommitMessage]:
    return [m for m in messages if isinstance(m, DisqueCommitMessage) and m.ids]


def _commit(opts: WriteOptions, messages: list[WriterCommitMessage | None]) -> None:
    for message in _messages(messages):
        if message.held:
            _io.enqueue_where_held({message.address: message.ids}, message.cluster, opts.password, message.working)


def _abort(opts: WriteOptions, messages: list[WriterCommitMessage | None]) -> None:
    for message in _messages(messages):
        _io.ack_where_held({message.address: message.ids}, message.cluster, opts.password)


class DisqueBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = WriteOptions.parse(options, schema.fieldNames())

    def write(self, iterator: Iterator[Any]) -> DisqueCommitMessage:
        return _write(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.opts, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.opts, messages)


def _read_marker(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def _write_marker(path: str, batch_id: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{batch_id}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class DisqueStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = WriteOptions.parse(options, schema.fieldNames())

    def write(self, iterator: Iterator[Any]) -> DisqueCommitMessage:
        return _write(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        marker = sink_marker_path(self.opts.checkpoint)
        if marker is not None and replayed(_read_marker(marker), batchId):
            log.info("batch %d was committed before: discarding its replayed jobs", batchId)
            _abort(self.opts, messages)
            return
        _commit(self.opts, messages)
        if marker is not None:
            _write_marker(marker, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _abort(self.opts, messages)
