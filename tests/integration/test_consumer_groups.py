"""Consumer groups on real processes with redis-py, as a bananaq client
uses them: one node (RESP3 and RESP2, exact replies, a blocked QNOTIFY woken
by another connection), a 3-node cluster (any node serves any event, the
server killed -9), and the AOF across kill -9."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from clusterkit import Cluster
from support import wait_for
from disque.testing.devcluster import NodeProcess

Spawn = Callable[..., NodeProcess]


def client(node: NodeProcess, protocol: int = 3) -> redis.Redis:
    return redis.Redis(host=node.host, port=node.port, protocol=protocol, socket_timeout=20)


def status(r: redis.Redis, queue: str, group: str) -> dict[bytes, int]:
    [[_, [_, flat]]] = r.execute_command("QSTATUS", queue, "GROUPS", group)
    return dict(zip(flat[::2], flat[1::2]))


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_bananaq_session(spawn: Spawn, protocol: int) -> None:
    r = client(spawn(), protocol)
    first = r.execute_command("QADD", "orders", 60, "order-1")
    second = r.execute_command("QADD", "orders", "30.5", "order-2")
    assert int(second) > int(first)
    assert r.execute_command("QADD", "orders", 60, "order-3", "NOBLOCK") == b"OK"
    assert r.execute_command("QGET", "orders", "billing", "EX", 10) == [first, b"order-1"]
    assert r.execute_command("QGET", "orders", "audit", "EX", 0) == [first, b"order-1"]  # every group
    assert r.execute_command("QACK", "orders", "billing", first) == 1
    assert r.execute_command("QACK", "orders", "billing", first) == 0
    assert status(r, "orders", "billing") == {
        b"total": 3, b"inprogress": 0, b"redo": 0, b"done": 1, b"available": 2, b"consumers": 0
    }
    assert r.execute_command("QINFO", "orders", "GROUPS", "audit") == [
        b"orders audit total:3 inprogress:0 redo:0 done:1 available:2 consumers:0"
    ]
    with pytest.raises(redis.ResponseError, match="^invalid ID string$"):
        r.execute_command("QACK", "orders", "billing", "not-an-id")
    with pytest.raises(redis.ResponseError, match="^insufficient arguments$"):
        r.execute_command("QGET", "orders")
    assert r.execute_command("QFLUSH", "orders") == b"OK" and r.execute_command("QSTATUS") == []


def test_qnotify_waits_for_a_qadd_on_another_connection(spawn: Spawn) -> None:
    node = spawn()
    waiter, producer = client(node), client(node)
    answer: list[object] = []
    thread = threading.Thread(target=lambda: answer.append(waiter.execute_command("QNOTIFY", "g", 10, "a", "b")))
    thread.start()
    wait_for(lambda: status(producer, "b", "g")[b"consumers"] == 1, what="the QNOTIFY to wait")
    producer.execute_command("QADD", "b", 60, "x")
    thread.join(10)
    assert answer == [b"b"]
    assert waiter.execute_command("QNOTIFY", "g", "0.1", "empty") is None


def test_any_node_serves_any_event_and_a_dead_server_is_replaced(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, "--cluster-node-timeout", "1000") as cluster:
        events = [cluster.call(0, "QADD", "orders", 600, f"e{n}") for n in range(4)]
        got = cluster.call(1, "QGET", "orders", "billing", "EX", 60)  # node 0 serves: a claim
        assert got == [events[0], b"e0"]
        assert cluster.call(2, "QACK", "orders", "billing", events[0]) == 1
        assert cluster.call(2, "QGET", "orders", "billing", "EX", 60) == [events[1], b"e1"]
        cluster.kill(0)
        wait_for(lambda: "fail" in cluster.flags(1, 0) and "fail" in cluster.flags(2, 0), timeout=20, what="FAIL")
        seen = []
        for i in (1, 2, 1, 2):
            if (reply := cluster.call(i, "QGET", "orders", "billing", "EX", 60)) is not None:
                seen.append(reply[1])
        assert seen == [b"e2", b"e3"]  # the acknowledged and the in-progress events are not handed out again
        assert cluster.call(1, "QGET", "orders", "audit", "EX", 0)[1] == b"e0"  # another group sees them all


def test_progress_survives_kill9(spawn: Spawn) -> None:
    node = spawn("--appendonly", "yes", "--appendfsync", "always")
    r = client(node)
    events = [r.execute_command("QADD", "q", 600, f"e{n}") for n in range(3)]
    r.execute_command("QGET", "q", "g", "EX", 0)
    r.execute_command("QGET", "q", "g", "EX", 300)
    r.close()
    node.kill()
    if node.proc is not None and node.proc.stderr is not None:
        node.proc.stderr.close()
    node.start()
    r = client(node)
    assert status(r, "q", "g") == {b"total": 3, b"inprogress": 1, b"redo": 0, b"done": 1, b"available": 1, b"consumers": 0}
    assert r.execute_command("QACK", "q", "g", events[1]) == 1
    assert r.execute_command("QGET", "q", "g") == [events[2], b"e2"]
    assert r.execute_command("BGREWRITEAOF")
    wait_for(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0, what="the rewrite")
    r.close()
    node.stop()
    node.start()
    assert status(client(node), "q", "g")[b"done"] == 2
