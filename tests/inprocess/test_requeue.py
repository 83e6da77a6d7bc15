"""Requeueing by the timer: a job comes back to its queue exactly at its
requeue time (WILLQUEUE 500 ms before), once, and never for an
at-most-once job; NACK and ENQUEUE counters; the scheduler's bounded pass."""

from __future__ import annotations

import pytest

from disque.core.types import NIL_ARRAY, Status
from disque.store.job import State
from disque.store.jobs import MAX_JOBS_PER_PASS
from disque.protocols.resp.front import RESP

from jobenv import env


def test_requeue_happens_exactly_at_qtime_with_willqueue_lead(env):
    job_id = env.add("q", "x", "RETRY", 2)
    shown = env.show(job_id)
    due = shown["next-requeue-within"]
    assert 2000 - 250 <= due <= 2000 + 249 and shown["next-awake-within"] == due - 500
    assert env.s("GETJOB", "FROM", "q")[0][1] == job_id
    env.wait(due - 1)
    assert env.s("QLEN", "q") == 0 and env.show(job_id)["next-awake-within"] == 1  # WILLQUEUE visit done
    env.wait(1)
    assert env.s("QLEN", "q") == 1
    shown = env.show(job_id)
    assert shown["additional-deliveries"] == 1 and 2000 - 250 <= shown["next-requeue-within"] <= 2000 + 249
    env.check()


def test_job_waiting_in_queue_past_qtime_is_not_duplicated(env):
    job_id = env.add("q", "x", "RETRY", 1)
    env.wait(5_000)
    assert env.s("QLEN", "q") == 1 and dict(env.s("QSTAT", "q"))[b"jobs-in"] == 1
    assert 0 < env.show(job_id)["next-requeue-within"] <= 1249
    env.check()


def test_input_pause_postpones_requeue_but_not_delayed_retry0(env):
    again = env.add("q", "again", "RETRY", 1)
    env.s("GETJOB", "FROM", "q")
    once = env.add("q", "once", "RETRY", 0, "DELAY", 1)
    assert env.s("PAUSE", "q", "in") == Status(b"in")
    env.wait(3_000)
    assert env.state(again) == "active" and env.state(once) == "queued"
    pushed = env.show(again)["next-requeue-within"]
    assert 0 < pushed <= 1249
    env.s("PAUSE", "q", "none")
    env.wait(pushed)
    assert env.state(again) == "queued"
    env.check()


@pytest.mark.parametrize("opts", [(), ("DELAY", 2)])
def test_working_on_retry0_job(env, opts):
    job_id = env.add("q", "x", "RETRY", 0, *opts)
    assert env.s("WORKING", job_id) == 0
    assert env.state(job_id) == "active"
    env.wait(3_000)
    if opts:  # a delayed at-most-once job keeps its one queueing
        assert env.s("GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    assert env.s("ENQUEUE", job_id) == 0 and env.s("NACK", job_id) == 0
    assert env.s("GETJOB", "NOHANG", "FROM", "q") is NIL_ARRAY
    env.check()


def test_nack_before_the_first_queueing_leaves_it_silent(env):
    job_id = env.add("q", "x", "RETRY", 5, "DELAY", 2)
    assert env.s("NACK", job_id) == 1
    env.s("GETJOB", "FROM", "q")
    env.wait(6_000)  # the timer's requeue is the first plain queueing: not counted
    shown = env.show(job_id)
    assert shown["state"] == "queued" and (shown["nacks"], shown["additional-deliveries"]) == (1, 0)
    env.s("DEQUEUE", job_id)
    assert env.s("ENQUEUE", job_id) == 1 and env.show(job_id)["additional-deliveries"] == 1


def test_counters_saturate_at_16_bits(env):
    job_id = env.add("q", "x")
    job = env.core.jobs.get(job_id)
    job.nacks = job.deliv = 0xFFFF
    for command in ("NACK", "ENQUEUE"):
        env.s("DEQUEUE", job_id)
        env.s(command, job_id)
    assert (job.nacks, job.deliv) == (0xFFFF, 0xFFFF)


@pytest.mark.parametrize("retry", [3, 0])
def test_early_scheduler_visit_changes_nothing(env, retry):
    """A visit before qtime (the job was rescheduled for another reason)
    must neither queue the job nor move its timer."""
    job_id = env.add("q", "x", "RETRY", retry)
    env.s("GETJOB", "FROM", "q")
    job = env.core.jobs.get(job_id)
    job.flags &= ~2  # WILLQUEUE already announced
    qtime, awake = job.qtime, job.awake
    env.core.jobs.schedule(job, env.clock.ms + 1)
    env.wait(1)
    assert job.state == State.ACTIVE and job.qtime == qtime and job.awake == (qtime or awake)


def test_scheduler_pass_is_bounded(env):
    for i in range(MAX_JOBS_PER_PASS + 5):
        env.core.handle_command(env.s.client, [b"ADDJOB", b"q", b"x", b"0", b"TTL", b"1", b"RETRY", b"0"], RESP.run)
    expiry = env.core.jobs.next_awake()
    env.clock.ms = expiry
    env.core.tick()
    assert len(env.core.jobs) == 5 and env.core.next_deadline() == expiry  # the rest: at once
    env.core.tick()
    assert len(env.core.jobs) == 0
    env.check()
