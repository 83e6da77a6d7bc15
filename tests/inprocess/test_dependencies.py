"""Jobs that wait for jobs (ADDJOB ... AFTER, core/dependencies.py): held
until every parent is acknowledged, ON-PARENT-FAIL for a parent that goes
without that, on one node, on the fake-clock mesh and through the AOF."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.dependencies import DEPEND_EVERY_MS
from disque.core.effects import AofAppend
from disque.core.homes import home
from disque.core.types import BLOCKED
from disque.store.job_options import MAX_PARENTS

from invariants import check_core
from jobenv import EVEN_ID, ODD_ID, duo, env, from_peer, make_env  # noqa: F401
from support import Session, make_core, replay
from test_mesh_cluster import added, formed, holders


def fetch_ack(env, queue="q", result=None) -> bytes:
    ((_, job_id, _),) = env.s("GETJOB", "NOHANG", "FROM", queue)
    env.s("ACKJOB", job_id, *(("RESULT", result) if result is not None else ()))
    return job_id


def test_a_chain_runs_one_job_after_the_other(env):
    a = env.add("q", "a")
    b = env.add("q", "b", "AFTER", a)
    c = env.add("q", "c", "AFTER", b, "ON-PARENT-FAIL", "drop")
    assert [env.state(x) for x in (a, b, c)] == ["queued", "active", "active"]
    shown = env.show(c)
    assert shown["waits-for"] == [b] and shown["on-parent-fail"] == "drop" and shown["next-requeue-within"] is None
    assert env.s("ENQUEUE", b) == 0  # held: nothing queues it
    assert fetch_ack(env, result="ra") == a
    assert [env.state(x) for x in (b, c)] == ["queued", "active"] and "waits-for" not in env.show(b)
    assert env.show(b)["after"] == [a] and env.show(c)["after"] == [b]  # kept once released
    assert env.s("RESULT", a) == b"ra"  # what b's consumer reads
    assert fetch_ack(env) == b
    assert env.state(c) == "queued"
    env.check()


def test_fan_in_waits_for_every_parent(env):
    parents = [env.add("q", f"p{i}") for i in range(3)]
    child = env.add("done", "c", "AFTER", parents[0], "after", parents[1], "AFTER", parents[2], "AFTER", parents[0])
    assert env.show(child)["waits-for"] == parents  # each listed once
    for _ in parents[:2]:
        fetch_ack(env)
    assert env.state(child) == "active"
    env.s("FASTACK", parents[2])
    assert env.state(child) == "queued"
    env.check()


def test_a_parent_already_acknowledged_releases_the_child_at_once(env):
    a = env.add("q", "a")
    fetch_ack(env)  # collected at once on one node: its ID is remembered
    assert env.state(env.add("q", "b", "AFTER", a)) == "queued"
    env.core.collected.clear()  # forgotten, but its result is kept
    b = env.add("q", "b")
    env.s("ACKJOB", b, "RESULT", "r")
    env.core.collected.clear()
    assert env.state(env.add("q", "c", "AFTER", b)) == "queued"
    held = env.add("q", "d", "AFTER", EVEN_ID)  # a parent nobody knows: held until its TTL
    assert env.state(held) == "active"
    env.check()


@pytest.mark.parametrize(
    "policy, outcome",
    [(None, "dead-lettered"), ("fail", "dead-lettered"), ("run", "queued"), ("drop", "gone")],
)
@pytest.mark.parametrize("how", ["expired", "dead-lettered"])
def test_a_parent_that_fails_applies_the_childs_policy(policy, outcome, how):
    env = make_env()
    parent = env.add("q", "p", "TTL", 5) if how == "expired" else env.add("q", "p", "MAXATTEMPTS", 1)
    child = env.add("kids", "c", "AFTER", parent, *(("ON-PARENT-FAIL", policy) if policy else ()))
    if how == "expired":
        env.wait(6_000)
    else:
        ((_, job_id, _),) = env.s("GETJOB", "NOHANG", "FROM", "q")
        env.s("NACK", job_id)  # its last attempt: dead-lettered
    state = env.state(child)
    if outcome == "dead-lettered":
        assert state is None
        ((_, dead_id, _),) = env.s("GETJOB", "NOHANG", "FROM", "kids-dead")
        shown = env.show(dead_id)
        assert shown["dead-letter-of"] == child and shown["error-type"] == b"ParentFailed" and parent in shown["error-message"]
    else:
        assert state == {"queued": "queued", "gone": None}[outcome]
        assert env.s("QLEN", "kids-dead") == 0
    env.check()


@pytest.mark.parametrize(
    "args, error",
    [
        (("ON-PARENT-FAIL", "run"), "ON-PARENT-FAIL needs AFTER"),
        (("AFTER", ODD_ID, "ON-PARENT-FAIL", "maybe"), "must be fail, run or drop"),
        (("AFTER", "D-nope"), "BADID"),
        (("AFTER",), "syntax error"),
        (tuple(x for i in range(MAX_PARENTS + 1) for x in ("AFTER", "DI%040x05a1SQ" % i)), f"at most {MAX_PARENTS}"),
    ],
)
def test_after_errors(env, args, error):
    reply = env.s("ADDJOB", "q", "b", 0, *args)
    assert isinstance(reply, Exception) and error.lower() in str(reply).lower()
    assert env.s("QLEN", "q") == 0


def test_a_schedule_takes_no_after(env):
    reply = env.s("SCHEDULE", "ADD", "s", "q", "b", "EVERY", 1000, "AFTER", ODD_ID)
    assert isinstance(reply, Exception) and "AFTER and BATCH do not apply" in str(reply)


def test_a_child_gone_before_its_parent_is_forgotten(env):
    a = env.add("q", "a")
    b = env.add("q", "b", "AFTER", a)
    assert env.s("DELJOB", b) == 1
    fetch_ack(env)
    assert env.core.deps.held == {} and env.show(b) is None
    env.check()


def test_the_aof_keeps_a_child_held_until_its_release_is_logged(env):
    env.core.aof.state = "on"
    a = env.add("q", "a")
    b = env.add("q", "b", "AFTER", a)
    held = b"".join(e.record for e in env.core.out.effects if isinstance(e, AofAppend))
    fetch_ack(env)
    log = b"".join(e.record for e in env.core.out.effects if isinstance(e, AofAppend))
    rewrite = b"".join(encode for encode in env.core.snapshot().records())
    for data, parents in ((held, [a]), (log, None), (rewrite, None)):
        core, clock, _ = make_core()
        clock.ms = env.clock.ms
        replay(core, data)
        shown = Session(core).show(b)
        assert shown.get("waits-for") == parents and shown["after"] == [a]
        check_core(core)


# ---------------------------------------------------------------- a cluster


def queued_on(mesh, job_id) -> list[int]:
    return [i for i, state in holders(mesh, job_id).items() if state == "queued"]


def test_a_child_on_other_nodes_is_queued_once_when_its_parent_is_acknowledged_elsewhere():
    mesh = formed(3)
    parent = added(mesh.call(0, "ADDJOB", "q", "p", 0, "REPLICATE", 1))
    child = added(mesh.reply(mesh.call(1, "ADDJOB", "kids", "c", 5000, "REPLICATE", 3, "AFTER", parent)))
    mesh.advance(3 * DEPEND_EVERY_MS)
    assert set(holders(mesh, child).values()) == {"active"}
    assert mesh.core(0).deps.watchers[parent] == {mesh.my_id(1), mesh.my_id(2)}  # the holders asked node 0
    ((_, job_id, _),) = mesh.call(0, "GETJOB", "FROM", "q")
    assert mesh.call(0, "ACKJOB", job_id, "RESULT", "from the parent") == 1
    assert len(queued_on(mesh, child)) == 1
    mesh.advance(20_000)  # the other holders' RETRY timers: still queued once
    assert len(queued_on(mesh, child)) == 1
    (home,) = queued_on(mesh, child)
    assert all(mesh.core(i).jobs.get(child).after == (parent,) for i in holders(mesh, child))  # the copies' too
    assert dict(mesh.call(home, "SHOW", child))[b"after"] == [parent] and mesh.call(home, "RESULT", parent) == b"from the parent"
    for core in mesh.cores:
        check_core(core)


def test_a_holder_that_missed_the_news_asks_again():
    mesh = formed(3)
    parent = added(mesh.call(0, "ADDJOB", "q", "p", 0, "REPLICATE", 1))
    child = added(mesh.call(1, "ADDJOB", "kids", "c", 0, "REPLICATE", 1, "AFTER", parent))
    mesh.lose_next(1, m.Settled)
    ((_, job_id, _),) = mesh.call(0, "GETJOB", "FROM", "q")
    mesh.call(0, "ACKJOB", job_id)
    assert holders(mesh, child) == {1: "active"}
    mesh.advance(DEPEND_EVERY_MS + 200)  # asked again: node 0 remembers the ACK
    assert holders(mesh, child) == {1: "queued"}


def test_a_child_made_after_its_parent_was_acknowledged_elsewhere_runs_at_once():
    mesh = formed(3)
    parent = added(mesh.call(0, "ADDJOB", "q", "p", 0, "REPLICATE", 1))
    ((_, job_id, _),) = mesh.call(0, "GETJOB", "FROM", "q")
    mesh.call(0, "ACKJOB", job_id)
    child = added(mesh.reply(mesh.call(1, "ADDJOB", "kids", "c", 5000, "REPLICATE", 2, "AFTER", parent)))
    assert len(queued_on(mesh, child)) == 1


def test_a_failed_parent_dead_letters_the_child_once_in_the_cluster():
    mesh = formed(3)
    parent = added(mesh.call(0, "ADDJOB", "q", "p", 0, "REPLICATE", 1, "TTL", 5))
    child = added(mesh.reply(mesh.call(1, "ADDJOB", "kids", "c", 5000, "REPLICATE", 3, "AFTER", parent)))
    mesh.advance(6_000)
    assert holders(mesh, child) == {}
    assert sum(mesh.call(i, "QLEN", "kids-dead") for i in range(3)) == 1


def test_a_child_whose_copies_are_being_made_is_queued_once_they_are():
    mesh = formed(3)
    parent = added(mesh.call(0, "ADDJOB", "q", "p", 0, "REPLICATE", 1))
    ((_, job_id, _),) = mesh.call(0, "GETJOB", "FROM", "q")
    mesh.call(0, "ACKJOB", job_id)
    mesh.lose_next(0, m.GotJob)  # the level is reached late: node 0 knows the parent's fate first
    client = mesh.call(0, "ADDJOB", "kids", "c", 5000, "REPLICATE", 3, "AFTER", parent)
    assert mesh.reply(client) is None  # waiting for its copies, though its parent is known acknowledged
    mesh.advance(3_000)
    child = added(mesh.reply(client))
    assert len(queued_on(mesh, child)) == 1


def test_a_child_released_while_its_creator_waits_for_its_copies_runs_only_after_its_addjob_is_answered():
    """Its creator queues it once the copies are made, even when another
    holder comes first in its order: a copy queued before would run, and be
    acknowledged, while ADDJOB still waits (and then fails, NOREPL)."""
    mesh = formed(3)
    ids = [mesh.my_id(i) for i in range(3)]
    parent = added(mesh.reply(mesh.call(0, "ADDJOB", "q", "p", 0, "REPLICATE", 3)))
    seen = {parent}
    for _ in range(20):  # a child whose first holder is not its creator, node 1
        mesh.lose_next(1, m.GotJob)  # its level is reached late
        client = mesh.call(1, "ADDJOB", "kids", "c", 5000, "REPLICATE", 3, "RETRY", 60, "AFTER", parent)
        (child,) = {job.id for job in mesh.core(2).jobs.values()} - seen
        seen.add(child)
        if home(child, ids) != ids[1]:
            break
    assert mesh.reply(client) is None and home(child, ids) != ids[1]
    ((_, job_id, _),) = mesh.call(0, "GETJOB", "FROM", "q")
    assert mesh.call(0, "ACKJOB", job_id) == 1
    assert queued_on(mesh, child) == [] and mesh.reply(client) is None  # released, not queued: ADDJOB still waits
    mesh.advance(3_000)
    assert added(mesh.reply(client)) == child and queued_on(mesh, child) == [1]
    mesh.advance(20_000)  # the other holders' RETRY timers: still queued once
    assert len(queued_on(mesh, child)) == 1
    for core in mesh.cores:
        check_core(core)


def test_a_child_whose_creator_is_down_is_queued_by_the_first_of_its_other_holders():
    mesh = formed(3)
    ids = [mesh.my_id(i) for i in range(3)]
    parent = added(mesh.reply(mesh.call(0, "ADDJOB", "q", "p", 0, "REPLICATE", 3)))
    child = added(mesh.reply(mesh.call(1, "ADDJOB", "kids", "c", 5000, "REPLICATE", 3, "RETRY", 60, "AFTER", parent)))
    mesh.kill(1)
    mesh.wait_for(lambda: ids[1] not in mesh.core(0).membership.up_ids() + mesh.core(2).membership.up_ids(), 10_000)
    ((_, job_id, _),) = mesh.call(0, "GETJOB", "FROM", "q")
    assert mesh.call(0, "ACKJOB", job_id) == 1
    assert queued_on(mesh, child) == [ids.index(home(child, ids[::2]))]  # at once, by the first of the others


def test_every_holder_of_a_parent_tells_its_watchers():
    """A parent with two copies: the holder that hears of a FASTACK through
    DELJOB tells the child's node too (SETTLED twice changes nothing)."""
    mesh = formed(3)
    parent = added(mesh.reply(mesh.call(0, "ADDJOB", "q", "p", 5000, "REPLICATE", 2)))
    (other,) = set(holders(mesh, parent)) - {0}
    child_node = ({0, 1, 2} - {0, other}).pop()
    child = added(mesh.call(child_node, "ADDJOB", "kids", "c", 0, "REPLICATE", 1, "AFTER", parent))
    assert mesh.core(other).deps.watchers[parent] == {mesh.my_id(child_node)}
    mesh.lose_next(child_node, m.Settled)  # node 0's news is lost: the other holder's reaches it
    assert mesh.call(0, "FASTACK", parent) == 1
    assert holders(mesh, child) == {child_node: "queued"} and parent not in mesh.core(other).deps.watchers


