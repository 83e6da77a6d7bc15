"""Batches (BATCH, ADDJOB ... BATCH, core/batches.py): callbacks fired once
the batch is closed and its jobs are done, once in the cluster; the records'
rules, their merge, the AOF; on one node and on the fake-clock mesh."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.batches import CRON_EVERY_MS, FIRE_GRACE_MS

GRACE = FIRE_GRACE_MS + 200  # a due callback fires at the first cron after its grace
from disque.core.effects import AofAppend
from disque.store import batch as records
from disque.store.batch import MAX_BODY, Batch

from invariants import check_core
from jobenv import OK, env, make_env  # noqa: F401
from support import Session, make_core, replay
from test_dependencies import fetch_ack
from test_mesh_cluster import added, formed


def shown(env, batch_id: bytes) -> dict:
    return {k.decode(): v for k, v in env.s("BATCH", "SHOW", batch_id)}


def new_batch(env, *callbacks) -> bytes:
    return bytes(env.s("BATCH", "NEW", *callbacks))


def test_the_callbacks_fire_once_the_batch_is_closed_and_done_and_a_running_job_may_add_to_it(env):
    b = new_batch(env, "ON-SUCCESS", "cb", "all good", "ON-COMPLETE", "cb", "all done")
    first, second = env.add("q", "1", "BATCH", b), env.add("q", "2", "BATCH", b)
    assert env.show(first)["batch"] == b
    fetch_ack(env)
    assert env.s("BATCH", "CLOSE", b) == OK and env.s("BATCH", "CLOSE", b) == OK
    ((_, job_id, _),) = env.s("GETJOB", "NOHANG", "FROM", "q")
    assert job_id == second
    third = env.add("q", "3", "batch", b)  # while `second` runs: the batch waits for it too
    env.s("ACKJOB", second)
    assert env.s("QLEN", "cb") == 0 and shown(env, b)["pending"] == 1
    assert fetch_ack(env) == third
    assert shown(env, b)["complete-fired"] == 0  # due: fired after its grace
    env.wait(GRACE)
    info = shown(env, b)
    assert (info["jobs"], info["pending"], info["done"], info["failed"], info["closed"]) == (3, 0, 3, 0, 1)
    assert (info["success-fired"], info["complete-fired"]) == (1, 1)
    callbacks = sorted(job[2] for job in env.s("GETJOB", "NOHANG", "COUNT", 10, "FROM", "cb"))
    assert callbacks == [b"all done", b"all good"]
    assert sorted(env.s("JSCAN", 0, "QUEUE", "cb", "STATE", "active")[1]) == sorted(info["callback-ids"])
    env.wait(10 * CRON_EVERY_MS)
    assert env.s("QLEN", "cb") == 0  # fired once
    assert isinstance(env.s("ADDJOB", "q", "late", 0, "BATCH", b), Exception)  # finished: nothing joins it
    assert first not in env.core.jobs
    env.check()


def test_a_failed_job_fires_on_complete_only(env):
    b = new_batch(env, "ON-SUCCESS", "cb", "good", "ON-COMPLETE", "cb", "done")
    env.add("q", "x", "TTL", 5, "BATCH", b)
    env.s("BATCH", "CLOSE", b)
    env.wait(6_000 + GRACE)
    info = shown(env, b)
    assert (info["failed"], info["success-fired"], info["complete-fired"]) == (1, 0, 1)
    assert [job[2] for job in env.s("GETJOB", "NOHANG", "COUNT", 10, "FROM", "cb")] == [b"done"]
    assert b"batches:1\r\nbatch_callbacks_fired:1\r\nbatch_records_dropped:0" in env.s("INFO", "workflows")
    env.check()


def test_an_empty_batch_closed_is_done_at_once(env):
    b = new_batch(env, "ON-SUCCESS", "cb", "good")
    assert shown(env, b)["on-complete"] == []
    env.s("BATCH", "CLOSE", b)
    env.wait(GRACE)
    assert env.s("QLEN", "cb") == 1 and shown(env, b)["success-fired"] == 1


@pytest.mark.parametrize(
    "args, error",
    [
        (("NEW", "ON-SUCCESS", "cb"), "Syntax error"),
        (("NEW", "ON-FAILURE", "cb", "x"), "Syntax error"),
        (("NEW", "ON-SUCCESS", "cb", "x", "on-success", "cb", "y"), "Syntax error"),
        (("SHOW",), "Syntax error"),
        (("NEW", "ON-SUCCESS", "", "x"), "a callback's queue"),
        (("NEW", "ON-COMPLETE", "cb", "x" * (MAX_BODY + 1)), "a callback's queue"),
        (("SHOW", "BT" + "0" * 40), "Unknown batch"),
        (("CLOSE", "nope"), "Unknown batch"),
    ],
)
def test_batch_errors(env, args, error):
    reply = env.s("BATCH", *args)
    assert isinstance(reply, Exception) and error in str(reply)
    assert "Unknown batch" in str(env.s("ADDJOB", "q", "x", 0, "BATCH", "nope"))
    assert env.s("QLEN", "q") == 0


def test_records_merge_by_union_and_are_checked():
    a = Batch(b"BT" + b"1" * 40, (b"q", b"x"), None, False, {b"j"}, {b"j"})
    b = Batch(a.id, None, (b"q", b"y"), True, {b"k"}, set(), {b"k"}, 2)
    assert a.merge(b) and not a.merge(b)
    assert (a.success, a.complete, a.closed, a.jobs, a.pending, a.fired) == ((b"q", b"x"), (b"q", b"y"), True, {b"j", b"k"}, set(), 2)
    job = b"DI" + b"f" * 40 + b"05a1SQ"
    good = Batch(a.id, (b"q", b"x"), None, True, {job}, {job})
    assert records.decode(records.encode(good)) == good
    for bad in (b"\xc1", records.encode(good)[:-1], b"\x93\x01\x02\x03", records.encode(Batch(b"BTnope"))):
        with pytest.raises(records.DecodeError):
            records.decode(bad)
    with pytest.raises(records.DecodeError, match="job list"):
        records.decode(records.encode(Batch(a.id, jobs={b"nope"})))
    with pytest.raises(records.DecodeError, match="callback"):
        records.decode(records.encode(good).replace(b"\x92\xc4\x01q\xc4\x01x", b"\x91\xc4\x01q", 1))


def test_a_bad_record_from_a_peer_is_dropped_alone(env):
    env.core.batches.on_batch_set("a" * 40, m.BatchSet(b"garbage"))
    assert env.core.batches.dropped == 1 and env.core.batches.batches == {}


def test_the_aof_keeps_batches_and_a_replayed_one_fires_at_the_cron(env):
    env.core.aof.state = "on"
    b = new_batch(env, "ON-COMPLETE", "cb", "done")
    env.add("q", "x", "BATCH", b)
    env.s("BATCH", "CLOSE", b)
    log = b"".join(e.record for e in env.core.out.effects if isinstance(e, AofAppend))
    assert log.count(b"BATCH\r\n") == 3
    fetch_ack(env)
    env.wait(GRACE)
    rewrite = b"".join(env.core.snapshot().other)
    for data, fired in ((log, 0), (rewrite, 1), (rewrite + log, 1)):
        core, clock, _ = make_core()
        clock.ms = env.clock.ms
        replay(core, data)
        s = Session(core)
        info = {k.decode(): v for k, v in s("BATCH", "SHOW", b)}
        assert info["complete-fired"] == fired and s("QLEN", "cb") == 0
        check_core(core)
    core.batches.batches[b].fired = 0
    core.batches.batches[b].done.add(b"DI" + b"f" * 40 + b"05a1SQ")  # (any job: the batch is finished either way)
    core.batches.batches[b].jobs = set(core.batches.batches[b].done)
    for _ in range(2):  # due, then fired after its grace
        clock.advance(CRON_EVERY_MS)
        core.tick()
    assert s("QLEN", "cb") == 1  # due and not known fired: the cron fires it
    assert env.s("DEBUG", "FLUSHALL") == OK and env.core.batches.batches == {}


def test_a_callback_refused_is_tried_again_and_one_made_before_counts(env):
    b = new_batch(env, "ON-COMPLETE", "cb", "done")
    env.s("ADDJOB", "cb", "other", 0)
    env.s("PAUSE", "cb", "in")
    env.s("BATCH", "CLOSE", b)
    env.wait(GRACE)
    assert shown(env, b)["complete-fired"] == 0  # a paused queue refused it
    env.s("PAUSE", "cb", "none")
    env.wait(CRON_EVERY_MS + GRACE)
    assert shown(env, b)["complete-fired"] == 1 and env.s("QLEN", "cb") == 2
    env.core.batches.batches[b].fired = 0  # a record that missed the news: the job is here already
    env.wait(CRON_EVERY_MS + GRACE)
    assert shown(env, b)["complete-fired"] == 1 and env.s("QLEN", "cb") == 2
    env.check()


def test_in_a_cluster_the_callback_fires_once():
    mesh = formed(3)
    b = bytes(mesh.call(0, "BATCH", "NEW", "ON-SUCCESS", "cb", "good"))
    jobs = [added(mesh.reply(mesh.call(i, "ADDJOB", "q", f"j{i}", 5000, "REPLICATE", 2, "BATCH", b))) for i in range(3)]
    assert all(len(mesh.core(i).batches.batches[b].jobs) == 3 for i in range(3))
    mesh.call(1, "BATCH", "CLOSE", b)
    for _ in range(3):  # (a node that asked for jobs may have been sent the others' since)
        for i in range(3):
            while isinstance(got := mesh.call(i, "GETJOB", "NOHANG", "FROM", "q"), list):
                mesh.call(i, "ACKJOB", got[0][1])
        mesh.advance(CRON_EVERY_MS)
    assert all(mesh.core(i).batches.batches[b].pending == set() for i in range(3))
    callback = mesh.core(0).batches.batches[b]
    assert callback.fired == records.SUCCESS and set(jobs) <= callback.done
    assert sum(mesh.call(i, "QLEN", "cb") for i in range(3)) == 1
    mesh.kill(0)  # a node that comes back learns every batch when it links up
    mesh.restart(0)
    mesh.advance(3_000)
    assert mesh.core(0).batches.batches[b].fired == records.SUCCESS


def test_a_record_learned_from_a_peer_is_logged_and_a_bad_one_in_the_aof_skipped(env):
    env.core.aof.state = "on"
    record = records.encode(Batch(b"BT" + b"2" * 40, None, (b"cb", b"done")))
    env.core.batches.on_batch_set("a" * 40, m.BatchSet(record))
    env.core.batches.on_batch_set("a" * 40, m.BatchSet(record))  # nothing new: not logged again
    assert [e.record.count(b"BATCH\r\n") for e in env.core.out.effects if isinstance(e, AofAppend)] == [1]
    rep = env.core.begin_load()
    rep.apply(0, [b"BATCH", b"garbage"])
    env.core.end_load()
    assert env.core.batches.dropped == 1 and list(env.core.batches.batches) == [b"BT" + b"2" * 40]


def test_a_finished_batch_is_forgotten_result_ttl_later():
    env = make_env()
    assert env.s("CONFIG", "SET", "result-ttl", "10") == OK
    b = new_batch(env, "ON-COMPLETE", "cb", "done")
    env.add("q", "x", "BATCH", b)
    env.s("BATCH", "CLOSE", b)
    env.wait(10_000)
    assert shown(env, b)["pending"] == 1  # not finished: kept
    fetch_ack(env)
    env.wait(GRACE + 5_000)
    assert shown(env, b)["complete-fired"] == 1
    env.wait(6_000)
    assert "Unknown batch" in str(env.s("BATCH", "SHOW", b)) and env.core.batches.finished_at == {}
