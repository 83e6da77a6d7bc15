"""A Dramatiq broker: Dramatiq actors enqueue to and consume from disque.

Theory of operation
-------------------
A Dramatiq message is a disque job whose body is the encoded message, in the
queue named after the actor's queue.  The broker maps Dramatiq's pieces onto
the server's, so that retries and dead letters live in the cluster, not in a
worker's memory:

* `enqueue(message, delay=)` is ADDJOB (`DELAY` in whole seconds, rounded
  up).  When the actor retries (the `Retries` middleware with a
  `max_retries`), the job gets `MAXATTEMPTS max_retries + 1` and `DEADLETTER
  <queue>.XQ`, Dramatiq's dead-letter name.  A message's `broker_priority`
  option (as RabbitMQ's broker takes it: higher first) is the job's
  `PRIORITY`, held to 0-9; without it the job takes its queue's default.
  Its `key`, `dedup` and `debounce` options are ADDJOB's KEY, DEDUP and
  DEBOUNCE (docs/keys.md: `send_with_options(args=..., key="order-42",
  dedup=60000)` adds nothing while a job of that key holds it; with
  `debounce=500` the key's last message runs 500 ms after it was sent,
  the earlier ones of the burst never).
* A consumer reads with GETJOB COUNT n WITHCOUNTERS on a connection of its
  own (named `dramatiq:<host>:<pid>:<queue>` for CLIENT LIST), n being the
  room the worker's prefetch leaves (its messages not yet acked or nacked),
  and hands the jobs out one at a time; a
  message's `retries` option is its job's NACK count, so the count Dramatiq
  uses is the server's.
* A retry: `Retries` enqueues the failed message again with a delay.  For a
  message that came from disque the broker does not add a job: it notes the
  delay, and the consumer answers the delivery with `NACK <id> DELAY <s>`
  instead of an ACK (the same job, its failure counted, and the exception
  the actor raised reported with it: NACK ... ERROR, which SHOW and the
  job's dead letter in `<queue>.XQ` show).
* `ack` is ACKJOB.  `nack` (the retries are exhausted, or the actor's
  `throws` matched) is NACK when the delivery was the job's last attempt:
  the server moves it to `<queue>.XQ`; before that (`throws`), or when the
  `Results` middleware keeps the exception as the message's result, the
  broker adds the message to `<queue>.XQ` itself and acknowledges the job
  (with that result; both in one write: a pipeline).
* `requeue` (prefetched messages a stopping worker did not run) is ENQUEUE,
  as is `close` for the jobs fetched but not handed out yet.
* An actor's `queue_rate` ("100/s", "20/m", "500/h") and
  `queue_concurrency` options become its queue's cluster-wide limits
  (QCONFIG SET, docs/limits.md) when a worker starts consuming the queue.

Results (docs/workflows.md), with no second store: `DisqueBackend` is a
Dramatiq result backend over the cluster's own results.  A result (or the
exception, as Dramatiq wraps it), encoded by Dramatiq's encoder, rides on
the job's acknowledgement (ACKJOB <id> RESULT <bytes>, at most 16 KiB);
`message.get_result()` reads it with RESULT, and `block=True` waits on the
server with WAITJOB ... WITHRESULTS (no polling).  A result is the job's,
so the broker remembers which job each message it enqueued became: in the
message `enqueue` returns (its `disque_job_id` option) and, for the
messages a pipeline or a group enqueued through it, in the broker itself
(the last `JOB_IDS` of them).
* A `pipeline` is added whole when its first message is enqueued: each
  next message an ADDJOB ... AFTER the one before (ON-PARENT-FAIL drop: a
  step that expires drops the rest), its `pipe_target` taken off so
  Dramatiq's own `Pipelines` middleware adds nothing.  The
  step's consumer reads the parent's result (`Client.parent_results`) and
  appends it to the message's arguments, unless `pipe_ignore`; a failed
  step's exception is its result (even without `Results`), and the steps
  after it are acknowledged with it, unrun.  So
  `pipeline.get_result()` and `group.get_results()` find every job.
* A group's completion callbacks are the cluster's batch (BATCH, docs/
  workflows.md), with no barrier counted anywhere: `DisqueGroupCallbacks`
  (installed by the broker) gives `group.run` a barrier backend whose
  `add` only notes how many members the group has.  The first member
  enqueued opens a batch (BATCH NEW ON-SUCCESS: a carrier of the
  callbacks, in the first callback's queue), each member joins it (ADDJOB
  ... BATCH; a pipeline member: its last step) and the last one closes it.
  The batch's home adds the carrier once every member is acknowledged; its
  consumer enqueues each callback and acknowledges it.  A member that
  fails for good is dead-lettered by the server, or its message added to
  `<queue>.XQ` in the batch by the broker: either way the batch never
  succeeds, and the callbacks never run.

Every command about a delivered job goes to the node that delivered the
job, on a second connection of the consumer: Dramatiq's worker threads
acknowledge while the consumer's thread waits in GETJOB, and on the GETJOB
connection an ACK (and the worker thread that sends it, so the next message
too) waited for that GETJOB to end: up to the worker timeout, a second.
`join`, `flush` and `flush_all` are not provided (use QLEN and the server's
commands).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from dramatiq.broker import Broker, Consumer, MessageProxy
from dramatiq.common import xq_name
from dramatiq.message import Message, get_encoder
from dramatiq.middleware import GroupCallbacks, Middleware, Retries
from dramatiq.rate_limits import RateLimiterBackend
from dramatiq.results import ResultBackend, ResultFailure, ResultMissing, Results, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT, Result
from dramatiq.results.result import unwrap_result, wrap_exception, wrap_result

from disque.client import Client, Job, connection_name
from disque.client.worker import MAX_RESULT_BYTES

log = logging.getLogger(__name__)

JOB_IDS = 100_000  # messages whose job ID the broker remembers (those a pipeline or group enqueued)
JOB_ID = "disque_job_id"  # the option of a message `enqueue` returns: its job's ID
PIPED = "disque_piped"  # the option of a pipeline's next message: it reads the previous one's result
PIPES = "disque_pipes"  # the option of a pipeline's message a next one waits for: its result is kept
GROUP = "group_completion_uuid"  # the option `group.run` gives each member (a pipeline: its last step)
BATCH = "disque_batch"  # the option of a group's member: the batch it joined
CALLBACKS = "disque_callbacks"  # the option of a batch's callback job: the group's callbacks, enqueued by its consumer


class DisqueBroker(Broker):
    """`nodes` and the other keyword arguments are `disque.client.Client`'s."""

    def __init__(self, nodes: Any = "127.0.0.1:7711", *, middleware: list[Middleware] | None = None, **client_options: Any) -> None:
        super().__init__(middleware=middleware)
        self.add_middleware(QueueLimits())
        self.add_middleware(PipeResults())
        self.add_middleware(DisqueGroupCallbacks(self))
        self.nodes = nodes
        self.client_options = client_options
        self.queues: set[str] = set()
        self._local = threading.local()  # one producer connection per thread
        self._job_ids: OrderedDict[str, str] = OrderedDict()  # message ID -> job ID, the last JOB_IDS enqueued
        self._lock = threading.Lock()
        self._clients: list[Client] = []  # every thread's producer connection, for close()
        self._groups: dict[str, _Group] = {}  # group.run's completion UUID -> its batch, members not yet enqueued

    @property
    def client(self) -> Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client(self.nodes, **self.client_options)
            with self._lock:
                self._clients.append(client)
        return client

    def close(self) -> None:
        """Close every thread's producer connection (dramatiq's worker calls
        it as it stops); a thread that sends again opens a new one."""
        with self._lock:
            clients, self._clients = self._clients, []
            self._local = threading.local()
        for client in clients:
            client.close()

    def max_attempts(self, message: Message | MessageProxy) -> int | None:
        """Deliveries before the dead-letter queue: `max_retries` + 1 (None:
        the actor retries without limit, or Retries is not installed)."""
        retries = next((m for m in self.middleware if isinstance(m, Retries)), None)
        if retries is None:
            return None  # no retries: a failed message is acknowledged, never NACKed
        actor = self.get_actor(message.actor_name)
        limit = message.options.get("max_retries", actor.options.get("max_retries", retries.max_retries))
        return None if limit is None else limit + 1

    def stores_results(self, message: Message | MessageProxy) -> bool:
        """Whether a `Results` middleware over a `DisqueBackend` keeps this message's result."""
        for middleware in self.middleware:
            if isinstance(middleware, Results) and isinstance(middleware.backend, DisqueBackend):
                actor = self.get_actor(message.actor_name)
                return bool(message.options.get("store_results", actor.options.get("store_results", middleware.store_results)))
        return False

    def declare_queue(self, queue_name: str) -> None:
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        self.emit_before("enqueue", message, delay)
        if isinstance(message, _Delivery):
            message.retry_in = math.ceil((delay or 0) / 1000)  # the consumer NACKs the job with it
        else:
            target = message.options.get("pipe_target")
            job_id = self._add(message.copy(options={"pipe_target": None, PIPES: True}) if target else message, delay)
            previous, message = message, message.copy(options={JOB_ID: job_id})
            while target is not None:  # the rest of a pipeline, each step AFTER the one before
                step: Message = Message(**target)
                target = step.options.get("pipe_target")
                ignore = step.options.get("pipe_ignore") or (  # (as Dramatiq's Pipelines decides it)
                    previous.actor_name in self.actors and self.get_actor(previous.actor_name).options.get("pipe_ignore")
                )
                step = step.copy(options={"pipe_target": None, "pipe_ignore": bool(ignore), PIPED: True, PIPES: target is not None})
                job_id = self._add(step, step.options.get("delay"), after=[job_id])
                previous = step
        self.emit_after("enqueue", message, delay)
        return message

    def _add(self, message: Message, delay: int | None, after: list[str] | None = None) -> str:
        """ADDJOB of `message` (AFTER `after`, dropped if that one expires); its job ID, remembered."""
        group = self._group(message) if message.options.get(GROUP) else None
        batch = None if group is None else group.batch
        if batch is not None:
            message = message.copy(options={GROUP: None, "group_completion_callbacks": None, BATCH: batch})
        attempts = self.max_attempts(message)
        priority = message.options.get("broker_priority")
        job_id = self.client.add_job(
            message.queue_name, message.encode(), delay=math.ceil(delay / 1000) if delay else None,
            max_attempts=attempts, dead_letter=xq_name(message.queue_name) if attempts else None,
            priority=None if priority is None else min(9, max(0, int(priority))),
            key=message.options.get("key"), dedup=message.options.get("dedup"),
            debounce=message.options.get("debounce"), after=after or (), on_parent_fail="drop" if after else None,
            batch=batch,
        )  # fmt: skip
        if group is not None and batch is not None:
            self._joined(group, batch)
        with self._lock:
            self._job_ids[message.message_id] = job_id.id
            if len(self._job_ids) > JOB_IDS:
                self._job_ids.popitem(last=False)
        return job_id.id

    def _group(self, message: Message) -> _Group | None:
        """The group `message` is a member of, its batch opened by its first
        member (None: a barrier not made by this broker's `group.run`)."""
        with self._lock:
            group = self._groups.get(message.options[GROUP])
        if group is not None and group.batch is None:
            callbacks = message.options["group_completion_callbacks"]
            carrier = Message(**callbacks[0]).copy(options={CALLBACKS: callbacks})
            group.batch = self.client.batch_new(on_success=(carrier.queue_name, carrier.encode()))
        return group

    def _joined(self, group: _Group, batch: str) -> None:
        """A member was added to its group's batch: after the last, BATCH CLOSE."""
        group.left -= 1
        if group.left == 0:
            with self._lock:
                self._groups.pop(group.uuid, None)
            self.client.batch_close(batch)

    def job_id(self, message: Message | MessageProxy) -> str | None:
        """The ID of the job `message` became, if known here (`enqueue`'s message, or remembered)."""
        known = message.options.get(JOB_ID)
        if known is None:
            with self._lock:
                known = self._job_ids.get(message.message_id)
        return known

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> Consumer:
        words = [
            w for name in self.get_declared_actors() if (actor := self.get_actor(name)).queue_name == queue_name
            for option, word in (("queue_rate", "rate-limit"), ("queue_concurrency", "concurrency"))
            if option in actor.options for w in (word, str(actor.options[option]))
        ]  # fmt: skip
        if words:  # the actors' limits become the queue's setting
            self.client.execute_command("QCONFIG", queue_name, "SET", *words)
        return _Consumer(self, queue_name, prefetch, timeout)

    def get_declared_queues(self) -> set[str]:
        return set(self.queues)

    def get_declared_delay_queues(self) -> set[str]:
        return set()  # delays are the server's (ADDJOB DELAY, NACK DELAY)


