"""Consumer groups (core/groups.py, protocols/resp/groups.py) under the fake
clock: every command of bananaq's interface with its exact replies and
errors, the group state machine (fresh, in progress, redo, done), QNOTIFY,
the AOF records and their replay; then whole nodes on the mesh: claims to
an event's server, progress on every holder, a server that dies, flushes."""

from __future__ import annotations

from typing import Any

import pytest

from disque.cluster import messages as m
from disque.store.records import job_from_wire, job_to_wire
from disque.core.effects import AofAppend
from disque.core.groups import CLAIM_MS, EventQueue, _Ask, event_id
from disque.core.types import BLOCKED, NIL_ARRAY, Waiter
from disque.protocols.resp.encoder import encode
from disque.core.replay import Replay
from disque.store.aof import AofCorrupt, check_record
from disque.store.job import EVENT
from invariants import check_core
from mesh import Mesh
from support import ClockedSession, Session, make_core, replay

FIGURES = (b"total", b"inprogress", b"redo", b"done", b"available", b"consumers")


@pytest.fixture
def env() -> ClockedSession:
    return ClockedSession()


def advance(s: ClockedSession, ms: int) -> None:
    s.clock.advance(ms)
    s.core.tick()


def figures(s: Session, queue: str, group: str) -> dict[str, int]:
    """QSTATUS of one queue and group as a dict."""
    [[name, [g, flat]]] = s("QSTATUS", queue, "GROUPS", group)
    assert (name, g) == (queue.encode(), group.encode()) and flat[::2] == list(FIGURES)
    return {k.decode(): v for k, v in zip(flat[::2], flat[1::2])}


def bodies(s: Session, queue: str, group: str, *ex: Any) -> list[bytes]:
    """QGET until nil: the bodies, in the order they came."""
    out = []
    while (got := s("QGET", queue, group, *ex)) is not None:
        out.append(got[1])
    return out


# ---------------------------------------------------------------- one node


def test_every_group_sees_every_event_once_and_ids_increase(env):
    ids = [env("QADD", "orders", 60, body) for body in ("a", "b", "c")]
    assert all(i.isdigit() for i in ids) and ids == sorted(ids, key=int) and len(set(ids)) == 3
    assert env("QGET", "orders", "billing") == [ids[0], b"a"]
    assert bodies(env, "orders", "billing") == [b"b", b"c"]
    assert bodies(env, "orders", "audit") == [b"a", b"b", b"c"]  # a new group sees the older events
    assert env("QGET", "orders", "billing") is None and env("QGET", "nothing", "billing") is None
    assert env.raw("QGET", "orders", "billing") == b"$-1\r\n"
    assert env.raw("QADD", "orders", 60, "d").startswith(b"$28\r\n")  # a bulk string, not a status


def test_ack_holds_within_the_deadline_only(env):
    first = env("QADD", "q", 60, "x")
    env("QADD", "q", 60, "y")
    assert env("QGET", "q", "g", "EX", "0.5")[0] == first
    assert env("QACK", "q", "other", first) == 0  # handed to another group
    assert env("QACK", "q", "g", first) == 1 and env("QACK", "q", "g", first) == 0  # already acked
    late = env("QGET", "q", "g", "EX", 1)[0]
    advance(env, 1001)
    assert env("QACK", "q", "g", late) == 0  # past its deadline, redo now
    assert env("QACK", "q", "g", "123") == 0 and env("QACK", "nope", "g", first) == 0
    assert figures(env, "q", "g") == {"total": 2, "inprogress": 0, "redo": 1, "done": 1, "available": 0, "consumers": 0}
    assert env("QGET", "q", "g")[0] == late  # the acknowledged event's timer passed too: skipped


def test_ex_zero_acknowledges_at_once(env):
    e = env("QADD", "q", 60, "x")
    assert env("QGET", "q", "g", "EX", 0) == [e, b"x"]
    assert env("QACK", "q", "g", e) == 0 and env("QGET", "q", "g") is None
    advance(env, 60_000 - 1)
    assert figures(env, "q", "g")["done"] == 1


def test_redo_comes_first_lowest_id_first(env):
    for body in "abcd":
        env("QADD", "q", 600, body)
    assert bodies(env, "q", "g", "EX", 2) == [b"a", b"b", b"c", b"d"]  # all four in progress
    advance(env, 2_001)
    assert figures(env, "q", "g")["redo"] == 4  # overdue counts as redo at once
    env("QADD", "q", 600, "e")
    assert [env("QGET", "q", "g", "EX", 30)[1] for _ in range(5)] == [b"a", b"b", b"c", b"d", b"e"]
    assert figures(env, "q", "g") == {"total": 5, "inprogress": 5, "redo": 0, "done": 0, "available": 0, "consumers": 0}


def test_the_default_ack_window_is_thirty_seconds(env):
    e = env("QADD", "q", 600, "x")
    assert env("QGET", "q", "g", "EX") == [e, b"x"]  # EX without a value: ignored
    advance(env, 30_000)
    assert env("QGET", "q", "g") is None
    advance(env, 1)
    assert env("QGET", "q", "g", "junk", "words") == [e, b"x"]


