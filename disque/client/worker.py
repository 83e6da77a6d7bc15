"""Workers that survive real failures: handlers declared on an `App`, run
`concurrency` jobs at a time by `run_worker` (`disque worker module:app`).

Theory of operation
-------------------
`App.job(queue, ...)` registers a `Handler`: the function (sync or async), its
queue, a per-job `timeout`, and what a failure leads to.  Producers send
through the handler (`handler.send(body)`), so MAXATTEMPTS and DEADLETTER
travel with every job and the server enforces them, even for deliveries that
no worker lived to count (`retries=n` is `max_attempts=n + 1`).

`Worker.run` (anyio: asyncio or trio) runs `concurrency` slots.  Each slot owns
one `AsyncClient`, so the GETJOB, WORKING and ACKJOB/NACK of a job all go to
the node that handed it out, and a blocked GETJOB never holds up another slot;
its connection is named `worker:<host>:<pid>:<slot>` (CLIENT SETNAME, on every
connect), so CLIENT LIST and the dashboard show which worker waits where:

    GETJOB COUNT n (GETJOB NOHANG in burst mode), n = 1 at first, then as
    many jobs as the slot ran in the last `PACE` seconds (`prefetch` at most):
    quick jobs come in batches, slow ones one at a time
    -> each job in turn: the handler (async: awaited in the slot; sync: in a
       daemon thread the slot reuses while its handlers return), `timeout`
       seconds at most; the slot's heartbeat task (one for the slot's life,
       not one per job) sends WORKING for a job still running after
       `first_heartbeat` seconds, then every RETRY/2
    -> ACKJOB when it returns, of all the jobs finished since the last one,
       each with its handler's return value as its result (`job_result`):
       in the same write as the next GETJOB, or alone after `ACK_DELAY`
       (a long job never holds back the ACK of the quick one before it);
       when it raises (or times out), the failure is
       logged with its traceback and the job NACKed with a DELAY growing
       exponentially with its delivery count, jittered (`Backoff`), and the
       error (NACK ... ERROR: type, message, traceback, host, pid), which
       SHOW and the job's dead letter show.  On the
       last allowed delivery the server moves the job to the dead-letter
       queue instead (the DELAY still holds back a job sent without the
       handler's MAXATTEMPTS).

A slot that reaches no node sleeps (`RECONNECT` backoff) and tries again,
forever.  SIGTERM or SIGINT stops the fetching; running jobs get `grace`
seconds to finish, then are cancelled (a sync handler's thread is abandoned,
and dies with the process) and NACKed, as are the prefetched jobs not
started, at once; a second signal ends the grace period at once.  In burst mode a slot stops when GETJOB NOHANG finds nothing (its
node's queues are empty), and the worker when every slot has.

Logs are records of the `disque.worker` logger (a name of its own, not the
module's, so that log configurations naming it still apply) whose fields (`job`, `queue`,
`attempt`, `retry_in`, ...) are record attributes; `LogFormatter` writes them
as `key=value` text or as one JSON object per line.
"""

from __future__ import annotations

import contextvars
import importlib
import itertools
import inspect
import json
import logging
import os
import queue
import random
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import click

from disque.client import (
    FIRST_HEARTBEAT,
    Address,
    AsyncClient,
    Client,
    DisqueConnectionError,
    DisqueReplyError,
    Job,
    JobHandle,
    connection_name,
    format_address,
    tracing,
)
from disque.client.base import _next_heartbeat
from disque.client.protocol import Arg

log = logging.getLogger("disque.worker")


