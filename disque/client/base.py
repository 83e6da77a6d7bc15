"""State and protocol logic shared by the blocking and the async client.

Every decision is written once, as generators that yield four I/O
operations (`_Open` an address, `_Send` bytes, `_Receive` bytes, `_Close` a
connection) and get their results back; `Client` (disque.client.sync) and
`AsyncClient` (disque.client.aio) differ only in the small driver that carries
those operations out and in how a worker runs a handler next to its WORKING
heartbeats.  `NodePlanner` decides which node to try next and `Affinity`
counts where consumed jobs were created; neither does I/O.
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, overload

import hiredis

from disque.client import tracing
from disque.client.models import Hello, Job, JobHandle, JobInfo, QueueKeys, QueueStats, _jobs, _optional, _same
from disque.client.protocol import (
    DEFAULT_ADDRESS,
    Address,
    Arg,
    DisqueConnectionError,
    DisqueReplyError,
    ReplicationTimeout,
    T,
    _options,
    _pairs,
    _to_bytes,
    _text,
    encode_command,
    failure_args,
    format_address,
    parse_addresses,
    parse_info,
)
from disque.store.ids import node_prefix

if TYPE_CHECKING:  # only annotations: disque.shell.tls makes the contexts, and importing ssl is slow
    import ssl

log = logging.getLogger("disque.client")

FIRST_HEARTBEAT = 0.5  # RETRY is at least 1 s and jittered by 250 ms: beat before 0.75 s
ADD_TIMEOUT_MS = 30_000  # add_job's wait for the copies: twice the default cluster-node-timeout (docs/client.md)
MAX_JOB_SIZE = 64 << 20  # the server's default max-job-size


# --------------------------------------------------------------------------
# Client-protocol decisions (no I/O)


class NodePlanner:
    """Which addresses to try, in order; owns the last HELLO and the randomness."""

    def __init__(self, seeds: list[Address], rng: random.Random) -> None:
        self.seeds = seeds
        self.rng = rng
        self.hello: Hello | None = None

    def learn(self, hello: Hello, address: Address) -> Hello:
        """Keep `hello`, filling in our node's address if it does not know it yet."""
        nodes = [replace(n, host=address[0]) if n.id == hello.node_id and not n.host else n for n in hello.nodes]
        self.hello = replace(hello, nodes=nodes)
        return self.hello

    def plan(self, failed: Address | None = None) -> list[Address]:
        learned = [n for n in (self.hello.nodes if self.hello else []) if n.host]
        self.rng.shuffle(learned)
        learned.sort(key=lambda n: n.priority)  # stable: random among equal priorities
        seeds = list(self.seeds)
        self.rng.shuffle(seeds)
        order = list(dict.fromkeys([n.address for n in learned] + seeds))
        if failed in order:
            order.remove(failed)
            order.append(failed)
        return order


class Affinity:
    """Counts the creating node of consumed jobs, by the node prefix in their IDs.

    After each window of `window` jobs, a node that created more than half of
    them, and is not the one we are connected to, is where to move.  Counts
    restart with every window, so the choice follows the producers."""

    def __init__(self, window: int = 100) -> None:
        self.window = window
        self.counts: Counter[str] = Counter()

    def observe(self, job_ids: Iterable[str], current_prefix: str) -> str | None:
        self.counts.update(node_prefix(i.encode()) for i in job_ids)
        seen = self.counts.total()
        if seen < self.window:
            return None
        prefix, count = self.counts.most_common(1)[0]
        self.counts.clear()
        return prefix if prefix != current_prefix and count * 2 > seen else None


def _next_heartbeat(retry: int) -> float | None:
    """Seconds until the next WORKING, given the RETRY it returned (0: at-most-once)."""
    return retry / 2 if retry > 0 else None


def _queue_list(queues: str | Iterable[str]) -> list[str]:
    return [queues] if isinstance(queues, str) else list(queues)



# --------------------------------------------------------------------------
# The shared client: generators yielding I/O operations


@dataclass(slots=True)
class _Link:
    address: Address
    transport: Any
    reader: Any
    node_id: str = ""


@dataclass(frozen=True, slots=True)
class _Open:
    address: Address


