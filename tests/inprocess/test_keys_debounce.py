"""ADDJOB ... KEY DEBOUNCE (core/keys.py, docs/keys.md) on whole cores: one
node (the job runs `ms` after the key's last ADDJOB, with the last body),
the options' rule, the bus (a peer's claims, a superseded job's producer),
the records, and three nodes on the mesh (whichever node gets each ADDJOB,
one job runs)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque.cluster import messages as m
from disque.core.errors import DisqueError
from disque.core.types import BLOCKED, Status
from disque.protocols.resp.commands import job_options
from disque.store import keyed
from disque.store.keyed import KeyHold
from disque.store.records import DecodeError

from jobenv import PEER, duo, env, from_peer  # noqa: F401 (fixtures)
from support import Session
from test_keys_dedup import add, formed, info, key_homed_at, reading_keys

JOB = b"DI" + b"5" * 44 + b"SQ"


def queued_bodies(env: Any, queue: str = "q") -> list[bytes]:
    return [entry[2] for entry in env.s("QPEEK", queue, 100)]


# ---------------------------------------------------------------- one node


def test_the_last_body_runs_its_ms_after_the_last_addjob(env) -> None:
    first = env.add("q", "a", "KEY", "k", "DEBOUNCE", 500)
    env.wait(200)
    second = env.add("q", "b", "KEY", "k", "DEBOUNCE", 500)
    env.wait(200)
    last = env.add("q", "c", "KEY", "k", "DEBOUNCE", 500)
    assert len({first, second, last}) == 3 and env.show(first) is None and env.show(second) is None
    assert env.show(last)["delay"] == 1  # (its copies' DELAY: whole seconds)
    env.wait(499)
    assert env.s("QLEN", "q") == 0
    env.wait(1)
    assert queued_bodies(env) == [b"c"]
    assert info(env.core)["debounce_superseded"] == 2 and info(env.core)["dedup_granted"] == 3
    later = env.add("q", "d", "KEY", "k", "DEBOUNCE", 500)  # the burst ended: a new one, the queued job stays
    assert env.show(last) is not None and env.show(later)["state"] == "active"
    env.wait(500)
    assert queued_bodies(env) == [b"c", b"d"] and info(env.core)["debounce_superseded"] == 2
    env.check()


def test_keys_and_queues_debounce_apart_and_dedup_does_not_supersede(env) -> None:
    env.add("q", "a", "KEY", "k", "DEBOUNCE", 300)
    env.add("q", "b", "KEY", "other", "DEBOUNCE", 300)
    env.add("q2", "c", "KEY", "k", "DEBOUNCE", 300)
    held = env.add("q", "x", "KEY", "held", "DEDUP", 10_000)
    assert env.add("q", "y", "KEY", "held", "DEBOUNCE", 300) == held  # a DEDUP hold answers a DEBOUNCE claim
    pending = env.add("q", "z", "KEY", "pend", "DEBOUNCE", 300)
    assert env.add("q", "w", "KEY", "pend", "DEDUP", 10_000) == pending  # and a pending job a DEDUP claim
    env.wait(300)
    assert sorted(queued_bodies(env)) == [b"a", b"b", b"x", b"z"] and queued_bodies(env, "q2") == [b"c"]
    assert info(env.core)["debounce_superseded"] == 0


@pytest.mark.parametrize(
    "args, error",
    [
        (("DEBOUNCE", 100), "ERR DEBOUNCE needs KEY"),
        (("KEY", "k", "DEBOUNCE", 0), "ERR DEBOUNCE must be a number of ms > 0"),
        (("KEY", "k", "DEBOUNCE", "-5"), "ERR DEBOUNCE must be a number of ms > 0"),
        (("KEY", "k", "DEBOUNCE", "soon"), "ERR DEBOUNCE must be a number of ms > 0"),
        (("KEY", "k", "DEBOUNCE"), "ERR syntax error"),
        (("KEY", "k", "DEBOUNCE", 100, "DEDUP", 100), "ERR DEBOUNCE and DEDUP can't be used together"),
        (("KEY", "k", "DEDUP", "ACTIVE", "DEBOUNCE", 100), "ERR DEBOUNCE and DEDUP can't be used together"),
        (("KEY", "k", "DEBOUNCE", 100, "DELAY", 0), "ERR DEBOUNCE and DELAY can't be used together"),
        (("KEY", "k", "DEBOUNCE", 1001, "TTL", 2), "ERR The specified DELAY is greater than TTL"),
    ],
)
def test_bad_debounce_options(env, args, error) -> None:
    assert str(env.s("ADDJOB", "q", "a", 0, *args)).startswith(error)
    assert env.s("QLEN", "q") == 0 and env.core.keys.holds == {}  # refused before its key's home is asked


def test_a_debounce_within_the_ttl_is_taken() -> None:
    opts = job_options([b"KEY", b"k", b"DEBOUNCE", b"1000", b"TTL", b"2"], 0)
    assert (opts.debounce, opts.delay, opts.dedup) == (1000, 1, 0)


_WORDS = st.sampled_from([b"KEY", b"k", b"DEBOUNCE", b"DEDUP", b"DELAY", b"TTL", b"ACTIVE", b"0", b"1", b"999", b"-1", b"x"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_WORDS, max_size=8))
def test_option_parsing_takes_debounce_only_by_its_rule(argv: list[bytes]) -> None:
    try:
        opts = job_options(argv, 0, b"0")
    except DisqueError:
        return
    if opts.debounce:
        assert opts.key and not opts.dedup and opts.delay == -(-opts.debounce // 1000) and b"DEBOUNCE" in argv
    elif b"DEBOUNCE" not in argv:
        assert opts.delay is None or b"DELAY" in argv


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10**12), st.booleans())
def test_a_debounce_is_taken_with_key_whatever_its_place(ms: int, first: bool) -> None:
    pair, key = [b"DEBOUNCE", b"%d" % ms], [b"KEY", b"k"]
    opts = job_options(pair + key if first else key + pair, 0, b"0")
    assert (opts.debounce, opts.delay, opts.key) == (ms, -(-ms // 1000), b"k")


# ---------------------------------------------------------------- records and the bus


def test_a_debounced_record_round_trips_and_breaks_no_older_reader() -> None:
    h = KeyHold(b"q", b"k", 5, "a" * 40, JOB, 9, False, True)
    assert keyed.decode(keyed.encode(h)) == h
    plain = KeyHold(b"q", b"k", 5, "a" * 40, JOB, 9)
    assert keyed.decode(keyed.encode(plain)) == plain and len(keyed.encode(h)) == len(keyed.encode(plain)) + 1
    with pytest.raises(DecodeError, match="DEBOUNCE and DEDUP"):
        keyed.decode(keyed.encode(KeyHold(b"q", b"k", 5, "a" * 40, JOB, 9, True, True)))


def test_the_home_supersedes_a_peer_s_pending_job_everywhere(duo) -> None:
    reading_keys(duo)
    key = key_homed_at(duo.core.membership.my_id, duo.core.membership.up_ids())
    other = b"DI" + b"6" * 44 + b"SQ"
    from_peer(duo, m.KeyClaim(1, b"q", key, JOB, 500, False, True))
    standby, claimed = duo.sent()
    assert claimed == m.KeyClaimed(1, b"q", key, JOB) and keyed.decode(standby.record).debounce
    from_peer(duo, m.KeyClaim(2, b"q", key, other, 500, False, True))
    assert duo.sent() == [m.DelJob(JOB, acked=False), m.KeySet(keyed.encode(duo.core.keys.holds[b"q\0" + key])),
                          m.KeyClaimed(2, b"q", key, other)]  # fmt: skip
    assert JOB in duo.core.collected  # its copy on its way here is not kept
    from_peer(duo, m.KeyClaim(2, b"q", key, other, 500, False, True))  # a copy of a claim (the bus may copy one)
    from_peer(duo, m.KeyClaim(1, b"q", key, JOB, 500, False, True))  # a late copy of the superseded job's claim
    assert duo.sent() == [m.KeyClaimed(2, b"q", key, other), m.KeyClaimed(1, b"q", key, JOB)]
    assert duo.core.keys.holds[b"q\0" + key].job == other and info(duo.core)["debounce_superseded"] == 1
    from_peer(duo, m.KeyClaim(3, b"q", key, JOB, 500, True, True))  # DEDUP ACTIVE and DEBOUNCE: dropped
    assert duo.sent() == [] and info(duo.core)["key_records_dropped"] == 1


def test_a_debounce_claim_waits_for_a_home_that_reads_debounce(duo) -> None:
    key = key_homed_at(PEER, duo.core.membership.up_ids())
    duo.core.membership.nodes[PEER].features = m.FEATURES & ~m.FEATURE_DEBOUNCE
    s = Session(duo.core)
    assert s("ADDJOB", "q", "a", 0, "KEY", key, "DEBOUNCE", 500, "REPLICATE", 1) is BLOCKED
    duo.wait(200)
    assert duo.sent() == []
    reading_keys(duo)
    duo.wait(100)
    [claim] = duo.sent()
    assert claim == m.KeyClaim(claim.ticket, b"q", key, claim.job, 500, False, True)
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", key, claim.job))
    assert s.pending() == [Status(claim.job)] and duo.s("QLEN", "q") == 0
    duo.wait(500)
    assert duo.s("QLEN", "q") == 1


def test_a_superseded_job_s_waiting_producer_gets_its_id(duo) -> None:
    reading_keys(duo)
    here = key_homed_at(duo.core.membership.my_id, duo.core.membership.up_ids())
    s = Session(duo.core)
    assert s("ADDJOB", "q", "a", 0, "KEY", here, "DEBOUNCE", 500, "REPLICATE", 2) is BLOCKED  # its copy not confirmed
    [repl] = [msg for msg in duo.sent() if isinstance(msg, m.ReplJob)]
    first = repl.job["id"]
    assert s("ADDJOB", "q", "b", 0, "KEY", here, "DEBOUNCE", 500, "REPLICATE", 2) is BLOCKED
    assert s.pending() == [Status(first)] and m.DelJob(first, acked=False) in duo.sent()
    # A job homed at the peer, superseded there while its copy is made here:
    there = key_homed_at(PEER, duo.core.membership.up_ids())
    s2 = Session(duo.core)
    assert s2("ADDJOB", "q", "c", 0, "KEY", there, "DEBOUNCE", 500, "REPLICATE", 2) is BLOCKED
    [claim] = duo.sent()
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", there, claim.job))
    assert s2.pending() == [] and duo.show(claim.job) is not None
    from_peer(duo, m.DelJob(claim.job, acked=False))
    assert s2.pending() == [Status(claim.job)] and duo.show(claim.job) is None


def test_a_newer_record_drops_the_copy_of_a_job_superseded_meanwhile(duo) -> None:
    reading_keys(duo)
    there = key_homed_at(PEER, duo.core.membership.up_ids())
    kept = []
    for body in ("superseded", "ran"):
        s = Session(duo.core)
        s("ADDJOB", "q", body, 0, "KEY", there, "DEBOUNCE", 500, "REPLICATE", 1)
        [claim] = duo.sent()
        from_peer(duo, m.KeyClaimed(claim.ticket, b"q", there, claim.job))
        now = duo.core.now
        from_peer(duo, m.KeySet(keyed.encode(KeyHold(b"q", there, now, PEER, claim.job, now + 500, False, True))))
        kept.append(claim.job)
        duo.wait(100)
    # (the second record replaced the first, made before it was due: the first job was superseded)
    assert duo.show(kept[0]) is None and duo.show(kept[1]) is not None
    now = duo.core.now  # a record of a new burst, made after the job was due: the job stays
    from_peer(duo, m.KeySet(keyed.encode(KeyHold(b"q", there, now + 600, PEER, JOB, now + 1100, False, True))))
    assert duo.show(kept[1]) is not None
    duo.wait(1000)  # queued here; then records from a home whose clock is behind say it was superseded: a due job stays
    assert duo.state(kept[1]) == "queued"
    from_peer(duo, m.KeySet(keyed.encode(KeyHold(b"q", there, now + 700, PEER, kept[1], now + 5000, False, True))))
    from_peer(duo, m.KeySet(keyed.encode(KeyHold(b"q", there, now + 800, PEER, JOB, now + 5000, False, True))))
    assert duo.core.keys.holds[b"q\0" + there].job == JOB and duo.state(kept[1]) == "queued"


# ---------------------------------------------------------------- three nodes


def test_three_nodes_one_run_with_the_last_body_ms_after_the_last_addjob() -> None:
    mesh = formed()
    ids = [add(mesh, i, "q", f"from {i} #{n}", 0, "KEY", "doc-1", "DEBOUNCE", 1000, "RETRY", 3)
           for n, i in enumerate((0, 1, 2, 1, 0, 2))]  # fmt: skip
    last_at = mesh.clock.ms
    assert len(set(ids)) == 6
    superseded = sum(info(mesh.core(i))["debounce_superseded"] for i in range(3))
    assert superseded == 5
    mesh.wait_for(lambda: sum(mesh.call(i, "QLEN", "q") for i in range(3)) == 1, 3000)
    assert 1000 <= mesh.clock.ms - last_at <= 1100
    [holder] = [i for i in range(3) if mesh.call(i, "QLEN", "q") == 1]
    [[_, job_id, body]] = mesh.call(holder, "GETJOB", "NOHANG", "FROM", "q")
    assert job_id == ids[-1] and body == b"from 2 #5"
    assert mesh.call(holder, "ACKJOB", job_id) == 1
    mesh.advance(8000)  # past every copy's DELAY and RETRY: no superseded copy comes back
    assert sum(mesh.call(i, "QLEN", "q") for i in range(3)) == 0
    assert all(mesh.call(i, "SHOW", j) is None for i in range(3) for j in ids[:-1])