@dataclass(frozen=True)
class Backoff:
    """Delay before retry n (n = 1 after the first failure): `base *
    factor**(n-1)`, at most `cap`, less a random part of up to `jitter` of
    it, so jobs that failed together do not all come back together."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.25

    def delay(self, n: int, rng: random.Random) -> float:
        exact = min(self.cap, self.base * self.factor ** min(n - 1, 64))
        return exact * (1 - self.jitter * rng.random())


RECONNECT = Backoff(base=0.1, cap=5.0, jitter=0.5)
PACE = 0.05  # s: a slot fetches as many jobs as it ran in this long (at least 1, at most the prefetch)
ACK_DELAY = 0.02  # s: a finished job's ACKJOB waits this long at most for a fetch to carry it
MAX_RESULT_BYTES = 16 * 1024  # the server's largest result (ACKJOB ... RESULT)


def job_result(value: Any) -> bytes | None:
    """A handler's return value as its job's result (ACKJOB ... RESULT,
    docs/workflows.md): None is none; bytes go as they are, a str in UTF-8,
    anything else as JSON.  A value with no JSON form, or a result over
    the server's 16 KiB, is not kept: the job is acknowledged without it,
    and a warning says why."""
    if value is None or isinstance(value, bytes):
        result = value
    elif isinstance(value, str):
        result = value.encode()
    else:
        try:
            result = json.dumps(value).encode()
        except (TypeError, ValueError) as e:
            log.warning("the handler's return value is not kept as the job's result: %s", e)
            return None
    if result is not None and len(result) > MAX_RESULT_BYTES:
        log.warning("the handler's return value is not kept as the job's result: %d bytes, over %d", len(result), MAX_RESULT_BYTES)
        return None
    return result


PERIOD_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_period(period: str | float) -> int:
    """A period in ms: "250ms", "90s", "5m", "1h", "1d", or a number (not a
    string) of seconds.  A string without its unit ("5": seconds? minutes?)
    is refused, with the forms accepted."""
    if isinstance(period, (int, float)):
        return round(period * 1000)
    text = period.strip().lower()
    unit = "ms" if text.endswith("ms") else text[-1:]
    try:
        return round(float(text.removesuffix(unit)) * PERIOD_UNITS[unit])
    except (ValueError, KeyError):
        raise ValueError(f"not a period: {period!r} (a number and its unit: 250ms, 90s, 5m, 1h, 1d)") from None


@dataclass(frozen=True)
class Handler:
    """A function registered by `App.job`; calling it calls the function."""

    app: App
    queue: str
    fn: Callable[[Job], Any]
    max_attempts: int | None
    dead_letter: str | None
    timeout: float | None
    backoff: Backoff
    priority: int | None = None
    parent_results: bool = False  # the job reaches the function with its parents' results (`Job.parent_results`)

    def __call__(self, job: Job) -> Any:
        return self.fn(job)

    @property
    def job_options(self) -> dict[str, Any]:
        """The ADDJOB options every job of this handler carries."""
        return {"max_attempts": self.max_attempts, "dead_letter": self.dead_letter, "priority": self.priority}

    def send(self, body: str | bytes, **options: Any) -> JobHandle:
        """ADDJOB to the handler's queue, with its options, through the app's
        client; `options` are `Client.add_job`'s.  Returns the job ID."""
        return self.app.client.add_job(self.queue, body, **(self.job_options | options))

    def retry_delay(self, job: Job, rng: random.Random) -> int:
        """Whole seconds (NACK DELAY) before the failed `job` may be delivered again."""
        return max(1, round(self.backoff.delay(job.deliveries or 1, rng)))

    def exhausted(self, job: Job) -> bool:
        """Whether this delivery of `job` was its last allowed one."""
        return self.max_attempts is not None and (job.deliveries or 1) >= self.max_attempts


