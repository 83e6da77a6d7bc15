"""Limits the cluster enforces (core/limits.py, store/limits.py, QCONFIG)
under the fake clock: the record and its rules, the option parser (fuzzed),
the command, the AOF records and the bus; one node handing out jobs within
a concurrency and a rate limit (ACK, NACK and a requeue free a slot,
WORKING keeps it, a blocked GETJOB wakes, NOHANG returns at once); then
whole nodes on the mesh: the leases lent by the queue's home never sum
above the limit, a dead node's lease lapses before it is lent again, and a
node that sees no majority lends nothing new."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import pytest
from hypothesis import given, strategies as st

from disque.cluster import messages as m
from disque.cluster.codec import decode_body, encode_body
from disque.core.effects import AofAppend
from disque.core.homes import home
from disque.core.limits import LEASE_MS, LEASE_SLACK, ORDER_WAIT_MS, SETTLE_MS, Budget
from disque.core.types import BLOCKED, NIL_ARRAY
from disque.store import limits as records
from disque.store.aof import AofCorrupt, check_record
from disque.store.limits import OptionError, QueueLimits, apply_options
from disque.store.records import DecodeError
from mesh import Mesh
from support import ClockedSession, Session, make_core, replay

QUIET = LEASE_MS + LEASE_SLACK  # a node lends no new slot this long after it starts


@pytest.fixture
def env() -> ClockedSession:
    return ClockedSession()


def run(s: ClockedSession, ms: int, step: int = 100) -> None:
    for _ in range(ms // step):
        s.clock.advance(step)
        s.core.tick()


def started(s: ClockedSession) -> None:
    run(s, QUIET)


def jobs(s: ClockedSession, n: int, queue: str = "q") -> list[bytes]:
    return [s("ADDJOB", queue, f"b{i}", 0, "REPLICATE", 1, "RETRY", 5) for i in range(n)]


def take(s: Any, queue: str = "q") -> list[bytes]:
    reply = s("GETJOB", "NOHANG", "COUNT", 100, "FROM", queue)
    return [] if reply is NIL_ARRAY else [job_id for _, job_id, _ in reply]


# ---------------------------------------------------------------- the record and its options


def test_options_parse_into_a_record():
    base = QueueLimits(b"q", 0, "", deleted=True)
    limits = apply_options(base, [b"RATE-LIMIT", b"300/s", b"concurrency", b"5", b"rate-limit-per-key", b"2/M",
                                  b"concurrency-per-key", b"1"])  # fmt: skip
    assert (limits.rate, limits.period, limits.concurrency) == (300, 1000, 5)
    assert (limits.key_rate, limits.key_period, limits.key_concurrency) == (2, 60_000, 1)
    assert not limits.deleted and limits.any() and records.broken_rule(limits) == ""
    assert dict(limits.options()) == {b"rate-limit": b"300/s", b"concurrency": 5, b"rate-limit-per-key": b"2/m",
                                      b"concurrency-per-key": 1, b"ordered": None}  # fmt: skip
    cleared = apply_options(limits, [b"rate-limit", b"none", b"concurrency", b"0", b"rate-limit-per-key", b"off",
                                     b"concurrency-per-key", b"none"])  # fmt: skip
    assert not cleared.any() and cleared.options()[0] == (b"rate-limit", None)
    assert apply_options(base, [b"rate-limit", b"7/h"]).period == 3_600_000


@pytest.mark.parametrize(
    "words, error",
    [
        ([], "takes <option> <value> pairs"), ([b"concurrency"], "takes <option> <value> pairs"),
        ([b"concurrency", b"-1"], "concurrency must be a number from 0"),
        ([b"concurrency", b"1000000001"], "concurrency must be a number from 0"),
        ([b"rate-limit", b"10"], "rate-limit must be <n>/s"), ([b"rate-limit", b"10/d"], "rate-limit must be <n>/s"),
        ([b"rate-limit", b"0/s"], "rate-limit must be <n>/s"), ([b"rate-limit", b"x/s"], "rate-limit must be <n>/s"),
        ([b"rate-limit-per-key", b"/s"], "rate-limit-per-key must be"),
        ([b"concurrency-per-key", b"a"], "concurrency-per-key must be"),
        ([b"speed", b"1"], "unknown option 'speed'"), ([b"ordered", b"1"], "ordered must be yes or no"),
        ([b"ordered", b"yes", b"concurrency-per-key", b"2"], "an ordered queue has one job per key out"),
    ],
)  # fmt: skip
def test_bad_options_are_named(words, error):
    with pytest.raises(OptionError, match=error):
        apply_options(QueueLimits(b"q", 0, ""), words)


@given(st.lists(st.one_of(
    st.sampled_from([b"rate-limit", b"concurrency", b"rate-limit-per-key", b"concurrency-per-key", b"none", b"0",
                     b"ordered", b"yes", b"no"]),
    st.from_regex(rb"\A[0-9]{1,11}/[smhd]?\Z"), st.binary(max_size=12),
), max_size=8))  # fmt: skip
def test_the_parser_takes_any_words_and_makes_only_good_records(words):
    try:
        limits = apply_options(QueueLimits(b"q", 1, "a"), words)
    except OptionError:
        return
    assert records.broken_rule(limits) == ""
    assert records.decode(records.encode(limits)) == limits


@pytest.mark.parametrize(
    "change, rule",
    [
        ({"queue": b""}, "queue name must be 1 to"), ({"queue": b"q" * 65537}, "queue name must be 1 to"),
        ({"concurrency": -1}, "a limit must be 0 to"), ({"key_rate": 10**10, "key_period": 1000}, "a limit must be 0 to"),
        ({"rate": 5}, "a rate's period"), ({"period": 1000}, "a rate's period"), ({"rate": 1, "period": 7}, "a rate's period"),
        ({"ordered": True, "key_concurrency": 3}, "an ordered queue has one job per key out"),
    ],
)  # fmt: skip
def test_one_rule_per_record_for_the_bus_and_the_aof(change, rule):
    bad = replace(QueueLimits(b"q", 5, "a"), **change)
    assert rule in records.broken_rule(bad)
    with pytest.raises(records.RuleError, match=rule):
        records.decode(records.encode(bad))


def test_ordered_is_one_job_per_key_out_and_a_record_without_it_is_as_before():
    limits = apply_options(QueueLimits(b"q", 1, "a"), [b"ORDERED", b"YES"])
    assert limits.ordered and limits.per_key() == 1 and limits.keyed() and limits.any()
    assert dict(limits.options())[b"ordered"] == b"yes" and records.decode(records.encode(limits)) == limits
    assert apply_options(limits, [b"concurrency-per-key", b"1"]).per_key() == 1
    off = apply_options(limits, [b"ordered", b"no"])
    assert not off.any() and not off.keyed()
    assert len(msgpack.unpackb(records.encode(off))) == 10  # read by a node from before `ordered`
    assert not replace(limits, deleted=True).keyed()


@pytest.mark.parametrize("data", ["text", b"\xc1", b"\x93\x01\x02\x03", b"\x9a" + b"\x01" * 10])
def test_a_malformed_record_is_a_decode_error(data):
    with pytest.raises(DecodeError):
        records.decode(data)


# ---------------------------------------------------------------- the command


def test_qconfig_set_get_del_list(env):
    assert env("QCONFIG", "q", "SET", "concurrency", 2, "rate-limit", "10/s") == b"OK"
    version = env.core.limits.defs[b"q"].version
    assert env("QCONFIG", "q", "SET", "concurrency", 2) == b"OK"  # no change: no new record
    assert env.core.limits.defs[b"q"].version == version
    show = dict(env("QCONFIG", "q", "GET"))
    assert show[b"rate-limit"] == b"10/s" and show[b"concurrency"] == 2 and show[b"out"] == 0
    assert env("QCONFIG", "LIST") == [b"q"]
    assert env("QCONFIG", "q", "DEL") == 1 and env("QCONFIG", "q", "DEL") == 0 and env("QCONFIG", "nope", "DEL") == 0
    assert env("QCONFIG", "LIST") == [] and env.core.limits.defs[b"q"].deleted
    assert dict(env("QCONFIG", "q", "GET"))[b"concurrency"] is None
    assert env("QCONFIG", "q", "SET", "concurrency", 3) == b"OK"  # over a tombstone: from nothing
    assert env.core.limits.defs[b"q"].concurrency == 3 and env.core.limits.defs[b"q"].rate == 0


@pytest.mark.parametrize(
    "args, error",
    [
        (("q",), "Syntax error, try QCONFIG"), (("q", "SET"), "Syntax error, try QCONFIG"),
        (("q", "GET", "x"), "Syntax error, try QCONFIG"), (("q", "FROB"), "Syntax error, try QCONFIG"),
        (("q", "SET", "concurrency", "x"), "concurrency must be a number"), (("q", "SET", "concurrency"), "pairs"),
    ],
)  # fmt: skip
def test_qconfig_errors(env, args, error):
    reply = env("QCONFIG", *args)
    assert isinstance(reply, Exception) and error in str(reply)
    assert env("QCONFIG", "LIST") == []


def test_aof_records_are_logged_replayed_and_rewritten(env):
    env.core.aof.state = "on"
    env("QCONFIG", "q", "SET", "concurrency", 2)
    env("QCONFIG", "gone", "SET", "rate-limit", "5/m")
    env("QCONFIG", "gone", "DEL")
    log = b"".join(e.record for e in env.core.out.effects if isinstance(e, AofAppend))
    assert log.count(b"QLIMITS\r\n") == 3
    rewrite = b"".join(env.core.snapshot().other)
    assert rewrite.count(b"QLIMITS\r\n") == 2
    for data in (log, rewrite, rewrite + log):
        core2, _, _ = make_core()
        replay(core2, data)
        assert Session(core2)("QCONFIG", "LIST") == [b"q"] and core2.limits.defs == env.core.limits.defs


def test_limits_records_are_checked_and_a_bad_one_is_skipped_alone(env):
    good = records.encode(QueueLimits(b"q", 5, "a" * 40, concurrency=1))
    assert check_record(0, [b"QLIMITS", b"x"]) is None  # well framed: replay skips it alone
    with pytest.raises(AofCorrupt):
        check_record(0, [b"QLIMITS"])
    rep = env.core.begin_load()
    rep.apply(0, [b"QLIMITS", b"x"])
    rep.apply(0, [b"QLIMITS", records.encode(QueueLimits(b"", 5, "a", concurrency=1))])
    rep.apply(0, [b"QLIMITS", good])
    rep.apply(0, [b"QLIMITS", records.encode(QueueLimits(b"q", 4, "a", concurrency=9))])  # older: ignored
    env.core.end_load()
    assert env.core.limits.names() == [b"q"] and env.core.limits.defs[b"q"].concurrency == 1
    assert dict(env.core.limits.info_fields())["limit_records_dropped"] == 2


def test_messages_cross_the_codec():
    header = m.Header("a" * 40, 7711, 0)
    for msg in (m.QSet(b"r"), m.LimitAsk(b"q", 3, 1, 2, 4, 99), m.LimitGrant(b"q", 2, 5, 7, 99),
                m.LimitAsk(b"q", 1, 0, 0, 0, 99, b"k", 5 * 10**15, b"DI" + b"a" * 44 + b"SQ"), m.LimitGrant(b"q", 0, 0, 0, 99, b"k", "b" * 40, True)):  # fmt: skip
        assert decode_body(encode_body(header, msg)) == (header, msg)
    older = {"v": 1, "t": "LIMITGRANT", "s": "a" * 40, "p": 7711, "f": 0, "m": 0, "q": b"q", "l": 1, "n": 0, "y": 0, "a": 9, "K": b"k"}
    assert decode_body(msgpack.packb(older))[1] == m.LimitGrant(b"q", 1, 0, 0, 9, b"k")  # a node of an older version
    with pytest.raises(DecodeError):
        decode_body(msgpack.packb(older | {"ht": "not a node"}))


def test_a_record_from_the_bus_is_kept_if_newer_and_a_bad_one_dropped(env):
    limits = env.core.limits
    limits.on_qset("b" * 40, m.QSet(b"junk"))
    limits.on_qset("b" * 40, m.QSet(records.encode(QueueLimits(b"q", 5, "b" * 40, concurrency=4))))
    limits.on_qset("b" * 40, m.QSet(records.encode(QueueLimits(b"q", 4, "b" * 40, concurrency=9))))
    assert limits.defs[b"q"].concurrency == 4 and limits.dropped == 1
    limits.on_grant("b" * 40, m.LimitGrant(b"other", 1, 1, 0, 5))  # a grant for no limit here: ignored
    limits.on_ask("b" * 40, m.LimitAsk(b"other", 1, 0, 0, 0, 5))  # an ask for a queue not limited here: no answer
    assert b"other" not in limits.budgets and (b"other", b"") not in limits.lenders


# ---------------------------------------------------------------- one node


def test_concurrency_is_held_and_each_answer_frees_its_slot(env):
    env("QCONFIG", "q", "SET", "concurrency", 2)
    ids = jobs(env, 6)
    assert take(env) == []  # a node lends nothing new in its first lease time
    started(env)
    got = take(env)
    assert len(got) == 2 and take(env) == []  # NOHANG returns at once, with nothing past the limit
    assert env("WORKING", got[0]) > 0 and take(env) == []  # WORKING keeps the slot
    assert env("ACKJOB", got[0]) == 1
    third = take(env)
    assert len(third) == 1  # ACK freed one at once
    assert env("NACK", third[0]) == 1
    again = take(env)
    assert again == [third[0]]  # NACK freed it, and the job came back
    assert env("NACK", again[0], "DELAY", 100) == 1 and len(take(env)) == 1  # a NACK ... DELAY frees it too
    out = dict(env("QCONFIG", "q", "GET"))
    assert out[b"out"] == 2 and out[b"lease"] == 2 and out[b"handed"] == 5
    run(env, 6000)  # RETRY 5: the jobs out are queued again, their slots free
    assert dict(env("QCONFIG", "q", "GET"))[b"out"] == 0 and len(take(env)) == 2
    assert set(ids) >= set(env.core.limits.budgets[b"q"].out)


def test_a_blocked_getjob_wakes_when_a_slot_frees(env):
    env("QCONFIG", "q", "SET", "concurrency", 1)
    started(env)
    jobs(env, 2)
    [first] = take(env)
    waiter = Session(env.core)
    assert waiter("GETJOB", "FROM", "q") is BLOCKED  # held back by the limit
    assert dict(env("QCONFIG", "q", "GET"))[b"waiting"] == 1
    env.clock.advance(40)
    env("PING")
    [row] = env.core.limits.figures()
    assert row == {"queue": "q", "concurrency": 1, "rate_per_second": 0, "out": 1, "lease": 1, "handed": 1, "waiting": 1,
                   "waited_seconds": 0.04}  # fmt: skip
    env("ACKJOB", first)
    reply = waiter.pending()
    assert len(reply) == 1 and reply[0][0][1] != first
    info = dict(env.core.limits.info_fields())
    assert info["limit_waits"] == 1 and info["limit_waited_ms"] == 40 and info["limited_queues_waiting"] == 0
    env("QCONFIG", "q", "SET", "rate-limit", "30/m")
    assert env.core.limits.figures()[0]["rate_per_second"] == 0.5 and env.core.limits.figures()[0]["waited_seconds"] == 0.04


def test_a_rate_limit_hands_out_no_more_than_its_rate(env):
    env("QCONFIG", "q", "SET", "rate-limit", "100/s")
    started(env)
    jobs(env, 400)
    waiters = [Session(env.core) for _ in range(10)]
    for w in waiters:
        assert w("GETJOB", "FROM", "q") is BLOCKED
    handed: list[int] = []  # when each job went out
    for _ in range(300):  # 3 s in 10 ms steps: a consumer that got a job acknowledges it and waits again
        env.clock.advance(10)
        env.core.tick()
        for w in waiters:
            for reply in w.pending():
                handed.append(env.clock.ms)
                w("ACKJOB", reply[0][1])
                assert w("GETJOB", "FROM", "q") is BLOCKED
    windows = [sum(1 for t in handed if start <= t < start + 1000) for start in range(handed[0], handed[-1] - 999, 10)]
    assert 290 <= len(handed) <= 310 and max(windows) <= 110


def test_a_consumer_takes_a_token_that_came_while_others_wait(env):
    env("QCONFIG", "q", "SET", "rate-limit", "10/s")
    started(env)
    jobs(env, 3)
    waiter = Session(env.core)
    assert waiter("GETJOB", "FROM", "q") is BLOCKED  # the bucket starts empty: the next token in 100 ms
    env.clock.advance(100)  # (before the node's tick serves the waiter)
    assert len(take(env)) == 1 and waiter.pending() == []
    assert env.core.limits.throttled == {b"q": None}


def test_a_limit_removed_serves_the_waiters_at_once(env):
    env("QCONFIG", "q", "SET", "rate-limit", "1/h")
    started(env)
    jobs(env, 3)
    assert len(take(env)) == 0  # the home's bucket starts empty
    waiter = Session(env.core)
    assert waiter("GETJOB", "FROM", "q") is BLOCKED
    env("QCONFIG", "q", "SET", "rate-limit", "none")
    assert len(waiter.pending()) == 1 and len(take(env)) == 2


# ---------------------------------------------------------------- a cluster


@pytest.fixture
def mesh() -> Mesh:
    mesh = Mesh(3)
    mesh.meet(0, 1)
    mesh.meet(0, 2)
    mesh.advance(3500)  # joined, past every node's quiet start
    return mesh


class Consumers:
    """`per_node` consumers blocked on `queue` on each live node of the
    mesh; each holds a job `hold_ms`, acknowledges it and asks again.  The
    history is theirs (when each job was seen and acknowledged), not the
    nodes' counters."""

    def __init__(self, mesh: Mesh, queue: str, per_node: int, hold_ms: int, nodes: tuple[int, ...] = (0, 1, 2)) -> None:
        self.mesh, self.queue, self.hold_ms = mesh, queue, hold_ms
        self.waiting: dict[int, int] = {}  # client id -> node
        self.out: dict[bytes, tuple[int, int]] = {}  # job ID -> (node, seen at)
        self.done: list[tuple[int, int, bytes]] = []  # (seen, acknowledged, job ID)
        self.served: dict[bytes, int] = {}  # job ID -> the node that handed it out (last)
        self.most_out = 0
        for i in nodes:
            for _ in range(per_node):
                self.wait(i)

    def wait(self, i: int) -> None:
        reply = self.mesh.call(i, "GETJOB", "FROM", self.queue)
        if isinstance(reply, list):  # a job at once
            self.got(i, reply)
        else:
            self.waiting[reply] = i

    def got(self, i: int, reply: list[Any]) -> None:
        for _, job_id, _ in reply:
            self.out[job_id] = (i, self.mesh.clock.ms)
            self.served[job_id] = i
        self.most_out = max(self.most_out, len(self.out))

    def run(self, ms: int, step: int = 10) -> None:
        mesh = self.mesh
        for _ in range(ms // step):
            mesh.advance(step)
            now = mesh.clock.ms
            for job_id, (i, seen) in list(self.out.items()):
                if now - seen >= self.hold_ms and mesh.cores[i] is not None:
                    assert mesh.call(i, "ACKJOB", job_id) == 1
                    del self.out[job_id]
                    self.done.append((seen, now, job_id))
                    self.wait(i)
            for client, i in list(self.waiting.items()):
                reply = mesh.reply(client)
                if reply is not None:
                    del self.waiting[client]
                    self.got(i, reply)


def add_jobs(mesh: Mesh, n: int, queue: str = "q", nodes: tuple[int, ...] = (0, 1, 2)) -> None:
    for k in range(n):
        mesh.call(nodes[k % len(nodes)], "ADDJOB", queue, f"b{k}", 0, "REPLICATE", 1, "RETRY", 60)


def test_a_record_reaches_every_node_and_one_that_links_up_later():
    mesh = Mesh(3)
    mesh.meet(0, 1)
    mesh.advance(3500)
    assert mesh.call(1, "QCONFIG", "q", "SET", "concurrency", 4) == b"OK"
    mesh.call(0, "QCONFIG", "gone", "SET", "rate-limit", "3/s")
    mesh.call(0, "QCONFIG", "gone", "DEL")
    assert all(mesh.core(i).limits.names() == [b"q"] for i in (0, 1))
    mesh.meet(0, 2)
    mesh.advance(1000)
    assert mesh.core(2).limits.defs == mesh.core(0).limits.defs and mesh.core(2).limits.defs[b"gone"].deleted


def test_concurrency_holds_across_the_cluster(mesh):
    mesh.call(0, "QCONFIG", "q", "SET", "concurrency", 3)
    add_jobs(mesh, 60)
    consumers = Consumers(mesh, "q", per_node=4, hold_ms=50)
    consumers.run(5000)  # (the nodes just joined: the home lends nothing new for its quiet time)
    assert consumers.most_out == 3 and len(consumers.done) == 60
    assert sum(1 for i in range(3) if mesh.core(i).limits.budgets[b"q"].handed) >= 2  # the share went where the jobs were
    assert [i for i in range(3) if (b"q", b"") in mesh.core(i).limits.lenders] == [home_of(mesh, b"q")]


def home_of(mesh: Mesh, queue: bytes) -> int:
    ids = [mesh.my_id(i) for i in range(3)]
    return ids.index(home(queue, ids))


def test_a_rate_holds_across_the_cluster(mesh):
    mesh.call(0, "QCONFIG", "q", "SET", "rate-limit", "50/s")
    add_jobs(mesh, 400)
    consumers = Consumers(mesh, "q", per_node=5, hold_ms=0)
    consumers.run(7000)  # (the home lends nothing for its quiet time after the join)
    seen = sorted(t for t, _, _ in consumers.done)
    windows = [sum(1 for t in seen if s <= t < s + 1000) for s in range(seen[0], seen[-1] - 999, 10)]
    assert 190 <= len(seen) and 47.5 <= len(seen) * 1000 / (seen[-1] - seen[0]) <= 52.5 and max(windows) <= 55


def test_a_dead_nodes_lease_is_lent_again_only_once_it_lapsed(mesh):
    mesh.call(0, "QCONFIG", "q", "SET", "concurrency", 2)
    mesh.advance(3000)  # past the home's quiet time
    other = next(i for i in range(3) if i != home_of(mesh, b"q"))
    rest = tuple(i for i in range(3) if i != other)
    add_jobs(mesh, 20, nodes=(other,))
    holder = Consumers(mesh, "q", per_node=2, hold_ms=100_000, nodes=(other,))  # holds its jobs for good
    holder.run(500)
    assert len(holder.out) == 2
    add_jobs(mesh, 20, nodes=rest)
    late = Consumers(mesh, "q", per_node=2, hold_ms=100_000, nodes=rest)
    late.run(1000)
    assert late.out == {}  # the whole budget is out on `other`
    mesh.kill(other)
    late.run(LEASE_MS)  # its lease has not lapsed at the home yet
    assert late.out == {}
    late.run(3 * LEASE_MS)
    assert len(late.out) == 2  # lapsed: lent again (the dead node's jobs come back by their RETRY)


def test_a_node_that_sees_no_majority_lends_nothing_new(mesh):
    mesh.call(0, "QCONFIG", "q", "SET", "concurrency", 5)
    mesh.advance(3000)
    lone = home_of(mesh, b"q")
    for i in range(3):
        if i != lone:
            mesh.kill(i)
    mesh.advance(5000)  # the others are flagged failing: it sees one node of three
    assert mesh.core(lone).membership.up_ids() == [mesh.my_id(lone)]
    add_jobs(mesh, 5, nodes=(lone,))
    assert take(Session(mesh.core(lone))) == []
    mesh.advance(3 * LEASE_MS)
    assert take(Session(mesh.core(lone))) == []
    mesh.restart((lone + 1) % 3)
    mesh.meet(lone, (lone + 1) % 3)
    mesh.advance(5000)  # a majority again, and the quiet time of a new view over
    assert len(take(Session(mesh.core(lone)))) == 5


# ---------------------------------------------------------------- per key


def keyed(s: Any, keys: list[str], queue: str = "q") -> list[bytes]:
    return [s("ADDJOB", queue, f"{key}{i}", 0, "REPLICATE", 1, "RETRY", 60, *(("KEY", key) if key else ()))
            for i, key in enumerate(keys)]  # fmt: skip


def test_concurrency_per_key_passes_over_the_jobs_of_a_busy_key(env):
    env("QCONFIG", "q", "SET", "concurrency-per-key", 1)
    started(env)
    a1, a2, b1, free, b2 = keyed(env, ["a", "a", "b", "", "b"])
    assert take(env) == [free, a1, b1]  # in turns (the plain jobs first); a2 and b2 wait for their key's slot
    assert take(env) == []
    env("ACKJOB", a1)
    assert take(env) == [a2]
    waiter = Session(env.core)
    assert waiter("GETJOB", "FROM", "q") is BLOCKED  # b2 waits for b1
    env("NACK", b1)  # b1 goes back to the queue, ahead of b2: it is served first
    assert waiter.pending()[0][0][1] == b1
    info = dict(env.core.limits.info_fields())
    assert info["limited_keys"] == 2 and info["limit_budgets_lent"] == 2  # each key's (the queue has no limit of its own)


def test_a_rate_per_key_lets_each_key_go_at_its_rate(env):
    env("QCONFIG", "q", "SET", "rate-limit-per-key", "5/s")
    started(env)
    keyed(env, ["a", "b"] * 40)
    waiters = [Session(env.core) for _ in range(4)]
    for w in waiters:
        assert w("GETJOB", "FROM", "q") is BLOCKED
    got: dict[bytes, int] = {b"a": 0, b"b": 0}
    for _ in range(300):  # 3 s
        env.clock.advance(10)
        env.core.tick()
        for w in waiters:
            for reply in w.pending():
                got[reply[0][2][:1]] += 1
                w("ACKJOB", reply[0][1])
                assert w("GETJOB", "FROM", "q") is BLOCKED
    assert 13 <= got[b"a"] <= 16 and 13 <= got[b"b"] <= 16  # 5 a second each (and the first token)


def test_the_shares_of_idle_keys_are_forgotten(env):
    env("QCONFIG", "q", "SET", "concurrency-per-key", 2, "concurrency", 10)
    started(env)
    [a] = keyed(env, ["a"])
    assert take(env) == [a]
    limits = env.core.limits
    assert (b"q", b"a") in limits.keyed and (b"q", b"a") in limits.lenders
    env("ACKJOB", a)
    run(env, 2 * QUIET)
    assert (b"q", b"a") not in limits.keyed and (b"q", b"a") not in limits.lenders
    keyed(env, ["c"])
    take(env)
    env("QCONFIG", "q", "SET", "concurrency-per-key", "none")  # the keys' shares go with the limit
    assert limits.keyed == {} and all(not key for _, key in limits.lenders)
    assert limits.budgets[b"q"] is not None


def test_a_job_on_disk_waits_to_be_read_back_before_it_is_looked_at():
    # keyed jobs stay in memory (core/read_behind.py); a queue with per-key limits may hold plain ones on disk
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=1)
    s = Session(core)
    s("QCONFIG", "q", "SET", "concurrency-per-key", 1)
    for _ in range(QUIET // 100):
        clock.advance(100)
        core.tick()
    ids = keyed(s, [""] * 6)
    assert core.queues.get(b"q").has_tail()  # the newest are on disk
    got = take(s)
    assert 0 < len(got) < len(ids) and got == ids[: len(got)]  # those in memory, in order


def test_concurrency_per_key_holds_across_the_cluster(mesh):
    mesh.call(0, "QCONFIG", "q", "SET", "concurrency-per-key", 1)
    mesh.advance(3000)
    keys = {}
    for k in range(60):
        job_id = mesh.call(k % 3, "ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 60, "KEY", f"k{k % 4}")
        keys[job_id] = k % 4
    consumers = Consumers(mesh, "q", per_node=3, hold_ms=50)
    consumers.run(6000)
    assert len(consumers.done) == 60
    for key in range(4):  # from the consumers' history: one job of a key out at a time
        spans = sorted((seen, acked) for seen, acked, job_id in consumers.done if keys[job_id] == key)
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))
    assert consumers.most_out > 1  # the keys went in parallel


