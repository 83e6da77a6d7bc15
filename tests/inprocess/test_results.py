"""Job results: ACKJOB <id> RESULT <bytes> keeps the consumer's bytes for
`result-ttl`; RESULT and WAITJOB ... WITHRESULTS return them; SETACK carries
them to every holder and the AOF keeps them (store/results.py)."""

from __future__ import annotations

import msgpack
import pytest

from disque.cluster import messages as m
from disque.cluster.codec import decode_body, encode_body
from disque.core.effects import AofAppend
from disque.core.types import BLOCKED
from disque.store import results as results_module
from disque.store.aof import AofCorrupt, check_record
from disque.store.records import DecodeError
from disque.store.results import MAX_RESULT_BYTES, Results

from jobenv import EVEN_ID, ODD_ID, PEER, OK, duo, env, fetched_with_a_replica, from_peer, make_env
from support import Session, make_core, replay


def test_ackjob_keeps_the_result_after_the_job_is_collected(env):
    job_id = env.add("q", "x")
    assert env.s("RESULT", job_id) is None
    assert env.s("ACKJOB", job_id, "RESULT", "42") == 1
    assert env.show(job_id) is None  # a single node collects it at once
    assert env.s("RESULT", job_id) == b"42"
    assert env.s("WAITJOB", job_id, "WITHRESULTS") == [1, [b"42"]]
    assert env.s("WAITJOB", job_id) == 1
    env.core.collected.clear()  # forgotten (a restart): its result still says it was acknowledged
    assert env.s("WAITJOB", job_id, "WITHRESULTS") == [1, [b"42"]]
    env.check()


def test_the_first_result_known_wins_and_each_result_goes_to_the_id_before_it(env):
    a, b, c = env.add("q", "a"), env.add("q", "b"), env.add("q", "c")
    assert env.s("ACKJOB", a, "Result", "ra", b, c, "result", "rc") == 3
    assert [env.s("RESULT", x) for x in (a, b, c)] == [b"ra", None, b"rc"]
    env.s("ACKJOB", a, "RESULT", "again")
    assert env.s("RESULT", a) == b"ra"
    assert env.s("RESULT", EVEN_ID) is None  # unknown: nil
    env.check()


@pytest.mark.parametrize(
    "args, error",
    [
        (("RESULT", "x"), "BADID"),  # (too short to be anything but IDs)
        (("RESULT", "x", "{id}"), "Syntax error"),
        (("{id}", "RESULT"), "BADID"),  # (too short to hold a result: RESULT is read as an ID)
        (("{id}", "{id}", "RESULT"), "Syntax error"),
        (("{id}", "RESULT", "a", "RESULT", "b"), "Syntax error"),
        (("{id}", "RESULT", "a", "{id}", "RESULT", "b"), "Syntax error"),
        (("{id}", "RESULT", "x" * (MAX_RESULT_BYTES + 1)), f"longer than {MAX_RESULT_BYTES} bytes"),
        (("{id}", "RESULT", "a", "D-nope"), "BADID"),
    ],
)
def test_ackjob_result_errors_do_nothing(env, args, error):
    job_id = env.add("q", "x")
    reply = env.s("ACKJOB", *[job_id if a == "{id}" else a for a in args])
    assert isinstance(reply, Exception) and error in str(reply)
    assert env.state(job_id) == "queued" and env.s("RESULT", job_id) is None
    assert env.s("ACKJOB", job_id, "RESULT", "x" * MAX_RESULT_BYTES) == 1  # the bound itself is fine
    assert env.s("RESULT", "D-nope").code == "BADID"


def test_a_result_is_forgotten_after_result_ttl():
    env = make_env()
    assert env.s("CONFIG", "SET", "result-ttl", "10") == OK
    job_id = env.add("q", "x")
    env.s("ACKJOB", job_id, "RESULT", "r")
    env.wait(9_000)
    assert env.s("RESULT", job_id) == b"r"
    env.wait(1_500)
    assert env.s("RESULT", job_id) is None and len(env.core.lifecycle.results) == 0
    env.check()


def test_results_keep_within_their_byte_budget(monkeypatch):
    monkeypatch.setattr(results_module, "RESULTS_MAX_BYTES", 10)
    kept = Results()
    assert kept.keep(b"a", b"12345", 100) and kept.keep(b"b", b"12345", 100)
    assert not kept.keep(b"a", b"other", 100)
    assert kept.keep(b"c", b"1", 100)  # over budget: the oldest goes
    assert kept.get(b"a", 0) is None and kept.get(b"c", 0) == b"1" and kept.size == 6
    assert kept.get(b"c", 100) is None  # its deadline passed, even before `expire`
    kept.clear()
    assert len(kept) == 0 and kept.size == 0


