"""Recurring jobs (core/schedules.py, store/schedule.py, SCHEDULE) under the
fake clock: the command and its errors, one job per tick with an ID made
from (schedule, tick), CRON with a zone, pause, the catch-up rule after
downtime and clock jumps, the AOF records and their replay; then whole
nodes on the mesh: one firer per tick, the next in line when it is down,
a tick fired twice collapsing into one job, schedules learned on link-up."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, strategies as st

from disque.cluster import messages as m
from disque.cluster.codec import FrameDecoder, FrameError, decode_body, encode_body, encode_frame
from disque.core.effects import AofAppend
from disque.core.types import BLOCKED
from disque.core.schedules import Schedules, _turn, ticks_after, ticks_back
from disque.store import schedule as records
from disque.store.aof import AofCorrupt, check_record
from disque.store.ids import tick_job_id, valid_id
from disque.store.records import DecodeError
from disque.store.schedule import Schedule
from mesh import Mesh
from support import ClockedSession, Session, make_core, replay

GRACE = 2000


@pytest.fixture
def env() -> ClockedSession:
    return ClockedSession()


def run(s: ClockedSession, ms: int) -> None:
    """Time passes in the 100 ms steps of the node's cron."""
    for _ in range(ms // 100):
        s.clock.advance(100)
        s.core.tick()


def tick_jobs(core: Any, queue: bytes = b"q") -> list[Any]:
    return sorted((j for j in core.jobs.values() if j.queue == queue), key=lambda j: j.ctime)


def started(s: ClockedSession) -> None:
    run(s, GRACE)  # a node fires nothing in its first grace


# ---------------------------------------------------------------- the command


@pytest.mark.parametrize(
    "args, error",
    [
        (("ADD", "s", "q", "b", "EVERY", "x"), "EVERY must be a number of ms, at least 100"),
        (("ADD", "s", "q", "b", "EVERY", "99"), "EVERY must be a number of ms, at least 100"),
        (("ADD", "s", "q", "b", "EVERY", "1000", "TZ", "UTC"), "TZ goes with CRON"),
        (("ADD", "s", "q", "b", "HOURLY", "1"), "syntax error"),
        (("ADD", "s", "q", "b", "CRON", "61 * * * *"), 'invalid CRON expression: the minute field "61" must be 0-59;'),
        (("ADD", "s", "q", "b", "CRON", "0 25 * * *"), 'the hour field "25" must be 0-23; 5 fields: minute hour'),
        (("ADD", "s", "q", "b", "CRON", "0 0 31 2 *"), 'the day field "31" must be 1-31, a day the month has'),
        (("ADD", "s", "q", "b", "CRON", "0 0 1 JUNE *"), 'the month field "JUNE" must be 1-12 or JAN-DEC'),
        (("ADD", "s", "q", "b", "CRON", "0 0 * * 8"), 'the weekday field "8" must be 0-7 or SUN-SAT'),
        (("ADD", "s", "q", "b", "CRON", "* * * * * *"), "invalid CRON expression: 6 fields, 5 fields: minute"),
        (("ADD", "s", "q", "b", "CRON", b"\xff * * * *"), "invalid CRON expression: not text;"),
        (("ADD", "s", "q", "b", "CRON", "* * * * *", "TZ", "Mars/Olympus"), "TZ must be a zone name"),
        (("ADD", "s", "q", "b", "CRON", "* * * * *", "TZ", "../etc"), "TZ must be a zone name"),
        (("ADD", "s", "q", "b", "EVERY", "1000", "DEADLETTER", "d"), "DEADLETTER needs MAXATTEMPTS"),
        (("ADD", "s", "q", "b", "EVERY", "1000", "RETRY", "0"), "With RETRY set to 0"),
        (("ADD", "s", "q", "b", "EVERY", "1000", "TTL", "5", "DELAY", "5"), "DELAY is greater than TTL"),
        (("ADD", "s", "q", "b", "EVERY", "1000", "BOGUS"), "syntax error"),
        (("ADD", "s", "q", "b", "EVERY", "1000", "REPLICATE", "2", "ZONES", "3"), "ZONES can't be greater"),
        (("ADD", "s", "q", "b", "EVERY", "1000", "PRIORITY", "10"), "PRIORITY must be between 0 and 9"),
        (("ADD", "s", "q", "b", "EVERY"), "Syntax error, try SCHEDULE"),
        (("SHOW",), "Syntax error, try SCHEDULE"),
        (("FROB", "s"), "Syntax error, try SCHEDULE"),
        (("PAUSE", "nope"), "no such schedule"),
    ],
)
def test_schedule_errors(env, args, error):
    reply = env("SCHEDULE", *args)
    assert isinstance(reply, Exception) and error in str(reply)
    assert env("SCHEDULE", "LIST") == []


def test_add_list_show_pause_del(env):
    assert env("SCHEDULE", "ADD", "b", "q", "x", "EVERY", 5000, "REPLICATE", 1, "TTL", 60, "RETRY", 0,
               "DELAY", 1, "MAXLEN", 9, "MAXATTEMPTS", 3, "DEADLETTER", "dl", "ASYNC") == b"OK"  # fmt: skip
    assert env("SCHEDULE", "ADD", "a", "q", "y", "CRON", "0 3 * * *", "TZ", "Europe/Paris") == b"OK"
    assert env("SCHEDULE", "LIST") == [b"a", b"b"]
    show = dict(env("SCHEDULE", "SHOW", "b"))
    assert show[b"options"] == [b"REPLICATE", b"1", b"TTL", b"60", b"RETRY", b"0", b"DELAY", b"1", b"MAXLEN", b"9",
                                b"MAXATTEMPTS", b"3", b"DEADLETTER", b"dl"]  # fmt: skip
    assert show[b"every"] == 5000 and show[b"cron"] is None and show[b"last-tick"] is None
    assert show[b"next-tick"] % 5000 == 0 and 0 < show[b"next-tick"] - env.core.now <= 5000
    a = dict(env("SCHEDULE", "SHOW", "a"))
    assert a[b"cron"] == b"0 3 * * *" and a[b"tz"] == b"Europe/Paris" and a[b"options"] == []
    assert env("SCHEDULE", "PAUSE", "a") == b"OK" and dict(env("SCHEDULE", "SHOW", "a"))[b"paused"] == 1
    assert env("SCHEDULE", "PAUSE", "a") == b"OK"  # already paused: no change
    version = env.core.schedules.defs[b"a"].version
    assert env.core.schedules.defs[b"a"].version == version
    assert env("SCHEDULE", "RESUME", "a") == b"OK" and dict(env("SCHEDULE", "SHOW", "a"))[b"paused"] == 0
    assert env("SCHEDULE", "DEL", "a") == 1 and env("SCHEDULE", "DEL", "a") == 0
    assert env("SCHEDULE", "SHOW", "a") is None and env("SCHEDULE", "LIST") == [b"b"]
    assert env.core.schedules.defs[b"a"].deleted  # a tombstone: a node with the old record cannot bring it back


def test_adding_the_same_definition_again_changes_nothing(env):
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    env("SCHEDULE", "PAUSE", "s")
    before = env.core.schedules.defs[b"s"]
    env.clock.advance(5000)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)  # a worker starting again
    assert env.core.schedules.defs[b"s"] is before
    env("SCHEDULE", "ADD", "s", "q", "y", "EVERY", 1000)  # a new body: a new version, still paused
    after = env.core.schedules.defs[b"s"]
    assert after.body == b"y" and after.paused and after.version > before.version