@dataclass(frozen=True, slots=True)
class _Send:
    link: _Link
    data: bytes


@dataclass(frozen=True, slots=True)
class _Receive:
    link: _Link


@dataclass(frozen=True, slots=True)
class _Close:
    transport: Any


Ops = Generator[Any, Any, T]
HELLO = encode_command(["HELLO"])
BATCH = 1000  # pipelined requests per write: their replies are read before the next write
_BODY_MARK = b"\x00the body of every job\x00"  # add_jobs: where each body goes in the request encoded once


def _failure(address: Address, exc: BaseException) -> DisqueConnectionError:
    while isinstance(exc.__cause__, BaseException):  # anyio and trio wrap the socket error
        exc = exc.__cause__.exceptions[0] if isinstance(exc.__cause__, BaseExceptionGroup) else exc.__cause__
    errno = getattr(exc, "errno", None)
    reason = os.strerror(errno) if errno else str(exc) or type(exc).__name__
    return DisqueConnectionError(f"{format_address(address)}: {reason}")


class _Scan(Generic[T]):
    """One JSCAN/QSCAN iteration: the cursor, and how to read a page."""

    def __init__(self, verb: str, options: list[Arg], item: Callable[[Any], T]) -> None:
        self.verb, self.options, self.item = verb, options, item
        self.cursor = "0"
        self.done = False

    def request(self) -> list[Arg]:
        return [self.verb, self.cursor, *self.options]

    def page(self, reply: list[Any]) -> list[T]:
        cursor, items = reply
        self.cursor = _text(cursor)
        self.done = self.cursor == "0"
        return [self.item(i) for i in items]


P = ParamSpec("P")


class _Blocking:
    """What a client whose commands return their values is (`Client`)."""


class _Awaiting:
    """What a client whose commands return awaitables is (`AsyncClient`)."""


class _Method:
    """A public method of `_Base` written once: its body returns what the
    driver runs (`runner`: `_run` a generator, `_drive` one that must not
    wait behind a blocked request, `_iterate` a scan); read from a client,
    it is a function that hands its body's result to that driver."""

    runner = "_run"

    def __init__(self, body: Callable[..., Any], runner: str | None = None) -> None:
        self.body = body
        self.runner = runner or self.runner
        self.__doc__ = body.__doc__
        self.__name__ = body.__name__

    def bind(self, client: object) -> Callable[..., Any]:
        body, run = self.body, getattr(client, self.runner)

        def method(*args: Any, **kwargs: Any) -> Any:
            return run(body(client, *args, **kwargs))

        method.__doc__, method.__name__ = self.__doc__, self.__name__
        return method


class _Command(_Method, Generic[P, T]):
    """A command: its value for `Client`, an awaitable of it for `AsyncClient`."""

    def __init__(self, body: Callable[Concatenate[Any, P], Ops[T]], runner: str | None = None) -> None:
        super().__init__(body, runner)

    @overload
    def __get__(self, client: None, owner: type) -> _Command[P, T]: ...
    @overload
    def __get__(self, client: _Blocking, owner: type | None = None) -> Callable[P, T]: ...
    @overload
    def __get__(self, client: _Awaiting, owner: type | None = None) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, client: _Base, owner: type | None = None) -> Callable[P, Any]: ...
    def __get__(self, client: object, owner: type | None = None) -> Any:
        return self if client is None else self.bind(client)


class _Scanning(_Method, Generic[P, T]):
    """A scan: an iterator of its items for `Client`, an async iterator for `AsyncClient`."""

    runner = "_iterate"

    def __init__(self, body: Callable[Concatenate[Any, P], _Scan[T]]) -> None:
        super().__init__(body)

    @overload
    def __get__(self, client: None, owner: type) -> _Scanning[P, T]: ...
    @overload
    def __get__(self, client: _Blocking, owner: type | None = None) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, client: _Awaiting, owner: type | None = None) -> Callable[P, AsyncIterator[T]]: ...
    @overload
    def __get__(self, client: _Base, owner: type | None = None) -> Callable[P, Any]: ...
    def __get__(self, client: object, owner: type | None = None) -> Any:
        return self if client is None else self.bind(client)


