"""Dramatiq's group completion callbacks over the cluster's batches
(disque.contrib.dramatiq.DisqueGroupCallbacks, docs/workflows.md): a real
`dramatiq` worker process and a producer process against a real 3-node
cluster.  A group of five with two callbacks runs each callback once, after
every member is done; a group with a pipeline member waits for the
pipeline's last step; a group whose members fail for good (dead-lettered by
the server, its exception kept as its result, or a pipeline's step after a
failed one) never runs its callback: its batch has a failed job and dead
letters pending."""

from __future__ import annotations

from pathlib import Path

from clusterkit import Cluster, run_dramatiq

TASKS = '''
import os

import dramatiq
from dramatiq.results import Results

from disque.contrib.dramatiq import DisqueBackend, DisqueBroker

broker = DisqueBroker(os.environ["DISQUE_NODES"].split(","))
broker.add_middleware(Results(backend=DisqueBackend(broker)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)
def member(x):
    return x


@dramatiq.actor(store_results=True)
def double(x):
    return 2 * x


@dramatiq.actor(max_retries=0)
def boom():
    raise ValueError("no way")


@dramatiq.actor(store_results=True, max_retries=0)
def boom_kept():
    raise ValueError("no way, kept")


@dramatiq.actor(queue_name="notes")
def note(tag):
    broker.client.add_job("fired", tag)
'''

HEAD = '''
import json
import os
import time

from dramatiq import group, pipeline

from disque.client import Client

import tasks

out = {}
client = Client(os.environ["DISQUE_NODES"].split(","))
nodes = [Client(address) for address in os.environ["DISQUE_NODES"].split(",")]
'''

# Waits for the batch a dead letter in default.XQ joined to have READY (done, failed, jobs), and
# prints it, with how many callbacks are queued in "fired" (none left).
FAILING_BATCH = '''
deadline = time.monotonic() + 30
batch = None
while batch is None or (batch["done"], batch["failed"], batch["jobs"]) != READY:
    assert time.monotonic() < deadline, batch
    for node in nodes:  # (QPEEK and SHOW are the node's own)
        for dead in node.qpeek("default.XQ", 10):
            shown = node.show(dead.id)
            if shown is not None and shown.batch:
                batch = client.batch_show(shown.batch)
    time.sleep(0.05)
out["failing batch"] = {k: batch[k] for k in ("closed", "jobs", "done", "failed", "pending", "success_fired")}
out["fired after"] = sum(node.qlen("fired") for node in nodes)
for c in [client, *nodes]:
    c.close()
tasks.broker.close()
print(json.dumps(out))
'''

PRODUCER = HEAD + '''
failing = group([tasks.member.message(1), tasks.boom.message(), tasks.boom_kept.message(),
                 pipeline([tasks.boom_kept.message(), tasks.member.message_with_options(args=(3,), pipe_ignore=True)])])
failing.add_completion_callback(tasks.note.message("failed"))
failing.run()
five = group([tasks.member.message(i) for i in range(5)])
five.add_completion_callback(tasks.note.message("five"))
five.add_completion_callback(tasks.note.message("five, again"))
five.run()
piped = group([tasks.member.message(1), pipeline([tasks.member.message(2), tasks.double.message()])])
piped.add_completion_callback(tasks.note.message("piped"))
piped.run()
fired = []
while len(fired) < 3:
    job = client.get_job("fired", timeout_ms=30000)
    assert job is not None, fired
    fired.append(job.body.decode())
    if job.body == b"five":  # every member was done before: their results are there
        out["five results"] = list(five.get_results())
    if job.body == b"piped":
        out["piped results"] = list(piped.get_results())
    client.ack(job.id)
out["fired"] = sorted(fired)
# The failing group's batch: its dead letters (boom_kept, the pipeline's last step, unrun) joined it.
''' + FAILING_BATCH.replace("READY", "(3, 1, 6)")


def test_group_completion_callbacks_through_a_real_worker(tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", 3) as cluster:
        out = run_dramatiq(cluster, tmp_path, TASKS, PRODUCER)
        assert out == {
            "five results": [0, 1, 2, 3, 4],
            "piped results": [1, 4],
            "fired": ["five", "five, again", "piped"],
            # member(1), boom_kept (its exception its result) and the pipeline's last step (unrun)
            # acknowledged, boom dead-lettered by the server, boom_kept's and the last step's dead
            # letters pending in default.XQ: the batch never succeeds.
            "failing batch": {"closed": 1, "jobs": 6, "done": 3, "failed": 1, "pending": 2, "success_fired": 0},
            "fired after": 0,
        }, out
        assert sum(cluster.qlen(i, "notes") for i in cluster.indexes) == 0  # the callbacks' carrier, acknowledged



# Without the Retries middleware a failed message is acknowledged: a member's is dead-lettered by the broker, in its batch.
NO_RETRIES = TASKS.replace(
    'broker = DisqueBroker(os.environ["DISQUE_NODES"].split(","))',
    "from dramatiq.middleware import Retries, default_middleware\n\n"
    'broker = DisqueBroker(os.environ["DISQUE_NODES"].split(","), middleware=[m() for m in default_middleware if m is not Retries])',
).replace("max_retries=0", "")  # (an option of Retries)

FAILED_ONCE = HEAD + '''
failing = group([tasks.member.message(1), tasks.boom.message()])
failing.add_completion_callback(tasks.note.message("failed"))
failing.run()
''' + FAILING_BATCH.replace("READY", "(2, 0, 3)")


def test_a_member_failed_with_no_retries_leaves_its_group_unsuccessful(tmp_path: Path) -> None:
    assert NO_RETRIES != TASKS
    with Cluster(tmp_path / "cluster", 3) as cluster:
        out = run_dramatiq(cluster, tmp_path, NO_RETRIES, FAILED_ONCE)
        # member(1) and boom acknowledged, boom's message in default.XQ, in the batch: pending for ever.
        assert out == {
            "failing batch": {"closed": 1, "jobs": 3, "done": 2, "failed": 0, "pending": 1, "success_fired": 0},
            "fired after": 0,
        }, out
