"""OpenTelemetry traces of jobs, with the `otel` extra (opentelemetry-api;
the SDK, or any other, to export them).

Theory of operation
-------------------
A Disque job has a body and no headers, so a producer that propagates its
trace context (`Client(..., trace_context=True)`, or an `App`'s handlers'
`send` with the same option) writes it in front of the body: MARK, the
propagator's fields as one line of JSON (W3C `traceparent`, `tracestate`,
baggage: whatever `opentelemetry.propagate` is configured with), a newline,
then the body.  The producer's span, `send <queue>` (kind PRODUCER), is the
parent so written.  The worker (`disque.client.worker`) takes the prefix off
before its handler sees the body and runs the handler in a span `process
<queue>` (kind CONSUMER), a child of that context when the job carries one,
with the job's queue, ID and attempt, and its outcome: `ack`, `retry`,
`dead-letter` (the last allowed attempt failed) or `interrupted` (stopped),
an error's type and the exception.  The attributes follow OpenTelemetry's
messaging conventions (`messaging.system` is `disque`; `disque.job.*` hold
what they do not name).

Other consumers of such a job see the prefix: `unwrap` takes it off, so a
producer propagates only when asked.  Without opentelemetry installed the
worker's spans are skipped, a job's prefix is still taken off, and asking a
client to propagate is an error that names the extra.  opentelemetry is
imported at the first job or the first traced ADDJOB, never at import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from disque.client.models import Job
from disque.client.protocol import _to_bytes

ID = TypeVar("ID", bound=str)  # the job ID add_job returns (a JobHandle)

if TYPE_CHECKING:
    from types import ModuleType

MARK = b"\x00disque-trace\x00"  # then the carrier's JSON, a newline, the body
SYSTEM = "disque"


@cache
def _otel() -> tuple[ModuleType, ModuleType] | None:
    """opentelemetry's trace and propagate modules, or None without the extra."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    return trace, propagate


def require() -> None:
    """Raise, naming the extra, unless opentelemetry can be imported."""
    if _otel() is None:
        raise RuntimeError("tracing needs OpenTelemetry: install the otel extra (pip install 'disque-server[otel]', or make extras EXTRAS=otel)")


def _tracer() -> Any:
    otel = _otel()
    assert otel is not None
    return otel[0].get_tracer("disque.client")


def wrap(body: str | bytes) -> bytes:
    """The body with the current trace context in front."""
    otel = _otel()
    assert otel is not None
    carrier: dict[str, str] = {}
    otel[1].inject(carrier)
    return MARK + json.dumps(carrier, separators=(",", ":")).encode() + b"\n" + _to_bytes(body)


def unwrap(body: bytes) -> tuple[dict[str, str] | None, bytes]:
    """(the trace context's fields, the body) of a job's body; (None, body)
    when it carries none."""
    if not body.startswith(MARK):
        return None, body
    line, newline, rest = body[len(MARK) :].partition(b"\n")
    try:
        carrier = json.loads(line)
    except ValueError:
        return None, body
    if not newline or not isinstance(carrier, dict):
        return None, body
    return carrier, rest


def sending(queue: str, body: str | bytes, send: Callable[[bytes], Generator[Any, Any, ID]]) -> Generator[Any, Any, ID]:
    """`send` (an ADDJOB) of `body` with the trace context in front, in a
    `send <queue>` span: the client's generator, run by its driver."""
    attributes = {"messaging.system": SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "ADDJOB",
                  "messaging.destination.name": queue}  # fmt: skip
    kind = _otel()[0].SpanKind.PRODUCER  # type: ignore[index]
    with _tracer().start_as_current_span(f"send {queue}", kind=kind, attributes=attributes) as span:
        job_id = yield from send(wrap(body))
        span.set_attribute("messaging.message.id", job_id)
        return job_id


@dataclass
class Processing:
    """A job as its handler gets it (the trace prefix off), and its span."""

    job: Job
    last_attempt: bool
    span: Any = None

    def end(self, error: BaseException | None) -> None:
        """Record how the handler's run ended."""
        if self.span is None:
            return
        outcome = "ack" if error is None else "dead-letter" if self.last_attempt else "retry"
        self.span.set_attribute("disque.job.outcome", outcome)
        if error is not None:
            trace = _otel()[0]  # type: ignore[index]
            self.span.set_attribute("error.type", type(error).__qualname__)
            self.span.record_exception(error)
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)))


@contextmanager
def processing(job: Job, last_attempt: bool) -> Iterator[Processing]:
    """The handler's run of `job`, in a `process <queue>` span continuing the
    producer's trace (without opentelemetry: the job alone, its prefix off)."""
    carrier, body = unwrap(job.body)
    job = job if carrier is None else replace(job, body=body)
    otel = _otel()
    if otel is None:
        yield Processing(job, last_attempt)
        return
    trace, propagate = otel
    attributes = {"messaging.system": SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "process",
                  "messaging.destination.name": job.queue, "messaging.message.id": job.id,
                  "messaging.message.body.size": len(job.body), "disque.job.attempt": job.deliveries or 1}  # fmt: skip
    context = propagate.extract(carrier) if carrier is not None else None
    with _tracer().start_as_current_span(f"process {job.queue}", context=context, kind=trace.SpanKind.CONSUMER,
                                         attributes=attributes, record_exception=False) as span:  # fmt: skip
        try:
            yield Processing(job, last_attempt, span)
        except BaseException:  # cancelled: the worker stops, the job is NACKed
            span.set_attribute("disque.job.outcome", "interrupted")
            raise