def test_waitjob_withresults_answers_once_every_job_is_acknowledged(env):
    a, b = env.add("q", "a"), env.add("q", "b")
    waiter = Session(env.core)
    assert waiter("WAITJOB", a, b, a, "WITHRESULTS") is BLOCKED
    env.s("ACKJOB", a, "RESULT", "ra")
    assert waiter.pending() == []
    env.s("ACKJOB", b)
    assert waiter.pending() == [[2, [b"ra", None]]]
    c = env.add("q", "c")
    assert waiter("WAITJOB", c, "TIMEOUT", 1000, "WITHRESULTS") is BLOCKED
    env.wait(1_100)
    assert waiter.pending() == [[0, [None]]]
    assert waiter("WAITJOB", c, "TIMEOUT", 1000) is BLOCKED
    env.wait(1_100)
    assert waiter.pending() == [0]
    env.check()


def test_setack_carries_the_result_to_every_holder(duo):
    job_id = fetched_with_a_replica(duo)
    assert duo.s("ACKJOB", job_id, "RESULT", "r") == 1
    (setack,) = [msg for msg in duo.sent() if isinstance(msg, m.SetAck)]
    assert setack.result == b"r"
    from_peer(duo, m.Queued(job_id))  # a holder that did not hear of the ACK yet is told again, result included
    (again,) = duo.sent()
    assert isinstance(again, m.SetAck) and again.result == b"r"
    from_peer(duo, m.GotAck(job_id, True))
    assert duo.show(job_id) is None and duo.s("RESULT", job_id) == b"r"
    duo.check()


def test_a_node_learns_a_result_from_setack_before_it_confirms(duo):
    job_id = fetched_with_a_replica(duo)
    duo.core.aof.state = "on"
    duo.core.out.effects.clear()
    from_peer(duo, m.SetAck(job_id, 2, (PEER,), b"from the peer"))
    assert duo.s("RESULT", job_id) == b"from the peer"
    log = [e.record for e in duo.core.out.effects if isinstance(e, AofAppend)]
    assert sum(b"RESULT" in r for r in log) == 1
    from_peer(duo, m.SetAck(ODD_ID, 2, (PEER,), b"a job never seen here"))  # a dummy ACK's result is kept too
    assert duo.s("RESULT", ODD_ID) == b"a job never seen here"
    duo.check()


def test_results_are_logged_replayed_and_rewritten(env):
    env.core.aof.state = "on"
    a, b = env.add("q", "a"), env.add("q", "b")
    env.s("ACKJOB", a, "RESULT", "ra", b, "RESULT", "rb")
    log = b"".join(e.record for e in env.core.out.effects if isinstance(e, AofAppend))
    assert log.count(b"RESULT\r\n") == 2
    rewrite = b"".join(env.core.snapshot().other)
    assert rewrite.count(b"RESULT\r\n") == 2
    for data in (log, rewrite, rewrite + log):
        core2, clock2, _ = make_core()
        clock2.ms = env.clock.ms
        replay(core2, data)
        assert [Session(core2)("RESULT", x) for x in (a, b)] == [b"ra", b"rb"]
    assert env.s("DEBUG", "FLUSHALL") == OK
    assert env.s("RESULT", a) is None and env.core.snapshot().other == []


def test_result_records_are_checked():
    job_id = b"DI" + b"f" * 40 + b"05a1SQ"
    assert check_record(0, [b"RESULT", job_id, b"1000", b"r"]) is None
    for bad in (
        [b"RESULT", b"nope", b"1000", b"r"],
        [b"RESULT", job_id, b"-1", b"r"],
        [b"RESULT", job_id, b"1" * 20, b"r"],
        [b"RESULT", job_id, b"1000", b"x" * (MAX_RESULT_BYTES + 1)],
        [b"RESULT", job_id, b"1000"],
    ):
        with pytest.raises(AofCorrupt):
            check_record(0, bad)


def test_setack_results_follow_the_size_rule():
    header = m.Header("a" * 40, 7711, 0)
    msg = m.SetAck(ODD_ID, 1, (), b"r")
    assert decode_body(encode_body(header, msg)) == (header, msg)
    body = msgpack.unpackb(encode_body(header, msg), raw=False)
    for bad in ("text", b"x" * (MAX_RESULT_BYTES + 1)):
        with pytest.raises(DecodeError, match="rs"):
            decode_body(msgpack.packb(body | {"rs": bad}, use_bin_type=True))
