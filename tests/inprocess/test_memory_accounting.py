"""The memory estimate against what CPython really allocates (tracemalloc):
`maxmemory` can only bound the process if `used_memory` is honest.  A change
that makes jobs or queues heavier fails here until the costs in node.py are
measured again."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest

from disque.core.memory import BASE_MEMORY
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
    before_estimate = core.memory.used
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(JOBS):
            body = (b"%08d" % i) * (size // 8)
            s(b"ADDJOB", b"q%d" % (i % queues), body, b"0", *opts)
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return traced / JOBS, (core.memory.used - before_estimate) / JOBS


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


def test_an_empty_node_costs_the_base():
    make_core()  # the modules are imported: only the node is traced
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        core, _, _ = make_core()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert core.memory.used == core.memory.peak == BASE_MEMORY
    assert 0.9 * traced <= BASE_MEMORY <= 1.25 * traced, traced


# ---------------------------------------------------------------- consumer groups

EVENTS = 3000


def traced_and_estimated(setup: Callable[[Session], object], step: Callable[[Session, int], object]) -> tuple[float, float]:
    """(bytes traced, bytes estimated) per `step`, run EVENTS times after
    `setup`; effects (AOF records) are taken as the shell would."""
    core, _, _ = make_core()
    s = Session(core)
    setup(s)
    core.take_effects()
    before_estimate = core.memory.used
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(EVENTS):
            step(s, i)
            core.take_effects()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert core.memory.used - BASE_MEMORY == core.groups.size() + sum(core.memory.job_size(j) for j in core.jobs.values())
    return traced / EVENTS, (core.memory.used - before_estimate) / EVENTS


def events(s: Session, count: int = EVENTS, queues: int = 1) -> None:
    for i in range(count):
        s(b"QADD", b"q%d" % (i % queues), b"600", b"%099d" % i)


@pytest.mark.parametrize(
    "what, setup, step",
    [
        ("an event", lambda s: None, lambda s, i: events(s, 1)),
        ("an event queue and its event", lambda s: None, lambda s, i: s(b"QADD", b"q%d" % i, b"600", b"%099d" % i)),
        ("a group that took an event", lambda s: events(s, 1), lambda s, i: s(b"QGET", b"q0", b"g%06d" % i, b"EX", b"0")),
        ("a group that holds an event", lambda s: events(s, 1), lambda s, i: s(b"QGET", b"q0", b"g%06d" % i, b"EX", b"60")),
        ("an event acknowledged", events, lambda s, i: s(b"QGET", b"q0", b"g", b"EX", b"0")),
        ("an event held", events, lambda s, i: s(b"QGET", b"q0", b"g", b"EX", b"60")),
    ],
)
def test_consumer_groups_cost_what_the_estimate_says(what, setup, step):
    traced, estimated = traced_and_estimated(setup, step)
    assert 0.9 * traced <= estimated <= 1.25 * traced, (what, traced, estimated)
