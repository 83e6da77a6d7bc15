"""`disque.client.worker` and `disque worker`: the pieces without I/O first, then
workers on real nodes, in this process (under asyncio and trio) and as
`disque worker` processes (concurrency, SIGTERM, the grace period, burst
mode, every node restarted)."""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from client_helpers import client, mesh, queue, shared_node, start_all  # noqa: F401  (fixtures)
from support import wait_for

from disque.client import Client, Job
from disque.client.protocol import failure_args
from disque.store.failure import LIMITS
from disque.testing.devcluster import NodeProcess
from disque.client.worker import MAX_RESULT_BYTES, App, Backoff, Handler, LogFormatter, Worker, job_result, load_app

BACKENDS = ["asyncio", "trio"]
NO_JOB = "DI" + "0" * 44 + "SQ"


def delivered(n: int) -> Job:
    """A job on its n-th delivery."""
    return Job(NO_JOB, "q", b"", nacks=n - 1, additional_deliveries=0)


def address(node: NodeProcess) -> str:
    return f"{node.host}:{node.port}"


# --------------------------------------------------------------------------
# No I/O


def test_backoff_grows_exponentially_up_to_the_cap_less_the_jitter() -> None:
    exact = Backoff(base=1, factor=2, cap=10, jitter=0)
    assert [exact.delay(n, random.Random(0)) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert exact.delay(100_000, random.Random(0)) == 10  # no overflow
    jittered = Backoff(base=8, cap=8, jitter=0.5)
    delays = [jittered.delay(1, random.Random(seed)) for seed in range(200)]
    assert all(4 <= d <= 8 for d in delays) and max(delays) - min(delays) > 3  # spread over the jitter


def test_retry_delay_in_whole_seconds_and_the_last_attempt() -> None:
    app = App("127.0.0.1:7711")
    limited = app.job("limited", retries=3, backoff=Backoff(base=2, jitter=0))(lambda job: None)
    assert limited.max_attempts == 4
    rng = random.Random(0)
    assert [limited.retry_delay(delivered(n), rng) for n in range(1, 6)] == [2, 4, 8, 16, 32]
    assert [limited.exhausted(delivered(n)) for n in range(1, 6)] == [False, False, False, True, True]
    unlimited = app.job("unlimited", backoff=Backoff(base=0.1, cap=1000, jitter=0))(lambda job: None)
    assert not unlimited.exhausted(delivered(1000))
    assert unlimited.retry_delay(delivered(1), rng) == 1  # at least a second
    assert unlimited.retry_delay(delivered(40), rng) == 1000
    assert unlimited.retry_delay(Job(NO_JOB, "unlimited", b""), rng) == 1  # no counters: the first delivery


def test_failure_args_name_the_exception_and_keep_the_end_of_a_long_traceback() -> None:
    class Bounce(Exception):
        pass

    def deep(n: int) -> None:
        if n == 0:
            raise Bounce("x" * 20_000)
        deep(n - 1)

    try:
        deep(3)
    except Bounce as e:
        args = failure_args(e)
    assert args[:2] == ["ERROR", f"{__name__}.test_failure_args_name_the_exception_and_keep_the_end_of_a_long_traceback.<locals>.Bounce".encode()]
    assert len(args[2]) == LIMITS["message"]  # cut to the node's rule
    trace = args[4]
    assert len(trace) == LIMITS["traceback"] and trace.startswith(b"...\n") and trace.endswith(b"x\n")
    assert args[5:] == ["HOST", socket.gethostname().encode(), "PID", os.getpid()]
    assert failure_args(ValueError("v"))[:3] == ["ERROR", b"ValueError", b"v"]


def test_app_registers_handlers_and_their_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISQUE_NODES", "10.0.0.1:7711,10.0.0.2:7712")
    monkeypatch.setenv("DISQUE_AUTH", "s3cret")
    app = App()
    assert (app.nodes, app.client_options) == (["10.0.0.1:7711", "10.0.0.2:7712"], {"password": "s3cret"})

    @app.job("emails", max_attempts=5, dead_letter="emails-dead", timeout=30)
    def send_email(job: Job) -> bytes:
        return job.body.upper()

    assert isinstance(send_email, Handler) and app.handlers == {"emails": send_email}
    assert send_email(Job(NO_JOB, "emails", b"hi")) == b"HI"  # still callable as the function
    assert (send_email.job_options, send_email.timeout) == ({"max_attempts": 5, "dead_letter": "emails-dead", "priority": None}, 30)
    with pytest.raises(ValueError, match="not both"):
        app.job("other", retries=1, max_attempts=2)
    with pytest.raises(ValueError, match="dead_letter needs"):
        app.job("other", dead_letter="dead")
    with pytest.raises(ValueError, match="already has a handler"):
        app.job("emails")
    with pytest.raises(ValueError, match="no handler for queue"):
        Worker(app, queues=("other",))
    with pytest.raises(ValueError, match="no handler"):
        Worker(App("127.0.0.1:7711"))
    with pytest.raises(ValueError, match="concurrency"):
        Worker(app, concurrency=0)


def test_load_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"tasks_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("from disque.client.worker import App\napp = App('h:1')\nother = App('h:2')\nnumber = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app puts the current directory in it
    try:
        assert load_app(name).nodes == "h:1"
        assert load_app(f"{name}:other").nodes == "h:2"
        with pytest.raises(TypeError, match="is a int, not a disque.client.worker.App"):
            load_app(f"{name}:number")
        with pytest.raises(AttributeError):
            load_app(f"{name}:missing")
        with pytest.raises(ModuleNotFoundError):
            load_app("no_such_module_anywhere")
    finally:
        sys.modules.pop(name, None)


def test_log_formatter_writes_the_fields_and_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError as e:
        error = e
    fields = {"job": "DI1", "queue": "q", "attempt": 2, "error": "ValueError('boom')", "note": "two words"}
    record = logging.getLogger("disque.worker").makeRecord(
        "disque.worker", logging.ERROR, __file__, 1, "job failed", (), (ValueError, error, error.__traceback__), extra=fields
    )
    entry = json.loads(LogFormatter(json_lines=True).format(record))
    assert {k: entry[k] for k in ("level", "logger", "message", *fields)} == {"level": "ERROR", "logger": "disque.worker", "message": "job failed", **fields}
    assert entry["traceback"].startswith("Traceback (most recent call last):") and entry["traceback"].endswith("ValueError: boom\n")
    first, *trace = LogFormatter().format(record).splitlines()
    assert first.endswith(""" ERROR disque.worker: job failed job=DI1 queue=q attempt=2 error=ValueError('boom') note="two words\"""")
    assert (trace[0], trace[-1]) == ("Traceback (most recent call last):", "ValueError: boom")


# --------------------------------------------------------------------------
# Workers in this process


def work(app: App, backend: str, **options: object) -> Worker:
    worker = Worker(app, **options)  # type: ignore[arg-type]
    anyio.run(functools.partial(worker.run, signals=False), backend=backend)
    return worker


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_and_async_handlers_until_the_queues_are_empty(backend: str, client: Client, shared_node: NodeProcess, queue: str) -> None:
    app = App(address(shared_node))
    seen: list[bytes] = []
    threads: set[str] = set()

    @app.job(queue)
    def in_a_thread(job: Job) -> None:
        threads.add(threading.current_thread().name)
        seen.append(job.body)

    @app.job(queue + "-async")
    async def in_a_task(job: Job) -> None:
        await anyio.sleep(0)
        seen.append(job.body)

    ids = [client.add_job(queue, f"sync {i}") for i in range(3)] + [client.add_job(queue + "-async", f"async {i}") for i in range(3)]
    worker = work(app, backend, concurrency=2, burst=True)
    assert sorted(seen) == sorted(f"{kind} {i}".encode() for kind in ("sync", "async") for i in range(3))
    assert (worker.processed, worker.failed) == (6, 0)
    assert [client.show(i) for i in ids] == [None] * 6  # acknowledged
    assert threads == {f"job {i}" for i in ids[:3]}  # a thread named after the job it runs


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_handlers_return_value_is_its_jobs_result(backend: str, client: Client, shared_node: NodeProcess, queue: str) -> None:
    app = App(address(shared_node))

    @app.job(queue)
    def handle(job: Job) -> object:
        return {b"text": "ok", b"bytes": b"raw", b"json": [1, 2], b"none": None, b"big": "x" * 20_000, b"odd": {1j}}[job.body]

    ids = client.add_jobs(queue, ["text", "bytes", "json", "none", "big", "odd"])
    worker = work(app, backend, burst=True)
    assert (worker.processed, worker.failed) == (6, 0)  # a result not kept still acknowledges its job
    assert client.wait_results(*ids) == (6, [b"ok", b"raw", b"[1, 2]", None, None, None])


def test_job_result_turns_a_return_value_into_bytes_within_the_size_rule() -> None:
    assert [job_result(v) for v in (None, b"b", "s", {"a": 1}, "x" * MAX_RESULT_BYTES)] == [
        None, b"b", b"s", b'{"a": 1}', b"x" * MAX_RESULT_BYTES
    ]
    assert job_result("x" * (MAX_RESULT_BYTES + 1)) is None and job_result(object()) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_quick_jobs_are_prefetched_acked_together_and_handed_back_on_stop(
    backend: str, client: Client, shared_node: NodeProcess, queue: str
) -> None:
    """The first fetch asks for one job; quick ones make the next ask for up
    to `prefetch`.  A finished job is acknowledged while the next one runs;
    the stop hands the prefetched jobs not started back (NACK)."""
    app = App(address(shared_node))
    holding, release = threading.Event(), threading.Event()

    @app.job(queue)
    def handle(job: Job) -> None:
        if job.body == b"hold":
            holding.set()
            release.wait(10)

    quick, second, hold, *rest = client.add_jobs(queue, ["quick", "second", "hold", "c", "d"], retry=60)
    worker = Worker(app, prefetch=4)
    acked_while_holding: list[bool] = []

    async def scenario() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(functools.partial(worker.run, signals=False))
            await anyio.to_thread.run_sync(holding.wait, 10)
            assert client.qlen(queue) == 0  # the three after `quick` came with `hold`
            await anyio.to_thread.run_sync(wait_for, lambda: client.show(second) is None)  # acked while `hold` runs
            acked_while_holding.append(client.show(hold) is not None)
            worker.stop()
            release.set()

    anyio.run(scenario, backend=backend)
    assert acked_while_holding == [True] and (worker.processed, worker.failed) == (3, 0)
    assert [client.show(i) for i in (quick, second, hold)] == [None] * 3
    for job_id in rest:  # not started: handed back at once, counted as a delivery
        info = client.show(job_id)
        assert info is not None and (info.state, info.nacks) == ("queued", 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_slot_heartbeats_keep_a_long_job_after_quick_ones(backend: str, client: Client, shared_node: NodeProcess, queue: str) -> None:
    """RETRY 1: without WORKING the node would queue the long job again
    after about a second; the quick jobs before it (and their ended
    heartbeat waits) change nothing."""
    app = App(address(shared_node))
    requeued: list[int] = []

    @app.job(queue)
    def handle(job: Job) -> None:
        if job.body == b"slow":
            with Client(address(shared_node)) as observer, pytest.raises(AssertionError):  # never requeued while it runs
                wait_for(lambda: observer.qlen(queue), timeout=2.0, what="a requeue")
            requeued.append(client.qlen(queue))

    ids = client.add_jobs(queue, ["quick", "quick", "slow"], retry=1)
    worker = work(app, backend, burst=True, first_heartbeat=0.3)
    assert requeued == [0] and (worker.processed, worker.failed) == (3, 0)
    assert [client.show(i) for i in ids] == [None] * 3


def test_prefetch_must_be_positive(shared_node: NodeProcess) -> None:
    app = App(address(shared_node))
    app.job("q")(lambda job: None)
    with pytest.raises(ValueError, match="prefetch"):
        Worker(app, prefetch=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failure_is_logged_with_its_traceback(
    backend: str, client: Client, shared_node: NodeProcess, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(address(shared_node))

    @app.job(queue, backoff=Backoff(base=4, jitter=0))
    def refuses(job: Job) -> None:
        raise ValueError(f"cannot handle {job.body.decode()}")

    job_id = client.add_job(queue, "this", retry=60)
    with caplog.at_level(logging.INFO, logger="disque.worker"):
        worker = work(app, backend, burst=True)
    [record] = [r for r in caplog.records if r.message == "job failed"]
    assert (record.job, record.queue, record.attempt, record.retry_in) == (job_id, queue, 1, 4)  # type: ignore[attr-defined]
    assert record.error == "ValueError('cannot handle this')"  # type: ignore[attr-defined]
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert "in refuses" in "".join(traceback.format_tb(record.exc_info[2]))
    assert (worker.processed, worker.failed) == (0, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_handlers_past_their_timeout_are_abandoned_as_failed(
    backend: str, client: Client, shared_node: NodeProcess, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(address(shared_node))
    never = threading.Event()

    @app.job(queue, timeout=0.2)
    def stuck_thread(job: Job) -> None:
        never.wait()

    @app.job(queue + "-async", timeout=0.2)
    async def stuck_task(job: Job) -> None:
        await anyio.sleep_forever()

    client.add_job(queue, "x", retry=60)
    client.add_job(queue + "-async", "y", retry=60)
    try:
        with caplog.at_level(logging.ERROR, logger="disque.worker"):
            worker = work(app, backend, concurrency=2, burst=True)
    finally:
        never.set()
    assert [r.error for r in caplog.records if r.message == "job failed"] == ["JobTimeout('still running after 0.2 s')"] * 2  # type: ignore[attr-defined]
    assert (worker.processed, worker.failed) == (0, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failing_job_comes_back_later_each_time_then_is_dead_lettered(
    backend: str, client: Client, shared_node: NodeProcess, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(address(shared_node))
    attempts: list[float] = []

    @app.job(queue, max_attempts=3, dead_letter=queue + "-dead", backoff=Backoff(base=1, factor=2, jitter=0))
    async def always_fails(job: Job) -> None:
        attempts.append(time.monotonic())
        raise RuntimeError("always")

    try:
        always_fails.send("doomed", retry=60)
    finally:
        app.close()
    worker = Worker(app)

    async def until_dead_lettered() -> None:
        async with anyio.create_task_group() as tasks, app.async_client() as watcher:
            tasks.start_soon(functools.partial(worker.run, signals=False))
            with anyio.fail_after(15):
                while await watcher.qlen(queue + "-dead") == 0:
                    assert not [r for r in caplog.records if r.message.startswith("could not settle")]
                    await anyio.sleep(0.05)
            worker.stop()

    with caplog.at_level(logging.INFO, logger="disque.worker"):
        anyio.run(until_dead_lettered, backend=backend)
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert len(gaps) == 2 and 0.9 <= gaps[0] < 1.8 and 1.9 <= gaps[1] < 2.8  # NACK DELAY 1, then 2
    [dead] = client.qpeek(queue + "-dead", 1)
    assert dead.body == b"doomed"
    shown = client.show(dead.id)  # the last failure went with it
    assert shown is not None and (shown.error_type, shown.error_message, shown.error_pid) == ("RuntimeError", "always", os.getpid())


# --------------------------------------------------------------------------
# `disque worker` processes


TASKS = """
import os, pathlib, time
from disque.client.worker import App

app = App()  # $DISQUE_NODES
OUT = pathlib.Path(os.environ["WORKER_OUT"])


@app.job(os.environ["WORKER_QUEUE"])
def handle(job):
    (OUT / f"started-{job.id}").touch()
    while job.body == b"hold" and not (OUT / "release").exists():
        time.sleep(0.01)
    (OUT / f"done-{job.id}").touch()
"""


class WorkerProcess:
    """`disque worker tasks:app` on the TASKS module: a job's handler marks
    it started, then (for a body of "hold") waits for `release`, then marks it done."""

    def __init__(self, workdir: Path, nodes: list[NodeProcess], queue: str, *options: str) -> None:
        workdir.mkdir()
        (workdir / "tasks.py").write_text(TASKS)
        self.out = workdir / "out"
        self.out.mkdir()
        self.log_path = workdir / "worker.log"
        env = {**os.environ, "DISQUE_NODES": ",".join(map(address, nodes)), "WORKER_OUT": str(self.out), "WORKER_QUEUE": queue}
        argv = [sys.executable, "-m", "disque.cli", "worker", "tasks:app", *options]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def _marked(self, mark: str) -> set[str]:
        return {p.name.removeprefix(mark) for p in self.out.glob(mark + "*")}

    def started(self) -> set[str]:
        return self._marked("started-")

    def done(self) -> set[str]:
        return self._marked("done-")

    def release(self) -> None:
        (self.out / "release").touch()

    def log(self) -> str:
        return self.log_path.read_text()

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def wait(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `disque worker` processes; any still running at teardown is killed by PID."""
    started: list[WorkerProcess] = []

    def start(nodes: list[NodeProcess], queue: str, *options: str) -> WorkerProcess:
        worker = WorkerProcess(tmp_path / f"worker-{len(started)}", nodes, queue, *options)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()


def test_concurrency_runs_that_many_jobs_at_once(start_worker: Callable[..., WorkerProcess], client: Client, shared_node: NodeProcess, queue: str) -> None:
    ids = [client.add_job(queue, "hold", retry=60) for _ in range(5)]
    worker = start_worker([shared_node], queue, "--concurrency", "3")
    wait_for(lambda: len(worker.started()) == 3, what="three jobs to start")
    with pytest.raises(AssertionError):  # the others wait for a free slot
        wait_for(lambda: len(worker.started()) > 3, timeout=1.0)
    assert client.qlen(queue) == 2
    worker.release()
    wait_for(lambda: worker.done() == set(ids), what="every job to be done")
    wait_for(lambda: [client.show(i) for i in ids] == [None] * 5, what="the jobs to be acknowledged")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_sigterm_lets_the_running_job_finish_and_fetches_no_more(
    start_worker: Callable[..., WorkerProcess], client: Client, shared_node: NodeProcess, queue: str
) -> None:
    long = client.add_job(queue, "hold", retry=60)
    worker = start_worker([shared_node], queue)
    wait_for(lambda: worker.started() == {long}, what="the long job to start")
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM: finishing the running jobs (grace 30 s)" in worker.log(), what="the signal to be handled")
    waiting = client.add_job(queue, "quick", retry=60)
    assert worker.proc.poll() is None and worker.done() == set()
    worker.release()
    assert worker.wait() == 0
    assert worker.done() == {long} and client.show(long) is None  # finished, then acknowledged
    assert [j.id for j in client.qpeek(queue, 5)] == [waiting]  # never fetched
    assert "worker stopped processed=1 failed=0" in worker.log()


@pytest.mark.parametrize("signals", [1, 2])
def test_a_job_still_running_when_the_grace_period_ends_is_nacked(
    start_worker: Callable[..., WorkerProcess], client: Client, shared_node: NodeProcess, queue: str, signals: int
) -> None:
    """One SIGTERM and a grace period of 0.5 s, or a second SIGTERM during a long one."""
    long = client.add_job(queue, "hold", retry=60)
    worker = start_worker([shared_node], queue, "--grace", "0.5" if signals == 1 else "600")
    wait_for(lambda: worker.started() == {long}, what="the long job to start")
    worker.signal(signal.SIGTERM)
    if signals == 2:
        wait_for(lambda: "SIGTERM: finishing" in worker.log(), what="the first signal to be handled")
        worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    info = client.show(long)
    assert info is not None and (info.state, info.nacks) == ("queued", 1)
    assert worker.done() == set() and "job interrupted by the stop, NACKed" in worker.log()


def test_burst_exits_once_the_queue_is_empty(start_worker: Callable[..., WorkerProcess], client: Client, shared_node: NodeProcess, queue: str) -> None:
    ids = [client.add_job(queue, "quick") for _ in range(4)]
    worker = start_worker([shared_node], queue, "--burst", "--concurrency", "2", "--backend", "trio", "--json-logs")
    assert worker.wait() == 0
    assert worker.done() == set(ids) and client.qlen(queue) == 0
    entries = [json.loads(line) for line in worker.log().splitlines()]
    assert (entries[0]["message"], entries[0]["concurrency"]) == ("worker started", 2)
    assert (entries[-1]["message"], entries[-1]["processed"]) == ("worker stopped", 4)


def test_a_worker_survives_every_node_restarting(start_worker: Callable[..., WorkerProcess], spawn: Callable[..., NodeProcess], queue: str) -> None:
    nodes = start_all([spawn, spawn])
    mesh(nodes)
    worker = start_worker(nodes, queue, "--concurrency", "2")
    with Client([address(n) for n in nodes]) as producer:
        before = producer.add_job(queue, "quick", replicate=1)
        wait_for(lambda: before in worker.done(), what="the first job")
        for node in nodes:
            node.stop()
        wait_for(lambda: "cannot fetch jobs" in worker.log(), what="the worker to find no node")
        start_all([node.start for node in nodes])
        after = producer.add_job(queue, "quick", replicate=1)
        wait_for(lambda: after in worker.done(), timeout=30, what="a job after the restart")
    assert worker.proc.poll() is None  # it never exited
    assert "connected again" in worker.log()
