"""The Dramatiq broker (disque.contrib.dramatiq) with a real `dramatiq` worker
process against two real nodes: a flaky actor succeeds on its third try,
its retries held back by NACK ... DELAY; an actor that always fails ends,
after max_retries + 1 deliveries, in Dramatiq's dead-letter queue by the
server's MAXATTEMPTS/DEADLETTER, with the exception it raised."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from client_helpers import queue, shared_node  # noqa: F401  (fixtures)
from support import wait_for
from dramatiq.message import Message

from disque.client import Client
from disque.contrib.dramatiq import DisqueBackend, DisqueBroker
from disque.testing.devcluster import NodeProcess, command, join

TASKS = '''
import os, pathlib, time

import dramatiq

from disque.contrib.dramatiq import DisqueBroker

dramatiq.set_broker(DisqueBroker(os.environ["DISQUE_NODES"].split(",")))
OUT = pathlib.Path(os.environ["OUT"])


def attempt(name):
    with open(OUT / f"{name}.log", "a") as log:
        log.write(f"{time.monotonic()}\\n")
    return len((OUT / f"{name}.log").read_text().splitlines())


@dramatiq.actor(max_retries=3, min_backoff=1000, max_backoff=1000)
def flaky(name):
    if attempt(name) < 3:
        raise RuntimeError("not yet")
    (OUT / f"{name}.done").write_text("ok")


@dramatiq.actor(max_retries=2, min_backoff=1000, max_backoff=1000)
def doomed(name):
    attempt(name)
    raise RuntimeError("always")
'''


def qlen(nodes: list[NodeProcess], queue: str) -> int:
    return sum(int(command(n.host, n.port, "QLEN", queue)[1:-2]) for n in nodes)


def test_a_dramatiq_worker_retries_through_nack_delay_and_dead_letters_through_maxattempts(
    spawn: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    nodes = [spawn(), spawn()]
    join(nodes)
    (tmp_path / "tasks.py").write_text(TASKS)
    env = {**os.environ, "DISQUE_NODES": ",".join(f"{n.host}:{n.port}" for n in nodes), "OUT": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    sent = subprocess.run([sys.executable, "-c", "import tasks; tasks.flaky.send('a'); tasks.doomed.send('b')"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([str(Path(sys.executable).with_name("dramatiq")), "tasks", "--processes", "1", "--threads", "2"],
                                  cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
        try:
            wait_for(lambda: (tmp_path / "a.done").exists(), timeout=30, what="the flaky actor to succeed")
            wait_for(lambda: qlen(nodes, "default.XQ") == 1, timeout=30, what="the doomed message in the dead-letter queue")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
    tries = [float(t) for t in (tmp_path / "a.log").read_text().split()]
    assert len(tries) == 3 and all(b - a >= 0.9 for a, b in zip(tries, tries[1:]))  # NACK DELAY 1 between tries
    assert len((tmp_path / "b.log").read_text().split()) == 3  # max_retries 2: three deliveries
    assert qlen(nodes, "default") == 0
    node = next(n for n in nodes if qlen([n], "default.XQ"))
    with redis.Redis(port=node.port) as r:
        [[_, dead_id, body]] = r.execute_command("QPEEK", "default.XQ", 1)
        shown = r.execute_command("SHOW", dead_id)
    message = Message.decode(body)
    assert message.actor_name == "doomed" and message.args == ("b",)
    # The exception the actor raised is the dead letter's last failure.
    assert (shown[b"error-type"], shown[b"error-message"], shown[b"dead-letter-from"]) == (b"RuntimeError", b"always", b"default")
    assert b'raise RuntimeError("always")' in shown[b"error-traceback"] and shown[b"error-pid"] > 0


def test_the_consumer_fetches_what_the_prefetch_leaves_room_for_and_queues_the_rest_again_on_close(shared_node: NodeProcess, queue: str) -> None:
    address = f"{shared_node.host}:{shared_node.port}"
    broker = DisqueBroker(address, middleware=[])  # no Retries: a nack goes to the dead-letter queue
    with Client(address) as client:
        ids = client.add_jobs(queue, [Message(queue, "a", (i,), {}, {}).encode() for i in range(5)], retry=60)
        consumer = broker.consume(queue, prefetch=3, timeout=100)
        first, second = next(consumer), next(consumer)
        assert (first.job_id, second.job_id, client.qlen(queue)) == (ids[0], ids[1], 2)  # three fetched at once
        consumer.ack(first)
        consumer.ack(second)
        third = next(consumer)  # the last of the three fetched
        assert next(consumer).job_id == ids[3] and client.qlen(queue) == 0  # room for two: both others fetched
        consumer.nack(third)  # not its last attempt: to the dead-letter queue, acknowledged, in one write
        assert client.show(third.job_id) is None and client.qlen(f"{queue}.XQ") == 1
        consumer.close()  # ids[4] was fetched, never handed out
        assert [j.id for j in client.qpeek(queue, 5)] == [ids[4]]


def test_an_actors_queue_limits_become_the_queues_setting_when_it_is_consumed(shared_node: NodeProcess, queue: str) -> None:
    import dramatiq

    address = f"{shared_node.host}:{shared_node.port}"
    broker = DisqueBroker(address, middleware=[])

    @dramatiq.actor(broker=broker, queue_name=queue, queue_rate="100/s", queue_concurrency=5)
    def stripe(amount: int) -> None: ...

    with Client(address) as client:
        broker.consume(queue, timeout=100).close()
        limits = dict(zip(*[iter(client.execute_command("QCONFIG", queue, "GET"))] * 2))
        assert limits[b"rate-limit"] == b"100/s" and limits[b"concurrency"] == 5
        client.execute_command("QCONFIG", queue, "DEL")
        broker.consume(queue + "-plain", timeout=100).close()  # no limits: none set
        assert f"{queue}-plain".encode() not in client.execute_command("QCONFIG", "LIST")
    broker.client.close()


def test_the_result_backend_reads_what_the_acknowledgement_carried(shared_node: NodeProcess, queue: str) -> None:
    import dramatiq
    from dramatiq.results import Results, ResultMissing, ResultTimeout

    broker = DisqueBroker(f"{shared_node.host}:{shared_node.port}", middleware=[])
    backend = DisqueBackend(broker)
    broker.add_middleware(Results(backend=backend))

    @dramatiq.actor(broker=broker, queue_name=queue, store_results=True)
    def add(x: int, y: int) -> int: ...

    sent = add.send(1, 2)
    assert sent.options["disque_job_id"] == broker.job_id(sent) == broker.job_id(Message(**{**sent.asdict(), "options": {}}))
    with pytest.raises(ResultMissing):
        backend.get_result(sent)  # not acknowledged yet
    with pytest.raises(ResultTimeout):
        backend.get_result(sent, block=True, timeout=50)
    with pytest.raises(ResultMissing):
        backend.get_result(add.message(1, 2))  # never enqueued: no job
    consumer = broker.consume(queue, timeout=100)
    delivery = next(consumer)
    backend.store_result(delivery, 3, 1000)  # what Results does once the actor returned
    backend.store_result(delivery, 4, 1000)  # the first one kept wins, as on the server
    consumer.ack(delivery)
    assert backend.get_result(sent) == 3 and backend.get_result(Message(**sent.asdict()), block=True) == 3
    too_big = add.send(0, 0)
    delivery = next(consumer)
    backend.store_result(delivery, "x" * 20_000, 1000)  # over 16 KiB: not kept, with a warning
    consumer.ack(delivery)
    with pytest.raises(ResultMissing):
        backend.get_result(too_big, block=True, timeout=5000)  # acknowledged without one
    consumer.close()
    broker.client.close()