def test_an_expired_event_is_gone_for_every_purpose(env):
    e = env("QADD", "q", "0.5", "short")
    env("QADD", "q", 60, "long")
    assert env("QGET", "q", "g", "EX", 60) == [e, b"short"]
    env.clock.advance(1_000)  # expired, not yet collected: already invisible
    assert env("QACK", "q", "g", e) == 0 and figures(env, "q", "g")["total"] == 1
    assert bodies(env, "q", "fresh") == [b"long"]
    for _ in range(70):
        env("QADD", "q", "0.5", "brief")
    advance(env, 2_000)
    assert len(env.core.groups.queues[b"q"].ids) < 10  # the IDs of gone events are compacted away
    advance(env, 60_000)
    assert env("QSTATUS") == [] and env.core.groups.queues == {}


def test_qadd_forms(env):
    never = env("QADD", "q", 0, "never seen")
    assert never.isdigit() and env("QADD", "q", -5, "x", "NOBLOCK") == b"OK"
    assert env("QSTATUS") == [] and len(env.core.jobs) == 0
    assert env("QADD", "q", 10, "x", "noblock") == b"OK" and int(env("QADD", "q", 10, "y", "other")) > int(never)
    assert env("QADD", "q", f"@{env.clock.ms / 1000 + 30}", "z").isdigit()
    events = env.core.groups.queues[b"q"].events.values()
    assert sorted(j.etime - env.clock.ms // 1000 for j in events) == [10, 10, 30]
    assert all(j.flags & EVENT and not j.retry and not j.qtime for j in events)
    assert env("QLEN", "q") == 0 and env("GETJOB", "NOHANG", "FROM", "q") is NIL_ARRAY  # never queued


@pytest.mark.parametrize(
    "argv, error",
    [
        (["QADD", "q", "1"], "insufficient arguments"),
        (["QGET", "q"], "insufficient arguments"),
        (["QACK", "q", "g"], "insufficient arguments"),
        (["QNOTIFY", "g"], "insufficient arguments"),
        (["QFLUSH"], "insufficient arguments"),
        (["QADD", "q", "", "x"], "empty expire string"),
        (["QADD", "q", "1x", "x"], 'strconv.ParseFloat: parsing "1x": invalid syntax'),
        (["QADD", "q", "@", "x"], 'strconv.ParseFloat: parsing "": invalid syntax'),
        (["QADD", "q", b'"\xff\n', "x"], 'strconv.ParseFloat: parsing "\\"\ufffd\\x0a": invalid syntax'),
        (["QGET", "q", "g", "EX", "soon"], 'strconv.ParseFloat: parsing "soon": invalid syntax'),
        (["QGET", "q", "g", "EX", "-1"], "bad expires value: -1 < 0"),
        (["QACK", "q", "g", "12a"], "invalid ID string"),
        (["QACK", "q", "g", "1" * 41], "invalid ID string"),
        (["QNOTIFY", "g", "x", "q"], 'bad timeout value: strconv.ParseFloat: parsing "x": invalid syntax'),
        (["QNOTIFY", "g", "-2", "q"], "bad timeout value: -2 < 0"),
    ],
)
def test_bad_arguments_get_bananaqs_errors(env, argv, error):
    reply = env(*argv)
    assert str(reply) == f"ERR {error}"
    assert env.raw(*argv) == f"-ERR {error}\r\n".encode()


def test_times_take_go_floats(env):
    for raw in ("1", "+1.5", ".5", "2.", "1e1", "1E+1"):
        assert env("QADD", "q", raw, "x").isdigit()
    assert env("QADD", "q", "1e99", "x").isdigit()  # clamped, not an overflow


def test_qstatus_and_qinfo_shapes(env):
    env("QADD", "b", 60, "x")
    env("QADD", "a", 60, "y")
    env("QGET", "b", "g2")
    env("QGET", "b", "g1", "EX", 0)
    zero = [b"total", 0, b"inprogress", 0, b"redo", 0, b"done", 0, b"available", 0, b"consumers", 0]
    assert env("QSTATUS") == [
        [b"a", []],
        [b"b", [
            b"g1", [b"total", 1, b"inprogress", 0, b"redo", 0, b"done", 1, b"available", 0, b"consumers", 0],
            b"g2", [b"total", 1, b"inprogress", 1, b"redo", 0, b"done", 0, b"available", 0, b"consumers", 0],
        ]],
    ]  # fmt: skip
    assert env("QSTATUS", "zz", "a", "zz", "groups", "g9") == [[b"zz", [b"g9", zero]], [b"a", [b"g9", zero[:1] + [1] + zero[2:8] + [b"available", 1, b"consumers", 0]]], [b"zz", [b"g9", zero]]]
    assert env("QSTATUS", "GROUPS") == [[b"a", []], [b"b", []]]
    assert env.raw("QSTATUS", "a") == b"*1\r\n*2\r\n$1\r\na\r\n*0\r\n"
    assert env("QINFO") == [b"a total:1", b"b g1 total:1 inprogress:0 redo:0 done:1 available:0 consumers:0",
                            b"b g2 total:1 inprogress:1 redo:0 done:0 available:0 consumers:0"]  # fmt: skip
    env.client.proto = 3
    assert env.raw("QSTATUS", "a", "GROUPS", "g") == b"*1\r\n*2\r\n$1\r\na\r\n*2\r\n$1\r\ng\r\n*12\r\n" + b"".join(
        encode(v, 3) for v in [b"total", 1, b"inprogress", 0, b"redo", 0, b"done", 0, b"available", 1, b"consumers", 0]
    )


def test_qflush_removes_events_and_progress(env):
    e = env("QADD", "q", 60, "x")
    env("QGET", "q", "g")
    env.core.out.effects.clear()
    assert env("QFLUSH", "q") == b"OK" and env("QFLUSH", "unknown") == b"OK"
    assert env("QACK", "q", "g", e) == 0 and env("QSTATUS") == [] and len(env.core.jobs) == 0
    env("QADD", "q", 60, "y")
    assert bodies(env, "q", "g") == [b"y"]
    other = Session(env.core)
    other("QNOTIFY", "g", 10, "waited")
    assert env("QFLUSH", "waited") == b"OK" and b"waited" in env.core.groups.waiting  # its waiter stays
    env("QADD", "waited", 60, "z")
    assert other.pending() == [b"waited"] and not env.core.groups.waiting


@pytest.mark.parametrize("policy", ["acks", "noeviction"])
def test_no_new_group_at_the_refusal_level_while_existing_groups_go_on(env, policy):
    """Over 95 % of maxmemory with nothing to evict (events never are), a
    client may not make a new group (-OOM, as Redis refuses a new consumer
    group) but the groups there are keep reading, acknowledging and
    waiting; progress a peer sends is kept whatever the level."""
    first, second = (env("QADD", "q", 60, body) for body in ("a", "b"))
    assert env("QGET", "q", "old", "EX", 60) == [first, b"a"]
    env.core.config.maxmemory_policy = policy
    env.core.config.maxmemory = (env.core.memory.used - 1) * 100 // 95 // 100 * 100
    assert env.core.memory.level() == 2
    for argv in (("QGET", "q", "new"), ("QNOTIFY", "new", 0, "q"), ("QRPEEK", "q"), ("QADD", "q", 60, "c")):
        assert env(*argv).code == "OOM", argv
    assert env("QGET", "unknown", "new") is None  # no queue: no group is made
    assert env("QNOTIFY", "old", 0, "q") == b"q" and env("QGET", "q", "old") == [second, b"b"]
    assert env("QACK", "q", "old", first) == 1
    job_id = next(job.id for job in env.core.jobs.values() if event_id(job.id) == int(first))
    env.core.groups.on_group_set("peer", m.GroupSet(job_id, b"theirs", 0))
    assert [g for g, _ in env.core.groups.status([b"q"], None)[0][2]] == [b"old", b"theirs"]
    check_core(env.core)
    env.core.config.maxmemory = 1 << 30
    assert env("QGET", "q", "new") == [first, b"a"]
    check_core(env.core)


def test_okq_commands_read_as_one_group(env):
    assert env("QRPOP", "jobs") is None and env("QRPEEK", "jobs") is None and env("QLPEEK", "jobs") is None
    first = env("QADD", "jobs", 60, "a")
    env.clock.advance(1)
    env("QADD", "jobs", "0.5", "b")
    assert env("QRPEEK", "jobs") == [first, b"a"] and env("QLPEEK", "jobs")[1] == b"b"
    assert env("QRPOP", "jobs", "EX", 0) == [first, b"a"]  # acknowledged at once
    got = env("QRPOP", "jobs")[0]
    assert env("QACK", "jobs", got) == 1 and env("QRPEEK", "jobs") is None  # okq's QACK queue id
    env.clock.advance(1_000)
    assert env("QLPEEK", "jobs") == [first, b"a"]  # "b" expired
    assert env("QREGISTER", "other", "jobs", "other") == b"OK" and env.client.registered == [b"other", b"jobs"]
    assert env("QNOTIFY", 5) is BLOCKED  # okq's form: the registered queues, for the okq group
    Session(env.core)("QADD", "other", 60, "c")
    assert env.pending() == [b"other"]
    assert env("QREGISTER") == b"OK" and env.client.registered == []
    assert str(env("QACK", "jobs")) == "ERR insufficient arguments" and str(env("QRPOP")) == "ERR insufficient arguments"
    assert str(env("QACK", "jobs", "g")) == "ERR insufficient arguments"  # not an ID: the three-argument form
    assert figures(env, "jobs", "okq")["done"] == 1  # "b" expired: it is not counted any more


# ---------------------------------------------------------------- QNOTIFY


def test_qnotify_answers_at_once_or_waits_for_a_qadd(env):
    env("QADD", "ready", 60, "x")
    assert env("QNOTIFY", "g", 5, "empty", "ready") == b"ready"
    assert env("QNOTIFY", "g", 0, "empty") is None and b"empty" not in env.core.groups.queues
    env("QGET", "ready", "g")
    other = Session(env.core)
    assert env("QNOTIFY", "g", 5, "empty", "ready") is BLOCKED
    assert figures(other, "ready", "g")["consumers"] == 1 and figures(other, "ready", "h")["consumers"] == 0
    other("QADD", "elsewhere", 60, "no")
    assert env.pending() == []
    other("QADD", "empty", 60, "yes")
    assert env.pending() == [b"empty"]
    assert figures(other, "ready", "g")["consumers"] == 0


def test_qnotify_times_out_with_nil_and_wakes_on_redo(env):
    assert env("QNOTIFY", "g", "0.25") is BLOCKED  # no queues: waits for the whole timeout
    advance(env, 200)
    assert env.pending() == []
    advance(env, 100)
    assert env.pending() == [None]
    env("QADD", "q", 60, "x")
    env("QGET", "q", "g", "EX", 1)
    env("QNOTIFY", "g", 10, "q")
    advance(env, 500)
    assert env.pending() == []
    advance(env, 600)  # the deadline passed: the event is redo, available again
    assert env.pending() == [b"q"]


def test_a_waiting_client_that_leaves_is_forgotten(env):
    other, third = Session(env.core), Session(env.core)
    other("QNOTIFY", "g", 10, "q")
    third("QNOTIFY", "g", 10, "q")
    env.core.disconnect(other.client.id)
    advance(env, 100)
    assert list(env.core.groups.waiting[b"q"]) == [third.client.id]  # the one that left is dropped by the cron
    env("CLUSTER", "RESET", "SOFT")  # every blocked client is answered at once
    third.pending()
    assert third("QNOTIFY", "g", 10, "r") is BLOCKED and list(env.core.groups.waiting) == [b"r"]


def test_a_huge_qnotify_costs_its_own_entries_only(env):
    """A QNOTIFY naming 100,000 queues makes no queue objects; the cron
    looks at the names that hold events, and a QADD on any name answers it."""
    other = Session(env.core)
    names = [f"q{i}" for i in range(100_000)]
    assert other("QNOTIFY", "g", 10, *names) is BLOCKED
    assert env.core.groups.queues == {} and len(env.core.groups.waiting) == 100_000
    advance(env, 200)
    assert other.pending() == []
    env("QADD", "q99999", 60, "x")
    assert other.pending() == [b"q99999"] and env.core.groups.waiting == {} and env.core.groups.notified == {}
    assert other("QNOTIFY", "g", "0.1", "a", "b") is BLOCKED
    env.clock.advance(200)
    env.core.tick()  # timed out: nil; its entries stay until the next cron or QNOTIFY
    assert other.pending() == [None]
    assert other("QNOTIFY", "g", 10, "b") is BLOCKED and set(env.core.groups.waiting) == {b"b"}


# ---------------------------------------------------------------- the AOF


def test_progress_is_logged_and_replayed(env):
    env.core.aof.state = "on"
    a = env("QADD", "q", 600, "a")
    b = env("QADD", "q", 600, "b")
    env("QADD", "q", 600, "c")
    env("QGET", "q", "g", "EX", 0)
    env("QGET", "q", "g", "EX", 60)
    env("QGET", "q", "h")
    env("QACK", "q", "h", a)
    log = b"".join(e.record for e in env.core.out.effects if isinstance(e, AofAppend))
    assert log.count(b"GROUPSET") == 4 and log.count(b"LOADJOB") == 3
    snapshot = env.core.groups.snapshot_records()  # a rewrite: the latest progress of each pair
    assert len(snapshot) == 3 and all(r.startswith(b"*5\r\n$8\r\nGROUPSET\r\n") for r in snapshot)  # sealed (store/aof.py)
    core2, clock2, _ = make_core()
    clock2.ms = env.clock.ms + 1_000
    replay(core2, log + b"".join(env.core.groups.snapshot_records()))  # a rewrite's records after the log: no change
    s2 = Session(core2)
    assert figures(s2, "q", "g") == {"total": 3, "inprogress": 1, "redo": 0, "done": 1, "available": 1, "consumers": 0}
    assert s2("QACK", "q", "g", b) == 1 and s2("QACK", "q", "h", a) == 0
    assert bodies(s2, "q", "g") == [b"c"] and bodies(s2, "q", "h") == [b"b", b"c"]


def test_a_queue_kept_out_of_the_journal_leaves_its_progress_out(env):
    env.core.aof.state = "on"
    env.core.config.queue_config.set_queue(["scratch", "journal", "false"])
    env("QADD", "scratch", 600, "a")
    env("QGET", "scratch", "g")
    assert not [e for e in env.core.out.effects if isinstance(e, AofAppend)]
    assert env.core.groups.snapshot_records() == []


def test_groupset_records_are_checked(env):
    job_id = b"DI" + b"0" * 44 + b"SQ"
    assert check_record(0, [b"GROUPSET", job_id, b"g", b"12"]) is None
    for bad in ([b"GROUPSET", job_id, b"g"], [b"GROUPSET", b"x", b"g", b"1"], [b"GROUPSET", job_id, b"g", b"-1"]):
        with pytest.raises(AofCorrupt):
            check_record(0, bad)
    rep = Replay(env.core.lifecycle, env.core.groups, env.core.settle, env.core.read_clock)
    rep.apply(0, [b"GROUPSET", job_id, b"g", b"1"])  # an event that is not loaded: nothing to do
    assert env.core.groups.queues == {}


def test_info_groups(env):
    env("QADD", "q", 60, "a")
    env("QACK", "q", "g", env("QGET", "q", "g")[0])
    info = env("INFO", "groups")
    assert info == (
        b"# Groups\r\nevent_queues:1\r\nevents:1\r\nconsumer_groups:1\r\ngroup_progress_entries:1\r\n"
        b"events_added:1\r\nevents_handed_out:1\r\nevents_acked:1\r\n"
    )


def test_an_older_event_arriving_late_is_still_fresh(env):
    env("QADD", "q", 600, "first")
    assert env("QNOTIFY", "h", 0, "q") == b"q"  # group h begins at the first event and reads nothing
    advance(env, 10)
    env("QADD", "q", 600, "new")
    assert bodies(env, "q", "g") == [b"first", b"new"]
    peer, peer_clock, _ = make_core(node_id="d" * 40)
    peer_clock.ms = env.clock.ms - 5  # between the two: behind g's cursor, ahead of h's
    peer.read_clock()
    job = peer.groups.new_event(b"q", b"old", 600, 1)
    job.nodes_delivered = (peer.membership.my_id, env.core.membership.my_id)
    env.core.lifecycle.adopt(job_from_wire(job_to_wire(job, peer_clock.ms), env.clock.ms))
    assert event_id(job.id) < int(env("QADD", "q", 600, "newer"))
    assert env.core.groups.queues[b"q"].ids[1] == event_id(job.id)
    # found below the group's cursor; its creator is unknown here, so this holder serves it
    assert bodies(env, "q", "g") == [b"old", b"newer"]
    assert bodies(env, "q", "h") == [b"first", b"old", b"new", b"newer"]


# ---------------------------------------------------------------- the cluster


def formed(n: int = 3) -> Mesh:
    mesh = Mesh(n, node_timeout=1000)
    for i in range(1, n):
        mesh.meet(i, 0)
    mesh.wait_for(lambda: all(len(c.membership.reachable()) == n - 1 for c in mesh.cores if c), 5000)
    return mesh


def held(mesh: Mesh, i: int, queue: bytes, group: bytes) -> dict[int, int]:
    q = mesh.core(i).groups.queues.get(queue)
    g = q.groups.get(group) if q else None
    return dict(g.progress) if g else {}


def test_a_qget_on_any_node_claims_the_event_from_its_server():
    mesh = formed()
    client = mesh.call(0, "QADD", "q", 60, "a")  # waits for its two replicas
    e = mesh.reply(client)
    assert e.isdigit() and all(int(e) in mesh.core(i).groups.queues[b"q"].events for i in range(3))
    mesh.call(0, "QADD", "q", 60, "b")
    waiting = mesh.call(1, "QGET", "q", "g")  # node 0 serves it: a claim
    assert mesh.reply(waiting) == [e, b"a"]
    assert all(list(held(mesh, i, b"q", b"g")) == [int(e)] for i in range(3))  # progress on every holder
    assert mesh.reply(mesh.call(2, "QACK", "q", "g", e)) == 1  # the server's word
    assert all(held(mesh, i, b"q", b"g") == {int(e): 0} for i in range(3))
    assert mesh.call(2, "QACK", "q", "g", e) == 0  # done: no need to ask
    assert mesh.call(0, "QGET", "q", "g")[1] == b"b"
    assert mesh.call(1, "QGET", "q", "g") is None


def test_a_denied_claim_picks_again_with_the_servers_view():
    mesh = formed()
    for body in ("a", "b", "c"):
        mesh.call(0, "QADD", "q", 60, body, "NOBLOCK")
    mesh.lose_next(1, m.GroupSet)  # node 1 does not hear that node 0 handed out "a"
    assert mesh.call(0, "QGET", "q", "g")[1] == b"a"
    client = mesh.call(1, "QGET", "q", "g")  # asks for "a": denied, then asks for "b"
    assert mesh.reply(client)[1] == b"b"
    mesh.lose_next(0, m.Claim)
    client = mesh.call(2, "QGET", "q", "g")
    mesh.advance(CLAIM_MS + 100)  # no answer: nil
    assert client in mesh.replies and mesh.reply(client) is None and not mesh.core(2).groups.asks


def test_a_claim_answered_after_the_client_left_is_dropped():
    mesh = formed()
    mesh.call(0, "QADD", "q", 60, "a", "NOBLOCK")
    mesh.lose_next(0, m.Claim)
    client = mesh.call(1, "QGET", "q", "g", "EX", 1)
    mesh.core(1).disconnect(client)
    mesh.advance(100)
    assert not mesh.core(1).groups.asks  # the cron drops it
    core = mesh.core(1)
    idle = core.connect(999)
    core.groups.asks[99] = _Ask(idle, b"q", b"g", b"", 0, 0, 1, Waiter(idle, (), False, 0))  # a waiter not its client's
    core.handle_bus(core.header(), m.Claimed(99, True))  # its client is not waiting: nothing happens
    assert 99 not in core.groups.asks and mesh.reply(mesh.call(1, "QGET", "q", "g"))[1] == b"a"


def test_denied_claims_give_up_after_a_few_tries():
    mesh = formed(2)
    mesh.call(0, "QADD", "q", 60, "a", "NOBLOCK")
    mesh.lose_next(1, m.GroupSet)
    mesh.call(0, "QGET", "q", "g")
    core = mesh.core(1)
    client = mesh.call(1, "QGET", "q", "g")
    assert mesh.reply(client) is None and held(mesh, 1, b"q", b"g")  # the server's view arrived with the denial
    job = next(iter(core.groups.queues[b"q"].events.values()))
    c = core.clients[client]
    core.groups.asks[7] = _Ask(c, b"q", b"g", job.id, 0, 0, 1, core.blocking.block(c, (), False, 0))
    core.handle_bus(core.header(), m.Claimed(7, False))
    assert mesh.reply(client) is None
    core.groups.asks[8] = _Ask(c, b"gone", b"g", b"DI" + b"0" * 44 + b"SQ", 0, 0, 2, core.blocking.block(c, (), False, 0))
    core.handle_bus(core.header(), m.Claimed(8, True))  # granted, but the event is gone here: picks again
    assert mesh.reply(client) is None and not core.groups.asks


def test_the_asker_tells_the_other_holders_what_the_server_granted():
    """The server's GROUPSETs to the third holder are lost (it died as it
    sent them): the holder that asked passes the claim and the QACK on."""
    mesh = formed()
    e = mesh.reply(mesh.call(0, "QADD", "q", 600, "a"))
    mesh.lose_next(2, m.GroupSet)
    assert mesh.reply(mesh.call(1, "QGET", "q", "g", "EX", 60)) == [e, b"a"]
    assert list(held(mesh, 2, b"q", b"g")) == [int(e)]  # in progress on node 2 too
    mesh.lose_next(2, m.GroupSet)
    assert mesh.reply(mesh.call(1, "QACK", "q", "g", e)) == 1
    assert held(mesh, 2, b"q", b"g") == {int(e): 0}  # done


def test_when_the_server_fails_the_lowest_holder_serves():
    mesh = formed()
    e = mesh.reply(mesh.call(0, "QADD", "q", 600, "a"))
    f = mesh.reply(mesh.call(0, "QADD", "q", 600, "b"))
    assert mesh.reply(mesh.call(2, "QGET", "q", "g")) == [e, b"a"]
    assert mesh.reply(mesh.call(2, "QACK", "q", "g", e)) == 1
    mesh.kill(0)
    assert mesh.call(1, "QGET", "q", "g") is None  # node 0 has no link: its events wait
    dead = mesh.core(1).membership.nodes[_id_of_dead(mesh)]
    mesh.wait_for(lambda: bool(dead.flags & m.FAIL), 10_000)
    lowest = min((1, 2), key=mesh.my_id)
    other = 3 - lowest
    got = mesh.call(other, "QGET", "q", "g")
    assert mesh.reply(got) == [f, b"b"]  # served by the lowest holder; the acknowledged event stays done
    assert mesh.call(lowest, "QGET", "q", "g") is None and mesh.call(lowest, "QGET", "q", "new")[1] == b"a"


def _id_of_dead(mesh: Mesh) -> str:
    alive = {c.membership.my_id for c in mesh.cores if c}
    return next(n for n in mesh.core(1).membership.nodes if n not in alive)


def test_qnotify_is_woken_by_a_qadd_on_another_node():
    mesh = formed()
    client = mesh.call(2, "QNOTIFY", "g", 5, "q")
    mesh.call(0, "QADD", "q", 60, "a")
    assert mesh.reply(client) == b"q"


def test_a_long_qflush_runs_in_slices(env):
    from disque.core.lifecycle import SLICE
    from disque.core.types import BLOCKED

    for i in range(SLICE + 5):
        env("QADD", "q", 60, f"e{i}")
    other = Session(env.core)
    assert env("QFLUSH", "q") is BLOCKED and len(env.core.jobs) == 5  # a slice now, the rest at the next step
    assert other("PING") == b"PONG"
    env.core.tick()
    assert env.pending() == [b"OK"] and len(env.core.jobs) == 0 and other("QSTATUS") == []


def test_qflush_reaches_every_node():
    mesh = formed()
    mesh.call(1, "QADD", "q", 60, "a")
    assert mesh.call(0, "QFLUSH", "q") == b"OK"
    assert all(not mesh.core(i).groups.queues and not len(mesh.core(i).jobs) for i in range(3))


def test_qadd_needs_a_majority_of_its_replicas():
    """An event lives on min(3, cluster size) nodes and settles for a majority
    of them, as a default ADDJOB does: one node of three down, QADD goes on;
    two down, NOREPL."""
    mesh = formed()
    mesh.kill(2)
    dead = mesh.core(0).membership.nodes[_id_of_dead(mesh)]
    mesh.wait_for(lambda: bool(dead.flags & (m.PFAIL | m.FAIL)), 10_000)
    assert mesh.reply(mesh.call(0, "QADD", "q", 60, "a")).isdigit()  # once node 1 has its copy
    assert all(len(mesh.core(i).jobs) == 1 for i in (0, 1))
    mesh.kill(1)
    mesh.wait_for(lambda: not mesh.core(0).membership.reachable(), 10_000)
    assert str(mesh.call(0, "QADD", "q", 60, "a")).startswith("NOREPL")
    mesh.call(0, "CLUSTER", "LEAVING", "yes")
    assert str(mesh.call(0, "QADD", "q", 60, "a")).startswith("LEAVING")


def test_a_single_node_stores_alone():
    core, clock, _ = make_core()
    assert Session(core)("QADD", "q", 60, "a").isdigit() and len(core.jobs) == 1


def test_an_event_waiting_for_its_replicas_is_not_handed_out():
    mesh = formed()
    mesh.lose_next(0, m.GotJob)
    client = mesh.call(0, "QADD", "q", 60, "a")
    assert client not in mesh.replies and mesh.call(0, "QGET", "q", "g") is None
    mesh.advance(200)  # the replica is asked again
    assert mesh.reply(client).isdigit() and mesh.call(0, "QGET", "q", "g")[1] == b"a"


def test_messages_about_unknown_events_change_nothing():
    mesh = formed(2)
    core, peer = mesh.core(0), mesh.core(1)
    job_id = b"DI" + b"0" * 44 + b"SQ"
    header = peer.header()
    core.handle_bus(header, m.GroupSet(job_id, b"g", 0), key=core.membership.nodes[header.sender].key)
    core.handle_bus(header, m.Claimed(12345, True), key=core.membership.nodes[header.sender].key)
    core.handle_bus(header, m.Claim(job_id, b"g", 0, 5), key=core.membership.nodes[header.sender].key)
    assert [e.msg for e in core.out.effects if hasattr(e, "msg")] == [m.Claimed(5, False, True)]
    assert core.groups.queues == {} and not core.groups.asks


def test_a_server_whose_clock_is_ahead_grants_a_deadline_it_has_not_passed():
    mesh = formed(2)
    mesh.call(0, "QADD", "q", 60, "a", "NOBLOCK")
    core = mesh.core(0)
    e, job = next(iter(core.groups.queues[b"q"].events.items()))
    key = core.membership.nodes[mesh.my_id(1)].key
    core.handle_bus(mesh.core(1).header(), m.Claim(job.id, b"g", core.now - 5_000, 1), key=key)
    assert core.groups.queues[b"q"].groups[b"g"].progress[e] == core.now + 1


def test_a_qack_elsewhere_is_the_servers_to_grant():
    mesh = formed()
    e = mesh.reply(mesh.call(0, "QADD", "q", 60, "a"))
    assert mesh.call(0, "QGET", "q", "g", "EX", 1)[0] == e
    mesh.lose_next(0, m.GroupAck)
    client = mesh.call(1, "QACK", "q", "g", e)
    mesh.advance(CLAIM_MS + 100)
    assert mesh.reply(client) == 0 and not mesh.core(1).groups.asks  # no answer in time: not acknowledged
    assert mesh.call(1, "QACK", "q", "g", e) == 0  # the deadline has passed here too
    core = mesh.core(0)
    assert mesh.call(0, "QGET", "q", "g", "EX", 5)[0] == e  # redo
    key = core.membership.nodes[mesh.my_id(1)].key
    core.handle_bus(mesh.core(1).header(), m.GroupAck(b"DI" + b"0" * 44 + b"SQ", b"g", 3), key=key)  # unknown: denied
    mesh.flush()
    for _ in range(2):  # node 2 hears neither the server nor node 1 say that the acknowledgement went through
        mesh.lose_next(2, m.GroupSet)
    assert mesh.reply(mesh.call(1, "QACK", "q", "g", e)) == 1
    late = mesh.call(2, "QACK", "q", "g", e)  # node 2 thinks it is still held: the server says no
    assert mesh.reply(late) == 0 and held(mesh, 2, b"q", b"g") == {int(e): 0}


def test_a_qack_decides_alone_when_the_server_is_out_of_reach():
    mesh = formed()
    e = mesh.reply(mesh.call(0, "QADD", "q", 60, "a"))
    assert mesh.reply(mesh.call(1, "QGET", "q", "g")) == [e, b"a"]
    mesh.kill(0)
    assert mesh.call(1, "QACK", "q", "g", e) == 1 and held(mesh, 2, b"q", b"g") == {int(e): 0}


def test_a_server_that_lost_its_copy_stops_being_asked():
    """A node restarted without its AOF keeps its ID but not its events:
    the holders that ask it learn it holds nothing and ask the next one."""
    mesh = formed()
    e = mesh.reply(mesh.call(0, "QADD", "q", 60, "a"))
    mesh.reply(mesh.call(0, "QADD", "q", 60, "b"))
    core0 = mesh.core(0)
    for job in list(core0.jobs.values()):
        core0.lifecycle.delete_job(job, log=False)  # as after a restart without the AOF
    client = mesh.call(1, "QGET", "q", "g")
    assert mesh.reply(client) == [e, b"a"]  # node 0 said it holds nothing; the lowest other holder serves
    assert mesh.my_id(0) not in mesh.core(1).jobs.get(mesh.core(1).groups.queues[b"q"].events[int(e)].id).nodes_delivered
    f = mesh.reply(mesh.call(2, "QGET", "q", "g"))[0]
    client = mesh.call(1, "QACK", "q", "g", f)  # node 1 still takes node 0 for the server of "b"
    assert mesh.reply(client) == 1 and mesh.call(2, "QACK", "q", "g", f) == 0


def test_a_holder_whose_link_comes_back_hears_the_progress_it_missed():
    mesh = formed()
    e = mesh.reply(mesh.call(0, "QADD", "q", 60, "a"))
    core = mesh.core(0)
    core.out.drop_link(core.membership.key_of(mesh.my_id(2)))
    mesh.flush()
    assert mesh.call(0, "QGET", "q", "g")[0] == e and mesh.call(0, "QACK", "q", "g", e) == 1
    assert held(mesh, 2, b"q", b"g") == {} and held(mesh, 1, b"q", b"g") == {int(e): 0}
    mesh.advance(200)  # the link is made again: node 0 tells node 2 what it missed
    assert held(mesh, 2, b"q", b"g") == {int(e): 0}


def test_a_node_without_the_event_asks_the_others_for_one():
    """Four nodes, three copies: a QGET on the node that holds nothing asks
    the others in turn (NEEDEVENT); the one serving an event hands it over
    with its body, and that node passes the QACK on."""
    mesh = formed(4)
    e = mesh.reply(mesh.call(0, "QADD", "q", 60, "a"))
    job_id = mesh.core(0).groups.queues[b"q"].events[int(e)].id
    outsider = next(i for i in range(4) if job_id not in mesh.core(i).jobs)
    client = mesh.call(outsider, "QGET", "q", "g", "EX", 10)
    assert mesh.reply(client) == [e, b"a"]
    assert mesh.reply(mesh.call(outsider, "QACK", "q", "g", e)) == 1
    assert all(held(mesh, i, b"q", b"g") == {int(e): 0} for i in range(4) if i != outsider)
    assert mesh.reply(mesh.call(outsider, "QGET", "q", "g")) is None  # every node asked: nothing left
    assert mesh.call(outsider, "QACK", "q", "g", "999") == 0
    auto = mesh.reply(mesh.call(outsider, "QGET", "q", "h", "EX", 0))
    assert auto == [e, b"a"] and not mesh.core(outsider).groups.lent.get((int(e), b"h"))  # done at once: nothing to pass on
    mesh.lose_next(0, m.NeedEvent)
    client = mesh.call(outsider, "QGET", "q", "k")
    mesh.core(outsider).disconnect(client)
    mesh.advance(CLAIM_MS + 200)  # the answer of the next node finds nobody waiting; lent entries expire
    assert not mesh.core(outsider).groups.asks
    mesh.advance(10_000)
    assert not mesh.core(outsider).groups.lent
    core = mesh.core(outsider)
    core.handle_bus(mesh.core(0).header(), m.YourEvent(12345, job_id, b"a"))  # nobody asked: ignored
    assert not core.groups.lent and not [e for e in core.out.effects if hasattr(e, "value")]


def test_a_qnotify_on_a_node_without_the_event_is_woken_too():
    mesh = formed(4)
    waiters = [mesh.call(i, "QNOTIFY", "g", 5, "q") for i in range(4)]
    e = mesh.reply(mesh.call(0, "QADD", "q", 60, "a"))
    assert [mesh.reply(w) for w in waiters] == [b"q"] * 4  # three hold it; the fourth heard NEWEVENT
    outsider = next(i for i in range(4) if int(e) not in mesh.core(i).groups.queues.get(b"q", EventQueue(b"q")).events)
    assert mesh.reply(mesh.call(outsider, "QGET", "q", "g")) == [e, b"a"]
    gone = mesh.call(outsider, "QNOTIFY", "g", 5, "q")
    mesh.core(outsider).disconnect(gone)  # its entry stays until the cron: NEWEVENT passes it by
    mesh.call(0, "QADD", "q", 60, "b", "NOBLOCK")
    assert gone not in mesh.replies and gone in mesh.core(outsider).groups.notified


def test_a_redo_event_whose_server_is_out_of_reach_lets_the_next_one_come():
    mesh = formed()
    a = mesh.reply(mesh.call(0, "QADD", "q", 600, "a"))
    b = mesh.reply(mesh.call(1, "QADD", "q", 600, "b"))
    assert int(a) < int(b)
    assert [mesh.reply(mesh.call(2, "QGET", "q", "g", "EX", 1))[0] for _ in range(2)] == [a, b]
    mesh.advance(1_100)  # both redo
    mesh.kill(0)  # a's server: no link, not yet flagged FAIL
    assert mesh.reply(mesh.call(2, "QGET", "q", "g")) == [b, b"b"]