def test_a_change_on_a_node_whose_clock_is_behind_still_wins(env):
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    env.core.schedules.on_sched_set("peer", m.SchedSet(records.encode(
        Schedule(b"s", env.core.now + 60_000, "f" * 40, b"q", b"x", 2000))))  # fmt: skip
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 3000)
    assert env.core.schedules.defs[b"s"].every == 3000
    assert env.core.schedules.defs[b"s"].version == env.core.now + 60_001


# ---------------------------------------------------------------- ticks on one node


def test_every_tick_becomes_one_job_whose_id_is_the_ticks(env):
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "hello", "EVERY", 1000, "TTL", 600, "MAXATTEMPTS", 2)
    t0 = env.core.now
    run(env, 5000)
    jobs = tick_jobs(env.core)
    ticks = list(range((t0 // 1000 + 1) * 1000, env.core.now + 1, 1000))
    assert [j.id for j in jobs] == [tick_job_id(b"s", t, 600, 1) for t in ticks] and len(ticks) == 5
    assert all(valid_id(j.id) and j.body == b"hello" and j.max_attempts == 2 for j in jobs)
    assert all(j.etime - env.core.now // 1000 <= 600 for j in jobs)
    show = dict(env("SCHEDULE", "SHOW", "s"))
    assert show[b"last-tick"] == ticks[-1] and show[b"last-node"] == env.core.membership.my_id
    info = dict(env.core.schedules.info_fields())
    assert info["schedule_ticks_fired"] == 5 and info["schedule_ticks_late"] == 0
    assert b"schedule_ticks_fired:5" in env("INFO", "schedules")


def test_a_ticks_job_takes_the_schedules_priority_and_zones(env):
    env("SCHEDULE", "ADD", "s", "q", "hello", "EVERY", 1000, "REPLICATE", 1, "PRIORITY", 8, "ZONES", 1)
    assert dict(env("SCHEDULE", "SHOW", "s"))[b"options"] == [b"REPLICATE", b"1", b"ZONES", b"1", b"PRIORITY", b"8"]
    started(env)
    run(env, 1000)
    assert [j.priority for j in tick_jobs(env.core)] == [8, 8, 8]


def test_a_tick_id_depends_on_schedule_tick_and_guarantee_only():
    a = tick_job_id(b"s", 1000, 60, 1)
    assert a == tick_job_id(b"s", 1000, 60, 5) and valid_id(a)
    assert len({a, tick_job_id(b"s", 2000, 60, 1), tick_job_id(b"t", 1000, 60, 1), tick_job_id(b"s", 1000, 60, 0)}) == 4


def test_a_node_fires_nothing_in_its_first_grace(env):
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 100)
    run(env, GRACE - 100)
    assert tick_jobs(env.core) == []
    run(env, 300)
    assert tick_jobs(env.core)


def test_the_smallest_grace_still_fires_between_crons_a_little_late(env):
    """A cron 150 ms after the last is late, not a stall, even when half the grace is 50 ms."""
    started(env)
    env("CONFIG", "SET", "schedule-grace", "100")
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 100)
    for _ in range(20):
        env.clock.advance(150)
        env.core.tick()
    assert len(tick_jobs(env.core)) >= 20


def test_paused_schedules_do_not_fire(env):
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    env("SCHEDULE", "PAUSE", "s")
    run(env, 5000)
    assert tick_jobs(env.core) == [] and dict(env.core.schedules.info_fields())["schedules_paused"] == 1


def test_cron_in_a_zone(env):
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "x", "CRON", "*/2 * * * *", "TZ", "Asia/Kolkata")  # +05:30: minutes still even
    run(env, 6 * 60_000)
    jobs = tick_jobs(env.core)
    assert len(jobs) == 3
    fired = sorted(t for t in env.core.schedules.runs[b"s"].fired) or [env.core.schedules.runs[b"s"].last]
    assert all(t % 120_000 == 0 for t in fired)


def test_tick_arithmetic():
    every = Schedule(b"e", 0, "", b"q", b"", 1000)
    assert list(ticks_after(every, 1000, 3500)) == [2000, 3000] and next(ticks_back(every, 3500)) == 3000
    cron = Schedule(b"c", 0, "", b"q", b"", 0, b"* * * * *")
    assert list(ticks_after(cron, 60_000, 180_500)) == [120_000, 180_000]
    assert list(ticks_after(cron, 60_500, 120_000)) == [120_000]
    assert next(ticks_back(cron, 180_000)) == 180_000 and next(ticks_back(cron, 179_999)) == 120_000
    assert next(ticks_back(every, 999), None) is None


def test_a_refused_tick_is_counted_and_not_retried(env):
    started(env)
    env.clock.advance(500)
    env("ADDJOB", "q", "old", 0)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "MAXLEN", 1)
    run(env, 3000)
    assert [j.body for j in tick_jobs(env.core)] == [b"old"]
    run(env, 5000)
    assert dict(env.core.schedules.info_fields())["schedule_ticks_refused"] == 8


