"""The systems bench/workers.py compares, each set up the way its own
documentation shows: a no-op handler of a 100-byte body, a producer that
enqueues one job at a time and, where the system has one, its bulk call.

This module is both the producer (`peers.timed("loop" or "bulk")`, printing
the seconds it took) and the handlers' module that each system's
worker command imports (`dramatiq peers`, `celery -A peers worker`, ...):
BENCH_SYSTEM picks the system set up at import.  The peers run in the
virtual environment of the `bench` extra (`make bench`: arq pins a redis-py
older than the test extra's), ours in the project's.

A handler counts the jobs it ran; the first and the last (BENCH_JOBS) write
their wall-clock time to BENCH_OUT, which is how bench/workers.py learns the
first-job latency and the drain time without touching any system's internals.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

SYSTEM = os.environ.get("BENCH_SYSTEM", "")
URL = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")
NODES = os.environ.get("DISQUE_NODES", "127.0.0.1:7711")
JOBS = int(os.environ.get("BENCH_JOBS", "10000"))
OUT = os.environ.get("BENCH_OUT", os.devnull)
REPLICATE = int(os.environ.get("BENCH_REPLICATE", "1"))
QUEUE = "bench"
BODY = "x" * 100

_ran = itertools.count(1)  # next() is atomic under the GIL: the handlers of every thread share it


def _done() -> None:
    n = next(_ran)
    if n in (1, JOBS):
        with open(OUT, "a") as f:
            f.write(f"{n} {time.time()}\n")


# --------------------------------------------------------------------------
# Each system, set up at import when it is BENCH_SYSTEM's


if SYSTEM == "ours":
    from disque.client import Client
    from disque.client.worker import App

    app = App(NODES.split(","))

    @app.job(QUEUE)
    def ours_noop(job: Any) -> None:
        _done()

    def produce(bulk: bool) -> None:
        with Client(NODES.split(",")[0]) as client:
            if bulk:
                client.add_jobs(QUEUE, [BODY] * JOBS, replicate=REPLICATE)
            else:
                for _ in range(JOBS):
                    client.add_job(QUEUE, BODY, replicate=REPLICATE)

elif SYSTEM == "redis-py":  # our server driven by redis-py's pipeline: the reference of our bulk figure
    import redis

    def produce(bulk: bool) -> None:
        host, port = NODES.split(",")[0].split(":")
        connection = redis.Redis(host=host, port=int(port))
        for start in range(0, JOBS, 1000):
            pipe = connection.pipeline(transaction=False)
            for _ in range(min(1000, JOBS - start)):
                pipe.execute_command("ADDJOB", QUEUE, BODY, 0, "REPLICATE", REPLICATE)
            pipe.execute()

elif SYSTEM == "dramatiq":
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=URL)
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=QUEUE, max_retries=0)
    def dramatiq_noop(body: str) -> None:
        _done()

    def produce(bulk: bool) -> None:
        if bulk:
            dramatiq.group(dramatiq_noop.message(BODY) for _ in range(JOBS)).run()
        else:
            for _ in range(JOBS):
                dramatiq_noop.send(BODY)

elif SYSTEM == "huey":
    from huey import RedisHuey

    huey = RedisHuey(QUEUE, url=URL, results=False)

    @huey.task()
    def huey_noop(body: str) -> None:
        _done()

    def produce(bulk: bool) -> None:
        for _ in range(JOBS):
            huey_noop(BODY)

elif SYSTEM == "celery":
    from celery import Celery, group

    app = Celery("peers", broker=URL)
    app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)

    @app.task(name="noop")
    def celery_noop(body: str) -> None:
        _done()

    def produce(bulk: bool) -> None:
        if bulk:
            group(celery_noop.s(BODY) for _ in range(JOBS)).apply_async()
        else:
            for _ in range(JOBS):
                celery_noop.delay(BODY)

elif SYSTEM == "rq":
    from redis import Redis
    from rq import Queue

    def rq_noop(body: str) -> None:
        _done()

    def produce(bulk: bool) -> None:
        queue = Queue(QUEUE, connection=Redis.from_url(URL))
        if bulk:
            queue.enqueue_many([Queue.prepare_data(rq_noop, (BODY,)) for _ in range(JOBS)])
        else:
            for _ in range(JOBS):
                queue.enqueue(rq_noop, BODY)

elif SYSTEM == "arq":
    from arq import create_pool
    from arq.connections import RedisSettings

    async def arq_noop(ctx: Any, body: str) -> None:
        _done()

    class WorkerSettings:
        functions = [arq_noop]
        redis_settings = RedisSettings.from_dsn(URL)
        max_jobs = 8

    def produce(bulk: bool) -> None:
        async def loop() -> None:
            pool = await create_pool(RedisSettings.from_dsn(URL))
            for _ in range(JOBS):
                await pool.enqueue_job("arq_noop", BODY)
            await pool.aclose()

        asyncio.run(loop())

elif SYSTEM == "taskiq":
    from taskiq_redis import ListQueueBroker

    broker = ListQueueBroker(URL, queue_name=QUEUE)

    @broker.task
    async def taskiq_noop(body: str) -> None:
        _done()

    def produce(bulk: bool) -> None:
        async def loop() -> None:
            await broker.startup()
            for _ in range(JOBS):
                await taskiq_noop.kiq(BODY)
            await broker.shutdown()

        asyncio.run(loop())


def timed(mode: str) -> None:
    """Run the producer (`loop` or `bulk`) and print the seconds it took.
    Called as `python -c 'import peers; ...'`, not as __main__: the systems
    that name a task by its module must see the module the workers import."""
    started = time.monotonic()
    produce(mode == "bulk")
    print(time.monotonic() - started)
