"""The client protocol on a real cluster: HELLO learning every node, failover
to a node known only from HELLO, consumer affinity following the producer,
and `disque cluster meet`.  Skipped while the server has no cluster bus."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner
from client_helpers import mesh, start_all
from support import wait_for

from disque.client import Client, DisqueReplyError, Job, ReplicationTimeout
from disque.cli.main import cli
from disque.testing.devcluster import NodeProcess, command, free_port


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    """Three joined nodes, shared by the tests that do not kill any."""
    nodes = [NodeProcess(free_port(), tmp_path_factory.mktemp("cluster")) for _ in range(3)]
    try:
        start_all([node.start for node in nodes])
        reply = command(nodes[1].host, nodes[1].port, "CLUSTER", "MEET", nodes[0].host, str(nodes[0].port))
        if reply.startswith(b"-ERR Wrong CLUSTER subcommand or number of arguments"):
            pytest.skip("cluster bus not available yet")
        mesh(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def address(node: NodeProcess) -> tuple[str, int]:
    return (node.host, node.port)


def my_id(node: NodeProcess) -> str:
    return command(node.host, node.port, "CLUSTER", "MYID").split(b"\r\n")[1].decode()


def test_hello_learns_every_node_from_one_seed(cluster: list[NodeProcess]) -> None:
    with Client(address(cluster[0])) as c:
        hello = c.hello()
        assert hello.node_id == my_id(cluster[0]) == c.node_id
        assert sorted((n.id, n.address, n.priority) for n in hello.nodes) == sorted((my_id(n), address(n), 1) for n in cluster)
    text = CliRunner(env={"COLUMNS": None}).invoke(cli, ["-p", str(cluster[1].port), "--json", "HELLO"]).stdout
    assert {n["port"] for n in json.loads(text)["nodes"]} == {n.port for n in cluster}


def test_failover_to_a_node_learned_from_hello(cluster: list[NodeProcess], spawn: Callable[..., NodeProcess]) -> None:
    first, second = nodes = start_all([spawn, spawn])
    mesh(nodes)
    with Client(address(first)) as c:  # the only node we are told about
        replicated = c.add_job("q", "survives", replicate=2)
        got: list[Job | None] = []
        consumer = threading.Thread(target=lambda: got.append(c.get_job("other")))
        consumer.start()
        wait_for(lambda: b"blocked\r\n:1" in command(first.host, first.port, "QSTAT", "other"), what="GETJOB to block")
        first.kill()
        command(second.host, second.port, "ADDJOB", "other", "for the survivor", "0", "REPLICATE", "1")
        consumer.join(10)
        assert got and got[0] is not None and got[0].body == b"for the survivor"  # found through HELLO
        assert c.address == address(second)
        info = c.show(replicated)
        assert info is not None and info.body == b"survives"
        with pytest.raises(ReplicationTimeout) as norepl:  # REPLICATE 2 settles for a majority of 2: both
            c.add_job("q", "x", timeout_ms=200)
        assert norepl.value.code == "NOREPL" and isinstance(norepl.value, DisqueReplyError)
        assert str(norepl.value).endswith("within 200 ms (not added: adding it again is safe)")


@pytest.mark.parametrize("affinity", [True, False])
def test_consumer_moves_to_the_node_producing_its_jobs(cluster: list[NodeProcess], affinity: bool) -> None:
    consumer_node, producer_node = cluster[0], cluster[1]
    queue = f"affinity-{affinity}"
    with Client(address(producer_node)) as producer:
        for i in range(8):
            producer.add_job(queue, f"job {i}", replicate=1)
    with Client(address(consumer_node), affinity=affinity, affinity_window=5) as consumer:
        consumer.connect()
        got = []
        for _ in range(5):  # brought to the consumer's node by federation
            job = consumer.get_job(queue, timeout_ms=5000)
            assert job is not None
            got.append(job)
        assert {j.id[2:10] for j in got} == {my_id(producer_node)[:8]}
        expected = producer_node if affinity else consumer_node
        assert (consumer.address, consumer.node_id) == (address(expected), my_id(expected))
        consumer.ack(*(j.id for j in got))


def test_affinity_stays_when_the_jobs_are_local(cluster: list[NodeProcess]) -> None:
    with Client(address(cluster[2]), affinity=True, affinity_window=3) as c:
        for i in range(3):
            c.add_job("local-affinity", str(i), replicate=1)
        jobs = c.get_jobs("local-affinity", count=3)
        assert len(jobs) == 3 and c.address == address(cluster[2])


def test_cli_cluster_meet(spawn: Callable[..., NodeProcess], cluster: list[NodeProcess]) -> None:
    a, b = start_all([spawn, spawn])
    runner = CliRunner(env={"COLUMNS": None})
    result = runner.invoke(cli, ["-p", str(a.port), "cluster", "meet", b.host, str(b.port)])
    assert (result.exit_code, result.stdout) == (0, "OK\n")
    wait_for(lambda: b"cluster_reachable_nodes:1" in command(a.host, a.port, "CLUSTER", "INFO"), what="the two nodes to meet")
    nodes = json.loads(runner.invoke(cli, ["-p", str(a.port), "--json", "cluster", "nodes"]).stdout)
    assert sorted((n["address"].split(":")[1], n["flags"]) for n in nodes) == sorted([(str(a.port), ["myself"]), (str(b.port), ["noflags"])])
    assert {n["address"] for n in nodes} >= {f"{b.host}:{b.port}"}  # b's address comes from the meeting
    pretty = runner.invoke(cli, ["-p", str(a.port), "--no-raw", "cluster", "nodes"]).stdout
    assert "2 node(s)" in pretty and f"{b.host}:{b.port}" in pretty
    bad = runner.invoke(cli, ["-p", str(a.port), "cluster", "meet", "not-an-ip", "7711"])
    assert (bad.exit_code, bad.stderr) == (1, "ERR Invalid node address specified: not-an-ip:7711\n")
    assert runner.invoke(cli, ["-p", str(a.port), "cluster", "meet", b.host, "port"]).exit_code == 2
