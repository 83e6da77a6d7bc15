"""`disque.client` against real nodes: every method of `Client` and
`AsyncClient`, the worker loop, reconnection and failover between nodes given
as seeds.  The protocol pieces without I/O are tested first, on their own."""

from __future__ import annotations

import pickle
import random
import re
import threading
from collections.abc import Callable
from contextlib import aclosing

import pytest
import trio
from client_helpers import client, queue, rng_trying_first, shared_node  # noqa: F401  (fixtures)
from support import wait_for

from disque.client import (
    Affinity,
    AsyncClient,
    Client,
    DisqueConnectionError,
    DisqueReplyError,
    Hello,
    Job,
    JobHandle,
    JobInfo,
    NodeInfo,
    NodePlanner,
    QueueKeys,
    QueueStats,
    encode_command,
    parse_address,
)
from disque.client.canvas import chain, chord, group, job
from disque.testing.devcluster import NodeProcess, command, free_port

ID = re.compile(r"DI[0-9a-f]{8}[0-9a-f]{32}[0-9a-f]{4}SQ")


def node_id(n: int) -> str:
    return f"{n:08x}" + "0" * 32


# --------------------------------------------------------------------------
# No I/O


def test_encode_command() -> None:
    assert encode_command(["ADDJOB", "q", b"\x00\xff", 0, 1.5]) == b"*5\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$2\r\n\x00\xff\r\n$1\r\n0\r\n$3\r\n1.5\r\n"
    assert encode_command(["\udcff"]) == b"*1\r\n$1\r\n\xff\r\n"  # surrogateescape round trip
    with pytest.raises(TypeError):
        encode_command([None])  # type: ignore[list-item]


def test_a_body_over_max_job_size_is_refused_before_it_is_sent() -> None:
    """No node is running at the address: the refusal comes first."""
    c = Client(("127.0.0.1", 1), max_job_size=4)
    with pytest.raises(DisqueReplyError, match=r"Job body of 5 bytes is larger than max-job-size \(4 bytes\): not sent"):
        c.add_job("q", "héll")  # 5 bytes in UTF-8
    assert Client().max_job_size == 64 << 20  # the server's default


def test_parse_address() -> None:
    assert parse_address("10.0.0.1:7712") == ("10.0.0.1", 7712)
    assert parse_address("[::1]:7711") == ("::1", 7711)
    assert parse_address(("h", "7711")) == ("h", 7711)  # type: ignore[arg-type]


def test_hello_is_sorted_by_priority_and_resolves_prefixes() -> None:
    reply = [1, node_id(1).encode(), *[[node_id(i).encode(), b"127.0.0.1", b"%d" % (7710 + i), p] for i, p in ((1, b"5"), (2, b"100"), (3, b"1"))]]
    hello = Hello.from_reply(reply)
    assert [(n.port, n.priority) for n in hello.nodes] == [(7713, 1), (7711, 5), (7712, 100)]
    assert hello.by_prefix("00000002") == NodeInfo(node_id(2), "127.0.0.1", 7712, 100)
    assert hello.by_prefix("ffffffff") is None


def test_planner_orders_by_priority_then_seeds_with_the_failed_node_last() -> None:
    seeds = [("s", 1), ("s", 2)]
    planner = NodePlanner(seeds, random.Random(1))
    assert sorted(planner.plan()) == seeds  # before HELLO: only the seeds
    firsts = {planner.plan()[0] for _ in range(50)}
    assert firsts == set(seeds)  # a random one first
    nodes = [NodeInfo(node_id(1), "", 7711, 1), NodeInfo(node_id(2), "h", 7712, 1), NodeInfo(node_id(3), "h", 7713, 10)]
    planner.learn(Hello(1, node_id(1), nodes), ("me", 7711))
    assert planner.hello is not None and planner.hello.nodes[0].host == "me"  # our own empty address filled in
    plans = [planner.plan(failed=("h", 7712)) for _ in range(50)]
    assert {p[0] for p in plans} == {("me", 7711)}  # the other priority-1 node failed
    assert all(p[1] == ("h", 7713) and sorted(p[2:4]) == seeds and p[-1] == ("h", 7712) for p in plans)
    plans = [planner.plan() for _ in range(50)]
    assert {p[0] for p in plans} == {("me", 7711), ("h", 7712)}  # random among equals


