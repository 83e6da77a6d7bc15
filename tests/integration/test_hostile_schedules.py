"""Hostile input on the schedules, on real processes: a definition that
breaks a record rule is refused by the command, naming the rule, and never
reaches the bus or the AOF; a bad record that still arrives (an older node,
a hand-made frame) is dropped alone and the link stays; a bad record in the
AOF is skipped at start and the node comes up; schedules count in the
node's memory and are refused at maxmemory; ten thousand of them leave the
node as quick as none."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import redis

from clusterkit import Cluster
from disque.cluster.codec import encode_frame
from disque.cluster.messages import Header, SchedSet
from disque.store import schedule as records
from disque.store.aof import SCHEDULE, encode_record
from disque.testing.devcluster import NodeProcess
from support import wait_for


@pytest.fixture
def cluster(tmp_path: Path):
    with Cluster(tmp_path, 3, "--appendonly", "yes", "--appendfsync", "always") as c:
        yield c


def dropped(cluster: Cluster, i: int) -> int:
    return cluster.call(i, "INFO", "schedules")["schedule_records_dropped"]


def test_a_bad_definition_is_refused_and_the_node_stays_in_its_cluster(cluster):
    for name, rule in ((b"", "name must be 1 to"), (b"a\r\nb", "control characters"), (b"x" * 300, "name must be 1 to")):
        with pytest.raises(Exception, match=rule):
            cluster.call(0, "SCHEDULE", "ADD", name, "q", "body", "EVERY", 1000)
    with pytest.raises(Exception, match="CRON expression and TZ must be at most"):
        cluster.call(0, "SCHEDULE", "ADD", "s", "q", "body", "CRON", ",".join(["1"] * 20_000) + " * * * *")
    assert cluster.call(0, "SCHEDULE", "LIST") == []
    job = cluster.addjob(0, "q", "body", 5000, "REPLICATE", 3)  # every peer still linked
    assert len(cluster.holders(job)) == 3
    assert all(dropped(cluster, i) == 0 for i in cluster.indexes)


def test_a_bad_record_on_the_bus_is_dropped_alone_and_the_link_stays(cluster):
    node = cluster.nodes[1]
    header = Header("f" * 40, 7711, 0)
    good = records.encode(records.Schedule(b"kept", 1, "f" * 40, b"q", b"b", 1000, since=1))
    nameless = good.replace(b"\xc4\x04kept", b"\xc4\x00", 1)
    with socket.create_connection((node.host, node.port + 10000), timeout=5) as sock:
        sock.sendall(encode_frame(header, SchedSet(nameless)) + encode_frame(header, SchedSet(b"garbage")))
        wait_for(lambda: dropped(cluster, 1) == 2, what="the bad records dropped")
        sock.sendall(encode_frame(header, SchedSet(good)))  # the same connection still read
        wait_for(lambda: cluster.call(1, "SCHEDULE", "LIST") == [b"kept"], what="the good record kept")
    assert "Schedule record from " + "f" * 40 + " dropped" in node.log_path.read_text()
    assert cluster.healthy()


def test_a_bad_record_in_the_aof_is_skipped_and_the_node_starts(cluster):
    assert cluster.call(2, "SCHEDULE", "ADD", "s", "q", "body", "EVERY", 1000) == b"OK"
    node: NodeProcess = cluster.nodes[2]
    cluster.kill(2)
    bad = records.encode(records.Schedule(b"s", 1, "f" * 40, b"q", b"b", 1000)).replace(b"\xc4\x01s", b"\xc4\x00", 1)
    with open(node.workdir / "disque.aof", "ab") as f:
        f.write(encode_record(SCHEDULE, bad))
    cluster.restart(2)
    assert cluster.call(2, "SCHEDULE", "LIST") == [b"s"] and dropped(cluster, 2) == 1
    assert "Schedule record in the AOF dropped" in node.log_path.read_text()


def test_schedules_count_in_used_memory_and_are_refused_at_maxmemory(spawn):
    node = spawn("--maxmemory", "60mb")
    with redis.Redis(port=node.port) as r:
        body = b"x" * (5 << 20)
        added = 0
        for i in range(100):
            try:
                r.execute_command("SCHEDULE", "ADD", f"big{i}", "q", body, "EVERY", 3_600_000)
            except redis.ResponseError as e:
                assert "maxmemory" in str(e)
                break
            added += 1
        assert 8 <= added <= 12
        memory = r.execute_command("INFO", "memory")
        assert memory["used_memory"] >= added * (5 << 20)
        assert r.execute_command("SCHEDULE", "DEL", "big0") == 1  # room again
        r.execute_command("SCHEDULE", "ADD", "small", "q", "x", "EVERY", 3_600_000)


@pytest.mark.slow
def test_ten_thousand_schedules_leave_ping_fast(spawn):
    """10,000 schedules: a pass looks only at those due (a heap), so the
    node answers as quickly as with none."""
    node = spawn()
    with redis.Redis(port=node.port) as r:
        pipe = r.pipeline(transaction=False)
        for i in range(10_000):
            pipe.execute_command("SCHEDULE", "ADD", f"s{i}", "q", "x", "EVERY", 3_600_000)
        pipe.execute()
        took = []
        end = time.monotonic() + 4
        while time.monotonic() < end:
            began = time.perf_counter()
            r.ping()
            took.append(time.perf_counter() - began)
            time.sleep(0.004)  # (about 25 of the node's cron passes a pass of 100 ms each)
        took.sort()
        assert took[int(len(took) * 0.99)] <= 0.010, (took[len(took) // 2], took[int(len(took) * 0.99)], took[-1])