class App:
    """Handlers and the nodes they consume from.

    `nodes` defaults to `$DISQUE_NODES` (comma-separated `host:port`) or
    127.0.0.1:7711, `password` to `$DISQUE_AUTH`; the other keyword
    arguments are `Client`'s (tls=..., affinity=...)."""

    def __init__(self, nodes: str | Address | list[str | Address] | None = None, **client_options: Any) -> None:
        self.nodes = nodes if nodes is not None else os.environ.get("DISQUE_NODES", "127.0.0.1:7711").split(",")
        client_options.setdefault("password", os.environ.get("DISQUE_AUTH"))
        self.client_options = client_options
        self.handlers: dict[str, Handler] = {}
        self.schedules: dict[str, list[str | int]] = {}  # name -> SCHEDULE ADD's arguments after the name
        self.limits: dict[str, list[str | int]] = {}  # queue -> QCONFIG SET's options (docs/limits.md)
        self._client: Client | None = None

    def job(
        self,
        queue: str,
        *,
        retries: int | None = None,
        max_attempts: int | None = None,
        dead_letter: str | None = None,
        timeout: float | None = None,
        backoff: Backoff = Backoff(),
        priority: int | None = None,
        rate: str | None = None,
        concurrency: int | None = None,
        ordered: bool = False,
        parent_results: bool = False,
    ) -> Callable[[Callable[[Job], Any]], Handler]:
        """Decorator: the function handles the jobs of `queue`.  A job is
        delivered at most `max_attempts` times (`retries` + 1), then moved to
        `dead_letter` (the server's default dead-letter queue if None); each
        run may take `timeout` seconds.  `send` adds jobs of `priority`
        (0-9, the queue's default if None; `send(..., priority=p)` overrides it).
        `rate` ("100/s", "20/m", "500/h") and `concurrency` become the
        queue's cluster-wide limits (QCONFIG SET, docs/limits.md) when a
        worker starts: how many jobs the whole cluster hands out per period,
        and how many may be out at once; `ordered` makes it hand out one
        job per key at a time, each key's oldest first (docs/keys.md).
        With `parent_results`, a job added AFTER others reaches the function
        with their results in `job.parent_results` (read from the node that
        served it, before the function runs: a failure to read them fails
        the attempt; docs/workflows.md)."""
        if retries is not None:
            if max_attempts is not None:
                raise ValueError("give retries or max_attempts, not both")
            max_attempts = retries + 1
        if dead_letter is not None and max_attempts is None:
            raise ValueError("dead_letter needs retries or max_attempts")
        if queue in self.handlers:
            raise ValueError(f"queue {queue!r} already has a handler")
        if rate is not None and not re.fullmatch(r"[1-9][0-9]*/[smh]", rate):
            raise ValueError(f"rate must be <n>/s, <n>/m or <n>/h, not {rate!r}")
        limits: list[str | int] = ["rate-limit", rate] if rate else []
        if concurrency is not None:
            limits += ["concurrency", concurrency]
        if ordered:
            limits += ["ordered", "yes"]
        if limits:
            self.limits[queue] = limits

        def register(fn: Callable[[Job], Any]) -> Handler:
            handler = Handler(self, queue, fn, max_attempts, dead_letter, timeout, backoff, priority, parent_results)
            self.handlers[queue] = handler
            return handler

        return register

    def every(
        self, period: str | float, queue: str | None = None, *, name: str | None = None, body: str = "",
        ttl: int | None = None, **job_options: Any,
    ) -> Callable[[Callable[[Job], Any]], Handler]:  # fmt: skip
        """Decorator: `job` for `queue` (default: the function's name), plus
        a recurring job added to it every `period` ("90s", "5m", "1h", "1d",
        "250ms" or seconds), registered (SCHEDULE ADD, docs/schedules.md)
        when a worker starts; `name` defaults to the queue's."""
        return self._scheduled(["EVERY", parse_period(period)], queue, name, body, ttl, job_options)

    def cron(
        self, expr: str, queue: str | None = None, *, tz: str | None = None, name: str | None = None, body: str = "",
        ttl: int | None = None, **job_options: Any,
    ) -> Callable[[Callable[[Job], Any]], Handler]:  # fmt: skip
        """Decorator: as `every`, at the times of a 5-field cron expression
        (in zone `tz`, UTC by default)."""
        return self._scheduled(["CRON", expr, *(["TZ", tz] if tz else [])], queue, name, body, ttl, job_options)

    def _scheduled(
        self, when: list[str | int], queue: str | None, name: str | None, body: str, ttl: int | None,
        job_options: dict[str, Any],
    ) -> Callable[[Callable[[Job], Any]], Handler]:  # fmt: skip
        def register(fn: Callable[[Job], Any]) -> Handler:
            handler = self.job(queue or fn.__name__, **job_options)(fn)
            words: list[str | int] = ["TTL", ttl] if ttl else []
            if handler.max_attempts is not None:  # the handler's retries travel with each tick's job
                words += ["MAXATTEMPTS", handler.max_attempts]
            if handler.dead_letter is not None:
                words += ["DEADLETTER", handler.dead_letter]
            self.schedules[name or handler.queue] = [handler.queue, body, *when, *words]
            return handler

        return register

    @property
    def client(self) -> Client:
        """A synchronous client shared by the producers of this process."""
        if self._client is None:
            self._client = Client(self.nodes, **self.client_options)
        return self._client

    def async_client(self, name: str | None = None) -> AsyncClient:
        """A new asynchronous client (one connection) to the app's nodes,
        named `name` (CLIENT SETNAME) if given."""
        return AsyncClient(self.nodes, **(self.client_options | ({"name": name} if name else {})))

    def close(self) -> None:
        """Close the producers' client, if it was opened."""
        if self._client is not None:
            self._client.close()