def _api(body: Callable[Concatenate[Any, P], Ops[T]]) -> _Command[P, T]:
    """Decorator: a public command method (`_Command`)."""
    return _Command(body)


class _Base:
    """State and protocol logic shared by `Client` and `AsyncClient`.

    Public methods are `_Command`s (`_Scanning` for the scans): each body
    returns a generator, which `_run` drives (`_drive` for `close`, which
    must not wait behind a blocked request): the value itself for `Client`,
    an awaitable for `AsyncClient`, typed as such."""

    def __init__(
        self,
        nodes: str | Address | Iterable[str | Address] = (DEFAULT_ADDRESS,),
        *,
        password: str | None = None,
        tls: bool = False,
        tls_ca_cert: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        failover: bool = True,
        affinity: bool = False,
        affinity_window: int = 100,
        connect_timeout: float = 5.0,
        socket_timeout: float | None = None,
        rng: random.Random | None = None,
        name: str | None = None,
        trace_context: bool = False,
        max_job_size: int = MAX_JOB_SIZE,
    ) -> None:
        seeds = parse_addresses(nodes)
        if not seeds:
            raise ValueError("no Disque node given")
        self.password = password
        self.name = name  # CLIENT SETNAME on every connection (CLIENT LIST, the dashboard show it)
        if trace_context:  # ADDJOB writes the trace context in front of the body (disque.client.tracing)
            tracing.require()
        self.trace_context = trace_context
        if ssl_context is None and tls:
            from disque.shell.tls import client_context

            ssl_context = client_context(ca=tls_ca_cert, cert=tls_cert, key=tls_key)
        elif ssl_context is None and (tls_ca_cert or tls_cert or tls_key):
            raise ValueError("TLS files given without tls=True")
        self.ssl_context = ssl_context  # TLS on every connection when set (server certificate and name checked)
        self.failover = failover
        self.connect_timeout = connect_timeout
        self.socket_timeout = socket_timeout
        self.max_job_size = max_job_size  # the server's max-job-size, checked before a body is sent
        self._planner = NodePlanner(seeds, rng or random.Random())
        self._affinity = Affinity(affinity_window) if affinity else None
        self._link: _Link | None = None
        self._lock = self._new_lock()  # one request at a time on the connection

    # What the drivers provide.
    _new_lock: Callable[[], Any]

    def _run(self, ops: Ops[T]) -> Any:
        raise NotImplementedError

    def _drive(self, ops: Ops[T]) -> Any:
        raise NotImplementedError

    def _iterate(self, scan: _Scan[Any]) -> Any:
        raise NotImplementedError

    @property
    def address(self) -> Address | None:
        """The node this client is connected to, if any."""
        return self._link.address if self._link else None

    @property
    def node_id(self) -> str | None:
        """ID of the connected node (known once HELLO has been asked)."""
        return (self._link.node_id or None) if self._link else None

    @property
    def cluster(self) -> Hello | None:
        """The last HELLO seen."""
        return self._planner.hello

    @_api
    def connect(self) -> Ops[None]:
        """Connect now rather than at the first command."""
        if self._link is None:
            yield from self._connect(self._planner.plan())

    def _disconnect(self) -> Ops[None]:
        """Close the connection (awaited for `AsyncClient`); the next command connects again."""
        link, self._link = self._link, None
        if link is not None:
            yield _Close(link.transport)

    close = _Command(_disconnect, runner="_drive")

    # -- connection management

    def _roundtrip(self, link: _Link, payload: bytes) -> Ops[Any]:
        yield _Send(link, payload)
        return (yield from self._reply(link))

    def _reply(self, link: _Link) -> Ops[Any]:
        """The next reply on the link, read as far as it takes."""
        try:
            while (reply := link.reader.gets()) is False:
                data = yield _Receive(link)
                if not data:
                    raise DisqueConnectionError(f"{format_address(link.address)}: connection closed by the server")
                link.reader.feed(data)
        except hiredis.ProtocolError as e:
            raise DisqueConnectionError(f"{format_address(link.address)}: protocol error ({e})") from e
        if isinstance(reply, hiredis.ReplyError):
            raise DisqueReplyError.from_line(str(reply))
        return reply

    def _connect(self, candidates: list[Address]) -> Ops[None]:
        """Connect to the first candidate that answers AUTH and HELLO."""
        failures = []
        for address in candidates:
            try:
                link = _Link(address, (yield _Open(address)), hiredis.Reader())
            except DisqueConnectionError as e:
                failures.append(str(e))
                continue
            try:
                if self.password is not None:
                    yield from self._roundtrip(link, encode_command(["AUTH", self.password]))
                if self.name:
                    yield from self._roundtrip(link, encode_command(["CLIENT", "SETNAME", self.name]))
                if self.failover or self._affinity:
                    hello = Hello.from_reply((yield from self._roundtrip(link, HELLO)))
                    link.node_id = self._planner.learn(hello, address).node_id
            except DisqueConnectionError as e:
                yield _Close(link.transport)
                failures.append(str(e))
                continue
            except BaseException:
                yield _Close(link.transport)
                raise
            self._link = link
            return
        if len(failures) == 1:
            raise DisqueConnectionError(f"Could not connect to Disque at {failures[0]}")
        raise DisqueConnectionError("Could not connect to any Disque node (" + "; ".join(failures) + ")")

    def _command(self, args: Sequence[Arg], convert: Callable[[Any], T] = _same) -> Ops[T]:
        """Send one command, failing over once to another node if needed."""
        payload = encode_command(args)
        failed: Address | None = None
        while True:
            if self._link is None:
                yield from self._connect(self._planner.plan(failed))
            link = self._link
            assert link is not None
            try:
                reply = yield from self._roundtrip(link, payload)
            except DisqueReplyError as e:
                if not (e.code == "LEAVING" and self.failover and failed is None):
                    raise
                yield from self._disconnect()
                failed = link.address
                continue
            except DisqueConnectionError:
                yield from self._disconnect()
                if not self.failover or failed is not None:
                    raise
                failed = link.address
                continue
            except BaseException:
                yield from self._disconnect()  # interrupted mid-request: replies would be out of step
                raise
            return convert(reply)

    def _batch(self, requests: Sequence[tuple[bytes, Callable[[Any], Any]]]) -> Ops[list[Any]]:
        """Send encoded requests `BATCH` at a time, each write followed by the
        reading of its replies; the converted replies, in order.  An error
        reply raises once every reply is read (the connection stays in step);
        a broken connection raises at once, with no failover: some requests
        may have run."""
        if self._link is None:
            yield from self._connect(self._planner.plan())
        link = self._link
        assert link is not None
        replies: list[Any] = []
        error: DisqueReplyError | None = None
        try:
            for start in range(0, len(requests), BATCH):
                chunk = requests[start : start + BATCH]
                yield _Send(link, b"".join(payload for payload, _ in chunk))
                for _, convert in chunk:
                    try:
                        replies.append(convert((yield from self._reply(link))))
                    except DisqueReplyError as e:
                        replies.append(e)
                        error = error or e
        except BaseException:
            yield from self._disconnect()
            raise
        if error is not None:
            raise error
        return replies

    def pipeline(self) -> Pipeline:
        """Commands queued and sent together: `p = client.pipeline()`,
        `p.add_job(...)` and `p.ack(...)` as often as needed, then
        `p.execute()` (awaited for `AsyncClient`) for their replies."""
        return Pipeline(self)

    def add_jobs(self, queue: str, bodies: Iterable[str | bytes], **options: Any) -> Any:
        """ADDJOB of every body, pipelined (`add_job`'s options for all); the
        job IDs, in order.  The request is encoded once, around a marker
        body, and each body put in its place."""
        probe, convert = self.pipeline().add_job(queue, _BODY_MARK, **options)._queued[0]
        head, _, tail = probe.partition(b"$%d\r\n%s\r\n" % (len(_BODY_MARK), _BODY_MARK))
        encoded = [_to_bytes(b) for b in bodies]
        for b in encoded:  # before anything is sent
            self._check_size(b)
        requests = [(b"%s$%d\r\n%s\r\n%s" % (head, len(b), b, tail), convert) for b in encoded]
        return self._run(self._batch(requests))

    def _consume(self, args: Sequence[Arg], acking: Sequence[Arg] = ()) -> Ops[list[Job]]:
        """GETJOB (after ACKJOB of `acking`, in the same write), then move
        towards the producers if affinity says so."""
        if acking:
            _, jobs = yield from self._batch([(encode_command(["ACKJOB", *acking]), _same), (encode_command(args), _jobs)])
        else:
            jobs = yield from self._command(args, _jobs)
        if self._affinity is not None and jobs and self._link is not None:
            prefix = self._affinity.observe([j.id for j in jobs], self._link.node_id[:8])
            if prefix is not None:
                yield from self._move(prefix)
        return jobs

    def _move(self, prefix: str) -> Ops[None]:
        node = self._planner.hello.by_prefix(prefix) if self._planner.hello else None
        if node is None:  # a node that joined after our last HELLO
            hello = yield from self._command(["HELLO"], self._hello)
            node = hello.by_prefix(prefix)
        old = self._link
        if node is None or not node.host or old is None:
            return
        try:
            yield from self._connect([node.address])
        except DisqueConnectionError as e:
            log.info("staying on %s: %s", format_address(old.address), e)
            return
        yield _Close(old.transport)

    def _hello(self, reply: list[Any]) -> Hello:
        assert self._link is not None
        return self._planner.learn(Hello.from_reply(reply), self._link.address)

    # -- commands

    @_api
    def execute_command(self, *args: Arg) -> Ops[Any]:
        """Any command; the reply as hiredis decodes it (bytes, int, list, None)."""
        return self._command(args)

    @_api
    def ping(self) -> Ops[str]:
        return self._command(["PING"], _text)

    @_api
    def add_job(
        self,
        queue: str,
        body: str | bytes,
        *,
        timeout_ms: int = ADD_TIMEOUT_MS,
        replicate: int | None = None,
        minrepl: int | None = None,
        delay: int | None = None,
        retry: int | None = None,
        ttl: int | None = None,
        maxlen: int | None = None,
        max_attempts: int | None = None,
        dead_letter: str | None = None,
        asynchronous: bool = False,
        priority: int | None = None,
        key: str | bytes | None = None,
        dedup: int | str | None = None,
        debounce: int | None = None,
        after: Iterable[str] = (),
        on_parent_fail: str | None = None,
        batch: str | None = None,
    ) -> Ops[JobHandle]:
        """ADDJOB; returns the job ID, a `JobHandle` (a `str` whose `result`
        and `wait()` read the job's result).  `timeout_ms` bounds synchronous
        replication (30 s by default, 0: wait for ever; docs/client.md), past
        it `ReplicationTimeout`; `replicate` and `minrepl` are REPLICATE and
        MINREPL (the server's defaults if None: docs/replication.md); after
        `max_attempts` failed deliveries the job moves to the `dead_letter`
        queue (the server's default one if None); a higher `priority` (0-9,
        the queue's default if None) is served first; `key` is KEY, and
        `dedup` DEDUP: ms during which another job of the key answers this
        one's ID, or "active" for as long as this one is not acknowledged,
        `debounce` DEBOUNCE: ms after the key's last add_job its last job
        runs, the earlier ones of the burst deleted (docs/keys.md);
        `after`: the IDs of the jobs this one waits for, `on_parent_fail`
        (fail, run or drop) what one that fails does to it, `batch` the
        batch it joins (docs/workflows.md).  A body over the
        client's `max_job_size` is refused before it is sent."""
        self._check_size(body)
        options = _options(
            [("ASYNC", asynchronous)],
            replicate=replicate, minrepl=minrepl, delay=delay, retry=retry, ttl=ttl, maxlen=maxlen,
            maxattempts=max_attempts, deadletter=dead_letter, priority=priority, key=key, dedup=dedup, batch=batch,
            debounce=debounce,
        )  # fmt: skip
        for parent in after:
            options += ["AFTER", parent]
        if on_parent_fail is not None:
            options += ["ON-PARENT-FAIL", on_parent_fail]

        def send(body: str | bytes) -> Ops[JobHandle]:
            return self._add_job(["ADDJOB", queue, body, timeout_ms, *options], timeout_ms)

        return tracing.sending(queue, body, send) if self.trace_context else send(body)

    def _check_size(self, body: str | bytes) -> None:
        """A body over the client's `max_job_size` is refused before it is sent."""
        size = len(body) if isinstance(body, bytes) else len(body.encode("utf-8", "surrogateescape"))
        if size > self.max_job_size:
            raise DisqueReplyError("ERR", f"Job body of {size} bytes is larger than max-job-size ({self.max_job_size} bytes): not sent")

    def _add_job(self, args: list[Arg], timeout_ms: int) -> Ops[JobHandle]:
        try:
            return (yield from self._command(args, lambda reply: JobHandle(_text(reply), self)))
        except DisqueReplyError as e:
            if e.code == "NOREPL" and e.message.startswith("Timeout"):
                raise ReplicationTimeout(e.code, f"{e.message} within {timeout_ms} ms (not added: adding it again is safe)") from None
            raise

    def _getjob(
        self, queues: Sequence[str], count: int, timeout_ms: int | None, nohang: bool, acking: Sequence[Arg] = ()
    ) -> Ops[list[Job]]:
        if not queues:
            raise ValueError("GETJOB needs at least one queue")
        options = _options([("NOHANG", nohang), ("WITHCOUNTERS", True)], timeout=timeout_ms, count=count)
        return self._consume(["GETJOB", *options, "FROM", *queues], acking)

    @_api
    def get_jobs(
        self, *queues: str, count: int = 1, timeout_ms: int | None = None, nohang: bool = False, acking: Sequence[Arg] = ()
    ) -> Ops[list[Job]]:
        """Up to `count` jobs (waiting for at least one unless `nohang` or
        timed out); `acking`: job IDs to acknowledge first, in the same write
        (a worker's finished jobs: one round trip for both)."""
        return self._getjob(queues, count, timeout_ms, nohang, acking)

    @_api
    def get_job(self, *queues: str, timeout_ms: int | None = None, nohang: bool = False) -> Ops[Job | None]:
        """One job, or None on timeout / with `nohang` when nothing is queued."""
        jobs = yield from self._getjob(queues, 1, timeout_ms, nohang)
        return jobs[0] if jobs else None

    def _ids(self, verb: str, ids: Sequence[str]) -> Ops[int]:
        return self._command([verb, *ids], int)

    @_api
    def ack(self, *ids: str, result: str | bytes | None = None) -> Ops[int]:
        """ACKJOB; the number of jobs newly acknowledged.  `result`: the
        result of the one job named (at most 16 KiB), kept by the cluster
        for `result-ttl` (docs/workflows.md): `result()` and
        `wait_results()` return it."""
        if result is None:
            return self._ids("ACKJOB", ids)
        if len(ids) != 1:
            raise ValueError("a result goes with one job ID")
        return self._command(["ACKJOB", ids[0], "RESULT", result], int)

    @_api
    def batch_new(self, on_success: tuple[str, str | bytes] | None = None, on_complete: tuple[str, str | bytes] | None = None) -> Ops[str]:
        """BATCH NEW: a batch's ID; `on_success` / `on_complete`: the (queue,
        body) of the job added once all its jobs are acknowledged / finished
        (docs/workflows.md).  `Client.batch` wraps it in a `with` block."""
        args: list[Arg] = ["BATCH", "NEW"]
        for word, callback in (("ON-SUCCESS", on_success), ("ON-COMPLETE", on_complete)):
            if callback is not None:
                args += [word, *callback]
        return self._command(args, _text)

    @_api
    def batch_close(self, batch_id: str) -> Ops[Any]:
        """BATCH CLOSE: no more jobs but from the batch's own running jobs."""
        return self._command(["BATCH", "CLOSE", batch_id])

    @_api
    def batch_show(self, batch_id: str) -> Ops[dict[str, Any]]:
        """BATCH SHOW: its counts (jobs, pending, done, failed), callbacks and what was fired."""
        return self._command(["BATCH", "SHOW", batch_id], _pairs)

    @_api
    def result(self, job_id: str) -> Ops[bytes | None]:
        """RESULT: the result the job was acknowledged with, None when the
        node keeps none (not acknowledged with one, or past `result-ttl`)."""
        return self._command(["RESULT", job_id])

    @_api
    def parent_results(self, job_id: str) -> Ops[dict[str, bytes | None]]:
        """The results of the jobs `job_id` was added after (ADDJOB ...
        AFTER), by parent ID, in AFTER's order (None for one acknowledged
        without a result, or past `result-ttl`): SHOW's `after`, then RESULT
        of each, in one write.  Ask the node that served the job (a worker's
        own connection): it holds the job, and learned each parent's result
        with its ACK (docs/workflows.md).  -NOJOB when it does not hold it."""
        info = yield from self._command(["SHOW", job_id], _optional(JobInfo.from_reply))
        if info is None:
            raise DisqueReplyError("NOJOB", f"Job {job_id} not known in the context of this node.")
        results = yield from self._batch([(encode_command(["RESULT", parent]), _same) for parent in info.after])
        return dict(zip(info.after, results))

    @_api
    def fast_ack(self, *ids: str) -> Ops[int]:
        return self._ids("FASTACK", ids)

    @_api
    def nack(self, *ids: str, delay: int | None = None, error: BaseException | None = None) -> Ops[int]:
        """NACK: queue again, counting a failed delivery; with `delay`, not
        handed out again before that many seconds; with `error`, the
        exception is kept with the job as its last failure (type, message,
        traceback, this host and process: SHOW, and its dead letter)."""
        failure = failure_args(error) if error is not None else []
        return self._command(["NACK", *ids, *_options(delay=delay), *failure], int)

    @_api
    def wait_job(self, *ids: str, timeout_ms: int | None = None) -> Ops[int]:
        """WAITJOB: block until every job is acknowledged, or `timeout_ms`
        passes; the number acknowledged."""
        return self._command(["WAITJOB", *ids, *_options(timeout=timeout_ms)], int)

    @_api
    def wait_results(self, *ids: str, timeout_ms: int | None = None) -> Ops[tuple[int, list[bytes | None]]]:
        """WAITJOB ... WITHRESULTS: `wait_job`, and the result of each job
        named, in order (None where the node keeps none)."""
        return self._command(_with_results(ids, timeout_ms), lambda reply: (reply[0], list(reply[1])))

    @_api
    def wait_result(self, job_id: str, timeout_ms: int | None = None) -> Ops[bytes | None]:
        """The job's result once it is acknowledged (None: acknowledged
        without one), waiting `timeout_ms` at most (None: for ever);
        `TimeoutError` when it is not acknowledged by then, or went without
        an acknowledgement (expired, dead-lettered).  `JobHandle.wait`."""

        def acknowledged(reply: list[Any]) -> bytes | None:
            if not reply[0]:
                raise TimeoutError(f"job {job_id} was not acknowledged (within {timeout_ms} ms, or it expired or was dead-lettered)")
            return reply[1][0]  # type: ignore[no-any-return]

        return self._command(_with_results([job_id], timeout_ms), acknowledged)

    @_api
    def enqueue(self, *ids: str) -> Ops[int]:
        return self._ids("ENQUEUE", ids)

    @_api
    def dequeue(self, *ids: str) -> Ops[int]:
        return self._ids("DEQUEUE", ids)

    @_api
    def del_job(self, *ids: str) -> Ops[int]:
        return self._ids("DELJOB", ids)

    @_api
    def working(self, job_id: str) -> Ops[int]:
        """WORKING: postpone the next delivery; returns the job's RETRY in seconds."""
        return self._command(["WORKING", job_id], int)

    @_api
    def show(self, job_id: str) -> Ops[JobInfo | None]:
        """SHOW as a `JobInfo`, or None for an unknown job."""
        return self._command(["SHOW", job_id], _optional(JobInfo.from_reply))

    @_api
    def qlen(self, queue: str) -> Ops[int]:
        return self._command(["QLEN", queue], int)

    @_api
    def qstat(self, queue: str) -> Ops[QueueStats | None]:
        """QSTAT as `QueueStats`, or None for a queue that does not exist."""
        return self._command(["QSTAT", queue], _optional(QueueStats.from_reply))

    @_api
    def qkeys(self, queue: str, count: int = 10) -> Ops[QueueKeys]:
        """QKEYS: the queue's keys with jobs queued on the connected node and
        its `count` busiest (docs/keys.md, "Watching keys")."""
        return self._command(["QKEYS", queue, "COUNT", count], QueueKeys.from_reply)

    @_api
    def qpeek(self, queue: str, count: int) -> Ops[list[Job]]:
        """The oldest `count` jobs (the newest first when negative), left queued."""
        return self._command(["QPEEK", queue, count], _jobs)

    @_api
    def pause(self, queue: str, *options: str) -> Ops[str]:
        """PAUSE queue in|out|all|none|state|bcast...; returns the resulting state."""
        return self._command(["PAUSE", queue, *(options or ("state",))], _text)

    @_api
    def hello(self) -> Ops[Hello]:
        return self._command(["HELLO"], self._hello)

    @_api
    def info(self, section: str | None = None) -> Ops[dict[str, dict[str, str]]]:
        return self._command(["INFO", *([section] if section else [])], parse_info)

    @_Scanning
    def jscan(
        self,
        queue: str | None = None,
        states: Iterable[str] = (),
        *,
        count: int | None = None,
        busyloop: bool = False,
        details: bool = False,
    ) -> _Scan[Any]:
        """Every job ID (a `JobInfo` each with `details`), following the cursor
        to the end; an async iterator for `AsyncClient`."""
        options = _options([("BUSYLOOP", busyloop)], count=count, queue=queue)
        options += [a for state in states for a in ("STATE", state)]
        if details:
            return _Scan("JSCAN", [*options, "REPLY", "all"], JobInfo.from_reply)
        return _Scan("JSCAN", options, _text)

    @_Scanning
    def qscan(
        self,
        *,
        minlen: int | None = None,
        maxlen: int | None = None,
        import_rate: int | None = None,
        count: int | None = None,
        busyloop: bool = False,
    ) -> _Scan[str]:
        """Every queue name, following the cursor to the end; an async iterator for `AsyncClient`."""
        options = _options([("BUSYLOOP", busyloop)], count=count, minlen=minlen, maxlen=maxlen, importrate=import_rate)
        return _Scan("QSCAN", options, _text)