class _Group:
    """A group being enqueued: its batch, and how many members are still to join it."""

    def __init__(self, uuid: str, left: int) -> None:
        self.uuid = uuid
        self.left = left
        self.batch: str | None = None


class _GroupBatches(RateLimiterBackend):
    """The barrier backend `group.run` is given: its `add` (Barrier.create)
    notes the group's size in the broker, which makes the group a batch as
    its members are enqueued.  The barrier is never waited on: the batch's
    home counts the members, so the other operations are not provided."""

    def __init__(self, broker: DisqueBroker) -> None:
        self.broker = broker

    def add(self, key: str, value: int, ttl: int) -> bool:
        with self.broker._lock:
            self.broker._groups[key] = _Group(key, value)
        return True


class DisqueGroupCallbacks(GroupCallbacks):
    """Dramatiq's `GroupCallbacks` over the cluster's batches (installed by
    DisqueBroker): the completion callbacks are run by the batch's callback
    job, never by a member's worker, so nothing happens after a message."""

    def __init__(self, broker: DisqueBroker) -> None:
        super().__init__(_GroupBatches(broker))

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None) -> None:
        pass


class DisqueBackend(ResultBackend):
    """Dramatiq's result backend over the cluster's results (ACKJOB ...
    RESULT, RESULT, WAITJOB ... WITHRESULTS): `Results(backend=DisqueBackend(broker))`.
    Results are kept for the server's `result-ttl`, not Dramatiq's
    `result_ttl`; one over 16 KiB is not kept (a warning says so)."""

    def __init__(self, broker: DisqueBroker, **options: Any) -> None:
        super().__init__(**options)
        self.broker = broker

    def store_result(self, message: Message | MessageProxy, result: Result, ttl: int) -> None:
        _keep(message, wrap_result(result))

    def store_exception(self, message: Message | MessageProxy, exception: Exception, ttl: int) -> None:
        _keep(message, wrap_exception(exception))

    def get_result(self, message: Message | MessageProxy, *, block: bool = False, timeout: int | None = None) -> Result:
        job_id = self.broker.job_id(message)
        if job_id is None:
            raise ResultMissing(message)
        client = self.broker.client
        if block:
            acked, (found,) = client.wait_results(job_id, timeout_ms=timeout or DEFAULT_TIMEOUT)
            if not acked:
                raise ResultTimeout(message)
        else:
            found = client.result(job_id)
        if found is None:
            raise ResultMissing(message)
        return self.unwrap_result(get_encoder().decode(found))


