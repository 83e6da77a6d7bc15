"""Send ten greetings to the `greetings` queue of the `make run` cluster.

    .venv/bin/python examples/producer.py            # $DISQUE_NODES, or make run's three nodes
"""

import os

from disque.client import Client

nodes = os.environ.get("DISQUE_NODES", "127.0.0.1:7711,127.0.0.1:7712,127.0.0.1:7713").split(",")

with Client(nodes) as client:
    for n in range(10):
        job_id = client.add_job("greetings", f"hello #{n}", retry=30)  # replicated before it returns
        print("queued", job_id)
