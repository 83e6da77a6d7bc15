"""WAITJOB: a client waits until every job it names is acknowledged (here or
on a peer), gone, or its timeout passes, and gets the count acknowledged."""

from __future__ import annotations

import random

import pytest

from disque.store import ids
from disque.cluster import messages as m
from disque.core.types import BLOCKED

from jobenv import duo, env, from_peer
from support import Session


def test_waitjob_returns_once_every_job_is_acknowledged(env):
    a, b, c = (env.add("q", body) for body in "abc")
    waiter = Session(env.core)
    assert waiter("WAITJOB", a, b, c, a) is BLOCKED  # an ID listed twice counts once
    assert env.s("ACKJOB", a) == 1 and waiter.pending() == []
    assert env.s("FASTACK", b) == 1 and waiter.pending() == []
    assert env.s("ACKJOB", c) == 1 and waiter.pending() == [3]
    assert waiter("WAITJOB", a, b, c) == 3  # collected after their ACK: at once
    env.check()


def test_waitjob_timeout_counts_what_was_acknowledged(env):
    a, b = env.add("q", "a"), env.add("q", "b")
    waiter = Session(env.core)
    assert waiter("WAITJOB", a, b, "TIMEOUT", 1000) is BLOCKED
    env.s("ACKJOB", a)
    env.wait(900)
    assert waiter.pending() == []
    env.wait(200)
    assert waiter.pending() == [1]
    env.check()


def test_waitjob_stops_waiting_for_a_job_that_goes_unacknowledged(env):
    a, b = env.add("q", "a", "TTL", 5), env.add("q", "b")
    waiter, gone = Session(env.core), Session(env.core)
    assert waiter("WAITJOB", a, b) is BLOCKED
    assert gone("WAITJOB", b) is BLOCKED
    env.core.disconnect(gone.client.id)  # a client that leaves stops waiting
    env.s("ACKJOB", b)
    env.wait(6_000)  # `a` expires
    assert waiter.pending() == [1] and env.core.blocking.job_waits == {}
    env.check()


@pytest.mark.parametrize(
    "args, error",
    [
        (("DI0123456789abcdef0123456789abcdef0123456789SQ",), "BADID"),
        (("TIMEOUT", "10"), "ERR"),
        ((ids.new_job_id("a" * 40, random.Random(1), 60, 30),), "NOJOB"),
    ],
)
def test_waitjob_errors(env, args, error):
    assert env.s("WAITJOB", *args).code == error


def test_waitjob_learns_acknowledgements_from_peers(duo):
    producer = Session(duo.core)
    producer("ADDJOB", "q", "x", 0)
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    from_peer(duo, m.GotJob(job_id))
    waiter = Session(duo.core)
    assert waiter("WAITJOB", job_id) is BLOCKED
    from_peer(duo, m.SetAck(job_id, 2))  # acknowledged on the peer
    assert waiter.pending() == [1]
    assert duo.state(job_id) == "acked" and waiter("WAITJOB", job_id) == 1  # acked, not collected yet
    other = duo.s("ADDJOB", "q", "y", 0, "REPLICATE", 1)
    assert waiter("WAITJOB", bytes(other)) is BLOCKED
    from_peer(duo, m.DelJob(bytes(other)))  # a FASTACK elsewhere
    assert waiter.pending() == [1]
    moved = bytes(duo.s("ADDJOB", "q", "z", 0, "REPLICATE", 1))
    assert waiter("WAITJOB", moved) is BLOCKED
    from_peer(duo, m.DelJob(moved, acked=False))  # dead-lettered elsewhere: gone, not acknowledged
    assert waiter.pending() == [0]
    assert waiter("WAITJOB", moved, bytes(other)) == 1  # remembered, each as it went
