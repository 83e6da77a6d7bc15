"""The Spark connector's decisions, without Spark and without a server."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import subprocess
import sys

import pytest

from disque.spark.logic import (
    COLUMNS,
    AckLedger,
    Budget,
    Offset,
    OptionError,
    ReadOptions,
    StreamBook,
    Taken,
    WriteOptions,
    addjob_args,
    ctime_datetime,
    jobs_to_add,
    projection,
    replayed,
    row_json,
    sink_marker_path,
    split,
    split_ids,
)


def test_pure_parts_do_not_import_spark():
    code = "import sys, disque.spark, disque.spark.logic; assert 'pyspark' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- options


def write_opts(**options: str) -> WriteOptions:
    return WriteOptions.parse({"queue": "q", **options}, ["body", "dest", "n"])


def test_write_options_defaults_and_case_insensitive_names():
    opts = WriteOptions.parse({"QUEUE": "q", "Replicate": "2", "RETRY": "30"}, ["body"])
    assert (opts.nodes, opts.queue, opts.body_column, opts.replicate, opts.retry) == (["127.0.0.1:7711"], "q", "body", 2, 30)
    assert opts.transactional and not opts.asynchronous and opts.timeout_ms == 5000
    assert WriteOptions.parse({"queue": "q"}, ["a", "b"]).body_column is None  # no body column: JSON rows
    assert WriteOptions.parse({"queue": "q", "bodyColumn": ""}, ["body"]).body_column is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "set option 'queue'"),
        ({"queueColumn": "nope"}, "no column 'nope'"),
        ({"queue": "q", "bodyColumn": "nope"}, "no column 'nope'"),
        ({"queue": "q", "ttl": "10", "delay": "10"}, "smaller than 'ttl'"),
        ({"queue": "q", "retry": "0"}, "needs replicate 1"),
        ({"queue": "q", "replicate": "0"}, ">= 1"),
        ({"queue": "q", "ttl": "soon"}, "must be an integer"),
        ({"queue": "q", "async": "maybe"}, "true or false"),
        ({"queue": "q", "nodes": "localhost"}, "not host:port"),
    ],
)
def test_write_options_are_checked_on_the_driver(options, message):
    with pytest.raises(OptionError, match=message):
        WriteOptions.parse(options, ["body"])


def test_hold_delay_keeps_jobs_out_of_queues_until_commit():
    assert write_opts().hold_delay == 86399  # default TTL - 1
    assert write_opts(ttl="600").hold_delay == 599
    assert write_opts(ttl="1").hold_delay is None  # nothing to hold with
    assert write_opts(delay="5").hold_delay is None  # the user's DELAY governs visibility
    assert write_opts(transactional="false").hold_delay is None


def test_working_before_enqueue_only_when_replicas_exist():
    assert write_opts().needs_working(3)
    assert not write_opts().needs_working(1)
    assert not write_opts(replicate="1").needs_working(3)
    assert not write_opts(replicate="1", retry="0").needs_working(3)


def test_addjob_arguments():
    opts = write_opts(replicate="2", retry="30", ttl="600", maxlen="10", timeout="100", **{"async": "true"})
    assert addjob_args(opts, "q", b"x", 599) == [
        "ADDJOB", "q", b"x", 100, "REPLICATE", 2, "DELAY", 599, "RETRY", 30, "TTL", 600, "MAXLEN", 10, "ASYNC",
    ]  # fmt: skip
    assert addjob_args(write_opts(), "q", b"x", None) == ["ADDJOB", "q", b"x", 5000]
    assert addjob_args(write_opts(minrepl="2"), "q", b"x", None) == ["ADDJOB", "q", b"x", 5000, "MINREPL", 2]


def test_a_row_over_max_job_size_fails_the_write_before_it_is_sent():
    assert write_opts().max_job_size == 64 << 20
    with pytest.raises(ValueError, match=r"Job body of 5 bytes is larger than max-job-size \(4 bytes\): not sent"):
        addjob_args(write_opts(maxJobSize="4"), "q", b"hello", None)


def test_read_options():
    opts = ReadOptions.parse({"queues": "a, b,a", "maxJobsPerTrigger": "50", "nodes": "h:1,h:2"}, streaming=True)
    assert (opts.queues, opts.max_jobs_per_trigger, opts.nodes) == (["a", "b"], 50, ["h:1", "h:2"])
    assert ReadOptions.parse({"queue": "a"}, streaming=True).queues == ["a"]
    assert ReadOptions.parse({}, streaming=False).queues == []  # batch read: every queue
    with pytest.raises(OptionError, match="queues"):
        ReadOptions.parse({}, streaming=True)
    with pytest.raises(OptionError, match=">= 1"):
        ReadOptions.parse({"queues": "a", "maxJobsPerTrigger": "0"}, streaming=True)


def test_projection_follows_a_user_schema():
    assert projection(list(COLUMNS)) == list(range(6))
    assert projection(["body", "id"]) == [2, 1]
    with pytest.raises(OptionError, match="unknown column"):
        projection(["value"])


# ---------------------------------------------------------------- bodies


def test_bodies_from_a_column_or_the_whole_row_as_json():
    opts = write_opts()
    assert list(jobs_to_add(opts, [{"body": "héllo"}, {"body": b"\x00\xff"}])) == [("q", "héllo".encode()), ("q", b"\x00\xff")]
    with pytest.raises(ValueError, match="null"):
        list(jobs_to_add(opts, [{"body": None}]))
    with pytest.raises(TypeError, match="string or binary"):
        list(jobs_to_add(opts, [{"body": 3}]))
    as_json = WriteOptions.parse({"queue": "q"}, ["n", "name"])
    [(queue, body)] = jobs_to_add(as_json, [{"n": 1, "name": "ann"}])
    assert (queue, json.loads(body)) == ("q", {"n": 1, "name": "ann"})


def test_json_of_spark_values():
    row = {
        "bin": b"\x01\x02", "ts": dt.datetime(2025, 1, 2, 3, 4, 5), "day": dt.date(2025, 1, 2),
        "dec": decimal.Decimal("1.50"), "nested": {"xs": [1, 2]}, "none": None, "text": "é",
    }  # fmt: skip
    assert json.loads(row_json(row)) == {
        "bin": base64.b64encode(b"\x01\x02").decode(), "ts": "2025-01-02T03:04:05", "day": "2025-01-02",
        "dec": "1.50", "nested": {"xs": [1, 2]}, "none": None, "text": "é",
    }  # fmt: skip


def test_rows_routed_by_a_queue_column():
    opts = WriteOptions.parse({"queueColumn": "dest"}, ["dest", "body"])
    assert [q for q, _ in jobs_to_add(opts, [{"dest": "a", "body": "1"}, {"dest": "b", "body": "2"}])] == ["a", "b"]
    with pytest.raises(ValueError, match="no default 'queue'"):
        list(jobs_to_add(opts, [{"dest": None, "body": "1"}]))
    fallback = WriteOptions.parse({"queueColumn": "dest", "queue": "default"}, ["dest", "body"])
    assert [q for q, _ in jobs_to_add(fallback, [{"dest": None, "body": "1"}])] == ["default"]


# ---------------------------------------------------------------- offsets


def test_offset_round_trips_through_json():
    offset = Offset(3, {"h:1": ["DI1", "DI2"], "h:2": ["DI3"]})
    assert Offset.from_json(json.loads(json.dumps(offset.to_json()))) == offset
    assert offset.count == 3 and offset.ids() == ["DI1", "DI2", "DI3"]
    assert Offset().to_json() == {"v": 1, "seq": 0, "jobs": {}}
    assert offset.following([("h:2", "DI9"), ("h:1", "DI8"), ("h:2", "DI7")]) == Offset(4, {"h:2": ["DI9", "DI7"], "h:1": ["DI8"]})
    with pytest.raises(ValueError, match="version"):
        Offset.from_json({"v": 99, "seq": 1})
    with pytest.raises(ValueError, match="malformed"):
        Offset.from_json({"v": 1, "seq": 1, "jobs": {"h:1": "DI1"}})


def test_ack_ledger_acknowledges_each_batch_once():
    ledger = AckLedger()
    assert not ledger.due(Offset(0))  # nothing in the initial offset
    batch = Offset(1, {"h:1": ["DI1"]})
    assert ledger.due(batch)
    ledger.done(batch)
    assert not ledger.due(batch)
    assert ledger.due(Offset(2, {"h:1": ["DI2"]}))


def test_budget_for_available_now():
    unbounded = Budget()
    assert unbounded.allow(100) == 100
    budget = Budget(25)
    assert budget.allow(10) == 10
    budget.spend(10)
    budget.spend(10)
    assert budget.allow(10) == 5
    budget.spend(7)  # GETJOB may return more than was counted (jobs imported meanwhile)
    assert budget.allow(10) == 0


def test_split_into_partitions():
    assert split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split([1], 4) == [[1]]
    assert split([], 2) == []
    assert split_ids({"a": ["1", "2", "3"], "b": ["4"]}, 2) == [[("a", ["1", "2"])], [("a", ["3"]), ("b", ["4"])]]


def test_ctime_is_nanoseconds():
    assert ctime_datetime(1_700_000_000_123_456_789) == dt.datetime(2023, 11, 14, 22, 13, 20, 123456, dt.timezone.utc)
    assert ctime_datetime(None) is None


def test_sink_marker_only_for_local_checkpoints():
    assert sink_marker_path("/ck/q1/") == "/ck/q1/disque-sink/last-committed-batch"
    assert sink_marker_path("file:///ck") == "/ck/disque-sink/last-committed-batch"
    assert sink_marker_path("file:/ck") == "/ck/disque-sink/last-committed-batch"
    assert sink_marker_path("hdfs://nn/ck") is None
    assert sink_marker_path("relative/ck") is None
    assert sink_marker_path(None) is None
    assert not replayed(None, 0)
    assert replayed(4, 4) and replayed(4, 3) and not replayed(4, 5)


# ---------------------------------------------------------------- the stream's bookkeeping


class FakeQueue:
    """GETJOB and ACKJOB on a list of job IDs, as the source runner's I/O."""

    def __init__(self, n: int, node: str = "h:1") -> None:
        self.queued = [f"DI{i:03d}" for i in range(n)]
        self.node = node
        self.takes: list[int] = []
        self.acked: list[list[str]] = []
        self.fail_ack = False

    def take(self, n: int) -> Taken:
        self.takes.append(n)
        ids, self.queued = self.queued[:n], self.queued[n:]
        return Taken([(self.node, i) for i in ids], [(i.encode(),) for i in ids])

    def ack(self, offset: Offset) -> None:
        if self.fail_ack:
            raise ConnectionError("node down")
        self.acked.append(offset.ids())


