"""Producers -> Spark structured streaming -> another queue, against `make run`.

In one terminal start the local cluster, in another run the pipeline:

    make run
    .venv/bin/python examples/spark_pipeline.py        # needs: make extras EXTRAS=spark

* Producer threads add order jobs (JSON) to the queue `orders`, each through
  its own node of the cluster.
* A Spark streaming query consumes `orders` from every node (GETJOB, ACK after
  each micro-batch), prices each order and writes an invoice job: orders of
  500 or more go to `invoices-large`, the others to `invoices` (routing with
  `queueColumn`).  Writes are transactional: a failed or replayed batch
  leaves no duplicate invoice.
* When the producers are done and Spark has processed everything, the query
  stops and the script prints per-queue statistics from every node (QSTAT),
  then a few invoices read with a snapshot batch read (which consumes nothing:
  the invoices stay queued for whatever comes next).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from typing import Any

from disque.client import Client, DisqueConnectionError

ORDERS, INVOICES, LARGE = "orders", "invoices", "invoices-large"
COUNTRIES = {"FR": 0.20, "DE": 0.19, "IT": 0.22, "US": 0.0, "JP": 0.10}


def produce(node: str, first: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    with Client(node) as client:
        for n in range(first, first + count):
            order = {
                "order": n,
                "customer": f"c{rng.randrange(1000):03d}",
                "country": rng.choice(list(COUNTRIES)),
                "quantity": rng.randint(1, 20),
                "unit_price": round(rng.uniform(1, 80), 2),
            }
            client.add_job(ORDERS, json.dumps(order).encode(), retry=60)


def session() -> Any:
    from disque.spark import local_session

    return local_session("disque-pipeline")


def start_query(spark: Any, nodes: str, checkpoint: str) -> Any:
    from pyspark.sql import functions as F

    vat = F.create_map(*[F.lit(x) for pair in COUNTRIES.items() for x in pair])
    order = "order long, customer string, country string, quantity int, unit_price double"
    orders = (
        spark.readStream.format("disque")
        .option("nodes", nodes)
        .option("queues", ORDERS)
        .option("maxJobsPerTrigger", "1000")
        .load()
        .select(F.from_json(F.col("body").cast("string"), order).alias("o"), "id")
        .select("o.*", F.col("id").alias("order_job"))
    )
    invoices = orders.withColumn(
        "total", F.round(F.col("quantity") * F.col("unit_price") * (1 + vat[F.col("country")]), 2)
    ).select(
        F.when(F.col("total") >= 500, F.lit(LARGE)).otherwise(F.lit(INVOICES)).alias("dest"),
        F.to_json(F.struct("order", "customer", "country", "total", "order_job")).alias("body"),
    )
    return (
        invoices.writeStream.format("disque")
        .option("nodes", nodes)
        .option("queueColumn", "dest")
        .option("retry", "120")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )


def print_stats(nodes: list[str]) -> None:
    print(f"\n{'queue':<16}{'node':<17}{'len':>7}{'jobs in':>9}{'jobs out':>10}")
    for queue in (ORDERS, INVOICES, LARGE):
        for node in nodes:
            with Client(node, failover=False) as client:
                stats = client.qstat(queue)
            if stats is None:
                print(f"{queue:<16}{node:<17}{'-':>7}{'-':>9}{'-':>10}")
            else:
                print(f"{queue:<16}{node:<17}{stats.len:>7}{stats.jobs_in:>9}{stats.jobs_out:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="127.0.0.1:7711,127.0.0.1:7712,127.0.0.1:7713")
    parser.add_argument("--jobs", type=int, default=5000, help="orders to produce")
    parser.add_argument("--producers", type=int, default=3)
    args = parser.parse_args()
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    try:
        with Client(nodes) as client:
            client.ping()
    except DisqueConnectionError as e:
        sys.exit(f"{e}\nStart the cluster first: make run")

    print("starting Spark (local[2])...", flush=True)
    spark = session()
    checkpoint = tempfile.mkdtemp(prefix="disque-pipeline-")
    query = start_query(spark, ",".join(nodes), checkpoint)

    started = time.monotonic()
    share = -(-args.jobs // args.producers)
    producers = [
        threading.Thread(target=produce, args=(nodes[i % len(nodes)], i * share, min(share, args.jobs - i * share), i))
        for i in range(args.producers)
    ]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    produced_s = time.monotonic() - started
    print(f"{args.producers} producers added {args.jobs} orders in {produced_s:.1f} s", flush=True)

    query.processAllAvailable()  # every order taken and processed...
    time.sleep(2)  # ...and the last batch acknowledged at the next trigger
    query.processAllAvailable()
    elapsed = time.monotonic() - started
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    query.stop()
    done = sum(p["numInputRows"] for p in progress)
    busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    print(f"Spark processed {done} orders in {len(progress)} micro-batches ({busy:.1f} s of batch time,"
          f" the first one starting the query's workers); {elapsed:.1f} s since the producers started")

    print_stats(nodes)
    snapshot = spark.read.format("disque").option("nodes", ",".join(nodes)).option("queues", f"{INVOICES},{LARGE}").load()
    print("\nqueued invoices (snapshot read, nothing consumed):")
    snapshot.groupBy("queue").count().show()
    snapshot.selectExpr("queue", "cast(body as string) as invoice").show(5, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