# ---------------------------------------------------------------- ordered keys


def test_an_ordered_queue_serves_each_keys_oldest_one_at_a_time(env):
    env("QCONFIG", "q", "SET", "ordered", "yes")
    started(env)
    many = keyed(env, ["a"] * 80)  # more of one key than KEY_SCAN, ahead of the others
    b1, b2, free = keyed(env, ["b", "b", ""])
    assert take(env) == [free, many[0], b1]  # one per key; a busy key holds back no other
    assert take(env) == []
    env("ACKJOB", many[0])
    env("ACKJOB", b1)
    assert take(env) == [many[1], b2]
    assert env("ACKJOB", b2, free) == 2
    env("NACK", many[1])  # handed back: it is next again, before many[2]
    assert take(env) == [many[1]]
    run(env, 62_000, step=1000)  # its RETRY (60 s) queues it again: the key's next is that one again
    assert take(env) == [many[1]]
    assert dict(env("QCONFIG", "q", "GET"))[b"ordered"] == b"yes"


def test_ordered_keys_go_one_at_a_time_across_the_cluster_and_in_parallel(mesh):
    mesh.call(1, "QCONFIG", "q", "SET", "ordered", "yes")
    mesh.advance(3000)
    order: dict[int, list[bytes]] = {key: [] for key in range(6)}
    for k in range(90):
        key = k % 6
        order[key].append(mesh.call(key % 3, "ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 60, "KEY", f"k{key}"))
    consumers = Consumers(mesh, "q", per_node=3, hold_ms=40)
    consumers.run(12_000)
    assert len(consumers.done) == 90
    for ids in order.values():  # from the consumers' history: one job of a key out at a time
        spans = sorted((seen, acked, job_id) for seen, acked, job_id in consumers.done if job_id in ids)
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))
        assert [job_id for _, _, job_id in spans] == ids  # in creation order (a key's jobs move between nodes whole)
    assert consumers.most_out > 1  # the keys went in parallel


