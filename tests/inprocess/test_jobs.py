"""The single-node job lifecycle, driven through commands with a fake clock."""

from __future__ import annotations

import pytest

from disque.core.types import BLOCKED, NIL_ARRAY, Map, Status
from support import NODE_ID, Session, make_core


@pytest.fixture
def env():
    core, clock, host = make_core()
    return core, clock, Session(core)


def tick(core, clock, ms):
    """Advance time in small steps, running the scheduler as the shell would."""
    end = clock.ms + ms
    while clock.ms < end:
        clock.ms = min(end, max(clock.ms + 1, core.next_deadline()))
        core.tick()


def add(s, queue="q", body="b", *opts):
    reply = s("ADDJOB", queue, body, 0, *opts)
    assert isinstance(reply, Status), reply
    return bytes(reply)


def test_addjob_returns_status_id_and_queues(env):
    core, clock, s = env
    job_id = add(s, "q", "hello")
    assert len(job_id) == 48 and job_id.startswith(b"DI" + NODE_ID[:8].encode()) and job_id.endswith(b"SQ")
    assert job_id[42:46] == b"05a1"  # default TTL 1440 min, forced odd (retry > 0)
    assert s("QLEN", "q") == 1
    info = s.show(job_id)
    assert info["state"] == "queued" and info["repl"] == 1 and info["retry"] == 300 and info["ttl"] == 86400
    assert info["nodes-delivered"] == [NODE_ID] and info["nodes-confirmed"] == []
    assert info["body"] == b"hello" and info["queue"] == b"q"


def test_retry0_id_is_even_and_never_requeued(env):
    core, clock, s = env
    job_id = add(s, "q", "x", "RETRY", 0)
    assert job_id[42:46] == b"05a0"
    assert s("GETJOB", "FROM", "q") == [[b"q", job_id, b"x"]]
    tick(core, clock, 60_000)
    assert s("QLEN", "q") == 0
    assert s.show(job_id)["next-requeue-within"] is None
    assert s("ENQUEUE", job_id) == 0  # at-most-once: never queued again