def test_each_batch_is_acked_when_spark_asks_for_the_next_one():
    fake = FakeQueue(25)
    book = StreamBook(fake.take, fake.ack)
    start = Offset().to_json()
    first = book.latest(start, 10)
    assert Offset.from_json(first) == Offset(1, {"h:1": [f"DI{i:03d}" for i in range(10)]})
    assert fake.acked == []  # nothing ACKed while batch 1 runs
    second = book.latest(first, 10)  # batch 1 completed
    assert fake.acked == [[f"DI{i:03d}" for i in range(10)]]
    book.commit(first)  # Spark's late commit: already done
    assert len(fake.acked) == 1
    third = book.latest(second, 10)
    assert Offset.from_json(third).count == 5
    idle = book.latest(third, 10)  # empty queue: the same offset, no new batch
    assert idle == third and len(fake.acked) == 3
    assert book.latest(idle, 10) == third and len(fake.acked) == 3  # acked once only


def test_asking_twice_for_the_same_start_takes_jobs_once():
    fake = FakeQueue(30)
    book = StreamBook(fake.take, fake.ack)
    start = Offset().to_json()
    assert book.latest(start, 10) == book.latest(start, 10)
    assert fake.takes == [10]


def test_partitions_ship_taken_rows_or_ids_to_replay():
    fake = FakeQueue(6)
    book = StreamBook(fake.take, fake.ack)
    start = Offset().to_json()
    end = book.latest(start, 6)
    rows, replay = book.plan(start, end, 2)
    assert rows == [[(b"DI000",), (b"DI001",), (b"DI002",)], [(b"DI003",), (b"DI004",), (b"DI005",)]] and replay == []
    assert book.plan(end, end, 2) == ([], [])
    # after a restart, a fresh reader rebuilds the batch from the offset's IDs
    fresh = StreamBook(FakeQueue(0).take, fake.ack)
    rows, replay = fresh.plan(start, end, 2)
    assert rows == [] and replay == [[("h:1", ["DI000", "DI001", "DI002"])], [("h:1", ["DI003", "DI004", "DI005"])]]