def ordered_mesh(mesh: Mesh) -> None:
    mesh.call(0, "QCONFIG", "q", "SET", "ordered", "yes")
    mesh.advance(3000)


def add_keyed(mesh: Mesh, nodes: list[int], key: str = "k") -> list[bytes]:
    """A key's jobs added one after the other through `nodes` (10 ms apart)."""
    ids = []
    for i in nodes:
        ids.append(mesh.call(i, "ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 60, "KEY", key))
        mesh.advance(10)
    return ids


def in_order(consumers: Consumers, ids: list[bytes]) -> bool:
    """From the consumers' history: the jobs went one at a time, in creation order."""
    spans = sorted((seen, acked, job_id) for seen, acked, job_id in consumers.done if job_id in ids)
    return all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:])) and [job_id for *_, job_id in spans] == ids


def test_a_keys_jobs_added_through_several_nodes_go_in_creation_order(mesh):
    ordered_mesh(mesh)
    order = {key: add_keyed(mesh, [(n + k) % 3 for n in range(12)], f"k{k}") for k, key in enumerate(("a", "b", "c"))}
    consumers = Consumers(mesh, "q", per_node=2, hold_ms=30)
    consumers.run(15_000)
    assert len(consumers.done) == 36 and all(in_order(consumers, ids) for ids in order.values())
    assert consumers.most_out > 1  # the keys went in parallel