def _keep(message: Message | MessageProxy, wrapped: Any) -> None:
    """Hold `wrapped` for the delivery's acknowledgement (the first one kept wins, as on the server)."""
    if not isinstance(message, _Delivery) or message.result is not None:
        return
    encoded = get_encoder().encode(wrapped)
    if len(encoded) > MAX_RESULT_BYTES:
        log.warning("the result of message %s is not kept: %d bytes, over %d", message.message_id, len(encoded), MAX_RESULT_BYTES)
        return
    message.result = encoded


class PipeResults(Middleware):
    """Keeps the result of a message a pipeline's next step waits for
    (`DisqueBroker.enqueue` added it AFTER this one), whether or not the
    actor stores results."""

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None) -> None:
        if exception is None and message.options.get(PIPES):
            _keep(message, wrap_result(result))


class QueueLimits(Middleware):
    """Lets actors take `queue_rate` and `queue_concurrency` (DisqueBroker.consume sets them)."""

    actor_options = {"queue_rate", "queue_concurrency"}


class _Delivery(MessageProxy):
    """A message delivered by a disque job."""

    def __init__(self, message: Message, job_id: str, deliveries: int) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.deliveries = deliveries
        self.retry_in: int | None = None  # set by a retry: NACK ... DELAY this many seconds
        self.error: BaseException | None = None  # what the actor raised, reported by the NACK
        self.result: bytes | None = None  # the result (or exception) the acknowledgement carries

    def stuff_exception(self, exception: BaseException) -> None:
        # Kept until the NACK: the worker clears its own copy before the consumer settles the job.
        super().stuff_exception(exception)
        self.error = exception


