"""Single node: ADDJOB / GETJOB NOHANG throughput and memory per queued job.

Throughput: redis-benchmark, 50 clients, unpipelined and pipelined 16, runs
`ADDJOB q <100-byte body> 0 RETRY 0` then `GETJOB NOHANG FROM q` (as many
GETJOBs as ADDJOBs, so every GETJOB takes a job) against a fresh node, and
`LPUSH q <100-byte body>` then `RPOP q` against redis-server.  Each of our
figures is divided by the Redis one (ADDJOB by LPUSH, GETJOB by RPOP) of the
same pipelining mode.

Memory: a fresh node gets N (200,000) ADDJOBs of 100-byte bodies over one
pipelined connection; the RSS growth measured once INFO has answered (the
node has processed everything), divided by N, is the memory per queued job.
The same figure for LPUSH on a fresh redis-server is printed as a reference.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from common import BODY, CLIENTS, RedisProcess, print_table, redis_benchmark, rss_bytes, send_pipelined, start_node

from disque.devcluster import command

PIPELINE = 16
TARGETS = {  # issue targets: ADDJOB / Redis LPUSH, and bytes per queued job
    "addjob_unpipelined_ratio": 0.6,
    "addjob_pipelined_ratio": 0.2,
    "bytes_per_job": 600,
}
ADDJOB = ["ADDJOB", "q", BODY, "0", "RETRY", "0"]
GETJOB = ["GETJOB", "NOHANG", "FROM", "q"]
LPUSH = ["LPUSH", "q", BODY]
RPOP = ["RPOP", "q"]


def _sizes(quick: bool) -> dict[str, int]:
    """Requests per run, sized for a few seconds each on 2 cores."""
    scale = 10 if quick else 1
    return {
        "node_unpipelined": 100_000 // scale,
        "node_pipelined": 300_000 // scale,
        "redis_unpipelined": 200_000 // scale,
        "redis_pipelined": 1_000_000 // scale,
        "memory_jobs": 200_000 // (4 if quick else 1),
    }


def _throughput(port: int, push: list[Any], pop: list[Any], unpipelined: int, pipelined: int) -> dict[str, float]:
    """push then pop, unpipelined then pipelined, so every pop finds an element."""
    return {
        "push_1": redis_benchmark(port, unpipelined, 1, *push),
        "push_16": redis_benchmark(port, pipelined, PIPELINE, *push),
        "pop_1": redis_benchmark(port, unpipelined, 1, *pop),
        "pop_16": redis_benchmark(port, pipelined, PIPELINE, *pop),
    }


def _growth_per_item(pid: int, port: int, argv: list[Any], count: int) -> float:
    before = rss_bytes(pid)
    send_pipelined(port, [a if isinstance(a, bytes) else a.encode() for a in argv], count)
    command("127.0.0.1", port, "INFO")
    time.sleep(0.5)
    return (rss_bytes(pid) - before) / count


def run(quick: bool) -> dict[str, Any]:
    sizes = _sizes(quick)
    with tempfile.TemporaryDirectory(prefix="disque-bench-") as tmp:
        base = Path(tmp)
        node = start_node(base / "node")
        try:
            ours = _throughput(node.port, ADDJOB, GETJOB, sizes["node_unpipelined"], sizes["node_pipelined"])
        finally:
            node.stop()
        redis = RedisProcess(base / "redis").start()
        try:
            theirs = _throughput(redis.port, LPUSH, RPOP, sizes["redis_unpipelined"], sizes["redis_pipelined"])
        finally:
            redis.stop()
        node = start_node(base / "node-mem")
        try:
            job_bytes = _growth_per_item(node.pid, node.port, ADDJOB, sizes["memory_jobs"])
        finally:
            node.stop()
        redis = RedisProcess(base / "redis-mem").start()
        try:
            element_bytes = _growth_per_item(redis.pid, redis.port, LPUSH, sizes["memory_jobs"])
        finally:
            redis.stop()

    rows, ratios = [], {}
    for mode, label in (("1", "unpipelined"), ("16", f"pipelined {PIPELINE}")):
        for op, name, redis_name in (("push_", "ADDJOB", "LPUSH"), ("pop_", "GETJOB NOHANG", "RPOP")):
            ratio = ours[op + mode] / theirs[op + mode]
            ratios[f"{name.split()[0].lower()}_{label.split()[0]}_ratio"] = ratio
            rows.append([name, label, ours[op + mode], redis_name, theirs[op + mode], ratio])
    print_table(
        f"Throughput, {CLIENTS} clients, 100-byte bodies (ratio = ours / the Redis command, same mode)",
        ["command", "mode", "ops/s", "redis", "redis ops/s", "ratio"],
        rows,
    )
    print_table(
        f"Memory, RSS growth over {sizes['memory_jobs']:,} queued 100-byte items",
        ["server", "bytes per item"],
        [["disque ADDJOB", job_bytes], ["redis LPUSH (reference)", element_bytes]],
    )
    measured = {**ratios, "bytes_per_job": job_bytes}
    met = {
        key: measured[key] <= goal if key == "bytes_per_job" else measured[key] >= goal for key, goal in TARGETS.items()
    }
    print_table(
        "Targets",
        ["figure", "target", "measured", "met"],
        [[key, ("<= " if key == "bytes_per_job" else ">= ") + str(goal), measured[key], "yes" if met[key] else "NO"]
         for key, goal in TARGETS.items()],
    )  # fmt: skip
    return {
        "sizes": sizes,
        "ops_per_sec": {"disque": ours, "redis": theirs},
        "ratios": ratios,
        "memory": {"disque_bytes_per_job": job_bytes, "redis_bytes_per_element": element_bytes},
        "targets": TARGETS,
        "targets_met": met,
    }