def test_the_node_holding_a_keys_oldest_hands_it_to_the_consumers_of_another(mesh):
    ordered_mesh(mesh)
    ids = add_keyed(mesh, [0, 1, 2, 0, 1, 2])
    consumers = Consumers(mesh, "q", per_node=1, hold_ms=30, nodes=(2,))  # consumers on one node only
    consumers.run(5000)
    assert len(consumers.done) == 6 and in_order(consumers, ids)
    assert sum(mesh.core(i).federation.jobs_exported for i in (0, 1)) >= 4  # the others handed theirs over


def test_a_fresh_job_waits_for_older_ones_elsewhere_to_be_told(mesh):
    ordered_mesh(mesh)
    old, new = add_keyed(mesh, [0, 1])  # node 0 has told no one of `old` yet
    consumers = Consumers(mesh, "q", per_node=1, hold_ms=30, nodes=(1,))
    consumers.run(SETTLE_MS // 2)
    assert consumers.out == {} and not consumers.done  # `new` is too young to go
    consumers.run(3000)
    assert in_order(consumers, [old, new])


def test_an_older_job_a_node_will_not_hand_over_holds_a_key_back_for_a_bounded_time(mesh):
    ordered_mesh(mesh)
    old, new = add_keyed(mesh, [0, 1])
    mesh.call(0, "PAUSE", "q", "out")  # node 0 keeps its job: it hands out none of the queue
    consumers = Consumers(mesh, "q", per_node=1, hold_ms=30, nodes=(1,))
    consumers.run(ORDER_WAIT_MS - 1000)
    assert not consumers.done  # held back for the older job on node 0
    consumers.run(2000)
    assert [job_id for *_, job_id in consumers.done] == [new]  # then out of order: documented
    info = dict(mesh.core(home_of(mesh, b"q\0k")).limits.info_fields())
    assert info["ordered_key_waits"] == 1 and info["ordered_key_breaks"] == 1  # counted at the key's home


def test_the_oldest_job_of_a_node_gone_holds_nothing_back(mesh):
    ordered_mesh(mesh)
    owner = home_of(mesh, b"q\0k")
    lost, holder = [i for i in range(3) if i != owner][:2], owner
    old, new = add_keyed(mesh, [lost[0], holder])
    mesh.advance(SETTLE_MS)
    mesh.kill(lost[0])
    consumers = Consumers(mesh, "q", per_node=1, hold_ms=30, nodes=(holder,))
    consumers.run(ORDER_WAIT_MS - 1000)  # flagged failing, then the home's quiet time: sooner than the fallback
    assert [job_id for *_, job_id in consumers.done] == [new]  # (the old one comes back by its RETRY)


def test_a_keys_oldest_is_told_only_to_a_home_that_reads_it(mesh):
    owner = home_of(mesh, b"q\0k")
    other = (owner + 1) % 3
    mesh.make_older(owner, ())
    for i in (owner, other):
        mesh.call(i, "QCONFIG", "q", "SET", "ordered", "yes")
    mesh.advance(3000)
    add_keyed(mesh, [other])
    mesh.advance(1000)  # no consumer at `other`: only its oldest would be told
    assert (b"q", b"k") in mesh.core(other).limits.keyed and (b"q", b"k") not in mesh.core(owner).limits.lenders


def test_a_keys_jobs_go_to_no_node_without_a_link(mesh):
    ordered_mesh(mesh)
    (job_id,) = add_keyed(mesh, [0])
    federation = mesh.core(0).federation
    for name, key in ((b"none", b"k"), (b"q", b"other"), (b"q", b"k")):
        federation.hand_key(name, key, "f" * 40)  # no such queue, key, or node linked
    assert federation.jobs_exported == 0 and mesh.call(0, "QLEN", "q") == 1


def test_a_keys_oldest_that_changes_while_its_report_is_lost_is_told_again(mesh):
    ordered_mesh(mesh)
    owner = home_of(mesh, b"q\0k")
    other = (owner + 1) % 3
    mesh.lose_next(owner, m.LimitAsk)
    first, second = add_keyed(mesh, [other, other])
    mesh.wait_for(lambda: mesh.core(other).limits.keyed.get((b"q", b"k"), Budget()).asked, 200)  # told, and lost
    assert mesh.call(other, "ACKJOB", first) == 1  # its oldest changes while the report is unanswered
    mesh.advance(1000)
    assert mesh.core(owner).limits.lenders[b"q", b"k"].firsts[mesh.my_id(other)][1] == second
