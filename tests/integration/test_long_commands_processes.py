"""Long admin commands yield: DEADLETTER REQUEUE of 50,000 dead letters
over RESP, then JSCAN of them all and DELJOB of them all, run in slices, so
another client's PING waits for a slice at most, never for a whole command
(a real node)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

N = 50_000


def dead_letters(r: redis.Redis, queue: str, n: int) -> None:
    """`n` jobs of `queue` that failed their one attempt: dead letters in <queue>-dead."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.execute_command("ADDJOB", queue, f"b{i}", 0, "RETRY", 60, "MAXATTEMPTS", 1, "REPLICATE", 1)
    pipe.execute()
    while batch := r.execute_command("GETJOB", "NOHANG", "COUNT", 1000, "FROM", queue):
        r.execute_command("NACK", *[job_id for _, job_id, _ in batch])
    assert r.execute_command("QLEN", f"{queue}-dead") == n


@pytest.mark.slow
def test_a_requeue_jscan_and_deljob_of_50000_jobs_leave_ping_fast(spawn):
    node = spawn()
    r = redis.Redis(port=node.port, socket_timeout=60)
    dead_letters(r, "q", N)
    took: dict[str, list[float]] = {"requeue": [], "jscan": [], "deljob": []}
    phase = ["requeue"]
    done, pinging = threading.Event(), threading.Event()

    def ping() -> None:
        with redis.Redis(port=node.port, socket_timeout=60) as other:
            while not done.is_set():
                began, during = time.perf_counter(), phase[0]
                other.ping()
                if phase[0] == during:  # (a PING that straddles two commands counts for neither)
                    took[during].append(time.perf_counter() - began)
                pinging.set()
                time.sleep(0.002)  # (the pace of the PINGs)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        assert pinging.wait(10), "the PINGs to start"
        assert r.execute_command("DEADLETTER", "REQUEUE", "q-dead") == N
        assert r.execute_command("QLEN", "q") == N and r.execute_command("QLEN", "q-dead") == 0
        phase[0] = "jscan"
        cursor, ids = r.execute_command("JSCAN", 0, "COUNT", 2 * N)
        assert cursor == b"0" and len(ids) == N
        phase[0] = "deljob"
        assert r.execute_command("DELJOB", *ids) == N
    finally:
        done.set()
        pinger.join()
    assert r.execute_command("QLEN", "q") == 0
    figures = {k: (len(v), max(v, default=0)) for k, v in took.items()}
    assert len(took["requeue"]) > 50 and max(took["requeue"]) <= 0.050, figures
    # Their reply and request (50,000 IDs) are written and read whole, which
    # the pure-Python build takes a good part of 0.1 s to do; one DELJOB of
    # them all took 2 s before it ran in slices.
    assert max(took["jscan"] + took["deljob"]) <= 0.500, figures
    r.close()