def test_affinity_moves_only_to_a_clear_majority_of_another_node() -> None:
    a, b, c = "DIaaaaaaaa" + "0" * 36 + "SQ", "DIbbbbbbbb" + "0" * 36 + "SQ", "DIcccccccc" + "0" * 36 + "SQ"
    affinity = Affinity(window=4)
    assert affinity.observe([b, b, b], current_prefix="aaaaaaaa") is None  # window not full
    assert affinity.observe([a], current_prefix="aaaaaaaa") == "bbbbbbbb"
    assert affinity.observe([a, a, a, b], current_prefix="aaaaaaaa") is None  # counts restarted; mostly ours
    assert affinity.observe([b, b, c, c], current_prefix="aaaaaaaa") is None  # no majority
    assert affinity.observe([c, c, c, a, a], current_prefix="cccccccc") is None  # we are the producer


# --------------------------------------------------------------------------
# Every method, synchronous client


def test_add_job_options_and_show(client: Client, queue: str) -> None:
    job_id = client.add_job(queue, b"payload", replicate=1, retry=7, ttl=3600, delay=2, timeout_ms=1000)
    assert ID.fullmatch(job_id)
    info = client.show(job_id)
    assert isinstance(info, JobInfo)
    assert (info.id, info.queue, info.body, info.state) == (job_id, queue, b"payload", "active")  # delayed
    assert (info.repl, info.retry, info.delay) == (1, 7, 2)
    assert 3590 <= info.ttl <= 3600
    assert info.nodes_delivered == [client.node_id]
    assert client.show("DI" + "0" * 44 + "SQ") is None
    with pytest.raises(DisqueReplyError) as bad:
        client.show("nope")
    assert (bad.value.code, bad.value.message) == ("BADID", "Invalid Job ID format.")


def test_qkeys_counts_a_queues_keys_and_names_the_busiest(client: Client, queue: str) -> None:
    assert client.qkeys(queue) == QueueKeys(0, 0, [])  # no such queue
    client.add_job(queue, "plain")
    for key, n in (("a", 1), ("b", 3), ("c", 2)):
        for _ in range(n):
            client.add_job(queue, "x", key=key)
    assert client.qkeys(queue) == QueueKeys(3, 6, [("b", 3), ("c", 2), ("a", 1)])
    assert client.qkeys(queue, count=1).busiest == [("b", 3)]


def test_add_job_asynchronous_and_maxlen(client: Client, queue: str) -> None:
    client.add_job(queue, "text body", asynchronous=True)
    with pytest.raises(DisqueReplyError) as full:
        client.add_job(queue, "x", maxlen=1)
    assert full.value.code == "MAXLEN"
    [job] = client.qpeek(queue, 1)
    assert job.body == b"text body"


def test_get_job_and_get_jobs(client: Client, queue: str) -> None:
    ids = [client.add_job(queue, f"b{i}") for i in range(3)]
    job = client.get_job(queue)
    assert job == Job(ids[0], queue, b"b0", nacks=0, additional_deliveries=0)
    assert [j.id for j in client.get_jobs(queue, "other-" + queue, count=5)] == ids[1:]
    assert client.get_job(queue, nohang=True) is None
    assert client.get_jobs(queue, nohang=True) == []
    assert client.get_job(queue, timeout_ms=50) is None
    with pytest.raises(ValueError):
        client.get_job()


def test_add_jobs_and_a_pipeline_send_many_commands_in_one_write(client: Client, queue: str) -> None:
    ids = client.add_jobs(queue, [f"b{i}" for i in range(2500)], retry=30)  # three writes of BATCH requests
    assert len(set(ids)) == 2500 and client.qlen(queue) == 2500
    assert client.show(ids[-1]).retry == 30  # every job has the options
    pipe = client.pipeline()
    assert pipe.get_jobs(queue, count=2).ack(ids[0]).qlen(queue) is pipe and len(pipe) == 3
    jobs, acked, left = pipe.execute()
    assert ([j.id for j in jobs], acked, left) == (ids[:2], 1, 2498) and len(pipe) == 0
    [third] = client.get_jobs(queue, acking=[ids[1]])  # the ACKJOB travels with the GETJOB
    assert third.id == ids[2] and client.show(ids[1]) is None
    with pytest.raises(DisqueReplyError, match="^ERR unknown command"):  # raised once every reply is read
        client.pipeline().add_job(queue, "x").execute_command("NOSUCH").add_job(queue, "y").execute()
    assert client.qlen(queue) == 2499 and client.ping() == "PONG"  # both ADDJOBs ran; the connection is in step
    assert client.add_jobs(queue, []) == []
    with pytest.raises(ValueError, match="queue ack"):
        client.pipeline().get_jobs(queue, acking=[ids[3]])


