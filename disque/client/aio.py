"""`AsyncClient`: drives `_Base`'s generators over anyio streams, so it runs
under asyncio and trio alike, one request at a time under an anyio lock; its
worker runs WORKING heartbeats in a task beside the handler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from disque.client.base import (
    FIRST_HEARTBEAT,
    Ops,
    _Awaiting,
    _Base,
    _Close,
    _failure,
    _next_heartbeat,
    _Open,
    _queue_list,
    _Receive,
    _Scan,
    _Send,
    log,
)
from disque.client.models import Job, JobHandle
from disque.client.protocol import Address, DisqueConnectionError, DisqueReplyError, T, _text


class AsyncClient(_Base, _Awaiting):
    """The same client for asyncio or trio (through anyio): every command
    method, and `close`, is awaited.  Safe to share between tasks of one
    event loop (one request at a time).

    >>> async with AsyncClient("127.0.0.1:7711") as c:
    ...     await c.add_job("q", b"hello")
    """

    @staticmethod
    def _new_lock() -> anyio.Lock:
        return anyio.Lock()  # not anyio.Lock itself: naming it loads half of anyio, slowing every import of this module

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def batch(
        self, on_success: tuple[str, str | bytes] | None = None, on_complete: tuple[str, str | bytes] | None = None
    ) -> AsyncIterator[AsyncBatchJobs]:
        """`Client.batch` for `async with`: `await b.add_job(...)` in the block."""
        jobs = AsyncBatchJobs(self, await self.batch_new(on_success, on_complete))
        yield jobs
        await self.batch_close(jobs.id)

    async def _run(self, ops: Ops[T]) -> T:
        async with self._lock:
            return await self._drive(ops)

    async def _drive(self, ops: Ops[T]) -> T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = ops.send(value) if error is None else ops.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                value = await self._perform(op)
            except BaseException as e:
                error = e

    async def _perform(self, op: _Open | _Send | _Receive | _Close) -> Any:
        if isinstance(op, _Close):
            return await anyio.aclose_forcefully(op.transport)
        address = op.address if isinstance(op, _Open) else op.link.address
        try:
            if isinstance(op, _Open):
                return await self._open(address)
            if isinstance(op, _Send):
                return await op.link.transport.send(op.data)
            with anyio.fail_after(self.socket_timeout):
                return await op.link.transport.receive(1 << 16)
        except anyio.EndOfStream:
            return b""
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as e:  # TimeoutError is an OSError
            raise _failure(address, e) from e

    async def _open(self, address: Address) -> anyio.abc.ByteStream:
        """The one place streams are made, and wrapped in TLS when configured."""
        with anyio.fail_after(self.connect_timeout):
            # not standard_compatible: closing does not wait for the server's close_notify
            return await anyio.connect_tcp(*address, ssl_context=self.ssl_context, tls_standard_compatible=False)

    async def _iterate(self, scan: _Scan[Any]) -> AsyncIterator[Any]:
        while not scan.done:
            for item in await self._run(self._command(scan.request(), scan.page)):
                yield item

    async def monitor(self) -> AsyncIterator[str]:
        """MONITOR, as `Client.monitor`: an async iterator once answered."""
        await self._run(self._command(["MONITOR"]))
        return self._monitor_lines()

    async def _monitor_lines(self) -> AsyncIterator[str]:
        link = self._link
        assert link is not None  # MONITOR was just answered on it
        while True:
            yield _text(await self._run(self._reply(link)))

    async def worker(
        self,
        queues: str | Iterable[str],
        handler: Callable[[Job], Awaitable[object]],
        *,
        max_jobs: int | None = None,
        first_heartbeat: float | None = FIRST_HEARTBEAT,
    ) -> int:
        """`Client.worker` for an async handler."""
        names = _queue_list(queues)
        done = 0
        while max_jobs is None or done < max_jobs:
            for job in await self.get_jobs(*names):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self.heartbeat, job.id, first_heartbeat)
                    try:
                        await handler(job)
                        ok = True
                    except Exception:
                        log.exception("handler failed on job %s", job.id)
                        ok = False
                    tasks.cancel_scope.cancel()
                await (self.ack if ok else self.nack)(job.id)
                done += 1
        return done

    async def heartbeat(self, job_id: str, delay: float | None = FIRST_HEARTBEAT) -> None:
        """Send WORKING for `job_id` after `delay` seconds, then every RETRY/2,
        until cancelled (None: never).  Gives up, with a warning, once the
        node cannot be reached or no longer knows the job."""
        while delay is not None:
            await anyio.sleep(delay)
            try:
                with anyio.CancelScope(shield=True):  # never cut a request in half
                    delay = _next_heartbeat(await self.working(job_id))
            except (DisqueReplyError, DisqueConnectionError) as e:
                log.warning("WORKING %s: %s", job_id, e)
                return


@dataclass(frozen=True)
class AsyncBatchJobs:
    """The batch of an `AsyncClient.batch` block: `await add_job(...)` adds to it."""

    client: AsyncClient
    id: str

    async def add_job(self, queue: str, body: str | bytes, **options: Any) -> JobHandle:
        return await self.client.add_job(queue, body, batch=self.id, **options)
