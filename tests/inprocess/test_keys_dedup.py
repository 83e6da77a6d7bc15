"""ADDJOB ... KEY DEDUP (core/keys.py, docs/keys.md) on whole cores: one
node's decisions, three nodes on the mesh (whichever node gets each ADDJOB,
one job per key and window), the home going away, lost answers, failed
ADDJOBs that release the hold, and the records (KEYSET, the AOF)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from disque.cluster import messages as m
from disque.core.effects import AofAppend
from disque.core.homes import ranked
from disque.core.keys import ASK_MS, FORGET_MS
from disque.core.types import Status
from disque.store import keyed
from disque.store.aof import KEYHOLD, encode_record
from disque.store.keyed import KeyHold
from disque.store.records import DecodeError

from jobenv import PEER, duo, env, from_peer, make_env  # noqa: F401 (fixtures)
from mesh import Mesh
from test_federation_upgrade import formed as upgrade_formed
from support import Session, make_core, replay


def info(core: Any) -> dict[str, int]:
    return dict(core.keys.info_fields())


# ---------------------------------------------------------------- one node


def test_a_key_within_its_window_answers_the_first_job(env) -> None:
    first = env.add("q", "a", "KEY", "k", "DEDUP", 5000)
    assert env.add("q", "b", "KEY", "k", "DEDUP", 5000) == first
    other = env.add("q", "c", "KEY", "other", "DEDUP", 5000)
    assert other != first and env.s("QLEN", "q") == 2
    env.wait(5001)
    third = env.add("q", "d", "KEY", "k", "DEDUP", 5000)
    assert third not in (first, other) and env.s("QLEN", "q") == 3
    assert info(env.core) | {"keys_held": 2} == {
        "keys_held": 2, "keys_waiting": 0, "dedup_hits": 1, "dedup_granted": 3, "dedup_unconfirmed": 0,
        "dedup_released": 0, "debounce_superseded": 0, "key_records_dropped": 0,
    }  # fmt: skip
    assert b"dedup_hits:1" in env.s("INFO", "keys")
    env.wait(6000)  # every hold ended: forgotten
    assert env.core.keys.holds == {} and info(env.core)["keys_held"] == 0
    env.check()


def test_dedup_active_holds_until_the_job_is_acknowledged(env) -> None:
    first = env.add("q", "a", "KEY", "k", "DEDUP", "ACTIVE")
    assert env.add("q", "b", "KEY", "k", "DEDUP", "active") == first
    env.s("GETJOB", "FROM", "q")
    assert env.s("ACKJOB", first) == 1
    second = env.add("q", "c", "KEY", "k", "DEDUP", "ACTIVE")
    assert second != first and info(env.core)["dedup_released"] == 1
    assert env.s("FASTACK", second) == 1
    assert env.add("q", "d", "KEY", "k", "DEDUP", "ACTIVE") not in (first, second)
    plain = env.add("q", "e", "KEY", "k2", "DEDUP", 10_000)
    assert env.s("FASTACK", plain) == 1  # an ACK ends an ACTIVE hold only: the window stays
    assert env.add("q", "f", "KEY", "k2", "DEDUP", 10_000) == plain


def test_an_addjob_that_fails_after_the_claim_releases_it(env) -> None:
    env.s("PAUSE", "q", "in")
    reply = env.s("ADDJOB", "q", "a", 0, "KEY", "k", "DEDUP", 5000)
    assert str(reply).startswith("PAUSED")
    env.s("PAUSE", "q", "none")
    job_id = env.add("q", "b", "KEY", "k", "DEDUP", 5000)  # not the ID of the job never made
    assert env.show(job_id)["body"] == b"b" and info(env.core)["dedup_released"] == 1


@pytest.mark.parametrize(
    "args, error",
    [
        (("DEDUP", 100), "ERR DEDUP needs KEY"),
        (("KEY", "k", "DEDUP", 0), "ERR DEDUP must be a number of ms > 0 or ACTIVE"),
        (("KEY", "k", "DEDUP", "soon"), "ERR DEDUP must be a number of ms > 0 or ACTIVE"),
        (("KEY", "k", "DEDUP"), "ERR syntax error"),
    ],
)
def test_bad_dedup_options(env, args, error) -> None:
    assert str(env.s("ADDJOB", "q", "a", 0, *args)).startswith(error)
    assert env.s("QLEN", "q") == 0


def test_the_aof_keeps_the_holds_and_a_rewrite_the_live_ones() -> None:
    src, src_clock, _ = make_core()
    src.aof.state = "on"
    s = Session(src)
    first = bytes(s("ADDJOB", "q", "a", 0, "KEY", "k", "DEDUP", 60_000))
    done = bytes(s("ADDJOB", "q", "b", 0, "KEY", "gone", "DEDUP", "ACTIVE"))
    s("FASTACK", done)
    blob = b"".join(e.record for e in src.out.effects if isinstance(e, AofAppend))
    assert blob.count(KEYHOLD) == 3  # two holds and a release
    assert len(src.snapshot().other) == 2  # the hold, and the release while the hold it ends would run
    core, clock, _ = make_core(seed=2)
    clock.ms = src_clock.ms + 1000
    core.read_clock()
    replay(core, blob + encode_record(KEYHOLD, b"\xc1"))  # a bad record is skipped alone
    assert info(core)["key_records_dropped"] == 1
    replayed = Session(core)
    assert bytes(replayed("ADDJOB", "q", "again", 0, "KEY", "k", "DEDUP", 60_000)) == first
    assert bytes(replayed("ADDJOB", "q", "again", 0, "KEY", "gone", "DEDUP", "ACTIVE")) != done


# ---------------------------------------------------------------- records


def test_a_key_record_round_trips_and_a_bad_one_does_not_decode() -> None:
    h = KeyHold(b"q", b"k", 5, "a" * 40, b"DI" + b"0" * 44 + b"SQ", 9, True)
    assert keyed.decode(keyed.encode(h)) == h and h.name == b"q\0k"
    assert h.newer(None) and not h.newer(h) and KeyHold(b"q", b"k", 6, "").newer(h)
    bad = [
        b"\xc1", b"\x90", keyed.encode(KeyHold(b"q", b"", 1, "a")), keyed.encode(KeyHold(b"q", b"k" * 1025, 1, "a")),
        keyed.encode(KeyHold(b"q", b"k", 1, "a", b"not an id")), keyed.encode(KeyHold(b"q", b"k", -1, "a")),
        msgpack.packb([b"q", b"k", 1, 7, b"", 0, False]),  # an origin not a string (a compiled KeyHold refuses one)
    ]  # fmt: skip
    for record in bad:
        with pytest.raises(DecodeError):
            keyed.decode(record)


def test_keyset_from_a_peer_newer_wins_and_a_bad_one_is_dropped(duo) -> None:
    job = b"DI" + b"1" * 44 + b"SQ"
    from_peer(duo, m.KeySet(keyed.encode(KeyHold(b"q", b"k", duo.core.now, PEER, job, duo.core.now + 60_000))))
    from_peer(duo, m.KeySet(keyed.encode(KeyHold(b"q", b"k", 1, PEER))))  # older: ignored
    from_peer(duo, m.KeySet(b"junk"))
    assert duo.core.keys.holds[b"q\0k"].job == job and info(duo.core)["key_records_dropped"] == 1
    assert duo.core.keys.sync_messages() == [m.KeySet(keyed.encode(duo.core.keys.holds[b"q\0k"]))]


# ---------------------------------------------------------------- a peer as the home


def key_homed_at(node_id: str, ids: list[str], queue: bytes = b"q") -> bytes:
    """A key whose home among `ids` is `node_id`."""
    return next(k for k in (b"k%d" % n for n in range(1000)) if ranked(queue + b"\0" + k, ids)[0] == node_id)


def reading_keys(duo: Any) -> Any:
    """`duo`, its PEER said it reads the key messages (FEATURE_KEYS)."""
    duo.core.membership.nodes[PEER].features = m.FEATURES
    return duo


def ask_peer(duo: Any, body: str = "a", *opts: Any) -> tuple[Session, bytes, m.KeyClaim]:
    """An ADDJOB ... KEY DEDUP 5000 on `duo` (its PEER reading the key
    messages) of a key homed at PEER: the session, the key, its KEYCLAIM."""
    reading_keys(duo)
    key = key_homed_at(PEER, duo.core.membership.up_ids())
    s = Session(duo.core)
    s("ADDJOB", "q", body, 0, "KEY", key, "DEDUP", 5000, *opts)
    [claim] = duo.sent()
    return s, key, claim


def test_a_claim_the_peer_home_answers(duo) -> None:
    s, key, claim = ask_peer(duo)
    assert isinstance(claim, m.KeyClaim) and claim.hold == 5000 and info(duo.core)["keys_waiting"] == 1
    holder = b"DI" + b"2" * 44 + b"SQ"
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", key, holder))
    assert s.pending() == [Status(holder)] and info(duo.core)["dedup_hits"] == 1 and duo.s("QLEN", "q") == 0
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", key, holder))  # the same answer again (a copy): ends nothing
    from_peer(duo, m.KeyClaimed(999, b"q", key, holder))  # nor an unknown ticket
    assert duo.sent() == []


def test_a_home_that_does_not_answer_lets_the_job_in_without_the_hold(duo) -> None:
    _, key, claim = ask_peer(duo, "a", "REPLICATE", 1)
    duo.wait(ASK_MS + 100)
    assert duo.s("QLEN", "q") == 1 and info(duo.core)["dedup_unconfirmed"] == 1
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", key, claim.job))  # granted late: the job exists, kept
    assert duo.sent() == []


def test_a_producer_gone_before_the_answer_releases_the_grant(duo) -> None:
    s, key, claim = ask_peer(duo)
    duo.core.disconnect(s.client.id)
    duo.wait(200)  # the cron forgets the ask, and remembers its claim
    assert info(duo.core)["keys_waiting"] == 0
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", key, claim.job))
    assert duo.sent() == [m.KeyDone(b"q", key, claim.job, True)]
    s, _, claim = ask_peer(duo, "b")  # gone before the cron ran: the same
    duo.core.disconnect(s.client.id)
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", key, claim.job))
    assert duo.sent() == [m.KeyDone(b"q", key, claim.job, True)]
    s, _, claim = ask_peer(duo, "c")  # an answer later than FORGET_MS: ends nothing
    duo.core.disconnect(s.client.id)
    duo.wait(FORGET_MS + 200)
    assert duo.core.keys.abandoned == {}
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", key, claim.job))
    assert duo.sent() == []


def test_the_home_decides_a_peer_s_claims_and_ends_holds_on_keydone(duo) -> None:
    reading_keys(duo)
    key = key_homed_at(duo.core.membership.my_id, duo.core.membership.up_ids())
    job = b"DI" + b"3" * 44 + b"SQ"
    from_peer(duo, m.KeyClaim(7, b"q", key, job, 60_000, True))
    standby, claimed = duo.sent()
    assert claimed == m.KeyClaimed(7, b"q", key, job) and isinstance(standby, m.KeySet)
    from_peer(duo, m.KeyClaim(8, b"q", key, b"DI" + b"4" * 44 + b"SQ", 5000))
    assert duo.sent()[0] == m.KeyClaimed(8, b"q", key, job)  # held: the holder
    from_peer(duo, m.KeyDone(b"q", key, b"DI" + b"4" * 44 + b"SQ"))  # not the holder: nothing
    assert duo.sent() == []
    from_peer(duo, m.KeyDone(b"q", key, job))
    assert isinstance(duo.sent()[0], m.KeySet) and not duo.core.keys.holds[b"q\0" + key].holds(duo.core.now)


# ---------------------------------------------------------------- three nodes


def formed() -> Mesh:
    return upgrade_formed(older=())


def add(mesh: Mesh, i: int, *args: Any) -> bytes:
    reply = mesh.call(i, "ADDJOB", *args)
    if isinstance(reply, int):
        mesh.wait_for(lambda: mesh.reply(reply) is not None, 5000)
        reply = mesh.reply(reply)
    assert isinstance(reply, Status), reply
    return bytes(reply)


def test_three_nodes_one_job_per_key_whichever_node_gets_the_addjob() -> None:
    mesh = formed()
    ids = [add(mesh, i, "q", f"from {i}", 0, "KEY", "order-1", "DEDUP", 60_000) for i in (0, 1, 2, 1, 0)]
    assert len(set(ids)) == 1
    assert sum(mesh.call(i, "QLEN", "q") for i in range(3)) == 1
    assert sum(info(mesh.core(i))["dedup_hits"] for i in range(3)) == 4


def test_the_standby_takes_over_when_the_home_goes_away() -> None:
    mesh = formed()
    ids = [mesh.my_id(i) for i in range(3)]
    key = key_homed_at(ids[0], ids)
    first = add(mesh, 1, "q", "a", 0, "KEY", key, "DEDUP", 60_000, "REPLICATE", 2)
    standby = ranked(b"q\0" + key, ids)[1]
    assert b"q\0" + key in mesh.core(ids.index(standby)).keys.holds
    mesh.kill(0)
    mesh.wait_for(lambda: all(not c.membership.nodes[ids[0]].link for c in mesh.cores[1:]), 5000)
    mesh.advance(3000)  # flagged failing: out of the key's order
    assert add(mesh, 2, "q", "b", 0, "KEY", key, "DEDUP", 60_000, "REPLICATE", 2) == first
    mesh.restart(0)  # no AOF: it learns the hold back when its links come up
    mesh.wait_for(lambda: b"q\0" + key in mesh.core(0).keys.holds, 10_000)
    mesh.advance(3000)
    assert add(mesh, 0, "q", "c", 0, "KEY", key, "DEDUP", 60_000, "REPLICATE", 2) == first


def test_a_replication_that_gives_up_releases_the_hold() -> None:
    mesh = formed()
    ids = [mesh.my_id(i) for i in range(3)]
    key = key_homed_at(ids[0], ids)
    mesh.lose_next(1, m.ReplJob)
    mesh.lose_next(2, m.ReplJob)
    client = mesh.call(0, "ADDJOB", "q", "a", 50, "KEY", key, "DEDUP", 60_000, "REPLICATE", 3, "RETRY", 5)
    mesh.wait_for(lambda: mesh.reply(client) is not None, 5000)
    assert str(mesh.reply(client)).startswith("NOREPL")
    assert info(mesh.core(0))["dedup_released"] == 1
    again = add(mesh, 1, "q", "b", 0, "KEY", key, "DEDUP", 60_000)
    assert mesh.call(1, "SHOW", again) is not None


def test_a_granted_claim_whose_addjob_fails_answers_the_error_and_releases(duo) -> None:
    s, key, claim = ask_peer(duo)
    duo.s("PAUSE", "q", "in")
    from_peer(duo, m.KeyClaimed(claim.ticket, b"q", key, claim.job))
    [reply] = s.pending()
    assert str(reply).startswith("PAUSED") and duo.sent() == [m.KeyDone(b"q", key, claim.job, True)]


def test_a_hold_replaced_before_it_ends_stays(duo) -> None:
    job = b"DI" + b"1" * 44 + b"SQ"
    now = duo.core.now
    from_peer(duo, m.KeySet(keyed.encode(KeyHold(b"q", b"k", now, PEER, job, now + 50))))
    from_peer(duo, m.KeySet(keyed.encode(KeyHold(b"q", b"k", now + 1, PEER, job, now + 100_000))))
    duo.wait(300)  # the first one's end comes: the record in force runs on
    assert duo.core.keys.holds[b"q\0k"].holds(duo.core.now)


def test_a_claim_waits_for_a_link_to_the_home_that_reads_it(duo) -> None:
    key = key_homed_at(PEER, duo.core.membership.up_ids())
    s = Session(duo.core)
    s("ADDJOB", "q", "a", 0, "KEY", key, "DEDUP", 5000)
    assert duo.sent() == [] and info(duo.core)["keys_waiting"] == 1  # its PONG said no FEATURE_KEYS (yet)
    duo.wait(200)
    assert duo.sent() == []
    reading_keys(duo)
    duo.wait(100)
    [claim] = duo.sent()
    assert isinstance(claim, m.KeyClaim)
    job_id = duo.add("q", "plain", "KEY", key, "REPLICATE", 1)  # KEY alone: no claim, and its ACK tells a home that reads it
    duo.core.membership.nodes[PEER].features = 0
    assert duo.s("FASTACK", job_id) == 1 and duo.sent() == []


def test_a_claim_waiting_when_this_node_becomes_the_home_is_decided_here(duo) -> None:
    key = key_homed_at(PEER, duo.core.membership.up_ids())
    s = Session(duo.core)
    s("ADDJOB", "q", "a", 0, "KEY", key, "DEDUP", 5000, "REPLICATE", 1)
    assert duo.sent() == []
    duo.core.membership.nodes[PEER].flags |= m.FAIL  # flagged: out of the key's order
    duo.core.membership.touch()
    duo.wait(100)
    [reply] = s.pending()
    assert isinstance(reply, Status) and duo.s("QLEN", "q") == 1 and info(duo.core)["dedup_granted"] == 1