def test_ack_fast_ack_and_del_job(client: Client, queue: str) -> None:
    a, b, c = (client.add_job(queue, x) for x in "abc")
    assert client.ack(a) == 1
    assert client.show(a) is None
    assert client.fast_ack(b, "DI" + "0" * 44 + "SQ") == 1
    assert client.show(b) is None
    assert client.del_job(c) == 1
    assert client.qlen(queue) == 0
    assert client.ack() == 0  # no IDs is legal


def test_ack_with_a_result_and_reading_it_back(client: Client, queue: str) -> None:
    a, b = client.add_job(queue, "a"), client.add_job(queue, "b")
    assert client.result(a) is None
    assert client.ack(a, result="done") == 1
    assert client.result(a) == b"done"
    with pytest.raises(ValueError, match="one job ID"):
        client.ack(a, b, result=b"x")
    assert client.wait_results(a, b, timeout_ms=50) == (1, [b"done", None])
    with pytest.raises(DisqueReplyError, match="longer than"):
        client.ack(b, result=b"x" * 20_000)


def test_add_job_after_and_the_canvas(client: Client, queue: str) -> None:
    def run_all() -> list[bytes]:
        """The jobs queued now, acknowledged with their bodies in upper case as their results."""
        jobs = client.get_jobs(queue, count=100, nohang=True)
        for done in jobs:
            client.ack(done.id, result=done.body.upper())
        return sorted(done.body for done in jobs)

    first = client.add_job(queue, "first")
    second = client.add_job(queue, "second", after=[first], on_parent_fail="drop")
    info = client.show(second)
    assert info is not None and info.state == "active"
    assert run_all() == [b"first"] and run_all() == [b"second"]
    tails = chain(job(queue, "a"), group([job(queue, "b1"), job(queue, "b2")]), job(queue, "c")).send(client)
    assert run_all() == [b"a"] and run_all() == [b"b1", b"b2"] and run_all() == [b"c"]
    assert client.wait_results(*tails) == (1, [b"C"])
    (end,) = chord([job(queue, f"h{i}") for i in range(3)], job(queue, "sum")).send(client)
    assert run_all() == [b"h0", b"h1", b"h2"] and run_all() == [b"sum"] and client.result(end) == b"SUM"


def test_the_id_add_job_returns_reads_the_jobs_result(client: Client, queue: str, shared_node: NodeProcess) -> None:

    handle = client.add_job(queue, "x")
    assert isinstance(handle, JobHandle) and isinstance(handle, str) and ID.fullmatch(handle) and handle.id == handle
    assert client.show(handle) is not None and {handle: 1}[str(handle)] == 1  # the ID string in every other way
    assert type(pickle.loads(pickle.dumps(handle))) is str
    assert handle.result is None
    with pytest.raises(TimeoutError, match="not acknowledged"):
        handle.wait(0.05)
    with Client((shared_node.host, shared_node.port)) as consumer:  # (the waiting client's connection is busy)
        acking = threading.Timer(0.2, lambda: consumer.ack(handle, result=b"done"))
        acking.start()
        assert handle.wait(10) == b"done" and handle.result == b"done"
        acking.join()
    (tail,) = chord([job(queue, "a")], job(queue, "b")).send(client)  # the canvas's tails are handles too
    with client.batch() as batch:
        member = batch.add_job(queue, "c")
    for name, done in (("a", "A"), ("b", "B"), ("c", "C")):
        got = client.get_job(queue, timeout_ms=5000)
        assert got is not None and got.body == name.encode()
        client.ack(got.id, result=done)
    assert (tail.wait(5), member.result) == (b"B", b"C")