def test_restart_acks_the_last_completed_batch_first():
    fake = FakeQueue(0)
    checkpointed = Offset(7, {"h:2": ["DIa", "DIb"]}).to_json()
    book = StreamBook(fake.take, fake.ack)  # a new query run
    assert book.latest(checkpointed, 10) == checkpointed
    assert fake.acked == [["DIa", "DIb"]]


def test_a_failed_ack_is_retried_and_takes_nothing():
    fake = FakeQueue(20)
    book = StreamBook(fake.take, fake.ack)
    first = book.latest(Offset().to_json(), 10)
    fake.fail_ack = True
    with pytest.raises(ConnectionError):
        book.latest(first, 10)
    assert fake.takes == [10]
    fake.fail_ack = False
    book.latest(first, 10)
    assert fake.acked == [[f"DI{i:03d}" for i in range(10)]] and fake.takes == [10, 10]


def test_available_now_reads_only_what_was_queued_at_start():
    fake = FakeQueue(100)
    book = StreamBook(fake.take, fake.ack)
    book.budget = Budget(25)
    offset = Offset().to_json()
    counts = []
    while True:
        nxt = book.latest(offset, 10)
        if nxt == offset:
            break
        counts.append(Offset.from_json(nxt).count)
        offset = nxt
    assert counts == [10, 10, 5]
    assert fake.takes == [10, 10, 5]


def test_cached_rows_are_dropped_once_acked():
    fake = FakeQueue(20)
    book = StreamBook(fake.take, fake.ack)
    first = book.latest(Offset().to_json(), 10)
    assert set(book.batches) == {1}
    book.latest(first, 10)
    assert set(book.batches) == {2}


def test_group_options_and_event_keys():
    from disque.spark.logic import event_key, event_of

    opts = ReadOptions.parse({"queues": "q", "group": "billing", "groupAckTimeout": "60"}, streaming=True)
    assert (opts.group, opts.group_ack_timeout) == ("billing", 60)
    assert ReadOptions.parse({"queues": "q"}, streaming=True).group is None
    with pytest.raises(OptionError, match="streaming"):
        ReadOptions.parse({"queue": "q", "group": "g"}, streaming=False)
    with pytest.raises(OptionError, match="groupAckTimeout"):
        ReadOptions.parse({"queues": "q", "group": "g", "groupAckTimeout": "0"}, streaming=True)
    assert event_of(event_key("orders@eu", "123")) == ("orders@eu", "123")
