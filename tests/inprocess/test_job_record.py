"""The job record (store/job.py): its transition table and the fields few
jobs set, kept in one shared record made when first needed."""

from __future__ import annotations

import itertools

import pytest

from disque.store.job import ABORT, ACK, ADOPT, AWAIT_REPL, DEQUEUE, ENQUEUE, FETCH, RARE_BYTES, REPLICATED, TRANSITIONS, Job, State


def test_transition_table_is_complete():
    events = (ENQUEUE, FETCH, DEQUEUE, ACK, ABORT, REPLICATED, AWAIT_REPL, ADOPT)
    for state, event in itertools.product(State, events):
        job = Job(b"x" * 48, b"q", b"", state=state)
        if event in TRANSITIONS[state]:
            job.move(event)
            assert job.state == TRANSITIONS[state][event]
        else:
            with pytest.raises(AssertionError, match="no transition"):
                job.move(event)
    job = Job(b"x" * 48, b"q", b"", nodes_delivered=("a",))
    job.add_delivered("a")
    job.add_delivered("b")
    assert job.nodes_delivered == ("a", "b") and not job.is_dummy_ack
    assert repr(job) == f"<Job {'x' * 48} active q=b'q'>"


def test_the_fields_few_jobs_set_share_one_record_made_when_first_needed():
    job = Job(b"a" * 48, b"q", b"")
    job.nacks = job.gc_retry = 0  # (resetting what is unset makes nothing)
    assert job.rare is None and (job.delay, job.nacks, job.max_attempts, job.gc_retry) == (0, 0, 0, 0)
    job.nacks = 1  # a NACK
    assert job.rare is not None and job.nacks == 1 and job.extra_size() == 0  # charged as it was made
    delayed = Job(b"b" * 48, b"q", b"", delay=5)
    assert delayed.delay == 5 and delayed.extra_size() == RARE_BYTES
    delayed.set_attempts(3, b"dead")
    assert (delayed.max_attempts, delayed.dead_letter, delayed.delay) == (3, b"dead", 5)
