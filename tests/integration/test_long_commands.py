"""Long admin commands yield: DEADLETTER REQUEUE of 50,000 dead letters
over RESP runs in slices, so another client's PING waits for a slice at
most, never for the whole requeue (a real node)."""

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
def test_a_requeue_of_50000_dead_letters_leaves_ping_fast(spawn):
    node = spawn()
    r = redis.Redis(port=node.port, socket_timeout=60)
    dead_letters(r, "q", N)
    took: list[float] = []
    done = threading.Event()

    def ping() -> None:
        with redis.Redis(port=node.port, socket_timeout=60) as other:
            while not done.is_set():
                began = time.perf_counter()
                other.ping()
                took.append(time.perf_counter() - began)
                time.sleep(0.002)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        time.sleep(0.2)
        assert r.execute_command("DEADLETTER", "REQUEUE", "q-dead") == N
    finally:
        done.set()
        pinger.join()
    assert r.execute_command("QLEN", "q") == N and r.execute_command("QLEN", "q-dead") == 0
    assert len(took) > 50 and max(took) <= 0.050, (len(took), sorted(took)[len(took) // 2], max(took))
    r.close()
