"""OpenTelemetry traces of jobs against a real node (disque.client.tracing):
a producer's `send` span, its context carried in the job, and the worker's
`process` span continuing it, collected by the SDK's in-memory exporter;
and, without opentelemetry, a worker that still takes the context off the
body and a client that names the extra when asked to propagate."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from client_helpers import queue, shared_node  # noqa: F401  (fixtures)
from disque.client import Client, Job
from disque.client.tracing import MARK, unwrap
from disque.client.worker import App, Worker
from disque.testing.devcluster import NodeProcess

EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)  # once per process: this module's
TRACER = trace.get_tracer("tests")


@pytest.fixture
def app(shared_node: NodeProcess) -> Iterator[App]:
    app = App(f"{shared_node.host}:{shared_node.port}")
    yield app
    app.close()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def burst(app: App) -> Worker:
    worker = Worker(app, burst=True)
    anyio.run(functools.partial(worker.run, signals=False))
    return worker


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def test_a_job_carries_its_trace_from_producer_to_worker(app: App, queue: str, spans: InMemorySpanExporter) -> None:
    app.client_options["trace_context"] = True  # the producer propagates (App's options are its client's)
    seen: list[tuple[bytes, int, int]] = []

    @app.job(queue)
    def handle(job: Job) -> None:  # a sync handler: run in a thread, in the job's span all the same
        context = trace.get_current_span().get_span_context()
        seen.append((job.body, context.trace_id, context.span_id))

    with TRACER.start_as_current_span("request") as request:
        job_id = handle.send(b"hello")
    with Client(app.nodes) as c:
        [peeked] = c.qpeek(queue, 1)
        carrier, body = unwrap(peeked.body)  # on the server: the context, then the body
        assert peeked.body.startswith(MARK) and body == b"hello" and carrier is not None and "traceparent" in carrier
    assert burst(app).processed == 1
    [send] = named(spans, f"send {queue}")
    [process] = named(spans, f"process {queue}")
    assert send.kind == SpanKind.PRODUCER and send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes or {}) == {"messaging.system": "disque", "messaging.operation.type": "send", "messaging.operation.name": "ADDJOB",
                                           "messaging.destination.name": queue, "messaging.message.id": job_id}  # fmt: skip
    assert process.kind == SpanKind.CONSUMER and process.parent is not None and process.parent.span_id == send.context.span_id
    assert process.context.trace_id == request.get_span_context().trace_id  # one trace, from the request to the handler
    assert dict(process.attributes or {}) == {
        "messaging.system": "disque", "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.destination.name": queue, "messaging.message.id": job_id, "messaging.message.body.size": 5,
        "disque.job.attempt": 1, "disque.job.outcome": "ack",
    }  # fmt: skip
    assert seen == [(b"hello", process.context.trace_id, process.context.span_id)]  # the handler: the body alone, in the span
    assert process.status.status_code == StatusCode.UNSET


def test_failures_are_recorded_with_their_outcome(app: App, queue: str, spans: InMemorySpanExporter) -> None:
    # a producer that does not propagate: the worker's spans start traces

    @app.job(queue, max_attempts=2, dead_letter=f"{queue}-dead")
    async def handle(job: Job) -> None:
        raise ValueError(f"bad {job.body.decode()}")

    handle.send("one", retry=1)
    with Client(app.nodes) as c:
        assert not c.qpeek(queue, 1)[0].body.startswith(MARK)
        burst(app)  # the first attempt: retried after its NACK DELAY
        c.enqueue(*c.jscan(queue))  # no waiting for the DELAY
        burst(app)  # the second, the last allowed: dead-lettered
    first, last = sorted(named(spans, f"process {queue}"), key=lambda s: s.start_time or 0)
    for span, attempt, outcome in ((first, 1, "retry"), (last, 2, "dead-letter")):
        attributes = dict(span.attributes or {})
        assert (attributes["disque.job.attempt"], attributes["disque.job.outcome"], attributes["error.type"]) == (attempt, outcome, "ValueError")
        assert span.parent is None and span.status.status_code == StatusCode.ERROR and span.status.description == "bad one"
        assert [e.name for e in span.events] == ["exception"] and span.events[0].attributes["exception.message"] == "bad one"  # type: ignore[index]


def test_without_opentelemetry(shared_node: NodeProcess, queue: str) -> None:
    """A process where opentelemetry cannot be imported: the worker runs jobs
    (taking a producer's context off their bodies), with no spans and no
    import of opentelemetry; a client asked to propagate names the extra."""
    with Client((shared_node.host, shared_node.port)) as c:
        c.add_job(queue, MARK + b'{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}\nhello')
    script = f"""
import functools, sys
sys.modules["opentelemetry"] = None  # as if the extra were not installed
import anyio
from disque.client import Client
from disque.client.worker import App, Worker
app = App("{shared_node.host}:{shared_node.port}")
seen = []
app.job("{queue}")(lambda job: seen.append(job.body))
worker = Worker(app, burst=True)
anyio.run(functools.partial(worker.run, signals=False))
print(seen, [m for m in sys.modules if m.startswith("opentelemetry.")])
try:
    Client("127.0.0.1:1", trace_context=True)
except RuntimeError as e:
    print(e)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[b'hello'] []",
        "tracing needs OpenTelemetry: install the otel extra (pip install 'disque-server[otel]', or make extras EXTRAS=otel)",
    ]


def test_unwrap_leaves_other_bodies_alone() -> None:
    for body in (b"", b"plain", MARK, MARK + b"not json\nx", MARK + b'["a list"]\nx', MARK + b"{}"):
        assert unwrap(body) == (None, body)
    assert unwrap(MARK + b'{"traceparent":"x"}\n\x00binary\n') == ({"traceparent": "x"}, b"\x00binary\n")