def _with_results(ids: Iterable[str], timeout_ms: int | None) -> list[Arg]:
    return ["WAITJOB", *ids, *_options(timeout=timeout_ms), "WITHRESULTS"]


class Pipeline(_Base):
    """Commands queued by `_Base.pipeline`, sent by `execute` in as few
    writes as `BATCH` allows.  The single-request methods queue: add_job,
    get_jobs, ack, fast_ack, nack, working, enqueue, dequeue, del_job, show,
    qlen, qstat, execute_command (each returns the pipeline); `execute` returns
    their replies, converted as the client's methods convert them, and
    empties the pipeline."""

    def __init__(self, client: _Base) -> None:  # not _Base's: the client's connection and settings are used
        self._client = client
        self.max_job_size = client.max_job_size
        self.trace_context = False  # a span per queued ADDJOB would end before it is sent
        self._queued: list[tuple[bytes, Callable[[Any], Any]]] = []

    def _add_job(self, args: list[Arg], timeout_ms: int) -> Any:
        return self._command(args, _text)  # (a NOREPL comes back as the node says it: `execute` raises it)

    def _command(self, args: Sequence[Arg], convert: Callable[[Any], T] = _same) -> Any:
        return (encode_command(args), convert)

    def _run(self, request: Any) -> Pipeline:
        self._queued.append(request)
        return self

    def _consume(self, args: Sequence[Arg], acking: Sequence[Arg] = ()) -> Any:
        if acking:
            raise ValueError("in a pipeline, queue ack() before get_jobs() instead of acking=")
        return self._command(args, _jobs)  # GETJOB queues too (no affinity move inside a pipeline)

    def __len__(self) -> int:
        return len(self._queued)

    def execute(self) -> Any:
        """The replies (awaited for `AsyncClient`); an error reply raises (`_Base._batch`)."""
        queued, self._queued = self._queued, []
        return self._client._run(self._client._batch(queued))
