"""A batch with WAITJOB: the producer adds 100 jobs on one node and waits
there until all are acknowledged, while a consumer takes and acknowledges
them on another node.

    .venv/bin/python examples/batch.py               # $DISQUE_NODES, or make run's three nodes
"""

import os
import threading

from disque.client import Client

nodes = os.environ.get("DISQUE_NODES", "127.0.0.1:7711,127.0.0.1:7712,127.0.0.1:7713").split(",")


def consume(address: str, count: int) -> None:
    with Client(address, failover=False) as consumer:
        for _ in range(count):
            job = consumer.get_job("batch", timeout_ms=10_000)
            consumer.ack(job.id)


with Client(nodes[0], failover=False) as producer:
    ids = producer.add_jobs("batch", [f"part {n}" for n in range(100)], replicate=min(2, len(nodes)))  # one write
    threading.Thread(target=consume, args=(nodes[-1], len(ids)), daemon=True).start()
    done = producer.wait_job(*ids, timeout_ms=60_000)
    print(f"{done} of {len(ids)} jobs acknowledged")
