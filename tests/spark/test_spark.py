"""The connector in a real local[2] SparkSession against a real node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install '.[spark]')")
pa = pytest.importorskip("pyarrow", reason="the spark extra is not installed (pip install '.[spark]')")

from disque.spark import _io  # noqa: E402
from disque.spark.logic import SCHEMA, OptionError, ReadOptions, WriteOptions, read_schema  # noqa: E402
from disque.spark.source import DisqueStreamWriter, _abort, _write  # noqa: E402


def add(conn: _io.Conn, queue: str, bodies: list[bytes], retry: int = 300) -> list[str]:
    return _io.add_jobs(conn, [["ADDJOB", queue, b, 0, "REPLICATE", 1, "RETRY", retry] for b in bodies])


def state(conn: _io.Conn, job_id: str) -> str | None:
    [info] = _io.show(conn, [job_id])
    return None if info is None else info.state


def live_jobs(conn: _io.Conn, queue: str) -> list[str]:
    """Jobs of `queue` that are not acknowledged (queued, active or held back)."""
    return [j.id for s in ("queued", "active") for j in _io.jscan(conn, queue, s)]


def writer(df: Any, address: str, **options: str) -> Any:
    w = df.write.format("disque").mode("append").option("nodes", address).option("replicate", "1")
    for key, value in options.items():
        w = w.option(key, value)
    return w


# -------------------------------------------------------------------- batch


def test_batch_write_then_snapshot_read(spark, address, conn, queue_name):
    q = queue_name("batch")
    df = spark.range(200).selectExpr("concat('job-', cast(id as string)) as body")
    writer(df, address, queue=q, retry="120", ttl="3600").save()
    assert conn.call("QLEN", q) == 200

    rows = spark.read.format("disque").option("nodes", address).option("queues", q).load().collect()
    assert sorted(r.body for r in rows) == sorted(f"job-{i}".encode() for i in range(200))
    assert {r.queue for r in rows} == {q}
    assert all(r.nacks == 0 and r.additional_deliveries == 0 and r.ctime is not None for r in rows)
    assert len({r.id for r in rows}) == 200
    # a snapshot consumes nothing
    assert conn.call("QLEN", q) == 200
    info = _io.show(conn, [rows[0].id])[0]
    assert (info.retry, info.state) == (120, "queued")
    assert info.ttl > 3500 and info.delay == 3599  # held by a DELAY of TTL - 1 until the write committed


def test_bodies_as_strings(spark, address, conn, queue_name, tmp_path):
    q = queue_name("text")
    add(conn, q, ["héllo".encode(), b"\xff"])
    reader = spark.read.format("disque").option("nodes", address).option("queues", q)
    assert reader.load().schema["body"].dataType.simpleString() == "binary"
    rows = reader.option("bodies", "string").load()
    assert rows.schema["body"].dataType.simpleString() == "string"
    assert sorted(r.body for r in rows.collect()) == sorted(["héllo", "\ufffd"])  # invalid UTF-8 as U+FFFD
    stream = spark.readStream.format("disque").option("nodes", address).option("queues", q).option("bodies", "string").load()
    query = stream.writeStream.format("memory").queryName(q.replace("-", "_")).trigger(availableNow=True) \
        .option("checkpointLocation", str(tmp_path / "cp")).start()
    query.awaitTermination()
    assert sorted(r.body for r in spark.sql(f"select body from {q.replace('-', '_')}").collect()) == sorted(["héllo", "\ufffd"])


def test_the_bodies_option() -> None:
    assert (read_schema({}), read_schema({"bodies": "binary"})) == (SCHEMA, SCHEMA)
    assert read_schema({"Bodies": "STRING"}) == SCHEMA.replace("body binary", "body string")
    opts = ReadOptions.parse({"bodies": "string"}, streaming=False)
    assert (opts.body(b"caf\xc3\xa9"), opts.body(None)) == ("café", None)
    assert ReadOptions.parse({}, streaming=False).body(b"\xff") == b"\xff"
    with pytest.raises(OptionError, match="option 'bodies' must be 'binary' or 'string', not 'text'"):
        ReadOptions.parse({"bodies": "text"}, streaming=False)


def test_binary_bodies_and_json_rows(spark, address, conn, queue_name):
    qb, qj = queue_name("bin"), queue_name("json")
    blobs = [bytes([i, 0, 255, 10]) for i in range(5)]
    writer(spark.createDataFrame([(b,) for b in blobs], "body binary"), address, queue=qb).save()
    assert sorted(j.body for j in _io.jscan(conn, qb)) == sorted(blobs)

    people = spark.createDataFrame([(1, "ann", 2.5), (2, "bob", None)], "n int, name string, score double")
    writer(people, address, queue=qj).save()
    got = sorted((json.loads(j.body) for j in _io.jscan(conn, qj)), key=lambda d: d["n"])
    assert got == [{"n": 1, "name": "ann", "score": 2.5}, {"n": 2, "name": "bob", "score": None}]


def test_multi_queue_routing(spark, address, conn, queue_name):
    a, b = queue_name("route-a"), queue_name("route-b")
    df = spark.range(30).selectExpr(f"if(id % 3 = 0, '{a}', '{b}') as dest", "cast(id as string) as body")
    writer(df, address, queueColumn="dest").save()
    assert (conn.call("QLEN", a), conn.call("QLEN", b)) == (10, 20)
    assert {int(j.body) % 3 for j in _io.jscan(conn, a)} == {0}

    both = spark.read.format("disque").option("nodes", address).option("queues", f"{a},{b}").load()
    counts = {r.queue: r["count"] for r in both.groupBy("queue").count().collect()}
    assert counts == {a: 10, b: 20}


def test_failed_write_leaves_no_job(spark, address, conn, queue_name):
    q = queue_name("fail")
    # one partition; a null body after 2500 rows fails the task in the middle of the write
    df = spark.range(3000).repartition(1).selectExpr("if(id = 2500, null, cast(id as string)) as body")
    with pytest.raises(Exception, match="null"):
        writer(df, address, queue=q).save()
    assert conn.call("QLEN", q) == 0
    assert live_jobs(conn, q) == []


def test_abort_acks_jobs_held_by_successful_tasks(address, conn, queue_name):
    q = queue_name("abort")
    opts = WriteOptions.parse({"nodes": address, "queue": q, "replicate": "1"}, ["body"])
    batch = pa.RecordBatch.from_pydict({"body": [f"b{i}" for i in range(50)]})
    message = _write(opts, iter([batch]))
    assert message.held and len(message.ids) == 50
    assert conn.call("QLEN", q) == 0  # held back until commit
    assert {state(conn, i) for i in message.ids} == {"active"}
    _abort(opts, [message, None])
    assert live_jobs(conn, q) == []


def test_replayed_sink_batch_is_not_enqueued_twice(address, conn, queue_name, tmp_path: Path):
    q = queue_name("sink-replay")
    options = {"nodes": address, "queue": q, "replicate": "1", "checkpointLocation": str(tmp_path)}
    batch = pa.RecordBatch.from_pydict({"body": ["x", "y"]})
    sink = DisqueStreamWriter(options, _schema("body string"))
    sink.commit([sink.write(iter([batch]))], 0)
    assert conn.call("QLEN", q) == 2
    # Spark stopped before its commit log: batch 0 runs again, in a new writer
    again = DisqueStreamWriter(options, _schema("body string"))
    again.commit([again.write(iter([batch]))], 0)
    assert conn.call("QLEN", q) == 2
    assert len(live_jobs(conn, q)) == 2
    again.commit([again.write(iter([batch]))], 1)
    assert conn.call("QLEN", q) == 4


def _schema(ddl: str) -> Any:
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(ddl)


# -------------------------------------------------------------------- streaming


def _stream(spark, address: str, queues: str, **options: str) -> Any:
    reader = spark.readStream.format("disque").option("nodes", address).option("queues", queues)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_stream_acks_only_after_the_batch_completed(spark, address, conn, queue_name, tmp_path):
    q = queue_name("stream")
    ids = add(conn, q, [f"m{i}".encode() for i in range(25)])
    batches: list[list[str]] = []
    unacked_during_batch: list[bool] = []

    def each(df, batch_id):
        rows = df.collect()
        batches.append([r.id for r in rows])
        # while the batch runs, its jobs are delivered but not acknowledged
        unacked_during_batch.append(all(state(conn, r.id) == "active" for r in rows))

    query = (
        _stream(spark, address, q, maxJobsPerTrigger="10")
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert [len(b) for b in batches] == [10, 10, 5]
    assert sorted(i for b in batches for i in b) == sorted(ids)
    assert all(unacked_during_batch)
    # acknowledged once their batch completed, the last one included
    assert conn.call("QLEN", q) == 0
    assert live_jobs(conn, q) == []


def test_a_stream_reads_a_queue_as_a_consumer_group(spark, address, conn, queue_name, tmp_path):
    """Option `group`: every group reads every event once, acknowledged
    (QACK) when its batch completed; the events stay for other groups."""
    q = queue_name("events")
    ids = [conn.call("QADD", q, 600, f"e{i}").decode() for i in range(25)]
    for group in ("billing", "audit"):
        batches: list[list[str]] = []
        query = (
            _stream(spark, address, q, maxJobsPerTrigger="10", group=group, groupAckTimeout="60")
            .writeStream.foreachBatch(lambda df, _: batches.append([r.id for r in df.collect()]))
            .option("checkpointLocation", str(tmp_path / f"ck-{group}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        assert [len(b) for b in batches] == [10, 10, 5] and [i for b in batches for i in b] == ids
        [[_, [_, figures]]] = conn.call("QSTATUS", q, "GROUPS", group)
        assert dict(zip(figures[::2], figures[1::2]))[b"done"] == 25


def test_killed_query_restarts_from_checkpoint_without_losing_jobs(spark, address, conn, queue_name, tmp_path):
    q = queue_name("crash")
    ids = add(conn, q, [f"c{i}".encode() for i in range(30)])
    checkpoint = str(tmp_path / "ck")
    delivered: list[list[str]] = []
    crashed: list[str] = []

    def crash_on_second(df, batch_id):
        rows = [r.id for r in df.collect()]
        if batch_id == 1:
            crashed.extend(rows)
            raise RuntimeError("worker lost")
        delivered.append(rows)

    query = (
        _stream(spark, address, q, maxJobsPerTrigger="10")
        .writeStream.foreachBatch(crash_on_second)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    with pytest.raises(Exception, match="worker lost"):
        query.awaitTermination(120)
    assert len(crashed) == 10
    # the crashed batch was not acknowledged: its jobs are still held for us
    assert {state(conn, i) for i in crashed} == {"active"}

    replayed: list[list[str]] = []

    def record(df, batch_id):
        rows = [r.id for r in df.collect()]
        (replayed if batch_id == 1 else delivered).append(rows)

    query = (
        _stream(spark, address, q, maxJobsPerTrigger="10")
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    # the batch rebuilt from the IDs in its offset is the one that crashed
    assert replayed == [crashed]
    seen = [i for b in delivered + replayed for i in b]
    assert set(seen) == set(ids)  # every job at least once, none lost
    assert live_jobs(conn, q) == []


def test_streaming_read_transform_write(spark, address, conn, queue_name, tmp_path):
    src, dst = queue_name("in"), queue_name("out")
    add(conn, src, [f"w{i}".encode() for i in range(20)])
    query = (
        _stream(spark, address, src, maxJobsPerTrigger="10")
        .selectExpr("upper(cast(body as string)) as body")
        .writeStream.format("disque")
        .option("nodes", address)
        .option("queue", dst)
        .option("replicate", "1")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(j.body for j in _io.jscan(conn, dst)) == sorted(f"W{i}".encode() for i in range(20))
    assert live_jobs(conn, src) == []


def test_stream_of_several_queues_keeps_polling(spark, address, conn, queue_name, tmp_path):
    a, b = queue_name("sa"), queue_name("sb")
    add(conn, a, [b"a0", b"a1"])
    seen: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def each(df, batch_id):
        with lock:
            seen.extend((r.queue, r.body) for r in df.collect())

    query = (
        _stream(spark, address, f"{a},{b}")
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        add(conn, b, [b"b0"])
        add(conn, a, [b"a2"])
        for _ in range(100):
            query.processAllAvailable()
            with lock:
                if len(seen) == 4:
                    break
    finally:
        query.stop()
    assert sorted(seen) == [(a, b"a0"), (a, b"a1"), (a, b"a2"), (b, b"b0")]


def test_data_source_is_discoverable_by_spark():
    import pkgutil

    import pyspark_disque

    from disque.spark import DisqueDataSource

    assert pyspark_disque.DefaultSource is DisqueDataSource and DisqueDataSource.name() == "disque"
    assert "pyspark_disque" in {m.name for m in pkgutil.iter_modules()}


# -------------------------------------------------------------- first run


def outside_the_venv() -> dict[str, str]:
    """The environment of a user who runs the venv's python by its path: no
    PYSPARK_PYTHON, and a PATH whose `python3` (if any) is not the venv's."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    drop = {"PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PATH": path}