# --------------------------------------------------------------------------
# Running handlers


class _Threads:
    """Daemon threads that run sync handlers, reused from job to job (each
    named after the job it runs).  One whose wait is cancelled (a timeout,
    the end of the grace period) is abandoned and never reused: a handler
    that never returns cannot hold up the next job, nor keep the process
    alive.  The thread tells the event loop it is done without waiting for it."""

    def __init__(self) -> None:
        self.idle: list[queue.SimpleQueue[Any]] = []

    async def run(self, fn: Callable[[Job], Any], job: Job) -> Any:
        inbox = self.idle.pop() if self.idle else self._start()
        done = anyio.Event()
        token = anyio.lowlevel.current_token()
        outcome: list[Any] = []  # the exception raised (None), the value returned
        context = contextvars.copy_context()  # the job's span, and whatever else the slot's context holds
        inbox.put((context, fn, job, outcome, lambda: token.backend_class.run_sync_soon(done.set, (), token.native_token)))
        await done.wait()
        self.idle.append(inbox)
        if outcome[0] is not None:
            raise outcome[0]
        return outcome[1]

    @staticmethod
    def _start() -> queue.SimpleQueue[Any]:
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def serve() -> None:
            while True:
                context, fn, job, outcome, notify = inbox.get()
                threading.current_thread().name = f"job {job.id}"
                try:
                    outcome += [None, context.run(fn, job)]
                except BaseException as e:
                    outcome += [e, None]
                try:
                    notify()
                except anyio.RunFinishedError:
                    return  # abandoned: the worker has stopped

        threading.Thread(target=serve, daemon=True).start()
        return inbox


class BadSetting(ValueError):
    """A node refused one of the app's schedules or limits (SCHEDULE ADD's or QCONFIG SET's error, naming it)."""


class JobTimeout(TimeoutError):
    """A handler ran longer than its `timeout`."""


def _fields(job: Job, **more: Any) -> dict[str, Any]:
    return {"job": job.id, "queue": job.queue, "attempt": job.deliveries, **more}


class _Acks:
    """A slot's finished jobs not yet acknowledged: their ACKJOB goes with
    the slot's next GETJOB, or alone once they have waited ACK_DELAY.
    `ids` are ACKJOB's arguments: each ID, and `RESULT <bytes>` after
    those that have one."""

    def __init__(self) -> None:
        self.ids: list[Arg] = []
        self.added = anyio.Event()

    def add(self, job_id: str, result: bytes | None = None) -> None:
        self.ids += [job_id] if result is None else [job_id, "RESULT", result]
        self.added.set()

    def take(self) -> list[Arg]:
        ids, self.ids = self.ids, []
        if self.added.is_set():
            self.added = anyio.Event()
        return ids

    def restore(self, ids: list[Arg]) -> None:
        self.ids[:0] = ids
        if ids:
            self.added.set()