def test_a_leaving_node_fires_nothing(env):
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    env("CLUSTER", "LEAVING", "yes")
    run(env, 3000)
    assert tick_jobs(env.core) == []


@pytest.mark.parametrize("policy, fired", [("last", 1), ("all", 100), ("none", 0)])
def test_missed_ticks_after_downtime_follow_the_catch_up_rule(policy, fired):
    core, clock, _ = make_core(schedule_catch_up=policy)
    s = Session(core)
    s.clock = clock
    started(s)
    s("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    run(s, 3000)
    assert len(tick_jobs(core)) == 3
    clock.advance(3_600_000)  # the clock jumps (or the whole cluster was down): ~3600 ticks missed
    core.tick()
    assert len(tick_jobs(core)) == 3  # time passed at once, as in a stall: it listens first
    run(s, GRACE // 2)
    window = GRACE // 1000  # the ticks of the last `grace * size` ms are due as usual
    assert len(tick_jobs(core)) == 3 + fired + window
    core.tick()
    assert len(tick_jobs(core)) == 3 + fired + window  # and each once


def test_a_clock_that_jumps_back_fires_no_tick_twice(env):
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 500)
    run(env, 3000)
    n = len(tick_jobs(env.core))
    env.clock.advance(-2000)
    run(env, 2000)
    assert len(tick_jobs(env.core)) == n  # the same ticks again: their jobs are here
    run(env, 1000)
    assert len(tick_jobs(env.core)) == n + 2


def test_a_clock_that_jumps_back_past_the_window_fires_no_tick_it_passed(env):
    """Ticks whose jobs are gone (deleted here, or made and acknowledged
    elsewhere) are not made again when the clock goes back over them."""
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 500)
    run(env, 3000)
    done = tick_jobs(env.core)
    assert len(done) == 6 and env("DELJOB", *[j.id for j in done]) == 6
    env.clock.advance(-5000)
    run(env, 5000)  # back where it was: nothing fired again
    assert tick_jobs(env.core) == [] and env.core.schedules.fired == 6
    run(env, 1000)
    assert len(tick_jobs(env.core)) == 2  # and the ticks after it fire