def test_a_child_reads_its_parents_results(client: Client, queue: str) -> None:
    parents = [client.add_job(queue, f"p{i}") for i in range(3)]
    child = client.add_job(queue + "-child", "c", after=parents, on_parent_fail="run")
    for i, parent in enumerate(parents):
        got = client.get_job(queue, timeout_ms=5000)
        assert got is not None and got.id == parent
        client.ack(got.id, result=f"r{i}") if i < 2 else client.ack(got.id)  # the last one without a result
    info = client.show(child)
    assert info is not None and info.after == parents and info.waits_for == []
    assert client.parent_results(child) == {parents[0]: b"r0", parents[1]: b"r1", parents[2]: None}
    assert client.parent_results(client.add_job(queue, "alone")) == {}
    with pytest.raises(DisqueReplyError) as unknown:
        client.parent_results("DI" + "0" * 44 + "SQ")
    assert unknown.value.code == "NOJOB"


def test_a_batch_block_and_its_callback(client: Client, queue: str) -> None:
    with client.batch(on_success=(queue + "-done", "all good"), on_complete=(queue + "-done", "all over")) as batch:
        ids = [batch.add_job(queue, body) for body in ("a", "b")]
        assert client.batch_show(batch.id)["closed"] == 0
    assert client.batch_show(batch.id)["pending"] == 2
    for job in client.get_jobs(queue, count=10, nohang=True):
        client.ack(job.id)
    first = client.get_job(queue + "-done", timeout_ms=5000)  # fired half a second after the last ACK
    second = client.get_job(queue + "-done", nohang=True)
    assert first is not None and second is not None and sorted([first.body, second.body]) == [b"all good", b"all over"]
    shown = client.batch_show(batch.id)
    assert (shown["done"], shown["success_fired"], shown["complete_fired"]) == (2, 1, 1) and len(ids) == 2


def test_nack_enqueue_dequeue_and_working(client: Client, queue: str) -> None:
    job_id = client.add_job(queue, "x", retry=30)
    client.get_job(queue)
    assert client.working(job_id) == 30
    assert client.nack(job_id) == 1
    assert client.qlen(queue) == 1
    assert client.get_job(queue).nacks == 1  # type: ignore[union-attr]
    assert client.enqueue(job_id) == 1
    assert client.dequeue(job_id) == 1
    assert client.show(job_id).state == "active"  # type: ignore[union-attr]
    with pytest.raises(DisqueReplyError) as unknown:
        client.working("DI" + "0" * 44 + "SQ")
    assert unknown.value.code == "NOJOB"


def test_qlen_qstat_qpeek(client: Client, queue: str) -> None:
    assert client.qstat(queue) is None
    ids = [client.add_job(queue, str(i)) for i in range(3)]
    assert client.qlen(queue) == 3
    stats = client.qstat(queue)
    assert isinstance(stats, QueueStats)
    assert (stats.name, stats.len, stats.jobs_in, stats.jobs_out, stats.blocked, stats.pause) == (queue, 3, 3, 0, 0, "none")
    assert [j.id for j in client.qpeek(queue, 2)] == ids[:2]
    assert [j.id for j in client.qpeek(queue, -1)] == ids[-1:]
    assert client.qpeek(queue, 1)[0].nacks is None  # QPEEK has no counters


def test_pause(client: Client, queue: str) -> None:
    assert client.pause(queue, "in") == "in"
    assert client.pause(queue) == "in"  # STATE by default
    with pytest.raises(DisqueReplyError) as paused:
        client.add_job(queue, "x")
    assert paused.value.code == "PAUSED"
    assert client.pause(queue, "none") == "none"


def test_jscan_follows_the_cursor_and_filters(client: Client, queue: str) -> None:
    ids = {client.add_job(queue, str(i)) for i in range(120)}
    other = client.add_job("other-" + queue, "x")
    assert set(client.jscan(queue, count=5)) == ids  # many pages of ~5
    everything = set(client.jscan(count=5))
    assert ids | {other} <= everything
    taken = client.get_job(queue)
    assert taken is not None
    assert set(client.jscan(queue, ["active"])) == {taken.id}
    details = list(client.jscan(queue, ["queued"], busyloop=True, details=True))
    assert {j.id for j in details} == ids - {taken.id}
    assert all(isinstance(j, JobInfo) and j.state == "queued" and j.queue == queue for j in details)


