"""Job keys (ADDJOB ... KEY, docs/keys.md) over the core under the fake clock:
the key rule (the command, the bus and the AOF loader), the outputs that show
a key (SHOW, GETJOB WITHCOUNTERS, QPEEK, JSCAN KEY), and the forms a keyed
job travels in (REPLJOB, the AOF, a dead letter's move)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque.client.models import Job as ClientJob
from disque.cluster.codec import LinkCodec
from disque.cluster.messages import Header, ReplJob
from disque.core.effects import AofAppend
from disque.core.types import BLOCKED
from disque.store.job import MAX_KEY, RARE_BYTES, Job, State, key_problem
from disque.store.records import DecodeError, decode_storage, encode_storage, job_from_wire, job_to_wire

from jobenv import duo, env, make_env  # noqa: F401 (fixtures)
from support import Session, make_core, replay


def test_a_key_is_kept_with_the_job_and_shown(env) -> None:
    keyed = env.add("q", "k", "KEY", "customer-7")
    plain = env.add("q", "p")
    assert env.show(keyed)["key"] == b"customer-7"
    assert "key" not in env.show(plain)
    assert env.core.jobs.get(plain).rare is None  # a plain job costs nothing more
    assert env.s("QPEEK", "q", 2) == [[b"q", keyed, b"k", b"key", b"customer-7"], [b"q", plain, b"p"]]
    assert env.s("GETJOB", "COUNT", 2, "WITHCOUNTERS", "FROM", "q") == [  # plain jobs first: their turn (fair GETJOB)
        [b"q", plain, b"p", b"nacks", 0, b"additional-deliveries", 0],
        [b"q", keyed, b"k", b"nacks", 0, b"additional-deliveries", 0, b"key", b"customer-7"],
    ]
    env.s("NACK", keyed)
    assert env.s("GETJOB", "FROM", "q") == [[b"q", keyed, b"k"]]  # without counters: Disque's three fields
    env.check()


def test_jscan_filters_by_key(env) -> None:
    a = env.add("q", "a", "KEY", "x")
    env.add("q", "b", "KEY", "y")
    env.add("q", "c")
    _, found = env.s("JSCAN", "KEY", "x", "COUNT", 100)
    assert found == [a]
    _, shown = env.s("JSCAN", "KEY", "y", "REPLY", "ALL")
    assert [dict(j)[b"body"] for j in shown] == [b"b"]


def test_the_key_rule_is_checked_by_the_command(env) -> None:
    assert env.show(env.add("q", "b", "KEY", "k" * MAX_KEY))["key"] == b"k" * MAX_KEY
    assert str(env.s("ADDJOB", "q", "b", 0, "KEY", "k" * (MAX_KEY + 1))) == f"ERR KEY longer than {MAX_KEY} bytes"
    assert str(env.s("ADDJOB", "q", "b", 0, "KEY")).startswith("ERR syntax")
    assert env.s("QLEN", "q") == 1
    assert key_problem(b"") is None
    reply = env.s("SCHEDULE", "ADD", "s", "q", "b", "EVERY", 1000, "KEY", "k")
    assert str(reply) == "ERR KEY and DEDUP do not apply to SCHEDULE"


def test_a_replica_and_a_dead_letter_keep_the_key(duo) -> None:
    assert Session(duo.core)("ADDJOB", "q", "x", 0, "KEY", "doc-1", "MAXATTEMPTS", 1) is BLOCKED
    (repl,) = duo.sent()
    assert repl.job["key"] == b"doc-1"
    env = make_env()
    job_id = env.add("q", "x", "KEY", "doc-1", "MAXATTEMPTS", 1)
    env.s("GETJOB", "FROM", "q")
    env.s("NACK", job_id)
    [dead] = env.s("QPEEK", "q-dead", 1)
    assert dead[3:] == [b"key", b"doc-1"]
    assert env.s("DEADLETTER", "REQUEUE", "q-dead") == 1
    assert env.s("QPEEK", "q", 1)[0][3:] == [b"key", b"doc-1"]


def test_the_aof_keeps_the_key() -> None:
    src, src_clock, _ = make_core()
    src.aof.state = "on"
    job_id = bytes(Session(src)("ADDJOB", "q", "x", 0, "KEY", "tenant-3"))
    blob = b"".join(e.record for e in src.out.effects if isinstance(e, AofAppend))
    core, clock, _ = make_core(seed=2)
    clock.ms = src_clock.ms
    core.read_clock()
    replay(core, blob)
    assert core.jobs.get(job_id).key == b"tenant-3"


def _job(key: bytes) -> Job:
    return Job(b"DI" + b"0" * 44 + b"SQ", b"q", b"b", State.QUEUED, ctime=7, etime=100, key=key)


@settings(max_examples=50, deadline=None)
@given(key=st.binary(max_size=MAX_KEY))
def test_the_key_round_trips_in_every_form(key: bytes) -> None:
    job = _job(key)
    assert decode_storage(encode_storage(job)).key == key
    assert job_from_wire(job_to_wire(job, 0), 0).key == key
    header = Header("a" * 40, 7711, 0)
    for positional in (False, True):
        codec = LinkCodec()
        codec.positional = positional
        assert LinkCodec().decode(codec.encode(header, ReplJob(job_to_wire(job, 0), False)))[1].job["key"] == key


def test_the_bus_and_the_aof_loader_apply_the_key_rule() -> None:
    stored = msgpack.unpackb(encode_storage(_job(b"k")))
    assert stored["k"] == b"k"
    assert "k" not in msgpack.unpackb(encode_storage(_job(b"")))  # left out without one
    for bad, error in ((b"k" * (MAX_KEY + 1), "longer than"), ("text", "expected bytes")):
        stored["k"] = bad
        with pytest.raises(DecodeError, match=error):
            decode_storage(msgpack.packb(stored, use_bin_type=True))
    header = Header("a" * 40, 7711, 0)
    frame = msgpack.unpackb(LinkCodec().encode(header, ReplJob(job_to_wire(_job(b"k"), 0), False)))
    frame["j"]["k"] = b"k" * (MAX_KEY + 1)
    with pytest.raises(ValueError, match="longer than"):
        LinkCodec().decode(msgpack.packb(frame, use_bin_type=True))
    del frame["j"]["k"]  # an older node's frame: no key
    assert LinkCodec().decode(msgpack.packb(frame, use_bin_type=True))[1].job["key"] == b""


def test_the_key_is_counted_in_the_job_s_memory() -> None:
    job = _job(b"")
    assert job.extra_size() == 0
    job.key = b""  # none: still no record
    assert job.rare is None
    job.key = b"abc"
    assert job.extra_size() == RARE_BYTES + 3


def test_the_client_reads_the_key_of_a_getjob_entry() -> None:
    entry = [b"q", b"id", b"b", b"nacks", 0, b"additional-deliveries", 0, b"key", b"k1"]
    assert ClientJob.from_entry(entry).key == "k1"
    assert ClientJob.from_entry(entry[:7]).key is None
