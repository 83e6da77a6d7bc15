"""NACK ... ERROR: the failure a consumer reports stays with the job, travels
with it (QUEUED, REPLJOB, the AOF), goes into its dead letter with the
original ID and queue, and shows in SHOW; its sizes are bounded by one rule."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import example, given, settings, strategies as st

from disque.cluster import messages as m
from disque.cluster.codec import decode_body, encode_body
from disque.core.effects import AofAppend
from disque.store import failure as failures
from disque.store.failure import Failure
from disque.store.records import DecodeError, decode_storage, encode_storage, job_from_wire, job_to_wire

from jobenv import duo, env, fetched_with_a_replica, from_peer, make_env
from support import Session, make_core, replay

TB = "Traceback (most recent call last):\n  File \"app.py\", line 3, in send\nValueError: no such address"
ERROR = ("ERROR", "ValueError", "no such address", "TRACEBACK", TB, "HOST", "worker-1", "PID", 4242)


def _fetched(env, *opts) -> bytes:
    job_id = env.add("emails", "x", "RETRY", 30, *opts)
    assert env.s("GETJOB", "FROM", "emails")[0][1] == job_id
    return job_id


def test_nack_error_is_kept_with_the_job_and_shown(env):
    job_id = _fetched(env)
    assert "error-type" not in env.show(job_id)  # SHOW's shape is Disque's until a failure is reported
    used = env.core.memory.used
    assert env.s("NACK", job_id, *ERROR) == 1
    shown = env.show(job_id)
    assert (shown["state"], shown["nacks"]) == ("queued", 1)
    assert (shown["error-type"], shown["error-message"], shown["error-traceback"]) == (b"ValueError", b"no such address", TB.encode())
    assert (shown["error-host"], shown["error-pid"], shown["error-time"]) == (b"worker-1", 4242, env.core.now)
    assert env.core.memory.used > used + len(TB)  # its bytes are counted
    # The next failure replaces it; a NACK without ERROR leaves it.
    env.s("GETJOB", "FROM", "emails")
    assert env.s("NACK", job_id, "ERROR", "KeyError", "'to'") == 1
    shown = env.show(job_id)
    assert (shown["error-type"], shown["error-message"], shown["error-traceback"], shown["error-pid"]) == (b"KeyError", b"'to'", b"", 0)
    env.s("GETJOB", "FROM", "emails")
    assert env.s("NACK", job_id) == 1 and env.show(job_id)["error-type"] == b"KeyError"
    env.check()


def test_nack_error_with_delay_and_refusals(env):
    job_id = _fetched(env)
    queued = env.add("emails", "y", "RETRY", 30)
    assert env.s("NACK", job_id, queued, "ERROR", "E", "m", "DELAY", 5) == 1  # the queued one is refused, as NACK does
    assert env.show(job_id)["error-type"] == b"E" and "error-type" not in env.show(queued)
    env.wait(5_100)
    assert env.s("QLEN", "emails") == 2
    env.check()


def test_the_dead_letter_keeps_the_error_the_original_id_and_queue(env):
    job_id = _fetched(env, "MAXATTEMPTS", 1, "DEADLETTER", "emails-failed")
    assert env.s("NACK", job_id, *ERROR) == 1
    assert env.show(job_id) is None
    [(_, dead_id, _)] = env.s("GETJOB", "NOHANG", "FROM", "emails-failed")
    dead = env.show(dead_id)
    assert (dead["dead-letter-of"], dead["dead-letter-from"], dead["error-type"], dead["error-host"]) == (
        job_id, b"emails", b"ValueError", b"worker-1"
    )
    # Requeued, it is a fresh job again: no failure.
    env.s("ENQUEUE", dead_id)
    assert env.s("DEADLETTER", "REQUEUE", "emails-failed") == 1
    [(_, again, _)] = env.s("GETJOB", "NOHANG", "FROM", "emails")
    assert "error-type" not in env.show(again)
    env.check()


@pytest.mark.parametrize(
    "args, error",
    [
        (("ERROR", "E"), "Syntax error, try NACK"),
        (("ERROR", "E", "m", "TRACEBACK"), "Syntax error, try NACK"),
        (("DELAY",), "Syntax error, try NACK"),
        (("DELAY", 1, "junk"), "Syntax error, try NACK"),
        (("TRACEBACK", "t"), "TRACEBACK, HOST and PID need ERROR"),
        (("DELAY", 1, "PID", 3), "TRACEBACK, HOST and PID need ERROR"),
        (("ERROR", "", "m"), "ERROR type must not be empty"),
        (("ERROR", "E", "m", "PID", "x"), "value is not an integer or out of range"),
        (("ERROR", "E", "m", "PID", -1), "ERROR pid must be between 0 and 4294967295"),
        (("ERROR", "E" * 257, "m"), "ERROR type longer than 256 bytes (the failure size limits)"),
        (("ERROR", "E", "m" * 4097), "ERROR message longer than 4096 bytes (the failure size limits)"),
        (("ERROR", "E", "m", "TRACEBACK", "t" * 16385), "ERROR traceback longer than 16384 bytes (the failure size limits)"),
        (("ERROR", "E", "m", "HOST", "h" * 256), "ERROR host longer than 255 bytes (the failure size limits)"),
        (("ERROR", "E", "m", "DELAY", -1), "DELAY time must be a non negative number"),
    ],
)
def test_nack_error_arguments(env, args, error):
    job_id = _fetched(env)
    got = env.s("NACK", job_id, *args)
    assert got.message.startswith(error)
    assert env.show(job_id)["state"] == "active" and "error-type" not in env.show(job_id)


def test_the_limits_are_the_edge_of_what_is_accepted(env):
    job_id = _fetched(env)
    limits = failures.LIMITS
    args = ("ERROR", "E" * limits["type"], "m" * limits["message"], "TRACEBACK", "t" * limits["traceback"],
            "HOST", "h" * limits["host"], "PID", failures.MAX_PID)  # fmt: skip
    assert env.s("NACK", job_id, *args) == 1
    assert len(env.show(job_id)["error-traceback"]) == limits["traceback"]


def test_the_failure_travels_in_queued_and_is_kept_by_the_peer(duo):
    job_id = fetched_with_a_replica(duo)
    assert duo.s("NACK", job_id, "ERROR", "E", "m", "DELAY", 3) == 1
    [queued] = duo.sent()
    assert queued.failure == Failure(b"E", b"m", at=duo.core.now) and queued.delay == 3
    duo.wait(3_100)
    duo.s("GETJOB", "FROM", "q")
    duo.sent()
    assert duo.s("NACK", job_id, "ERROR", "F", "n") == 1
    [queued] = duo.sent()
    assert (queued.incr_nacks, queued.failure.type) == (True, b"F")
    # A peer's QUEUED with a failure: this node keeps it (and counts its bytes).
    other = Failure(b"G", b"o", b"tb", b"host", 7, 123)
    from_peer(duo, m.Queued(job_id, incr_nacks=True, failure=other))
    shown = duo.show(job_id)
    assert (shown["error-type"], shown["error-time"], shown["nacks"]) == (b"G", 123, 3)
    from_peer(duo, m.Queued(job_id))  # none: the last one stays
    assert duo.show(job_id)["error-type"] == b"G"


def test_the_failure_survives_a_restart_from_the_aof() -> None:
    src, src_clock, _ = make_core()
    src.aof.state = "on"
    s = Session(src)
    job_id = bytes(s("ADDJOB", "q", "x", 0, "RETRY", 5))
    dead_job = bytes(s("ADDJOB", "q", "y", 0, "RETRY", 5, "MAXATTEMPTS", 1))
    s("GETJOB", "COUNT", 2, "FROM", "q")
    assert s("NACK", job_id, dead_job, *ERROR) == 2
    blob = b"".join(e.record for e in src.out.effects if isinstance(e, AofAppend))
    core, clock, _ = make_core(seed=2)
    clock.ms = src_clock.ms
    core.read_clock()
    replay(core, blob)
    assert core.jobs.get(job_id).failure.type == b"ValueError"
    assert dead_job not in core.jobs
    [dead] = [job for job in core.jobs.values() if job.queue == b"q-dead"]
    assert (dead.origin, dead.dead_letter, dead.failure.host, dead.failure.pid) == (dead_job, b"q", b"worker-1", 4242)


failure_st = st.builds(
    Failure,
    st.binary(min_size=1, max_size=failures.LIMITS["type"]),
    st.binary(max_size=200),
    st.binary(max_size=500),
    st.binary(max_size=failures.LIMITS["host"]),
    st.integers(0, failures.MAX_PID),
    st.integers(0, 2**64 - 1),
)


@settings(max_examples=60, deadline=None)
@given(failure=failure_st)
def test_the_failure_round_trips_in_every_form(failure: Failure) -> None:
    env = make_env()
    job_id = env.add("q", "x")
    job = env.core.jobs.get(job_id)
    job.failure = failure
    assert decode_storage(encode_storage(job)).failure == failure
    assert job_from_wire(job_to_wire(job, 0), 0).failure == failure
    header = m.Header("a" * 40, 7711, 0)
    assert decode_body(encode_body(header, m.Queued(job_id, failure=failure)))[1].failure == failure


@pytest.mark.parametrize(
    "value, error",
    [
        ("x", "expected an array"),
        ([b"E"], "expected 6 items"),
        ([b"E", "m", b"", b"", 0, 0], "expected bytes"),
        ([b"E", b"m", b"", b"", -1, 0], "is not in"),
        ([b"", b"m", b"", b"", 0, 0], "type must not be empty"),
        ([b"E", b"m" * 4097, b"", b"", 0, 0], "message longer than 4096 bytes"),
    ],
)
def test_a_stored_failure_that_breaks_the_rule_does_not_decode(env, value, error) -> None:
    job_id = env.add("q", "x")
    stored = msgpack.unpackb(encode_storage(env.core.jobs.get(job_id)))
    stored["er"] = value
    with pytest.raises(DecodeError, match=error):
        decode_storage(msgpack.packb(stored, use_bin_type=True))


def test_an_empty_stored_failure_is_none(env) -> None:
    job_id = env.add("q", "x")
    job = env.core.jobs.get(job_id)
    job.failure = ()
    assert job.rare is None and job.extra_size() == 0  # none needs no record
    stored = msgpack.unpackb(encode_storage(env.core.jobs.get(job_id)))
    stored["er"] = []
    assert decode_storage(msgpack.packb(stored, use_bin_type=True)).failure == ()


words = st.sampled_from([b"ERROR", b"error", b"TRACEBACK", b"HOST", b"PID", b"DELAY", b"E", b"1", b"-1", b"", b"x" * 300])


@settings(max_examples=200, deadline=None)
@given(args=st.lists(words, max_size=9))
@example(args=[b"DELAY", b"ERROR", b"DELAY", b"1"])  # a DELAY given twice: each value checked
def test_nack_arguments_fuzz(args: list[bytes]) -> None:
    """Any NACK options: a count or an error reply, never a crash, and a
    failure is kept only when the reply counted the job."""
    env = make_env()
    job_id = env.add("q", "x", "RETRY", 30)
    env.s("GETJOB", "FROM", "q")
    got = env.s("NACK", job_id, *args)
    shown = env.show(job_id)
    if isinstance(got, int):
        assert got == 1 and shown["state"] == "queued" or shown["state"] == "active"
        assert ("error-type" in shown) == any(a.lower() == b"error" for a in args)
    else:
        assert shown["state"] == "active" and "error-type" not in shown
    env.check()


dl_words = st.sampled_from([b"LIST", b"REQUEUE", b"DELETE", b"MOVES", b"STOP", b"COUNT", b"FROM", b"ERROR", b"SINCE", b"UNTIL",
                           b"RATE", b"q", b"q-dead", b"E", b"0", b"2", b"-1", b""])  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(args=st.lists(dl_words, min_size=1, max_size=9))
def test_deadletter_arguments_fuzz(args: list[bytes]) -> None:
    """Any DEADLETTER arguments: a reply (a count, a list, an error), never a
    crash, and the node's invariants hold."""
    env = make_env()
    job_id = env.add("q", "x", "RETRY", 30, "MAXATTEMPTS", 1)
    env.s("GETJOB", "FROM", "q")
    assert env.s("NACK", job_id, "ERROR", "E", "m") == 1
    got = env.s("DEADLETTER", *args)
    assert isinstance(got, int | list) or got == b"OK" or got.message
    env.wait(2_000)  # a paced move it started runs
    env.check()


def test_older_nodes_and_files_need_no_failure(env) -> None:
    """A job row of an older node (positional, without the field that ends
    it) or a record of an older file (no "er" key) reads with no failure;
    a row with one more field than this node knows still reads."""
    from disque.store import records

    job_id = env.add("q", "x")
    job = env.core.jobs.get(job_id)
    job.failure = Failure(b"E", b"m")
    row = records._dump_wire_job_pos.pack(job_to_wire(job, 0), ())
    assert records._wire_job_pos.check(row)["failure"] == Failure(b"E", b"m")
    older = row[: len(row) - len(records._DEPENDS) - 2]  # an older node's row: no failure, nor the fields after it (the key, ...)
    assert records._wire_job_pos.check(older)["failure"] == ()
    assert records._wire_job_pos.check(row + ["a field of a newer node"])["failure"] == Failure(b"E", b"m")
    stored = msgpack.unpackb(encode_storage(job))
    del stored["er"]
    assert decode_storage(msgpack.packb(stored, use_bin_type=True)).failure == ()
