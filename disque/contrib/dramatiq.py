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
  the server moves it to `<queue>.XQ`; before that (`throws`), the broker
  adds the message to `<queue>.XQ` itself and acknowledges the job (both
  in one write: a pipeline).
* `requeue` (prefetched messages a stopping worker did not run) is ENQUEUE,
  as is `close` for the jobs fetched but not handed out yet.
* An actor's `queue_rate` ("100/s", "20/m", "500/h") and
  `queue_concurrency` options become its queue's cluster-wide limits
  (QCONFIG SET, docs/limits.md) when a worker starts consuming the queue.

Every command about a delivered job goes to the node that delivered the
job, on a second connection of the consumer: Dramatiq's worker threads
acknowledge while the consumer's thread waits in GETJOB, and on the GETJOB
connection an ACK (and the worker thread that sends it, so the next message
too) waited for that GETJOB to end: up to the worker timeout, a second.
`join`, `flush` and `flush_all` are not provided (use QLEN and the server's
commands).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

from dramatiq.broker import Broker, Consumer, MessageProxy
from dramatiq.common import xq_name
from dramatiq.message import Message
from dramatiq.middleware import Middleware, Retries

from disque.client import Client, Job, connection_name


class DisqueBroker(Broker):
    """`nodes` and the other keyword arguments are `disque.client.Client`'s."""

    def __init__(self, nodes: Any = "127.0.0.1:7711", *, middleware: list[Middleware] | None = None, **client_options: Any) -> None:
        super().__init__(middleware=middleware)
        self.add_middleware(QueueLimits())
        self.nodes = nodes
        self.client_options = client_options
        self.queues: set[str] = set()
        self._local = threading.local()  # one producer connection per thread

    @property
    def client(self) -> Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client(self.nodes, **self.client_options)
        return client

    def max_attempts(self, message: Message | MessageProxy) -> int | None:
        """Deliveries before the dead-letter queue: `max_retries` + 1 (None:
        the actor retries without limit, or Retries is not installed)."""
        retries = next((m for m in self.middleware if isinstance(m, Retries)), None)
        if retries is None:
            return None  # no retries: a failed message is acknowledged, never NACKed
        actor = self.get_actor(message.actor_name)
        limit = message.options.get("max_retries", actor.options.get("max_retries", retries.max_retries))
        return None if limit is None else limit + 1

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
            attempts = self.max_attempts(message)
            priority = message.options.get("broker_priority")
            self.client.add_job(
                message.queue_name, message.encode(), delay=math.ceil(delay / 1000) if delay else None,
                max_attempts=attempts, dead_letter=xq_name(message.queue_name) if attempts else None,
                priority=None if priority is None else min(9, max(0, int(priority))),
                key=message.options.get("key"), dedup=message.options.get("dedup"),
                debounce=message.options.get("debounce"),
            )  # fmt: skip
        self.emit_after("enqueue", message, delay)
        return message

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
        if not self._fetched:
            room = max(1, self.prefetch - self._unsettled)
            self._fetched.extend(self.client.get_jobs(self.queue_name, count=room, timeout_ms=self.timeout))
            if not self._fetched:
                return None
        job = self._fetched.popleft()
        self._settled(-1)
        message = Message.decode(job.body)
        message.options["retries"] = job.nacks
        return _Delivery(message, job.id, job.deliveries)

    def _settled(self, n: int) -> None:
        with self._jobs_lock:
            self._unsettled -= n

    def ack(self, message: MessageProxy) -> None:
        assert isinstance(message, _Delivery)
        message.error, error = None, message.error
        self._settled(1)
        if message.retry_in is None:
            self.jobs_client.ack(message.job_id)
        else:
            self.jobs_client.nack(message.job_id, delay=message.retry_in or None, error=error)

    def nack(self, message: MessageProxy) -> None:
        assert isinstance(message, _Delivery)
        message.error, error = None, message.error
        self._settled(1)
        attempts = self.broker.max_attempts(message)
        if attempts is not None and message.deliveries >= attempts:
            self.jobs_client.nack(message.job_id, error=error)  # the last attempt: the server dead-letters it
        else:
            self.jobs_client.pipeline().add_job(xq_name(self.queue_name), message.encode()).ack(message.job_id).execute()

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