class _Beat:
    """A slot's running job (None between jobs) and when it started, for
    the slot's heartbeat task (`Worker._heartbeats`)."""

    def __init__(self) -> None:
        self.job: Job | None = None
        self.since = 0.0
        self._changed: anyio.Event | None = None  # set when a job starts, if the task waits for one

    def start(self, job: Job) -> None:
        self.job, self.since = job, anyio.current_time()
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_change(self) -> None:
        self._changed = anyio.Event()
        await self._changed.wait()


class _CancelGroup:
    """Cancel scopes cancelled together, those entered afterwards included."""

    def __init__(self) -> None:
        self.scopes: set[anyio.CancelScope] = set()
        self.cancelled = False

    @contextmanager
    def scope(self) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            if self.cancelled:
                scope.cancel()
            self.scopes.add(scope)
            try:
                yield scope
            finally:
                self.scopes.discard(scope)

    def cancel(self) -> None:
        self.cancelled = True
        for scope in self.scopes:
            scope.cancel()


@dataclass
class Worker:
    """Runs an app's handlers (those of `queues`, all by default); see the module docstring."""

    app: App
    concurrency: int = 1
    burst: bool = False
    grace: float = 30.0
    queues: tuple[str, ...] = ()
    first_heartbeat: float | None = FIRST_HEARTBEAT
    prefetch: int = 8  # jobs a slot fetches at most at once (fewer while its jobs are slow: PACE)
    rng: random.Random = field(default_factory=random.Random)
    processed: int = 0  # jobs acknowledged
    failed: int = 0  # failed runs, each NACKed or left to the job's RETRY
    _handlers: dict[str, Handler] = field(init=False)
    _fetching: _CancelGroup = field(default_factory=_CancelGroup, init=False)  # cancelled by `stop`
    _running: _CancelGroup = field(default_factory=_CancelGroup, init=False)  # cancelled when the grace ends
    _tasks: anyio.abc.TaskGroup | None = field(default=None, init=False)
    _threads: _Threads = field(default_factory=_Threads, init=False)

    def __post_init__(self) -> None:
        unknown = set(self.queues) - set(self.app.handlers)
        if unknown:
            raise ValueError(f"no handler for queue(s) {', '.join(sorted(unknown))}")
        self._handlers = {q: h for q, h in self.app.handlers.items() if not self.queues or q in self.queues}
        if not self._handlers:
            raise ValueError("the app has no handler")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.prefetch < 1:
            raise ValueError("prefetch must be at least 1")

    async def run(self, *, signals: bool = True) -> None:
        """Work until stopped (`stop`, or SIGTERM/SIGINT when `signals`), or
        in burst mode until the queues are empty."""
        log.info("worker started", extra={"queues": ",".join(self._handlers), "concurrency": self.concurrency})
        try:
            async with anyio.create_task_group() as self._tasks:
                if signals:
                    self._tasks.start_soon(self._watch_signals)
                if self.app.schedules or self.app.limits:
                    self._tasks.start_soon(self._register_settings)
                async with anyio.create_task_group() as slots:
                    for n in range(1, self.concurrency + 1):
                        slots.start_soon(self._slot, n)
                self._tasks.cancel_scope.cancel()  # the signal watcher and grace timer
        except* BadSetting as group:  # the one error, not the task groups around it
            raise group.exceptions[0] from None
        log.info("worker stopped", extra={"processed": self.processed, "failed": self.failed})

    def stop(self) -> None:
        """Stop fetching and let running jobs finish for `grace` seconds; a
        second call cancels them now.  Call it from the worker's event loop."""
        if self._fetching.cancelled:
            self._running.cancel()
            return
        self._fetching.cancel()
        assert self._tasks is not None, "stop() before run()"
        self._tasks.start_soon(self._grace_timer)

    async def _register_settings(self) -> None:
        """SCHEDULE ADD of the app's schedules and QCONFIG SET of its limits,
        until a node takes them (setting an unchanged one again changes
        nothing, so every worker does it)."""
        app = self.app
        commands = [(f"schedule {name!r} (queue {args[0]!r})", ["SCHEDULE", "ADD", name, *args]) for name, args in app.schedules.items()]
        commands += [(f"the limits of queue {queue!r}", ["QCONFIG", queue, "SET", *words]) for queue, words in app.limits.items()]
        client = app.async_client()
        try:
            for tries in itertools.count(1):
                try:
                    for what, argv in commands:
                        try:
                            await client.execute_command(*argv)
                        except DisqueReplyError as e:
                            raise BadSetting(f"{what}: {e.message or e}") from None
                    log.info("settings registered", extra={"schedules": ",".join(app.schedules), "limits": ",".join(app.limits)})
                    return
                except DisqueConnectionError as e:
                    delay = RECONNECT.delay(tries, self.rng)
                    log.warning("cannot register the settings: %s", e, extra={"retry_in": round(delay, 2)})
                    await anyio.sleep(delay)
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()

    async def _grace_timer(self) -> None:
        await anyio.sleep(self.grace)
        self._running.cancel()

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                again = "cancelling the running jobs" if self._fetching.cancelled else f"finishing the running jobs (grace {self.grace:g} s)"
                log.warning("%s: %s", signal.Signals(signum).name, again)
                self.stop()

    async def _slot(self, n: int) -> None:
        client = self.app.async_client(connection_name("worker", n))
        acks, beat = _Acks(), _Beat()
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._acker, client, acks)
                tasks.start_soon(self._heartbeats, client, beat)
                await self._consume(client, acks, beat)
                tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._acknowledge(client, acks.take())
                await client.close()

    async def _consume(self, client: AsyncClient, acks: _Acks, beat: _Beat) -> None:
        """Fetch (the finished jobs' ACKJOB in the same write) and run, until stopped."""
        queues = list(self._handlers)
        outage = 0  # failed tries in a row
        count = 1  # jobs asked for: as many as the slot's pace runs in PACE seconds
        while not self._fetching.cancelled:
            jobs: list[Job] = []
            with self._fetching.scope():
                acking = acks.take()
                try:
                    if outage:
                        await client.connect()
                        log.info("connected again", extra={"node": format_address(client.address), "tries": outage})  # type: ignore[arg-type]
                        outage = 0
                    jobs = await client.get_jobs(*queues, count=count, nohang=self.burst, acking=acking)
                except BaseException as e:
                    acks.restore(acking)  # sent again with the next fetch (an ACKJOB twice is harmless)
                    if not isinstance(e, (DisqueConnectionError, DisqueReplyError)):
                        raise
                    outage += 1
                    delay = RECONNECT.delay(outage, self.rng)
                    log.warning("cannot fetch jobs: %s", e, extra={"retry_in": round(delay, 2), "tries": outage})
                    await anyio.sleep(delay)
                    continue
            if not jobs and self.burst:
                return
            started = time.monotonic()
            for i, job in enumerate(jobs):
                if self._fetching.cancelled:
                    await self._hand_back(client, jobs[i:])
                    break
                await self._process(client, job, acks, beat)
            pace = (time.monotonic() - started) / max(1, len(jobs))
            count = max(1, min(self.prefetch, int(PACE / pace) if pace else self.prefetch))

    async def _acker(self, client: AsyncClient, acks: _Acks) -> None:
        """ACKJOB of finished jobs that waited ACK_DELAY without a fetch to carry them."""
        while True:
            await acks.added.wait()
            await anyio.sleep(ACK_DELAY)
            await self._acknowledge(client, acks.take())

    async def _acknowledge(self, client: AsyncClient, args: list[Arg]) -> None:
        if not args:
            return
        try:
            with anyio.CancelScope(shield=True):  # never cut a request in half
                await client.ack(*args)  # type: ignore[arg-type]  # (the IDs, with their RESULTs)
        except (DisqueConnectionError, DisqueReplyError) as e:
            ids = [a for a in args if isinstance(a, str) and a != "RESULT"]  # (a result is bytes)
            log.warning("could not acknowledge %d job(s), they will be delivered again: %s", len(ids), e, extra={"jobs": ",".join(ids)})

    async def _hand_back(self, client: AsyncClient, jobs: list[Job]) -> None:
        """NACK, with no DELAY, of prefetched jobs the stop left unstarted, so
        that another worker runs them at once (a NACK counts a delivery, as
        for a job interrupted by the stop)."""
        log.info("prefetched jobs handed back", extra={"jobs": ",".join(j.id for j in jobs)})
        await self._settle(client.nack(*[j.id for j in jobs]), jobs[0])

    async def _process(self, client: AsyncClient, job: Job, acks: _Acks, beat: _Beat) -> None:
        handler = self._handlers[job.queue]
        started = time.monotonic()
        with self._running.scope() as scope:
            error, value = await self._attempt(client, beat, handler, job)
        if scope.cancelled_caught:
            log.warning("job interrupted by the stop, NACKed", extra=_fields(job))
            await self._settle(client.nack(job.id), job)
        elif error is None:
            self.processed += 1
            log.debug("job done", extra=_fields(job, seconds=round(time.monotonic() - started, 3)))
            acks.add(job.id, job_result(value))
        else:
            self.failed += 1
            delay = handler.retry_delay(job, self.rng)
            outcome = {"dead_letter": handler.dead_letter or "(default)"} if handler.exhausted(job) else {"retry_in": delay}
            log.error("job failed", exc_info=error, extra=_fields(job, error=repr(error), **outcome))
            await self._settle(client.nack(job.id, delay=delay, error=error), job)  # the reason stays with the job

    async def _attempt(self, client: AsyncClient, beat: _Beat, handler: Handler, job: Job) -> tuple[Exception | None, Any]:
        """`_run_handler` in the job's trace span (disque.client.tracing), which
        also takes a producer's trace context off the body."""
        with tracing.processing(job, handler.exhausted(job)) as traced:
            error, value = await self._run_handler(client, beat, handler, traced.job)
            traced.end(error)
            return error, value

    async def _run_handler(self, client: AsyncClient, beat: _Beat, handler: Handler, job: Job) -> tuple[Exception | None, Any]:
        """Run the handler (given its parents' results first, if it asked
        for them, on the slot's node: the one that served the job), the
        slot's heartbeats watching it; the exception it raised, if any, and
        the value it returned."""
        beat.start(job)
        error: Exception | None = None
        value: Any = None
        try:
            with anyio.fail_after(handler.timeout) as deadline:
                if handler.parent_results:
                    job = replace(job, parent_results=await client.parent_results(job.id))
                if inspect.iscoroutinefunction(handler.fn):
                    value = await handler.fn(job)
                else:
                    value = await self._threads.run(handler.fn, job)
        except Exception as e:
            error = e
        finally:
            beat.job = None
        if deadline.cancelled_caught:
            timeout = JobTimeout(f"still running after {handler.timeout:g} s")
            timeout.__cause__ = error  # anyio's TimeoutError: its context shows where the handler was
            error = timeout
        return error, value

    async def _heartbeats(self, client: AsyncClient, beat: _Beat) -> None:
        """WORKING for the slot's running job `first_heartbeat` seconds after
        it started, then every RETRY/2, until it ends; gives up on a job,
        with a warning, once the node cannot be reached or no longer knows
        it.  One task for the slot's life: quick jobs cost it no wake-up."""
        while True:
            job = beat.job
            if job is None or self.first_heartbeat is None:
                await beat.wait_change()
                continue
            await anyio.sleep_until(beat.since + self.first_heartbeat)
            delay: float | None = self.first_heartbeat
            while beat.job is job and delay is not None:
                try:
                    with anyio.CancelScope(shield=True):  # never cut a request in half
                        delay = _next_heartbeat(await client.working(job.id))
                except (DisqueReplyError, DisqueConnectionError) as e:
                    log.warning("WORKING %s: %s", job.id, e)
                    delay = None
                if delay is not None:
                    await anyio.sleep(delay)
            if beat.job is job:  # given up: wait for the next job
                await beat.wait_change()

    async def _settle(self, request: Any, job: Job) -> None:
        """ACKJOB or NACK; when it fails the job comes back after its RETRY."""
        try:
            await request
        except (DisqueConnectionError, DisqueReplyError) as e:
            log.warning("could not settle the job, it will be delivered again: %s", e, extra=_fields(job))