def test_info_workflows_counts_held_released_and_failed(env):
    a, b = env.add("q", "a"), env.add("q", "b", "TTL", 5)
    env.add("q", "c", "AFTER", a)
    env.add("q", "d", "AFTER", b, "ON-PARENT-FAIL", "run")
    info = env.core.deps.info_fields()
    assert dict(info)["jobs_held"] == 2 and b"jobs_held:2" in env.s("INFO", "workflows")
    fetch_ack(env, result="ra")
    env.wait(6_000)
    assert dict(env.core.deps.info_fields()) == {
        "jobs_held": 0, "jobs_released": 2, "parents_failed": 1, "parents_watched": 0, "results_kept": 1, "results_bytes": 2,
    }


def test_an_acknowledged_parent_that_expires_before_its_collection_is_no_failure(duo):
    assert Session(duo.core)("ADDJOB", "q", "p", 0, "REPLICATE", 2, "TTL", 5) is BLOCKED
    (repl,) = duo.sent()
    parent = repl.job["id"]
    from_peer(duo, m.GotJob(parent))
    child = duo.add("kids", "c", "REPLICATE", 1, "AFTER", parent, "ON-PARENT-FAIL", "drop")
    assert duo.s("ACKJOB", parent) == 1  # the peer never confirms: the acked record waits
    assert duo.state(child) == "queued"
    duo.wait(6_000)  # the acked record expires
    assert duo.state(parent) is None and duo.state(child) == "queued" and duo.core.deps.failed == 0