def test_an_acknowledged_tick_is_not_fired_again(env):
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    run(env, 1000)
    [job] = tick_jobs(env.core)
    assert env("ACKJOB", job.id) == 1
    run(env, 100)
    assert job.id in env.core.collected
    env.clock.advance(-1000)
    env.core.schedules.runs[b"s"].fired.clear()
    run(env, 1000)
    assert tick_jobs(env.core) == []


# ---------------------------------------------------------------- records


def test_records_round_trip_and_reject_garbage():
    s = Schedule(b"n", 5, "a" * 40, b"q", b"b\x00,:", 0, b"0 3 * * *", b"UTC", True, False, 7, 2, 60, 0, 1, 3, 4, b"d")
    assert records.decode(records.encode(s)) == s
    assert Schedule(b"n", 6, "a").newer(s) and not s.newer(s) and s.newer(None)
    assert Schedule(b"n", 5, "b").newer(s)
    good = records.encode(s)
    row = msgpack.unpackb(good)
    for bad in (b"", good[:-1], good + b"x", msgpack.packb(row[:17]), msgpack.packb(row + [0]),
                msgpack.packb([row[0], "5", *row[2:]]), msgpack.packb([b"", *row[1:]]),
                msgpack.packb(row[:8] + [2] + row[9:]), msgpack.packb({"name": b"n"}), "text"):  # fmt: skip
        with pytest.raises(DecodeError):
            records.decode(bad)  # type: ignore[arg-type]
    older = records.decode(msgpack.packb(row[:18]))  # a record of a node from before ZONES and PRIORITY
    assert (older.zones, older.priority) == (0, -1) and older.options()[-2:] == [b"DEADLETTER", b"d"]


@given(st.binary(max_size=200))
def test_decoding_any_bytes_returns_a_record_or_raises_decode_error(data):
    try:
        s = records.decode(data)
    except DecodeError:
        return
    assert records.encode(s) == data


def test_bus_messages_round_trip_and_a_bad_record_is_dropped_alone(env):
    from disque.cluster.messages import Header

    header = Header("a" * 40, 7711, 0)
    record = records.encode(Schedule(b"n", 5, "a" * 40, b"q", b"b", 1000))
    for msg in (m.SchedSet(record), m.Ticked(b"n", 1000, "b" * 40)):
        assert decode_body(encode_body(header, msg))[1] == msg
    decoder = FrameDecoder()
    decoder.feed(encode_frame(header, m.SchedSet(b"garbage")))
    sender, msg = decoder.next_frame()  # well framed: the link stays, the core checks the record
    nameless = records.encode(Schedule(b"n", 5, "a" * 40, b"q", b"b", 1000)).replace(b"\xc4\x01n", b"\xc4\x00", 1)
    for bad in (msg, m.SchedSet(nameless)):
        env.core.schedules.on_sched_set("b" * 40, bad)
    env.core.schedules.on_sched_set("b" * 40, m.SchedSet(record))
    assert env.core.schedules.names() == [b"n"]
    assert dict(env.core.schedules.info_fields())["schedule_records_dropped"] == 2


@pytest.mark.parametrize(
    "field, value, rule",
    [
        ("name", b"", "name must be 1 to 256 bytes"), ("name", b"x" * 257, "name must be 1 to 256 bytes"),
        ("name", b"a\nb", "without control characters"), ("cron", b"*" * 1025, "at most 1024 bytes"),
        ("tz", b"x" * 1025, "at most 1024 bytes"), ("queue", b"q" * 65537, "queue names must be at most"),
        ("dead_letter", b"q" * 65537, "queue names must be at most"), ("body", b"b" * ((64 << 20) + 1), "body must be at most"),
    ],
)  # fmt: skip
def test_one_rule_per_record_for_the_command_the_bus_and_the_aof(env, field, value, rule):
    from dataclasses import replace

    bad = replace(Schedule(b"n", 5, "a" * 40, b"q", b"b", 1000), **{field: value})
    assert rule in records.broken_rule(bad)
    with pytest.raises(records.RuleError, match=rule):
        records.decode(records.encode(bad))
    args = {"name": b"n", "queue": b"q", "body": b"b", "dead_letter": None, "cron": None, "tz": None}
    args[field] = value
    words = [b"SCHEDULE", b"ADD", args["name"], args["queue"], args["body"]]
    words += [b"CRON", args["cron"] or b"* * * * *"] if args["cron"] or args["tz"] else [b"EVERY", b"1000"]
    words += [b"TZ", args["tz"]] if args["tz"] else []
    words += [b"MAXATTEMPTS", b"1", b"DEADLETTER", args["dead_letter"]] if args["dead_letter"] else []
    reply = env(*words)
    assert isinstance(reply, Exception) and rule in str(reply)
    assert env("SCHEDULE", "LIST") == []