# --------------------------------------------------------------------------
# The command


_RECORD_KEYS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class LogFormatter(logging.Formatter):
    """A record's message, its extra fields and the traceback: as
    `time level logger: message key=value ...` lines, or one JSON object."""

    def __init__(self, json_lines: bool = False) -> None:
        super().__init__()
        self.json_lines = json_lines

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _RECORD_KEYS}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        trace = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else None
        if self.json_lines:
            entry = {"time": stamp, "level": record.levelname, "logger": record.name, "message": record.getMessage(), **fields}
            return json.dumps({**entry, "traceback": trace} if trace else entry, default=str)
        pairs = "".join(f" {k}={json.dumps(v, default=str) if isinstance(v, str) and ' ' in v else v}" for k, v in fields.items())
        text = f"{stamp} {record.levelname} {record.name}: {record.getMessage()}{pairs}"
        return text + "\n" + trace.rstrip() if trace else text


def load_app(path: str) -> App:
    """`module:attribute` (`module` alone: its `app`), the current directory importable."""
    module_name, _, attribute = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    value: Any = importlib.import_module(module_name)
    for name in (attribute or "app").split("."):
        value = getattr(value, name)
    if not isinstance(value, App):
        raise TypeError(f"{path} is a {type(value).__name__}, not a disque.client.worker.App")
    return value


