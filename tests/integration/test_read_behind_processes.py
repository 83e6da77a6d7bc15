"""Read-behind on real processes: a backlog past the memory budget survives
kill -9 (and stays on disk when the RETRY timers queue it again after the
restart), and replicas kept on disk serve their jobs when the node that
created them dies."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import redis

from clusterkit import Cluster
from disque.testing.devcluster import NodeProcess

JOBS = 3000
BODY = 1024


def read_behind(client: redis.Redis) -> dict[str, int | str]:
    return client.info("read-behind")


def test_a_backlog_past_the_budget_survives_kill_9(spawn):
    node: NodeProcess = spawn("--appendonly", "yes", "--appendfsync", "always", "--read-behind-prefetch", "100")
    client = redis.Redis(host=node.host, port=node.port, protocol=2)
    used = client.info("memory")["used_memory"]
    client.execute_command("CONFIG", "SET", "job-memory-limit", used + (1 << 20))  # a megabyte of room for jobs
    pipe = client.pipeline(transaction=False)
    for i in range(JOBS):
        pipe.execute_command("ADDJOB", "backlog", b"%d:" % i + b"x" * BODY, 0)
    ids = pipe.execute()
    assert all(isinstance(i, bytes) for i in ids)  # each one acknowledged (fsynced: appendfsync always)
    figures = read_behind(client)
    assert figures["jobs_on_disk"] > JOBS * 3 // 4 and figures["jobs_in_memory"] < JOBS // 4
    assert client.info("memory")["used_memory"] < used + (2 << 20)
    client.close()
    node.kill()
    node.start()
    client = redis.Redis(host=node.host, port=node.port, protocol=2)
    seen: dict[bytes, bytes] = {}
    for i in range(JOBS):  # after a crash jobs come back active: they are queued again by their retry
        job = client.execute_command("SHOW", ids[i])
        assert job is not None, f"job {i} lost"
        fields = dict(zip(job[::2], job[1::2]))
        seen[ids[i]] = fields[b"body"]
    assert all(seen[ids[i]].startswith(b"%d:" % i) for i in range(JOBS))
    client.execute_command("ENQUEUE", *ids)
    assert client.execute_command("QLEN", "backlog") == JOBS
    got = []
    while len(got) < JOBS:
        got += client.execute_command("GETJOB", "NOHANG", "COUNT", 500, "FROM", "backlog") or []
    assert [g[1] for g in got] == ids  # in order
    assert read_behind(client)["jobs_on_disk"] == 0
    client.close()


def test_a_backlog_queued_again_after_kill_9_stays_within_the_budget(spawn):
    """The RETRY timers queue again every job a crash left active: what they
    queue must go back to disk as it comes, and the replay too must keep to
    the budget (sampled from the start of the new process)."""
    jobs, room = 20_000, 8 << 20
    patience = 30  # seconds for the restart, then for the requeue
    node: NodeProcess = spawn("--appendonly", "yes", "--appendfsync", "no")
    client = redis.Redis(host=node.host, port=node.port, protocol=2)
    client.execute_command("CONFIG", "SET", "job-memory-limit", client.info("memory")["used_memory"] + room)
    client.execute_command("CONFIG", "REWRITE")  # the restarted process has the same budget
    most_in_memory = room // BODY  # a job in memory costs more than its body
    ids: list[bytes] = []
    for start in range(0, jobs, 2000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, start + 2000):
            pipe.execute_command("ADDJOB", "backlog", b"%06d:" % i + b"x" * BODY, 0, "RETRY", 1)
        ids += pipe.execute()
    assert read_behind(client)["jobs_in_memory"] <= most_in_memory
    client.close()
    node.kill()
    samples: list[tuple[int, int]] = []  # (jobs_in_memory, QLEN) from the restart on
    done = threading.Event()

    def sample() -> None:
        probe = redis.Redis(host=node.host, port=node.port, protocol=2, socket_timeout=5)
        while not done.is_set():
            try:
                figures = read_behind(probe)
                samples.append((int(figures["jobs_in_memory"]), probe.execute_command("QLEN", "backlog")))
            except (redis.ConnectionError, redis.ResponseError):  # not listening, or LOADING (QLEN)
                time.sleep(0.01)
        probe.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        node.start(wait=patience)
        deadline = time.monotonic() + patience
        while not samples or samples[-1][1] < jobs:  # every job queued again by its RETRY
            assert time.monotonic() < deadline, f"requeued {samples[-1:] or 'none'} of {jobs}"
            time.sleep(0.05)
    finally:
        done.set()
        sampler.join()
    assert max(n for n, _ in samples) <= most_in_memory, samples
    client = redis.Redis(host=node.host, port=node.port, protocol=2)
    assert read_behind(client)["jobs_on_disk"] >= jobs - most_in_memory
    served: dict[bytes, bytes] = {}
    while len(served) < jobs:  # (a job served more than a RETRY ago may come again: its first time counts)
        batch = client.execute_command("GETJOB", "NOHANG", "COUNT", 1000, "FROM", "backlog") or []
        for _, job_id, body in batch:
            served.setdefault(job_id, body)
        if batch:
            client.execute_command("ACKJOB", *(job_id for _, job_id, _ in batch))
    assert list(served) == ids and all(served[ids[i]].startswith(b"%06d:" % i) for i in range(jobs))  # in order
    client.close()


def test_replicas_on_disk_serve_their_jobs_when_the_creator_dies(tmp_path: Path):
    with Cluster(tmp_path, 3, "--read-behind", "force", "--read-behind-prefetch", "5") as cluster:
        ids = [cluster.addjob(0, "q", f"job-{i}", 5000, "REPLICATE", 3, "RETRY", 2) for i in range(200)]
        for i in (1, 2):  # every replica here is on disk (one whose timer is due within the second waits for it)
            cluster.wait(lambda: read_behind(cluster.client(i))["active_jobs_on_disk"] == 200, what=f"node {i}'s copies on disk")
        cluster.kill(0)
        bodies: dict[str, bytes] = {}

        def drained() -> bool:
            for i in (1, 2):
                for _, job_id, body in cluster.call(i, "GETJOB", "NOHANG", "COUNT", 100, "FROM", "q") or []:
                    bodies[job_id.decode()] = body
                    cluster.call(i, "ACKJOB", job_id)
            return len(bodies) == len(ids)

        cluster.wait(drained, timeout=30, what="every job served by the surviving replicas")
        assert {bodies[i] for i in ids} == {f"job-{n}".encode() for n in range(200)}
