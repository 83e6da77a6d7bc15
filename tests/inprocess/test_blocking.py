"""Blocked clients (core/blocking.py): GETJOB served when a queue becomes
ready, over several queues, when a pause clears, a node leaves, FLUSHALL
or a bus message; disconnects; silenced blocking commands."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.types import BLOCKED, NIL_ARRAY, SILENT, Status
from disque.core.memory import BASE_MEMORY

from jobenv import duo, env, from_peer
from support import Session


def test_clearing_out_pause_serves_blocked_clients(env):
    env.s("PAUSE", "q", "out")
    c1, c2 = Session(env.core), Session(env.core)
    assert c1("GETJOB", "FROM", "q") is BLOCKED and c2("GETJOB", "FROM", "q") is BLOCKED
    first, second = env.add("q", "1"), env.add("q", "2")
    assert c1.pending() == [] and env.s("QLEN", "q") == 2
    assert env.s("PAUSE", "q", "in") == Status(b"in")  # out cleared, in set
    assert c1.pending() == [[[b"q", first, b"1"]]] and c2.pending() == [[[b"q", second, b"2"]]]
    env.check()


def test_blocked_on_several_queues_gets_one_job_with_counters(env):
    c1 = Session(env.core)
    assert c1("GETJOB", "WITHCOUNTERS", "COUNT", 3, "FROM", "a", "b", "a") is BLOCKED
    assert env.core.blocking.blocked[c1.client.id].queues == (b"a", b"b")
    job_id = env.add("b", "x")
    assert c1.pending() == [[[b"b", job_id, b"x", b"nacks", 0, b"additional-deliveries", 0]]]
    assert dict(env.s("QSTAT", "a"))[b"blocked"] == 0
    env.check()


def test_getjob_rounds_over_queues(env):
    a = [env.add("a", f"a{i}") for i in range(3)]
    b = env.add("b", "b0")
    reply = env.s("GETJOB", "NOHANG", "COUNT", 10, "FROM", "a", "b", "a")
    assert [e[1] for e in reply] == [a[0], b, a[1], a[2]]
    c = [env.add("c", f"c{i}") for i in range(2)]
    assert [e[1] for e in env.s("GETJOB", "COUNT", 1, "FROM", "c", "missing")] == c[:1]
    assert env.s("QSTAT", "missing") is NIL_ARRAY  # COUNT reached before it was looked at


def test_leaving_node_answers_blocked_clients_and_refuses_to_block(env):
    c1 = Session(env.core)
    assert c1("GETJOB", "FROM", "q") is BLOCKED
    assert env.s("CLUSTER", "LEAVING", "yes") == Status(b"OK")
    env.wait(100)
    assert [e.code for e in c1.pending()] == ["LEAVING"]
    assert env.s("GETJOB", "FROM", "q").code == "LEAVING"
    assert env.s("GETJOB", "NOHANG", "FROM", "q") is NIL_ARRAY
    assert env.s("ADDJOB", "q", "x", 0).message.endswith("reason: I'm leaving the cluster")
    env.s("CLUSTER", "LEAVING", "no")
    assert isinstance(env.s("ADDJOB", "q", "x", 0), Status)


def test_flushall_answers_blocked_clients_and_forgets_queues(env):
    for name in ("a", "b"):
        env.add(name, "x")
    env.s("PAUSE", "p", "all")
    c1 = Session(env.core)
    c1("GETJOB", "FROM", "empty")
    assert env.s("DEBUG", "FLUSHALL") == Status(b"OK")
    assert c1.pending() == [NIL_ARRAY]
    assert env.s("QSCAN", "BUSYLOOP") == [b"0", []] and env.s("PAUSE", "p", "state") == Status(b"none")
    assert env.core.memory.used == BASE_MEMORY
    env.check()


def test_disconnect_is_idempotent_and_keeps_other_waiters(env):
    c1, c2 = Session(env.core), Session(env.core)
    c1("GETJOB", "FROM", "q")
    c2("GETJOB", "FROM", "q")
    env.core.disconnect(c1.client.id)
    env.core.disconnect(c1.client.id)
    env.core.disconnect(env.s.client.id)  # not blocked
    job_id = bytes(Session(env.core)("ADDJOB", "q", "x", 0))
    assert c2.pending() == [[[b"q", job_id, b"x"]]]


def test_bus_message_serves_blocked_clients(duo):
    job_id = duo.add("q", "x", "REPLICATE", 1, "DELAY", 30)
    consumer = Session(duo.core)
    assert consumer("GETJOB", "FROM", "q") is BLOCKED
    from_peer(duo, m.Enqueue(job_id, 0))
    assert consumer.pending() == [[[b"q", job_id, b"x"]]]


@pytest.mark.parametrize("mode", ["OFF", "SKIP"])
def test_silenced_blocking_command_stays_silent_when_served(env, mode):
    consumer = Session(env.core)
    consumer("CLIENT", "REPLY", mode)
    assert consumer("GETJOB", "FROM", "q") is BLOCKED
    env.add("q", "x")
    assert consumer.pending() == [SILENT] and consumer.client.waiter is None  # no reply, but the session resumes
    assert consumer("PING") == (Status(b"PONG") if mode == "SKIP" else SILENT)
    producer = Session(env.core)
    producer("CLIENT", "REPLY", "OFF")
    producer("ADDJOB", "q", "y", 0)
    assert producer.client.mute_next is False  # it did not block: nothing to drop later
