"""A bad day on real processes (docs/replication.md): one node of three dies
or hangs and default ADDJOBs go on, answered within two node timeouts with a
majority of copies; the jobs added meanwhile get their third copy once the
node is back and are delivered.  A big job replicates in seconds without
closing a bus link or stalling the other clients, and a job over
`max-job-size` is refused with an error that names it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from clusterkit import Cluster

from disque.client import Client

TIMEOUT_MS = 1000
FAST = ("--cluster-node-timeout", str(TIMEOUT_MS))


@pytest.fixture
def c3(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "c3", 3, *FAST) as cluster:
        yield cluster


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_default_addjobs_go_on_with_one_node_of_three_down(c3: Cluster, fault: str) -> None:
    """kill -9 (its links drop at once) or SIGSTOP (its links stay up until
    it is flagged): every default ADDJOB, from redis-py and from our client,
    is answered within 2 x cluster-node-timeout of the fault."""
    limit = 2 * TIMEOUT_MS / 1000
    producer = redis.Redis(host="127.0.0.1", port=c3.nodes[0].port, protocol=2, socket_timeout=limit)
    ours = Client(("127.0.0.1", c3.nodes[1].port), socket_timeout=limit)
    added: list[str] = []
    try:
        c3.kill(2) if fault == "kill" else c3.pause(2)
        faulted = time.monotonic()
        while time.monotonic() - faulted < 3 * TIMEOUT_MS / 1000:  # before and after it is flagged
            started = time.monotonic()
            added.append(producer.execute_command("ADDJOB", "badq", "r", 0).decode())
            added.append(ours.add_job("badq", b"c"))
            assert time.monotonic() - started < limit
        assert {"fail", "fail?"} & c3.flags(0, 2)
    finally:
        producer.close()
        ours.close()
    for job_id in added[-2:]:
        assert c3.show(0, job_id)["repl"] == 3 and len(c3.holders(job_id)) == 2
    c3.restart(2) if fault == "kill" else c3.resume(2)
    c3.wait(lambda: all(len(c3.holders(j)) == 3 for j in added), 15, "every job's third copy")
    delivered: set[str] = set()
    while len(delivered) < len(added):  # the returned node's consumers get every job
        for _, job_id, _ in c3.call(2, "GETJOB", "TIMEOUT", 5000, "COUNT", 100, "FROM", "badq"):
            delivered.add(job_id.decode())
            c3.call(2, "ACKJOB", job_id)
    assert delivered == set(added)


def test_a_50_mb_job_replicates_without_closing_links_or_stalling_clients(c3: Cluster) -> None:
    body = b"x" * (50 << 20)
    pings: list[float] = []
    done = threading.Event()
    pinger = redis.Redis(host="127.0.0.1", port=c3.nodes[0].port, protocol=2, socket_timeout=10)

    def ping() -> None:
        while not done.is_set():
            started = time.monotonic()
            pinger.ping()
            pings.append(time.monotonic() - started)
            time.sleep(0.005)

    thread = threading.Thread(target=ping)
    thread.start()
    try:
        started = time.monotonic()
        job_id = c3.addjob(0, "bigq", body, 60_000, "REPLICATE", 3)  # type: ignore[arg-type]
        took = time.monotonic() - started
    finally:
        done.set()
        thread.join()
        pinger.close()
    assert took < 20, took
    assert set(c3.holders(job_id)) == {0, 1, 2}
    assert max(pings) < 1.0, max(pings)  # a loaded test machine; bench/big_jobs.py measures it quietly
    logs = "".join(node.log_path.read_text() for node in c3.nodes)
    assert "Closing bus link" not in logs


def test_max_job_size_is_named_when_a_job_is_refused(c3: Cluster) -> None:
    assert c3.call(0, "CONFIG", "SET", "max-job-size", "1mb") == b"OK"
    with pytest.raises(redis.ResponseError, match=r"Job body of 1048577 bytes is larger than max-job-size \(1048576 bytes\)"):
        c3.call(0, "ADDJOB", "q", b"x" * ((1 << 20) + 1), 0)
    assert c3.call(0, "CONFIG", "SET", "max-job-size", "100mb") == b"OK"  # on this node only
    job_id = c3.addjob(0, "q", b"y" * (70 << 20), 60_000, "REPLICATE", 3)  # type: ignore[arg-type]
    assert len(c3.holders(job_id)) == 3  # over the others' max-job-size, still a frame they take
