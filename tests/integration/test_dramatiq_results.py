"""Dramatiq's results, pipelines and groups over the cluster's own results
(disque.contrib.dramatiq.DisqueBackend, docs/workflows.md): a real
`dramatiq` worker process and a producer process against a real 3-node
cluster; a pipeline added whole (each step AFTER the one before), each
step given the previous one's result, a failed step ending it; a group
waited for; an actor's exception read back as Dramatiq's ResultFailure."""

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
def add(x, y):
    return x + y


@dramatiq.actor(store_results=True)
def double(x):
    return 2 * x


@dramatiq.actor(store_results=True, max_retries=0)
def fail():
    raise ValueError("no way")
'''

PRODUCER = '''
import json

from dramatiq import group, pipeline
from dramatiq.results import ResultFailure, ResultMissing

import tasks

out = {}
try:
    tasks.add.message(1, 2).get_result()
except ResultMissing:
    out["missing"] = True  # never enqueued: no job
message = tasks.add.send(1, 2)
steps = pipeline([tasks.add.message(1, 2), tasks.double.message(), tasks.double.message_with_options(args=(10,), pipe_ignore=True)]).run()
fan = group([tasks.add.message(i, i) for i in range(3)] + [pipeline([tasks.add.message(5, 5), tasks.double.message()])]).run()
fan.wait(timeout=30000)
out["group"] = list(fan.get_results())
out["message"] = message.get_result(block=True, timeout=30000)
out["pipeline"] = steps.get_result(block=True, timeout=30000)
out["steps"] = list(steps.get_results(block=True, timeout=30000))
try:
    tasks.fail.send().get_result(block=True, timeout=30000)
except ResultFailure as e:
    out["failure"] = str(e)
broken = pipeline([tasks.add.message(1, 2), tasks.fail.message_with_options(pipe_ignore=True), tasks.double.message()]).run()
try:
    broken.get_result(block=True, timeout=30000)
except ResultFailure as e:
    out["broken"] = str(e)  # double's: acknowledged with the failure before it, unrun (run, it would return a number)
print(json.dumps(out))
'''


def test_results_pipelines_and_groups_through_a_real_worker(tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", 3) as cluster:
        out = run_dramatiq(cluster, tmp_path, TASKS, PRODUCER)
        assert out == {
            "missing": True,
            "group": [0, 2, 4, 20],
            "message": 3,
            "pipeline": 20,  # double(10): pipe_ignore
            "steps": [3, 6, 20],  # add(1, 2), double(3), double(10)
            "failure": "actor raised ValueError: no way",
            "broken": "actor raised ValueError: no way",
        }, out
        assert sum(cluster.qlen(i, "default.XQ") for i in cluster.indexes) == 2  # the failed messages, dead-lettered