class _Consumer(Consumer):
    def __init__(self, broker: DisqueBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.prefetch = prefetch
        self.timeout = timeout
        # The GETJOB connection, named for CLIENT LIST and the dashboard.
        self.client = Client(broker.nodes, **{"name": connection_name("dramatiq", queue_name), **broker.client_options})
        self._jobs_client: Client | None = None
        self._jobs_lock = threading.Lock()
        self._fetched: deque[Job] = deque()  # fetched, not handed out yet
        self._unsettled = 0  # handed out, not yet acked, nacked or requeued (worker threads settle them)

    @property
    def jobs_client(self) -> Client:
        """The connection for commands about delivered jobs: to the node the
        GETJOB connection is on (a new one if that moved)."""
        address = self.client.address
        with self._jobs_lock:
            client = self._jobs_client
            if client is None or (address is not None and client.address not in (None, address)):
                if client is not None:
                    client.close()
                nodes = self.broker.nodes if address is None else [address]
                client = self._jobs_client = Client(nodes, **self.broker.client_options)
            return client

    def __next__(self) -> MessageProxy | None:
        while True:
            if not self._fetched:
                room = max(1, self.prefetch - self._unsettled)
                self._fetched.extend(self.client.get_jobs(self.queue_name, count=room, timeout_ms=self.timeout))
                if not self._fetched:
                    return None
            job = self._fetched.popleft()
            message = Message.decode(job.body)
            message.options["retries"] = job.nacks
            if message.options.get(CALLBACKS):  # a group's callbacks, due: each enqueued as its own message
                for callback in message.options[CALLBACKS]:
                    self.broker.enqueue(Message(**callback))
                self.jobs_client.ack(job.id)
                continue
            step = self._piped(job.id, message) if message.options.get(PIPED) else message
            if step is not None:
                self._settled(-1)
                return _Delivery(step, job.id, job.deliveries)

    def _piped(self, job_id: str, message: Message) -> Message | None:
        """A pipeline's step, the previous step's result appended to its
        arguments (unless `pipe_ignore`); None when that step failed: this
        one is then acknowledged with the same failure, unrun, and so on
        down the pipeline, whose `get_result` raises `ResultFailure`."""
        results = list(self.jobs_client.parent_results(job_id).values())
        wrapped = results[0] if results else None
        value = None if wrapped is None else get_encoder().decode(wrapped)
        try:
            unwrap_result(value)
        except ResultFailure:
            if message.options.get(BATCH):  # a group's member: its group fails too
                self._dead_letter(job_id, message, wrapped)
            else:
                self.jobs_client.ack(job_id, result=wrapped)
            return None
        if message.options.get("pipe_ignore"):
            return message
        if wrapped is None:
            log.warning("pipeline step %s: the previous step's result is not kept; None is passed", message.message_id)
        return message.copy(args=(*message.args, value))

    def _settled(self, n: int) -> None:
        with self._jobs_lock:
            self._unsettled -= n

    def ack(self, message: MessageProxy) -> None:
        assert isinstance(message, _Delivery)
        message.error, error = None, message.error
        self._settled(1)
        if message.retry_in is None and error is not None and message.options.get(BATCH):
            self._dead_letter(message.job_id, message, message.result)  # a group's member failed, and nothing retries it
        elif message.retry_in is None:
            self.jobs_client.ack(message.job_id, result=message.result)
        else:
            self.jobs_client.nack(message.job_id, delay=message.retry_in or None, error=error)

    def nack(self, message: MessageProxy) -> None:
        assert isinstance(message, _Delivery)
        message.error, error = None, message.error
        self._settled(1)
        # Results keeps the exception only after the nack, too late; a pipeline's next step reads it to end there.
        if self.broker.stores_results(message) or message.options.get(PIPES):
            _keep(message, wrap_exception(error or Exception("unknown")))
        attempts = self.broker.max_attempts(message)
        if attempts is not None and message.deliveries >= attempts and message.result is None:
            self.jobs_client.nack(message.job_id, error=error)  # the last attempt: the server dead-letters it
        else:
            self._dead_letter(message.job_id, message, message.result)

    def _dead_letter(self, job_id: str, message: Message | MessageProxy, result: bytes | None) -> None:
        """Add `message` to `<queue>.XQ` and acknowledge its job (with
        `result`), in one write; a group's member's dead letter joins the
        group's batch, which then never succeeds (unless that dead letter
        is acknowledged)."""
        dead = self.jobs_client.pipeline().add_job(xq_name(self.queue_name), message.encode(), batch=message.options.get(BATCH))
        dead.ack(job_id, result=result).execute()

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        ids = [m.job_id for m in messages if isinstance(m, _Delivery)]
        self._settled(len(ids))
        if ids:
            self.jobs_client.enqueue(*ids)

    def close(self) -> None:
        if self._fetched:  # never handed out: queued again at once
            self.jobs_client.enqueue(*[job.id for job in self._fetched])
            self._fetched.clear()
        self.client.close()
        if self._jobs_client is not None:
            self._jobs_client.close()