def test_aof_records_are_logged_replayed_and_rewritten(env):
    env.core.aof.state = "on"
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    env("SCHEDULE", "ADD", "gone", "q", "x", "EVERY", 1000)
    env("SCHEDULE", "DEL", "gone")
    env("SCHEDULE", "PAUSE", "s")
    env("SCHEDULE", "RESUME", "s")
    run(env, 2000)
    log = b"".join(e.record for e in env.core.out.effects if isinstance(e, AofAppend))
    assert log.count(b"SCHEDULE\r\n") == 5 and log.count(b"SCHEDTICK") == 2
    rewrite = b"".join(env.core.snapshot().other)
    assert rewrite.count(b"SCHEDULE\r\n") == 2 and rewrite.count(b"SCHEDTICK") == 1
    for data in (log, rewrite, rewrite + log):
        core2, clock2, _ = make_core()
        clock2.ms = env.clock.ms
        replay(core2, data)
        assert Session(core2)("SCHEDULE", "LIST") == [b"s"]
        assert core2.schedules.runs[b"s"].last == env.core.schedules.runs[b"s"].last
        assert core2.schedules.defs == env.core.schedules.defs


def test_schedule_records_are_checked_and_a_bad_one_is_skipped_alone(env):
    good = records.encode(Schedule(b"n", 5, "a" * 40, b"q", b"b", 1000))
    assert check_record(0, [b"SCHEDULE", good]) is None
    assert check_record(0, [b"SCHEDULE", b"x"]) is None  # well framed: replay skips it alone
    assert check_record(0, [b"SCHEDTICK", b"n", b"1000", b"a" * 40]) is None
    for bad in ([b"SCHEDULE"], [b"SCHEDTICK", b"n", b"-1", b"a"], [b"SCHEDTICK", b"n", b"1"]):
        with pytest.raises(AofCorrupt):
            check_record(0, bad)
    rep = env.core.begin_load()
    rep.apply(0, [b"SCHEDULE", b"x"])
    rep.apply(0, [b"SCHEDULE", good.replace(b"\xc4\x01n", b"\xc4\x00", 1)])
    rep.apply(0, [b"SCHEDULE", good])
    env.core.end_load()
    assert env.core.schedules.names() == [b"n"]
    assert dict(env.core.schedules.info_fields())["schedule_records_dropped"] == 2


def test_a_tick_record_of_an_unknown_schedule_is_ignored(env):
    rep = env.core.begin_load()
    rep.apply(0, [b"SCHEDTICK", b"nope", b"1000", b"a" * 40])
    rep.apply(0, [b"SCHEDULE", records.encode(Schedule(b"d", 5, "a", deleted=True))])
    rep.apply(0, [b"SCHEDULE", records.encode(Schedule(b"d", 4, "a", b"q", b"b", 1000))])  # older: ignored
    rep.apply(0, [b"SCHEDTICK", b"nope", b"1000", b"a" * 40])
    env.core.end_load()
    assert env.core.schedules.runs == {} and env.core.schedules.defs[b"d"].deleted


# ---------------------------------------------------------------- a cluster


@pytest.fixture
def mesh() -> Mesh:
    mesh = Mesh(3)
    mesh.meet(0, 1)
    mesh.meet(0, 2)
    mesh.advance(3500)  # (off the ticks' boundaries)
    return mesh


def all_tick_jobs(mesh: Mesh) -> dict[bytes, list[int]]:
    """Job ID -> the nodes holding a copy."""
    held: dict[bytes, list[int]] = {}
    for i, core in enumerate(mesh.cores):
        if core is not None:
            for job in tick_jobs(core):
                held.setdefault(job.id, []).append(i)
    return held


def firers(mesh: Mesh) -> int:
    return sum(dict(c.schedules.info_fields())["schedule_ticks_fired"] for c in mesh.cores if c is not None)


def test_one_node_fires_each_tick_and_every_node_knows(mesh):
    assert mesh.call(1, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 2) == b"OK"
    assert all(c.schedules.live(b"s") for c in mesh.cores)
    mesh.advance(10_000)
    held = all_tick_jobs(mesh)
    assert len(held) == 10 and firers(mesh) == 10 and all(len(h) == 2 for h in held.values())
    assert len({c.schedules.runs[b"s"].last for c in mesh.cores}) == 1
    who = {c.schedules.runs[b"s"].last_by for c in mesh.cores}
    assert len(who) == 1
    assert sum(dict(c.schedules.info_fields())["schedule_ticks_collapsed"] for c in mesh.cores) == 0


def test_the_next_node_fires_when_the_first_is_down(mesh):
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 3)
    mesh.advance(2000)
    mesh.kill(2)
    before = set(all_tick_jobs(mesh))
    mesh.advance(10_000)
    new = set(all_tick_jobs(mesh)) - before
    assert len(new) == 10 and firers(mesh) >= 10
    mesh.restart(2)
    mesh.advance(3000)  # it comes back: learns what fired, fires nothing twice
    held = all_tick_jobs(mesh)
    assert len(held) == len(before) + 10 + 3


