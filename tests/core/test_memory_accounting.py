"""The memory estimate against what CPython really allocates (tracemalloc):
`maxmemory` can only bound the process if `used_memory` is honest.  A change
that makes jobs or queues heavier fails here until the costs in node.py are
measured again."""

from __future__ import annotations

import tracemalloc

import pytest

from disque.core.node import BASE_MEMORY
from support import FORCE_READ_BEHIND, Session, make_core

# These measure jobs in memory; read-behind's slots have their own test (test_read_behind.py).
pytestmark = pytest.mark.skipif(FORCE_READ_BEHIND, reason="jobs on disk: measured by test_read_behind.py")

JOBS = 5000


def allocated_per_job(size: int, *opts: bytes, queues: int = 1) -> tuple[float, float]:
    """(bytes traced, bytes estimated) per job, for JOBS jobs of `size`-byte
    bodies over `queues` queues, each request's strings fresh as a parser
    makes them."""
    core, _, _ = make_core()
    s = Session(core)
    before_estimate = core.used_memory
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(JOBS):
            body = (b"%08d" % i) * (size // 8)
            s(b"ADDJOB", b"q%d" % (i % queues), body, b"0", *opts)
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return traced / JOBS, (core.used_memory - before_estimate) / JOBS


@pytest.mark.parametrize(
    "size, opts",
    [
        (8, ()),
        (96, ()),
        (1024, ()),
        (96, (b"RETRY", b"0")),
        (96, (b"DELAY", b"100")),
        (96, (b"TTL", b"60", b"RETRY", b"5")),
    ],
)
def test_a_job_costs_what_the_estimate_says(size, opts):
    traced, estimated = allocated_per_job(size, *opts)
    # Within 10 % under (never much less than the truth) and 25 % over.
    assert 0.9 * traced <= estimated <= 1.25 * traced, (traced, estimated)


def test_a_queue_costs_what_the_estimate_says():
    one_queue, _ = allocated_per_job(8)
    per_queue, estimated = allocated_per_job(8, queues=JOBS)
    traced_queue = per_queue - one_queue
    estimated_queue = estimated - allocated_per_job(8)[1]
    assert 0.9 * traced_queue <= estimated_queue <= 1.25 * traced_queue, (traced_queue, estimated_queue)


def test_the_base_is_what_the_shell_measured():
    core, _, _ = make_core()
    core.set_base_memory(40_000_000)
    assert core.used_memory == 40_000_000 and core.peak_memory == 40_000_000
    core.set_base_memory(BASE_MEMORY)
    assert core.used_memory == BASE_MEMORY
