"""Many real nodes on loopback (`make scale`, DISQUE_SCALE=1): 100 nodes join
within 30 s and stay joined with no node flagged fail? or fail; among 32, a
killed node is flagged FAIL everywhere within 2 x node-timeout, the jobs it
queued are queued again by their replicas, and restarted it rejoins.  The
12-node join of `make test` is tests/integration/test_devcluster.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import redis

from clusterkit import Cluster, parse_nodes
from disque.testing.devcluster import NodeProcess, join, ports_below_ephemeral

pytestmark = [
    pytest.mark.skipif(not os.environ.get("DISQUE_SCALE"), reason="many nodes: make scale"),
    pytest.mark.slow,
    pytest.mark.timeout(1200),
]

HOLD_S = float(os.environ.get("DISQUE_SCALE_HOLD", "60"))  # make scale: how long 100 idle nodes must stay joined


def flagged(nodes: list[NodeProcess]) -> list[str]:
    """The fail? and fail flags every node shows (observer port: node id, flags)."""
    seen = []
    for node in nodes:
        with redis.Redis(host=node.host, port=node.port, protocol=2, socket_timeout=30) as client:
            view = parse_nodes(client.execute_command("CLUSTER", "NODES"))
        seen += [f"{node.port}: {node_id} {e['flags']}" for node_id, e in view.items() if {"fail", "fail?"} & e["flags"]]
    return seen


def test_100_nodes_join_within_30_s_and_stay_joined(tmp_path: Path) -> None:
    n = 100
    first = ports_below_ephemeral(n)
    nodes = [NodeProcess(first + i, tmp_path / str(i)) for i in range(n)]
    try:
        for node in nodes:
            node.start(wait=30)
        started = time.monotonic()
        join(nodes, timeout=30)  # MEET with the first, every node sees 99 reachable
        joined = time.monotonic() - started
        assert joined <= 30
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline:
            assert not (flags := flagged(nodes)), flags[:5]
            time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
        assert all(node.alive() for node in nodes)
    finally:
        for node in nodes:
            node.stop()


def test_a_killed_node_among_32_is_failed_its_jobs_requeued_and_it_rejoins(tmp_path: Path) -> None:
    timeout_ms = 5000
    cluster = Cluster(tmp_path, 32, "--cluster-node-timeout", str(timeout_ms)).start(timeout=60)
    try:
        victim = 7
        jobs = [cluster.addjob(victim, "scale-q", f"job {k}", 5000, "REPLICATE", 3, "RETRY", 1) for k in range(10)]
        killed = time.monotonic()
        cluster.kill(victim)
        live = cluster.live()

        def failed_everywhere() -> bool:
            return all("fail" in cluster.flags(i, victim) for i in live)

        cluster.wait(failed_everywhere, 3 * timeout_ms / 1000, what="FAIL everywhere")
        assert time.monotonic() - killed <= 2 * timeout_ms / 1000
        # its replicas queue the jobs again (RETRY 1): each job is queued somewhere
        cluster.wait(lambda: all("queued" in cluster.holders(job, live).values() for job in jobs), 30, what="jobs requeued")
        cluster.restart(victim)
        cluster.wait_healthy(60)
    finally:
        cluster.stop()
