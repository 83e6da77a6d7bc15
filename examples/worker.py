"""A worker for the greetings of producer.py: failures come back later and
later (NACK ... DELAY), long jobs are kept with WORKING.

    cd examples && ../.venv/bin/disque worker worker:app --concurrency 4          # until Ctrl-C
    cd examples && ../.venv/bin/disque worker worker:app --burst                  # until its node's queue is empty
"""

from disque.client.worker import App

app = App()  # $DISQUE_NODES, or 127.0.0.1:7711


@app.job("greetings", timeout=10)
def greet(job):
    print("greeted:", job.body.decode(), flush=True)  # raising instead: retried after a backoff
