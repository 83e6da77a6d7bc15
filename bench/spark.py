"""Spark connector: jobs per second through a batch write and through a
streaming read-transform-write pipeline, on local[2] against one fresh node.

Write: `spark.range(N)` turned into 100-byte string bodies, written with
`df.write.format("disque")` (REPLICATE 1, transactional: ADDJOB with a holding
DELAY in the tasks, ENQUEUE at commit), then the same with
`transactional=false` (ADDJOB only).  A small write first starts the Python
workers, so the figures are for a warm session.

Pipeline: M jobs queued beforehand; a streaming query reads them
(`maxJobsPerTrigger` 5000), upper-cases the body and writes it to another
queue, with `Trigger.AvailableNow`: end to end from start to termination
(query start-up included), and the steady rate of the micro-batches after
the first one (which also starts the query's Python workers).  Every job is
GETJOB'd, ACKed (after its batch), ADDJOB'd and ENQUEUEd.

Needs the `spark` extra (pyspark, pyarrow) and Java 17.  Run alone with
`.venv/bin/python bench/spark.py [--quick]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import BODY, print_table, start_node

from disque.spark import _io

BATCH = 5000


def _sizes(quick: bool) -> dict[str, int]:
    return {"write": 20_000 if quick else 100_000, "pipeline": 10_000 if quick else 50_000}


def _session() -> Any:
    from disque.spark import local_session

    return local_session("disque-bench")


def _write(spark: Any, address: str, queue: str, rows: int, **options: str) -> float:
    pad = BODY.decode()[: len(BODY) - 8]
    df = spark.range(rows).selectExpr(f"concat(lpad(cast(id as string), 8, '0'), '{pad}') as body")
    writer = df.write.format("disque").mode("append").option("nodes", address).option("queue", queue)
    for key, value in {"replicate": "1", **options}.items():
        writer = writer.option(key, value)
    started = time.perf_counter()
    writer.save()
    return time.perf_counter() - started


def _pipeline(spark: Any, address: str, src: str, dst: str, checkpoint: str) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    query = (
        spark.readStream.format("disque").option("nodes", address).option("queues", src)
        .option("maxJobsPerTrigger", str(BATCH)).load()
        .selectExpr("upper(cast(body as string)) as body")
        .writeStream.format("disque").option("nodes", address).option("queue", dst).option("replicate", "1")
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"the pipeline failed: {query.exception()}")
    return elapsed, [p for p in query.recentProgress if p["numInputRows"]]


def run(quick: bool) -> dict[str, Any]:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        sys.exit("the Spark benchmark needs the spark extra: .venv/bin/pip install '.[spark]'")
    sizes = _sizes(quick)
    with tempfile.TemporaryDirectory(prefix="disque-bench-spark-") as tmp:
        node = start_node(Path(tmp) / "node")
        address = f"127.0.0.1:{node.port}"
        try:
            started = time.perf_counter()
            spark = _session()
            session_s = time.perf_counter() - started
            try:
                warmup_s = _write(spark, address, "warmup", 1000)
                write_s = _write(spark, address, "w", sizes["write"])
                plain_s = _write(spark, address, "w-plain", sizes["write"], transactional="false")
                with _io.Conn(address) as conn:
                    queued = conn.call("QLEN", "w") + conn.call("QLEN", "w-plain")
                    if queued != 2 * sizes["write"]:
                        raise RuntimeError(f"{queued} jobs queued, {2 * sizes['write']} written")
                    _io.add_jobs(conn, (["ADDJOB", "in", BODY, 0, "REPLICATE", 1, "RETRY", 600]
                                        for _ in range(sizes["pipeline"])))  # fmt: skip
                pipeline_s, progress = _pipeline(spark, address, "in", "out", str(Path(tmp) / "ck"))
                with _io.Conn(address) as conn:
                    moved, left = conn.call("QLEN", "out"), conn.call("QLEN", "in")
                if (moved, left) != (sizes["pipeline"], 0):
                    raise RuntimeError(f"pipeline moved {moved} jobs, {left} left in the source queue")
            finally:
                spark.stop()
        finally:
            node.stop()
    # The first micro-batch also starts the query's Python workers: the steady
    # rate is the one of the batches after it (rows / trigger execution time).
    batches = len(progress)
    steady = progress[1:]
    steady_rate = (sum(p["numInputRows"] for p in steady) / (sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000)
                   if steady else float("nan"))  # fmt: skip
    figures = {
        "write_rows": sizes["write"],
        "write_jobs_per_s": sizes["write"] / write_s,
        "write_untransactional_jobs_per_s": sizes["write"] / plain_s,
        "pipeline_jobs": sizes["pipeline"],
        "pipeline_jobs_per_s": sizes["pipeline"] / pipeline_s,
        "pipeline_steady_jobs_per_s": steady_rate,
        "pipeline_batches": batches,
        "session_start_s": session_s,
        "first_write_s": warmup_s,
    }
    print_table(
        f"Spark connector, local[2], one node, {os.cpu_count()} CPU(s)",
        ["run", "jobs", "seconds", "jobs/s"],
        [
            ["batch write (transactional)", sizes["write"], write_s, figures["write_jobs_per_s"]],
            ["batch write (transactional=false)", sizes["write"], plain_s, figures["write_untransactional_jobs_per_s"]],
            [f"stream read-transform-write ({batches} batches)", sizes["pipeline"], pipeline_s, figures["pipeline_jobs_per_s"]],
            ["  the same, batches after the first", sum(p["numInputRows"] for p in steady),
             sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000, steady_rate],
        ],  # fmt: skip
    )
    print(f"(session start {session_s:.1f} s, first 1000-row write {warmup_s:.1f} s)")
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