def test_qscan_follows_the_cursor_and_filters(client: Client, queue: str) -> None:
    names = {f"{queue}-{i}" for i in range(60)}
    for name in names:
        client.add_job(name, "x")
    client.add_job(f"{queue}-0", "y")
    assert names <= set(client.qscan(count=3))
    assert {n for n in client.qscan(minlen=2, busyloop=True) if n.startswith(queue)} == {f"{queue}-0"}
    assert f"{queue}-0" not in set(client.qscan(maxlen=1))


def test_hello_info_ping_and_raw_commands(client: Client, shared_node: NodeProcess) -> None:
    hello = client.hello()
    assert len(hello.node_id) == 40 and client.node_id == hello.node_id
    assert hello.nodes == [NodeInfo(hello.node_id, shared_node.host, shared_node.port, 1)]  # address filled in
    assert client.cluster == hello
    info = client.info()
    assert int(info["Jobs"]["registered_jobs"]) >= 0 and info["Server"]["tcp_port"] == str(shared_node.port)
    assert list(client.info("queues")) == ["Queues"]
    assert client.ping() == "PONG"
    assert client.execute_command("PING", "hi") == b"hi"
    assert client.address == (shared_node.host, shared_node.port)
    with pytest.raises(DisqueReplyError) as unknown:
        client.execute_command("NOPE")
    assert str(unknown.value) == "ERR unknown command 'NOPE'"


def test_connection_errors_name_the_address() -> None:
    port = free_port()
    with pytest.raises(DisqueConnectionError, match=rf"^Could not connect to Disque at 127\.0\.0\.1:{port}: Connection refused$"):
        Client(("127.0.0.1", port)).ping()
    other = free_port()
    with pytest.raises(DisqueConnectionError, match="^Could not connect to any Disque node") as both:
        Client([f"127.0.0.1:{port}", f"127.0.0.1:{other}"]).ping()
    assert f"127.0.0.1:{port}: Connection refused" in str(both.value) and f"127.0.0.1:{other}: Connection refused" in str(both.value)


def test_password(shared_node: NodeProcess) -> None:
    node = (shared_node.host, shared_node.port)
    with Client(node) as admin:
        admin.execute_command("CONFIG", "SET", "requirepass", "s3cret")
    with Client(node, password="s3cret") as c:
        try:
            with pytest.raises(DisqueReplyError, match="NOAUTH"):
                Client(node).ping()
            with pytest.raises(DisqueReplyError, match="invalid password"):
                Client(node, password="wrong").ping()
            assert c.ping() == "PONG"
            c.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
            assert c.qlen("q") == 0  # the reconnection authenticates again
        finally:
            c.execute_command("CONFIG", "SET", "requirepass", "")


def test_reconnects_after_the_server_closed_the_connection(client: Client, queue: str) -> None:
    client.add_job(queue, "x")
    client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
    assert client.qlen(queue) == 1
    with Client(client.address, failover=False) as once:  # type: ignore[arg-type]
        once.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
        with pytest.raises(DisqueConnectionError, match=rf"^127\.0\.0\.1:{once.address[1]}: "):  # type: ignore[index]
            once.qlen(queue)
        assert once.qlen(queue) == 1  # the next command connects again


# --------------------------------------------------------------------------
# Failover between seed nodes (no cluster needed): a node of its own, which
# the client tries first and the test stops, and the shared node.


Seeds = tuple[NodeProcess, list[tuple[str, int]], Callable[[], random.Random]]


@pytest.fixture
def seeds(spawn: Callable[..., NodeProcess], shared_node: NodeProcess) -> Seeds:
    """(a node, both addresses, a maker of Randoms with which the client tries that node first)."""
    first = spawn()
    addresses = [(first.host, first.port), (shared_node.host, shared_node.port)]
    return first, addresses, lambda: rng_trying_first(addresses, addresses[0])


def test_failover_to_another_seed_when_the_node_dies(seeds: Seeds, queue: str) -> None:
    first, addresses, rng = seeds
    with Client(addresses, rng=rng()) as c:
        got: list[Job | None] = []
        consumer = threading.Thread(target=lambda: got.append(c.get_job(queue)))
        consumer.start()
        wait_for(lambda: b"blocked\r\n:1" in command(first.host, first.port, "QSTAT", queue), what="GETJOB to block")
        assert c.address == addresses[0]
        first.kill()
        job_id = command(*addresses[1], "ADDJOB", queue, "hello", "0")[1:-2].decode()
        consumer.join(10)
        assert got and got[0] is not None and got[0].id == job_id  # the blocked GETJOB moved with the client
        assert c.address == addresses[1]
    with pytest.raises(DisqueConnectionError, match=rf"any Disque node \(.*:{first.port}: Connection refused"):
        Client([addresses[0], ("127.0.0.1", free_port())]).ping()


