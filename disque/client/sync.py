"""The blocking `Client`: drives `_Base`'s generators over plain sockets, one
request at a time under a thread lock; its worker runs WORKING heartbeats in a
thread beside the handler.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from disque.client.base import (
    FIRST_HEARTBEAT,
    Ops,
    _Base,
    _Blocking,
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


class Client(_Base, _Blocking):
    """Blocking client; safe to share between threads (one request at a time).

    >>> with Client(["127.0.0.1:7711", "127.0.0.1:7712"]) as c:
    ...     c.add_job("q", b"hello")
    """

    _new_lock = staticmethod(threading.Lock)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def batch(
        self, on_success: tuple[str, str | bytes] | None = None, on_complete: tuple[str, str | bytes] | None = None
    ) -> Iterator[BatchJobs]:
        """`with client.batch(on_success=(queue, body)) as b: b.add_job(...)`:
        BATCH NEW, the jobs the block adds, BATCH CLOSE when it ends (a block
        that raises leaves the batch open: its callbacks never fire)."""
        jobs = BatchJobs(self, self.batch_new(on_success, on_complete))
        yield jobs
        self.batch_close(jobs.id)

    def _run(self, ops: Ops[T]) -> T:
        with self._lock:
            return self._drive(ops)

    def _drive(self, ops: Ops[T]) -> T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = ops.send(value) if error is None else ops.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                value = self._perform(op)
            except BaseException as e:
                error = e

    def _perform(self, op: _Open | _Send | _Receive | _Close) -> Any:
        if isinstance(op, _Close):
            return op.transport.close()
        address = op.address if isinstance(op, _Open) else op.link.address
        try:
            if isinstance(op, _Open):
                return self._open(address)
            if isinstance(op, _Send):
                return op.link.transport.sendall(op.data)
            return op.link.transport.recv(1 << 16)
        except OSError as e:
            raise _failure(address, e) from e

    def _open(self, address: Address) -> socket.socket:
        """The one place sockets are made, and wrapped in TLS when configured."""
        sock = socket.create_connection(address, timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=address[0])  # handshakes now
            except BaseException:
                sock.close()
                raise
        sock.settimeout(self.socket_timeout)
        return sock

    def _iterate(self, scan: _Scan[Any]) -> Iterator[Any]:
        while not scan.done:
            yield from self._run(self._command(scan.request(), scan.page))

    def monitor(self) -> Iterator[str]:
        """MONITOR.  Returns once the node has answered (every command it
        runs from then on is seen), an iterator of one line per command.  The
        connection stays a monitor: close the client to stop."""
        self._run(self._command(["MONITOR"]))
        return self._monitor_lines()

    def _monitor_lines(self) -> Iterator[str]:
        link = self._link
        assert link is not None  # MONITOR was just answered on it
        while True:
            yield _text(self._run(self._reply(link)))

    def worker(
        self,
        queues: str | Iterable[str],
        handler: Callable[[Job], object],
        *,
        max_jobs: int | None = None,
        first_heartbeat: float | None = FIRST_HEARTBEAT,
    ) -> int:
        """Consume forever (or `max_jobs` jobs): ACK when `handler(job)` returns,
        NACK when it raises.  While the handler runs, WORKING is sent after
        `first_heartbeat` seconds, then every RETRY/2 (None: never)."""
        names = _queue_list(queues)
        done = 0
        while max_jobs is None or done < max_jobs:
            for job in self.get_jobs(*names):
                stop = threading.Event()
                beats = threading.Thread(target=self._heartbeat, args=(job.id, stop, first_heartbeat), daemon=True)
                beats.start()
                try:
                    handler(job)
                    ok = True
                except Exception:
                    log.exception("handler failed on job %s", job.id)
                    ok = False
                finally:
                    stop.set()
                    beats.join()
                (self.ack if ok else self.nack)(job.id)
                done += 1
        return done

    def _heartbeat(self, job_id: str, stop: threading.Event, delay: float | None) -> None:
        while delay is not None and not stop.wait(delay):
            try:
                delay = _next_heartbeat(self.working(job_id))
            except (DisqueReplyError, DisqueConnectionError) as e:
                log.warning("WORKING %s: %s", job_id, e)
                return


@dataclass(frozen=True)
class BatchJobs:
    """The batch of a `Client.batch` block: `add_job` adds to it."""

    client: Client
    id: str

    def add_job(self, queue: str, body: str | bytes, **options: Any) -> JobHandle:
        return self.client.add_job(queue, body, batch=self.id, **options)