def test_a_tick_fired_twice_collapses_into_one_job(mesh):
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1)
    t = (mesh.clock.ms // 1000 + 1) * 1000
    first = min(range(3), key=lambda i: _turn(b"s", t, mesh.my_id(i)))
    for i in set(range(3)) - {first}:
        mesh.lose_next(i, m.Ticked)  # the notices of the next tick are lost: the next in line fires it too
    mesh.advance(5000)
    held = all_tick_jobs(mesh)
    assert len(held) == 5 and firers(mesh) == 6
    [(twice, holders)] = [(job_id, h) for job_id, h in held.items() if len(h) == 2]
    assert sum(dict(c.schedules.info_fields())["schedule_ticks_collapsed"] for c in mesh.cores) == 1
    copies = [mesh.core(i).jobs.get(twice) for i in holders]
    assert all(set(c.nodes_delivered) == {mesh.my_id(i) for i in holders} for c in copies)  # each knows the other
    assert mesh.call(holders[0], "ACKJOB", twice) == 1
    mesh.advance(1000)
    assert all(mesh.core(i).jobs.get(twice) is None for i in holders)  # one ACK collected both


def test_a_copy_made_across_a_partition_meets_the_other_on_link_up(mesh):
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1)
    mesh.advance(1000)
    mesh.kill(1)
    mesh.kill(2)
    mesh.advance(3000)  # node 0 alone fires the next ticks
    for i in (1, 2):
        mesh.restart(i)  # they come back without links: node 1 and 2 alone think they are first too
    mesh.advance(100)
    mesh.advance(4000)
    held = all_tick_jobs(mesh)
    assert all(len(set(h)) == len(h) for h in held.values())
    merged = [job_id for job_id, h in held.items() if len(h) > 1]
    for job_id in merged:
        assert all(len(mesh.core(i).jobs.get(job_id).nodes_delivered) == len(held[job_id]) for i in held[job_id])


def test_a_node_that_joins_learns_every_schedule_and_what_fired():
    mesh = Mesh(3)
    mesh.meet(0, 1)
    mesh.advance(3500)
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1)
    mesh.call(1, "SCHEDULE", "ADD", "gone", "q", "x", "EVERY", 1000)
    mesh.call(1, "SCHEDULE", "DEL", "gone")
    mesh.advance(3000)
    mesh.meet(0, 2)
    mesh.advance(1000)
    new = mesh.core(2).schedules
    assert new.names() == [b"s"] and new.defs[b"gone"].deleted
    assert new.runs[b"s"].last == mesh.core(0).schedules.runs[b"s"].last > 0
    mesh.advance(5000)
    assert len(all_tick_jobs(mesh)) == 9  # the 9 ticks since the ADD, once each


def test_a_notice_of_an_unknown_schedule_is_ignored(env):
    env.core.schedules.on_ticked("peer", m.Ticked(b"nope", 1000, "b" * 40))
    assert env.core.schedules.runs == {}
    assert isinstance(env.core.schedules, Schedules)