def test_getjob_requeue_after_retry(env):
    core, clock, s = env
    job_id = add(s, "q", "x", "RETRY", 2)
    assert s("GETJOB", "NOHANG", "FROM", "q") == [[b"q", job_id, b"x"]]
    assert s("GETJOB", "NOHANG", "FROM", "q") is NIL_ARRAY
    tick(core, clock, 1_500)
    assert s("QLEN", "q") == 0
    tick(core, clock, 1_000)
    assert s("QLEN", "q") == 1
    reply = s("GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert reply == [[b"q", job_id, b"x", b"nacks", 0, b"additional-deliveries", 1]]


def test_working_postpones_and_toolate(env):
    core, clock, s = env
    job_id = add(s, "q", "x", "RETRY", 5, "TTL", 20)
    s("GETJOB", "FROM", "q")
    tick(core, clock, 4_000)
    assert s("WORKING", job_id) == 5
    tick(core, clock, 4_000)
    assert s("QLEN", "q") == 0  # postponed by a whole retry period
    tick(core, clock, 3_000)
    assert s("WORKING", job_id).code == "TOOLATE"
    assert s("WORKING", b"DI" + b"0" * 44 + b"SQ").code == "NOJOB"
    assert s("WORKING", "bad").code == "BADID"


def test_ttl_expiry_window(env):
    core, clock, s = env
    job_id = add(s, "q", "x", "TTL", 5, "RETRY", 1)
    tick(core, clock, 3_999)
    assert s.show(job_id) is not None
    tick(core, clock, 3_000)
    assert s.show(job_id) is None
    assert s("QLEN", "q") == 0


def test_delay_queues_later(env):
    core, clock, s = env
    job_id = add(s, "q", "x", "DELAY", 2)
    assert s("QLEN", "q") == 0 and s.show(job_id)["state"] == "active"
    tick(core, clock, 2_100)
    assert s("QLEN", "q") == 1


def test_ack_deletes_single_copy(env):
    core, clock, s = env
    job_id = add(s)
    assert s("ACKJOB", job_id) == 1
    assert s.show(job_id) is None
    assert s("ACKJOB", job_id) == 0  # unknown, single node: no dummy ack
    assert s("ACKJOB", job_id, "bad").code == "BADID"
    assert s("ACKJOB") == 0


def test_nack_counts_and_requeues(env):
    core, clock, s = env
    job_id = add(s)
    s("GETJOB", "FROM", "q")
    assert s("NACK", job_id) == 1
    assert s("NACK", job_id) == 0  # already queued
    assert s.show(job_id)["nacks"] == 1
    assert s("QLEN", "q") == 1


def test_enqueue_dequeue_deljob_fastack(env):
    core, clock, s = env
    a, b = add(s), add(s)
    assert s("DEQUEUE", a, b) == 2 and s("QLEN", "q") == 0
    assert s("ENQUEUE", a) == 1 and s("QLEN", "q") == 1
    assert s.show(a)["additional-deliveries"] == 1  # queued before: counted
    assert s("DELJOB", a) == 1 and s("FASTACK", b) == 1
    assert s("INFO", "jobs") == b"# Jobs\r\nregistered_jobs:0\r\n"


def test_queue_order_by_ctime_with_requeue(env):
    core, clock, s = env
    ids = [add(s, "q", str(i)) for i in range(5)]
    s("DEQUEUE", ids[1], ids[3])
    s("ENQUEUE", ids[3], ids[1])
    assert [e[1] for e in s("QPEEK", "q", 10)] == ids
    assert [e[1] for e in s("QPEEK", "q", -2)] == [ids[4], ids[3]]
    assert s("QPEEK", "q", 0) == [] and s("QPEEK", "nope", 3) == []
    assert s("QPEEK", "q", "x").message == "value is not an integer or out of range"


def test_maxlen_and_pause(env):
    core, clock, s = env
    add(s)
    add(s)
    assert s("ADDJOB", "q", "b", 0, "MAXLEN", 2).code == "MAXLEN"
    assert s("PAUSE", "q", "in") == Status(b"in")
    assert s("ADDJOB", "q", "b", 0).code == "PAUSED"
    assert s("PAUSE", "q", "none", "out") == Status(b"out")
    assert s("GETJOB", "NOHANG", "FROM", "q") is NIL_ARRAY
    assert s("PAUSE", "q", "state") == Status(b"out")
    assert s("PAUSE", "missing", "none") == Status(b"none")
    assert s("QSTAT", "missing") is NIL_ARRAY
    assert s("PAUSE", "q", "in", "bogus").message == "syntax error"
    assert s("PAUSE", "q", "state") == Status(b"out")


def test_blocked_clients_fifo_one_job_each(env):
    core, clock, s = env
    c1, c2 = Session(core), Session(core)
    assert c1("GETJOB", "COUNT", 5, "FROM", "q") is BLOCKED
    assert c2("GETJOB", "FROM", "q", "q") is BLOCKED
    assert s("QSTAT", "q")[4] == (b"blocked", 2)
    a = add(s, "q", "1")
    assert c1.pending() == [[[b"q", a, b"1"]]] and c2.pending() == []
    b = add(s, "q", "2")
    assert c2.pending() == [[[b"q", b, b"2"]]]
    assert s("QSTAT", "q")[4] == (b"blocked", 0)


def test_blocked_timeout_and_disconnect(env):
    core, clock, s = env
    c1, c2 = Session(core), Session(core)
    assert c1("GETJOB", "TIMEOUT", 250, "FROM", "q") is BLOCKED
    assert c2("GETJOB", "FROM", "q") is BLOCKED
    core.disconnect(c2.client.id)
    tick(core, clock, 400)
    assert c1.pending() == [NIL_ARRAY]
    job_id = add(s)
    assert s("QLEN", "q") == 1  # nobody left waiting: the job stays queued
    assert s.show(job_id)["state"] == "queued"


def test_idle_queue_collected(env):
    core, clock, s = env
    s("GETJOB", "NOHANG", "FROM", "tmp")
    assert s("QSCAN", "BUSYLOOP") == [b"0", [b"tmp"]]
    tick(core, clock, 301_000)
    assert s("QSCAN") == [b"0", []]


def test_dummy_ack_never_on_single_node(env):
    core, clock, s = env
    assert s("ACKJOB", b"DI" + b"a" * 40 + b"05a1SQ") == 0
    assert s("INFO", "jobs").endswith(b"registered_jobs:0\r\n")


def test_jscan_filters_and_reply_all(env):
    core, clock, s = env
    a = add(s, "q1")
    b = add(s, "q2")
    s("GETJOB", "FROM", "q2")
    cursor, items = s("JSCAN", "BUSYLOOP", "STATE", "active")
    assert cursor == b"0" and items == [Status(b)] and isinstance(items[0], Status)
    cursor, items = s("JSCAN", "QUEUE", "q1", "REPLY", "all")
    assert len(items) == 1 and isinstance(items[0], Map) and dict(items[0])[b"id"] == a
    assert s("JSCAN", "STATE", "bogus").message == "Invalid job state name"
    assert s("JSCAN", "REPLY", "x").message == "Invalid REPLY type, try ID or ALL"
    assert s("JSCAN", "0", "0").message == "syntax error"
    assert s("JSCAN", "COUNT").message == "invalid cursor or option name"
    assert s("SCANJOBS", "BUSYLOOP") == s("JSCAN", "BUSYLOOP")


def test_jscan_cursor_iteration_returns_everything(env):
    core, clock, s = env
    ids = {add(s, "q", str(i)) for i in range(300)}
    seen, cursor = set(), b"0"
    calls = 0
    while True:
        cursor, items = s("JSCAN", cursor, "COUNT", 10)
        seen.update(bytes(i) for i in items)
        calls += 1
        if cursor == b"0":
            break
    assert seen == ids and calls > 1