def test_leaving_node_sends_the_client_elsewhere(seeds: Seeds, queue: str) -> None:
    first, addresses, rng = seeds
    command(first.host, first.port, "CLUSTER", "LEAVING", "yes")
    command(*addresses[1], "ADDJOB", queue, "there", "0")
    with Client(addresses, rng=rng()) as c:
        job = c.get_job(queue)  # the leaving node refuses to block: -LEAVING
        assert job is not None and job.body == b"there"
        assert c.address == addresses[1]
    with Client(addresses, rng=rng(), failover=False) as c, pytest.raises(DisqueReplyError, match="^LEAVING"):
        c.get_job(queue)


# --------------------------------------------------------------------------
# The worker


def test_worker_acks_on_success_and_nacks_on_exception(client: Client, queue: str) -> None:
    good = client.add_job(queue, "good", retry=60)
    bad = client.add_job(queue, "boom", retry=60)
    seen = []

    def handler(job: Job) -> None:
        seen.append(job.body)
        if job.body == b"boom":
            raise ValueError("cannot process")

    assert client.worker(queue, handler, max_jobs=2) == 2
    assert seen == [b"good", b"boom"]
    assert client.show(good) is None  # acked, then collected
    failed = client.show(bad)
    assert failed is not None and (failed.state, failed.nacks) == ("queued", 1)


@pytest.mark.parametrize("heartbeat", [True, False])
def test_worker_heartbeat_keeps_a_long_job(client: Client, queue: str, heartbeat: bool) -> None:
    """RETRY 1: without WORKING the node queues the job again after about a second."""
    job_id = client.add_job(queue, "slow", retry=1)
    with Client(client.address) as observer:  # type: ignore[arg-type]

        def handler(job: Job) -> None:
            if heartbeat:
                with pytest.raises(AssertionError):  # never requeued while we work
                    wait_for(lambda: observer.qlen(queue), timeout=1.5, what="a requeue")
            else:
                wait_for(lambda: observer.qlen(queue), timeout=5, what="a requeue")

        client.worker([queue], handler, max_jobs=1, first_heartbeat=0.5 if heartbeat else None)  # type: ignore[arg-type]
    assert client.show(job_id) is None


def test_monitor_streams_what_the_node_runs(shared_node: NodeProcess, client: Client, queue: str) -> None:
    client.connect()  # its HELLO before the watch starts
    with Client((shared_node.host, shared_node.port), failover=False) as watcher:
        lines = watcher.monitor()  # returns once MONITOR is answered: nothing after is missed
        job_id = client.add_job(queue, "watched")
        client.ack(job_id)
        first, second = next(lines), next(lines)
    assert re.fullmatch(rf'\d+\.\d{{6}} \[127\.0\.0\.1:\d+\] "ADDJOB" "{queue}" "watched" "30000"', first)  # add_job's default timeout
    assert second.endswith(f'"ACKJOB" "{job_id}"')
    assert client.ping() == "PONG"  # the other connection is untouched


# --------------------------------------------------------------------------
# AsyncClient


