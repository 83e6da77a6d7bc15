"""ADDJOB MAXATTEMPTS and DEADLETTER: after its last attempt a job moves to
its dead-letter queue, on this node and on the peers that hold it."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.types import NIL_ARRAY

from jobenv import duo, env, from_peer
from support import Session


def test_maxattempts_moves_the_job_to_its_dead_letter_queue_after_the_last_nack(env):
    """MAXATTEMPTS 3: a consumer that always NACKs sees the job three times;
    the third NACK moves it, as a new job carrying the old ID, its body and
    counters, to the dead-letter queue."""
    job_id = env.add("q", "x", "RETRY", 30, "MAXATTEMPTS", 3, "DEADLETTER", "failed")
    assert env.show(job_id)["max-attempts"] == 3 and env.show(job_id)["dead-letter"] == b"failed"
    seen = 0
    while (got := env.s("GETJOB", "NOHANG", "FROM", "q")) is not NIL_ARRAY:
        assert got[0][1] == job_id
        seen += 1
        assert env.s("NACK", job_id) == 1
    assert seen == 3 and env.show(job_id) is None
    [(queue, dead_id, body)] = env.s("GETJOB", "NOHANG", "FROM", "failed")
    dead = env.show(dead_id)
    assert (queue, body, dead["dead-letter-of"], dead["nacks"]) == (b"failed", b"x", job_id, 2)
    assert "max-attempts" not in dead and dict(env.s("QSTAT", "q"))[b"dead-lettered"] == 1
    assert env.core.stats.dead_lettered == 1
    env.check()


@pytest.mark.parametrize("how", ["retry", "nack-delay", "enqueue"])
def test_maxattempts_counts_every_kind_of_redelivery(env, how):
    job_id = env.add("q", "x", "RETRY", 2, "MAXATTEMPTS", 2)  # the default dead-letter queue: q-dead
    assert env.s("GETJOB", "FROM", "q")[0][1] == job_id
    assert env.s("NACK", job_id, "DELAY", 3) == 1  # the first failure: back after 3 s
    env.wait(3_100)
    assert env.s("GETJOB", "FROM", "q")[0][1] == job_id
    if how == "retry":
        env.wait(2_400)  # not acknowledged within RETRY: that was the last attempt
    elif how == "nack-delay":
        assert env.s("NACK", job_id, "DELAY", 60) == 1
    else:
        assert env.s("ENQUEUE", job_id) == 1
    assert env.show(job_id) is None and env.s("QLEN", "q-dead") == 1
    env.check()


def test_maxattempts_needs_no_change_for_other_jobs_and_checks_its_arguments(env):
    plain = env.add("q", "x")
    assert "max-attempts" not in env.show(plain) and "dead-letter-of" not in env.show(plain)
    assert env.s("ADDJOB", "q", "x", 0, "MAXATTEMPTS", 0).message == "MAXATTEMPTS must be between 1 and 65535"
    assert env.s("ADDJOB", "q", "x", 0, "DEADLETTER", "d").message == "DEADLETTER needs MAXATTEMPTS"


def test_a_dead_lettered_job_is_deleted_everywhere_and_its_copy_replicated(duo):
    producer = Session(duo.core)
    producer("ADDJOB", "q", "x", 0, "RETRY", 10, "MAXATTEMPTS", 1)
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    from_peer(duo, m.GotJob(job_id))
    duo.s("GETJOB", "FROM", "q")
    duo.sent()
    assert duo.s("NACK", job_id) == 1
    deljob, copy = duo.sent()
    assert deljob == m.DelJob(job_id, acked=False) and isinstance(copy, m.ReplJob) and copy.noreply
    assert copy.job["queue"] == b"q-dead" and copy.job["origin"] == job_id and copy.job["body"] == b"x"
