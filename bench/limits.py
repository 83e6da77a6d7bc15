"""Limits on real processes (docs/limits.md): a rate held by three nodes, and what a plain queue pays.

* rate: a fresh 3-node cluster, a queue at `rate-limit 300/s` (RATE),
  consumers on every node (10 each) taking jobs as fast as they come for
  60 s (DURATION, 15 s with --quick).  The figures come from the consumers'
  own clocks: the rate delivered over the run against the limit, and the
  most delivered in any one-second window (slid by 10 ms) against it.
* plain: one node, N jobs preloaded, then 8 consumers loop `GETJOB NOHANG`
  + `ACKJOB` until the queue is empty (no limit on the queue): cycles per
  second, and the node's CPU time per cycle (user + system, which the
  other processes of a shared machine disturb less), the median of 5 runs.  Run it once with this tree's sources and
  once with another's (PYTHONPATH=<tree> python bench/limits.py --plain) to
  compare what a queue without limits costs.

Usage: python bench/limits.py [--quick] [--plain]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

from common import cpu_seconds
from disque.testing.devcluster import NodeProcess, free_port, join

RATE = 300
CONSUMERS = 10  # per node
PLAIN_JOBS = 10_000


def deliveries(ports: list[int], queue: str, seconds: float) -> list[float]:
    """Consumers on each port take jobs for `seconds`; when each came."""
    seen: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def consumer(port: int) -> None:
        client = redis.Redis(port=port, socket_timeout=10)
        while time.monotonic() < stop:
            reply = client.execute_command("GETJOB", "TIMEOUT", 100, "FROM", queue)
            if reply:
                now = time.monotonic()
                client.execute_command("FASTACK", reply[0][1])
                with lock:
                    seen.append(now)
        client.close()

    threads = [threading.Thread(target=consumer, args=(port,)) for port in ports for _ in range(CONSUMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(seen)


def rate_run(base: Path, seconds: float) -> None:
    nodes = [NodeProcess(free_port(), base / f"node{i}").start() for i in range(3)]
    try:
        join(nodes)
        r = [redis.Redis(port=n.port) for n in nodes]
        r[0].execute_command("QCONFIG", "api", "SET", "rate-limit", f"{RATE}/s")
        pipe = [c.pipeline(transaction=False) for c in r]
        for i in range(int(RATE * seconds * 1.3)):  # more than the limit lets out
            pipe[i % 3].execute_command("ADDJOB", "api", "x", 0, "REPLICATE", 1, "ASYNC")
        for p in pipe:
            p.execute()
        time.sleep(3)  # the limit's home lends nothing for its quiet time after the cluster formed
        seen = deliveries([n.port for n in nodes], "api", seconds)
        start = seen[0]
        windows = [sum(1 for t in seen if s <= t < s + 1) for s in (start + k / 100 for k in range(int((seen[-1] - start - 1) * 100)))]
        rate = len(seen) / (seen[-1] - start)
        print(f"rate-limit {RATE}/s, 3 nodes, {3 * CONSUMERS} consumers, {seconds:.0f} s: {len(seen)} jobs, "
              f"{rate:.1f}/s delivered ({100 * (rate - RATE) / RATE:+.1f} % of the limit); "
              f"most in any second {max(windows)} ({100 * (max(windows) - RATE) / RATE:+.1f} %)")  # fmt: skip
        for c in r:
            c.close()
    finally:
        for n in nodes:
            n.stop()


def plain_run(base: Path) -> None:
    node = NodeProcess(free_port(), base / "plain").start()
    try:
        client = redis.Redis(port=node.port)
        rates, costs = [], []
        assert node.proc is not None
        for _ in range(5):
            pipe = client.pipeline(transaction=False)
            for _ in range(PLAIN_JOBS):
                pipe.execute_command("ADDJOB", "plain", "x", 0, "REPLICATE", 1)
            pipe.execute()
            done = [0] * 8

            def consumer(k: int) -> None:
                c = redis.Redis(port=node.port)
                while (reply := c.execute_command("GETJOB", "NOHANG", "FROM", "plain")) is not None:
                    c.execute_command("ACKJOB", reply[0][1])
                    done[k] += 1
                c.close()

            began, cpu = time.monotonic(), sum(cpu_seconds(node.proc.pid))
            threads = [threading.Thread(target=consumer, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rates.append(sum(done) / (time.monotonic() - began))
            costs.append((sum(cpu_seconds(node.proc.pid)) - cpu) / sum(done) * 1e6)
        import disque

        print(f"plain queue, GETJOB NOHANG + ACKJOB, 8 consumers ({Path(disque.__file__).parent.parent}): "
              f"{statistics.median(rates):.0f} cycles/s (median of {len(rates)}: {', '.join(f'{x:.0f}' for x in rates)}), "
              f"the node's CPU {statistics.median(costs):.1f} us a cycle ({', '.join(f'{x:.1f}' for x in costs)})")  # fmt: skip
        client.close()
    finally:
        node.stop()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="disque-limits-") as tmp:
        if "--plain" in sys.argv:
            plain_run(Path(tmp))
        else:
            rate_run(Path(tmp), 15 if "--quick" in sys.argv else 60)


if __name__ == "__main__":
    main()