async def test_async_client_methods(shared_node: NodeProcess, queue: str) -> None:
    async with AsyncClient(f"{shared_node.host}:{shared_node.port}") as c:
        assert await c.ping() == "PONG"
        first = await c.add_job(queue, b"one", retry=30)
        second = await c.add_job(queue, "two", ttl=600)
        assert await c.qlen(queue) == 2
        assert [j.id for j in await c.qpeek(queue, 5)] == [first, second]
        stats = await c.qstat(queue)
        assert stats is not None and stats.len == 2
        assert {i async for i in c.jscan(queue, count=1)} == {first, second}
        assert sorted([i.body async for i in c.jscan(queue, details=True)]) == [b"one", b"two"]
        assert queue in {q async for q in c.qscan(count=1)}
        job = await c.get_job(queue)
        assert job == Job(first, queue, b"one", 0, 0)
        assert await c.working(first) == 30
        assert await c.nack(first) == 1
        assert [j.id for j in await c.get_jobs(queue, count=2)] == [first, second]  # by creation time
        assert await c.get_job(queue, nohang=True) is None
        assert await c.enqueue(first) == 1 and await c.dequeue(first) == 1
        info = await c.show(first)
        assert info is not None and (info.state, info.nacks) == ("active", 1)
        assert await c.ack(first) == 1 and await c.fast_ack(second) == 1 and await c.del_job(second) == 0
        assert await c.pause(queue, "out") == "out"
        assert (await c.hello()).node_id == c.node_id
        assert "Server" in await c.info()
        with pytest.raises(DisqueReplyError, match="^ERR unknown command"):
            await c.execute_command("NOPE")
        parent = await c.add_job(queue + "-r", "p")  # (`queue` is paused)
        child = await c.add_job(queue + "-r", "c", after=[parent])
        assert await parent.result is None and (await c.show(child)).waits_for == [parent]  # type: ignore[union-attr]
        got = await c.get_job(queue + "-r", nohang=True)
        assert got is not None and got.id == parent and await c.ack(parent, result="42") == 1
        assert await parent.wait(5) == b"42" and await parent.result == b"42"
        assert await c.parent_results(child) == {parent: b"42"}
        async with c.batch() as batch:
            member = await batch.add_job(queue + "-r", "m")
        with pytest.raises(TimeoutError):
            await member.wait(0.05)
    with pytest.raises(DisqueConnectionError, match=r"127\.0\.0\.1:\d+: Connection refused"):
        await AsyncClient(("127.0.0.1", free_port())).ping()


async def test_async_monitor(shared_node: NodeProcess, queue: str) -> None:
    async with AsyncClient((shared_node.host, shared_node.port)) as watcher, AsyncClient((shared_node.host, shared_node.port)) as c:
        await c.connect()  # its HELLO before the watch starts
        async with aclosing(await watcher.monitor()) as lines:
            await c.qlen(queue)
            assert (await anext(lines)).endswith(f'"QLEN" "{queue}"')


async def test_async_worker_and_heartbeat(shared_node: NodeProcess, queue: str) -> None:
    async with AsyncClient((shared_node.host, shared_node.port)) as c, AsyncClient((shared_node.host, shared_node.port)) as observer:
        slow = await c.add_job(queue, "slow", retry=1)
        bad = await c.add_job(queue, "boom", retry=60)
        requeued = []

        async def handler(job: Job) -> None:
            if job.body == b"boom":
                raise RuntimeError("boom")
            with trio.move_on_after(1.5):
                while not requeued:
                    if await observer.qlen(queue) > 1:  # "boom" waits in the queue meanwhile
                        requeued.append(job.id)
                    await trio.sleep(0.05)

        assert await c.worker(queue, handler, max_jobs=2) == 2
        assert requeued == []
        assert await c.show(slow) is None
        failed = await c.show(bad)
        assert failed is not None and failed.nacks == 1


async def test_async_blocked_get_job_moves_to_another_node(seeds: Seeds, queue: str) -> None:
    first, addresses, rng = seeds
    got: list[Job | None] = []
    async with AsyncClient(addresses, rng=rng()) as c, trio.open_nursery() as nursery:

        async def consume() -> None:
            got.append(await c.get_job(queue))

        nursery.start_soon(consume)
        with trio.fail_after(10):
            while b"blocked\r\n:1" not in command(first.host, first.port, "QSTAT", queue):
                await trio.sleep(0.02)
        first.kill()
        job_id = command(*addresses[1], "ADDJOB", queue, "hello", "0")[1:-2].decode()
    assert got[0] is not None and got[0].id == job_id and c.address is None  # closed on leaving the block


async def test_async_cancelled_request_does_not_block_the_next_one(shared_node: NodeProcess, queue: str) -> None:
    async with AsyncClient((shared_node.host, shared_node.port)) as c:
        with trio.move_on_after(0.1):
            await c.get_job(queue)  # blocks, then is cancelled mid-request
        with trio.fail_after(5):  # on the old connection PING would wait behind the GETJOB
            assert await c.ping() == "PONG"