def run_worker(
    app_path: str,
    concurrency: int = 1,
    burst: bool = False,
    *,
    grace: float = 30.0,
    queues: tuple[str, ...] = (),
    nodes: list[str] | None = None,
    backend: str = "asyncio",
    prefetch: int = 8,
    json_logs: bool = False,
    level: int = logging.INFO,
) -> Worker:
    """Load the app, log to stderr, and work until stopped (see `Worker`).
    A missing module or app, or a bad option, is a `click.UsageError`."""
    try:
        app = load_app(app_path)
        if nodes:
            app.nodes = nodes
        worker = Worker(app, concurrency=concurrency, burst=burst, grace=grace, queues=queues, prefetch=prefetch)
    except (ModuleNotFoundError, AttributeError, TypeError, ValueError) as e:
        raise click.UsageError(str(e)) from e
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter(json_logs))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    try:
        anyio.run(worker.run, backend=backend)
    except BadSetting as e:
        raise click.ClickException(str(e)) from None
    return worker


@click.command("worker")
@click.argument("app_path", metavar="MODULE:APP")
@click.option("-c", "--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Jobs run at once.")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.option("--grace", default=30.0, show_default=True, help="Seconds running jobs get to finish after SIGTERM/SIGINT.")
@click.option("-q", "--queue", "queues", multiple=True, help="Only this queue's handler (repeatable).")
@click.option("--node", "nodes", multiple=True, metavar="HOST:PORT", help="Node to connect to, instead of the app's (repeatable).")
@click.option("--backend", type=click.Choice(["asyncio", "trio"]), default="asyncio", show_default=True, help="Event loop for the handlers.")
@click.option("--json-logs", is_flag=True, help="One JSON object per log line.")
@click.option("--prefetch", default=8, show_default=True, type=click.IntRange(min=1), help="Jobs a slot fetches at most at once, while its jobs are quick.")
@click.option("-v", "--verbose", is_flag=True, help="Log every job done too.")
def worker_command(
    app_path: str, concurrency: int, burst: bool, grace: float, queues: tuple[str, ...], nodes: tuple[str, ...],
    backend: str, json_logs: bool, prefetch: int, verbose: bool,
) -> None:  # fmt: skip
    """Run the handlers of MODULE:APP (a disque.client.worker.App), CONCURRENCY
    jobs at a time, until SIGTERM or SIGINT.  The nodes are the app's (or --node),
    not -h/-p."""
    run_worker(app_path, concurrency, burst, grace=grace, queues=queues, nodes=list(nodes) or None,
               backend=backend, prefetch=prefetch, json_logs=json_logs, level=logging.DEBUG if verbose else logging.INFO)  # fmt: skip


if __name__ == "__main__":
    worker_command()