def test_importing_disque_spark_chooses_the_workers_python_unless_the_user_did(tmp_path):
    show = "import disque.spark, os; print(os.environ['PYSPARK_PYTHON'])"
    env = outside_the_venv()
    assert subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, check=True).stdout == f"{sys.executable}\n"
    chosen = {**env, "PYSPARK_PYTHON": "/opt/python/bin/python3"}
    assert subprocess.run([sys.executable, "-c", show], env=chosen, capture_output=True, text=True, check=True).stdout == "/opt/python/bin/python3\n"


@pytest.mark.slow  # a Spark driver of its own: about two minutes on two busy cores
def test_the_quick_example_of_the_docs_runs_as_written(address, conn, queue_name, tmp_path):
    """docs/spark.md's first example, in a fresh driver started the way a user
    starts it (PYSPARK_PYTHON unset, the venv not on PATH), against the test's
    node instead of make run's three and with queues of its own."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "spark.md").read_text()
    example = re.search(r"```python\n(.*?)```", page, re.S).group(1)  # type: ignore[union-attr]
    numbers, labels = queue_name("numbers"), queue_name("labels")
    for old, new in {'"127.0.0.1:7711,127.0.0.1:7712,127.0.0.1:7713"': f'"{address}"', '"numbers"': f'"{numbers}"',
                     '"labels"': f'"{labels}"', "/tmp/numbers-to-labels": str(tmp_path / "checkpoint")}.items():  # fmt: skip
        assert old in example, old
        example = example.replace(old, new)
    script = tmp_path / "example.py"
    script.write_text(example + "\nspark.stop()\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env={**outside_the_venv(), "SPARK_LOCAL_IP": "127.0.0.1"},
                          capture_output=True, text=True, timeout=280)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    shown = done.stdout  # .show() of the snapshot: the bodies as text, not byte arrays
    assert re.search(rf"^\|\s*{re.escape(numbers)}\|\s*DI[0-9a-f]+\.\.\.\|\s*\d+\|", shown, re.M), shown  # IDs cut at 20 characters
    assert conn.call("QLEN", numbers) == 0 and conn.call("QLEN", labels) == 1000
    assert sorted(j.body for j in _io.jscan(conn, labels))[:2] == [b"n=0", b"n=1"]
