"""NACK ... DELAY: the job is held back, counted once, its arguments checked,
and the delay travels to the nodes that hold a copy."""

from __future__ import annotations

import pytest

from disque.core import figures
from disque.cluster import messages as m

from jobenv import duo, env, fetched_with_a_replica, from_peer
from support import Session


def test_nack_delay_holds_the_job_back_and_counts_one_nack(env):
    job_id = env.add("q", "x", "RETRY", 30)
    assert env.s("GETJOB", "FROM", "q")[0][1] == job_id
    assert env.s("NACK", job_id, "DELAY", 5) == 1
    assert env.s("QLEN", "q") == 0 and env.show(job_id)["nacks"] == 1
    env.wait(4_900)
    assert env.s("QLEN", "q") == 0
    env.wait(200)
    assert env.s("QLEN", "q") == 1
    shown = env.show(job_id)
    assert (shown["nacks"], shown["additional-deliveries"], shown["state"]) == (1, 0, "queued")
    assert figures.node_figures(env.core)["queues"][0]["nacks"] == 1
    # Delivered and NACKed again: the delay applies again, and the count goes on.
    env.s("GETJOB", "FROM", "q")
    assert env.s("NACK", job_id, "DELAY", 1) == 1 and env.s("QLEN", "q") == 0
    env.wait(1_100)
    assert env.s("QLEN", "q") == 1 and env.show(job_id)["nacks"] == 2
    env.check()


@pytest.mark.parametrize(
    "args, reply",
    [
        (("DELAY", "0"), 1),  # a plain NACK
        (("DELAY", "-1"), "DELAY time must be a non negative number"),
        (("DELAY", "soon"), "DELAY time must be a non negative number"),
    ],
)
def test_nack_delay_arguments(env, args, reply):
    job_id = env.add("q", "x", "RETRY", 30)
    env.s("GETJOB", "FROM", "q")
    got = env.s("NACK", job_id, *args)
    assert got == reply if isinstance(reply, int) else got.message == reply
    if reply == 1:
        assert env.s("QLEN", "q") == 1


def test_nack_delay_refuses_what_nack_refuses(env):
    once = env.add("q", "x", "RETRY", 0)
    env.s("GETJOB", "FROM", "q")
    queued = env.add("q", "y", "RETRY", 30)
    assert env.s("NACK", once, queued, "DELAY", 5) == 0  # at-most-once delivered; not active
    env.wait(6_000)
    assert env.s("QLEN", "q") == 1  # only `queued`, as before
    env.check()


def test_nack_delay_travels_to_the_nodes_that_hold_the_job(duo):
    job_id = fetched_with_a_replica(duo)
    assert duo.s("NACK", job_id, "DELAY", 3) == 1
    assert duo.sent() == [m.Queued(job_id, incr_nacks=True, delay=3)]
    duo.wait(2_000)
    assert duo.s("QLEN", "q") == 0 and duo.sent() == []
    duo.wait(600)  # WILLQUEUE goes 500 ms before the requeue
    assert duo.s("QLEN", "q") == 0 and duo.sent() == [m.WillQueue(job_id)]
    duo.wait(1_000)
    assert duo.s("QLEN", "q") == 1 and duo.sent() == [m.Queued(job_id)]  # no second count


def test_a_peer_nack_delay_postpones_the_local_copy(duo):
    """Receiving QUEUED with a delay: a queued copy is taken out, and the
    local requeue waits for the delay plus RETRY."""
    producer = Session(duo.core)
    producer("ADDJOB", "q", "x", 0, "RETRY", 10)
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    from_peer(duo, m.GotJob(job_id))
    assert duo.s("QLEN", "q") == 1
    from_peer(duo, m.Queued(job_id, incr_nacks=True, delay=3))
    assert duo.s("QLEN", "q") == 0 and duo.show(job_id)["nacks"] == 1
    job = duo.core.jobs.get(job_id)
    assert job.qtime - duo.core.now > 12_000  # the delay, then RETRY (10 s, give or take its jitter)