def test_a_node_with_a_copy_of_the_tick_does_not_fire_it_again(mesh):
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 3)
    t = (mesh.clock.ms // 1000 + 1) * 1000
    first = min(range(3), key=lambda i: _turn(b"s", t, mesh.my_id(i)))
    for i in set(range(3)) - {first}:
        mesh.lose_next(i, m.Ticked)  # the notice is lost, but the copy came
    mesh.advance(5000)
    assert len(all_tick_jobs(mesh)) == 5 and firers(mesh) == 5


def test_a_merge_needs_a_live_copy_here(mesh):
    mesh.call(0, "SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1)
    mesh.advance(1000)
    core = next(c for c in mesh.cores if c.schedules.runs[b"s"].mine)
    run = core.schedules.runs[b"s"]
    [t] = run.mine
    [job] = tick_jobs(core)
    core.lifecycle.delete_job(job)  # acknowledged and gone here
    other = next(c for c in mesh.cores if c is not core).membership.my_id
    core.schedules.on_ticked(other, m.Ticked(b"s", t, other))
    assert dict(core.schedules.info_fields())["schedule_ticks_collapsed"] == 1
    assert not mesh.core(0).out.effects


def test_a_schedule_that_never_fired_sends_its_record_only(env):
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    assert [type(msg) for msg in env.core.schedules.sync_messages()] == [m.SchedSet]


def test_a_node_remembers_the_last_ticks_it_made_only(env, monkeypatch):
    monkeypatch.setattr("disque.core.schedules.MINE_MAX", 2)
    started(env)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 500)
    run(env, 2000)
    run_ = env.core.schedules.runs[b"s"]
    assert len(run_.mine) == 2 and max(run_.mine) == run_.last


def test_figures_list_every_schedule_for_the_dashboard(env):
    from disque.core.figures import node_figures

    started(env)
    env("SCHEDULE", "ADD", "b", "q", "x", "EVERY", 1000, "TTL", 60)
    env("SCHEDULE", "ADD", "a", "q2", "y", "CRON", "0 3 * * *", "TZ", "Europe/Paris")
    env("SCHEDULE", "PAUSE", "a")
    run(env, 1000)
    fig = node_figures(env.core)
    a, b = fig["schedule_list"]
    assert (a["name"], a["cron"], a["tz"], a["every"], a["paused"], a["last-tick"], a["options"]) == (
        "a", "0 3 * * *", "Europe/Paris", None, 1, None, "")  # fmt: skip
    assert (b["name"], b["queue"], b["every"], b["options"], b["last-node"]) == ("b", "q", 1000, "TTL 60", env.core.membership.my_id)
    assert b["next-tick"] == b["last-tick"] + 1000
    assert fig["schedules"]["schedules"] == 2 and fig["schedules"]["schedules_paused"] == 1
    assert fig["schedules"]["schedule_ticks_fired"] == 1


def test_show_says_whether_anyone_takes_the_schedules_jobs(env):
    """SCHEDULE SHOW's queue fields: a schedule whose queue keeps growing
    with nobody waiting and nothing taken since its oldest job was made has
    lost its consumer; a fetch or a waiting consumer says otherwise."""
    assert env("SCHEDULE", "ADD", "s", "reports", "x", "EVERY", 1000, "REPLICATE", 1) == b"OK"
    show = dict(env("SCHEDULE", "SHOW", "s"))
    assert (show[b"queue-len"], show[b"queue-waiting"], show[b"queue-fetched"], show[b"queue-oldest"]) == (0, 0, None, None)
    run(env, 3000)
    show = dict(env("SCHEDULE", "SHOW", "s"))
    assert show[b"queue-len"] == 3 and show[b"queue-fetched"] is None and show[b"queue-oldest"] <= env.core.now - 1000
    assert env("GETJOB", "FROM", "reports")
    taken = env.core.now
    run(env, 2000)
    show = dict(env("SCHEDULE", "SHOW", "s"))
    assert show[b"queue-fetched"] == taken and show[b"queue-oldest"] < taken  # taken since: still served
    env("GETJOB", "COUNT", 10, "FROM", "reports")
    assert dict(env("SCHEDULE", "SHOW", "s"))[b"queue-len"] == 0
    assert Session(env.core)("GETJOB", "TIMEOUT", 60_000, "FROM", "reports") is BLOCKED
    assert dict(env("SCHEDULE", "SHOW", "s"))[b"queue-waiting"] == 1


_words = st.sampled_from([b"EVERY", b"CRON", b"TZ", b"REPLICATE", b"TTL", b"RETRY", b"DELAY", b"MAXLEN", b"MAXATTEMPTS",
                          b"DEADLETTER", b"ZONES", b"PRIORITY", b"ASYNC", b"1000", b"0", b"-1", b"* * * * *", b"UTC", b""])  # fmt: skip
_args = st.lists(st.one_of(_words, st.binary(max_size=40), st.text(max_size=40).map(str.encode)), max_size=12)


_adds = st.tuples(
    st.just(b"ADD"), st.binary(max_size=300), st.binary(max_size=20), st.binary(max_size=20),
    st.sampled_from([b"EVERY", b"CRON"]), st.one_of(_words, st.binary(max_size=2000)),
).map(list)  # fmt: skip


@given(sub=st.one_of(_adds, st.sampled_from([b"ADD", b"DEL", b"SHOW", b"PAUSE", b"RESUME", b"LIST", b"x"]).map(lambda w: [w])),
       args=_args)  # fmt: skip
def test_any_schedule_arguments_answer_ok_or_an_error_and_keep_only_good_records(sub, args):
    s = ClockedSession()
    reply = s(b"SCHEDULE", *sub, *args)
    assert not isinstance(reply, Exception) or str(reply)
    for rec in s.core.schedules.defs.values():  # what the bus and the AOF would carry: each passes their check
        assert records.decode(records.encode(rec)) == rec
    assert s("PING") == b"PONG"


# ---------------------------------------------------------------- cost


def test_a_pass_looks_only_at_the_schedules_due(env, monkeypatch):
    started(env)
    for i in range(300):
        env("SCHEDULE", "ADD", f"s{i}", "q", "x", "EVERY", 3_600_000)
    env("SCHEDULE", "ADD", "often", "q", "x", "EVERY", 1000)
    run(env, 200)  # the first look at each new schedule, PASS_MAX a pass
    looked: list[bytes] = []
    real = Schedules._due
    monkeypatch.setattr(Schedules, "_due", lambda self, s, *a: looked.append(s.name) or real(self, s, *a))
    run(env, 3000)
    assert looked and set(looked) == {b"often"}  # the hourly ones wait for their hour in the heap
    assert env("SCHEDULE", "PAUSE", "often") == b"OK"
    looked.clear()
    run(env, 2000)
    assert looked == []  # paused: not looked at until RESUME (a new record) wakes it
    env("SCHEDULE", "RESUME", "often")
    run(env, 100)
    assert looked == [b"often"]


def test_a_pass_looks_at_most_at_pass_max_schedules(env, monkeypatch):
    from disque.core import schedules as module

    monkeypatch.setattr(module, "PASS_MAX", 2)
    started(env)
    for i in range(5):
        env("SCHEDULE", "ADD", f"s{i}", "q", "x", "EVERY", 3_600_000)
    waiting = []
    for _ in range(3):
        run(env, 100)
        waiting.append(sum(at <= env.clock.ms for at in env.core.schedules.due_at.values()))
    assert waiting == [3, 1, 0]


def test_records_are_counted_in_used_memory_and_refused_at_the_limit():
    env = ClockedSession(maxmemory=2_000_000)
    started(env)
    before = env.core.memory.used
    assert env("SCHEDULE", "ADD", "s", "q", b"x" * 100_000, "EVERY", 1000) == b"OK"
    assert env.core.memory.used - before == env.core.schedules.size() > 100_000
    for i in range(30):
        reply = env("SCHEDULE", "ADD", f"big{i}", "q", b"x" * 100_000, "EVERY", 3_600_000)
        if isinstance(reply, Exception):
            break
    assert isinstance(reply, Exception) and "OOM" in str(reply)
    assert env.core.memory.used <= 2_000_000 + 200_000
    env("SCHEDULE", "ADD", "s", "q", b"y", "EVERY", 1000)  # replaced: the old body no longer counted
    assert env.core.memory.data() - env.core.memory.base == env.core.schedules.size()


def test_a_tombstone_expires_a_day_after_the_deletion(env):
    from disque.core.schedules import TOMBSTONE_MS

    started(env)
    env("SCHEDULE", "ADD", "gone", "q", "x", "EVERY", 1000)
    base = env.core.memory.used - env.core.schedules.size()
    assert env("SCHEDULE", "DEL", "gone") == 1
    assert env.core.schedules.defs[b"gone"].deleted
    env.clock.advance(TOMBSTONE_MS - 1000)
    run(env, 500)
    assert b"gone" in env.core.schedules.defs  # not yet
    run(env, 1000)
    assert b"gone" not in env.core.schedules.defs and env.core.memory.used == base
    ahead = Schedule(b"ahead", env.clock.ms + 5000, "b" * 40, deleted=True)  # made by a node whose clock is ahead
    env.core.schedules.on_sched_set("b" * 40, m.SchedSet(records.encode(ahead)))
    env.clock.advance(TOMBSTONE_MS)
    run(env, 100)
    assert b"ahead" in env.core.schedules.defs
    run(env, 5000)
    assert b"ahead" not in env.core.schedules.defs


class Ahead:
    """A node's clock `ms` ahead of the others' (its wall clock too, when `wall`)."""

    def __init__(self, clock: Any, ms: int, wall: bool) -> None:
        self.clock, self.ms, self.wall = clock, ms, wall

    def now_ms(self) -> int:
        return self.clock.ms + self.ms

    def since_us(self) -> int:
        return 0

    def wall_us(self) -> int:
        return (self.clock.ms + self.ms * self.wall) * 1000


@pytest.mark.parametrize("wall", [False, True])
def test_a_node_whose_clock_is_ahead_fires_no_tick_early(wall):
    """Its node clock 300 s ahead (still leaning back after its wall clock was
    corrected; or its wall clock wrong too): its ticks follow the time its
    peers' PING and PONG say, not its own."""
    mesh = Mesh(3)
    ahead = mesh.core(0)
    ahead.clock = ahead.schedules.clock = Ahead(mesh.clock, 300_000, wall)

    def advance(ms: int) -> None:  # (its deadlines are 300 s ahead of the mesh's: its steps are driven here)
        for _ in range(ms // 100):
            mesh.advance(100)
            ahead.tick()
            mesh.flush()

    mesh.meet(0, 1)
    mesh.meet(0, 2)
    advance(3500)
    assert Session(ahead)("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000, "REPLICATE", 1) == b"OK"
    advance(8000)
    ticks = {int(t) for core in mesh.cores for t in core.schedules.runs[b"s"].fired}
    assert ticks and max(ticks) <= mesh.clock.ms
    mine = dict(ahead.schedules.info_fields())["schedule_ticks_fired"]
    assert mine >= 1  # it takes its turns, at the agreed time
    assert abs(ahead.schedules.offset + 300_000) < 100


def test_a_node_alone_follows_its_wall_clock_when_its_node_clock_is_ahead():
    env = ClockedSession()
    env.core.clock = env.core.schedules.clock = Ahead(env.clock, 300_000, wall=False)
    run(env, GRACE + 100)
    env("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 1000)
    run(env, 3000)
    assert tick_jobs(env.core) and all(t <= env.clock.ms for t in env.core.schedules.runs[b"s"].fired)
