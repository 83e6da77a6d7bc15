"""Single node: ADDJOB / GETJOB NOHANG throughput and memory per queued job.

Throughput: redis-benchmark, 50 clients, unpipelined and pipelined 16, runs
`ADDJOB q <100-byte body> 0 RETRY 0` then `GETJOB NOHANG FROM q` (as many
GETJOBs as ADDJOBs, so every GETJOB takes a job) against a fresh node, and
`LPUSH q <100-byte body>` then `RPOP q` against redis-server.  Each of our
figures is divided by the Redis one (ADDJOB by LPUSH, GETJOB by RPOP) of the
same pipelining mode.

References for Python itself, both bench/bare_server.py, get the ADDJOB runs
too.  The bare loop parses requests with hiredis and answers each with a
fixed 48-byte status (no command logic): its ratio is about the most any
Python server could reach on this machine.  The job-keeping loop (--jobs)
also stores each job as the node does (ID, record, index, queue, timer) with
no checks: the distance from it to ours is what a complete ADDJOB costs on
top of keeping the job.  Our node also gets PING runs: a request with no
command work, so its ratio is the most our request path (parser, dispatch
checks, statistics, reply queueing) allows any command.

CPU per request: the user and system CPU time each server process used
during a run (/proc/PID/stat), divided by the requests of the run.  System
time is mostly the loopback recv/send work, which costs both servers about
the same; user time is where a Python node and Redis differ.

Priorities: the same ADDJOB and GETJOB runs on a second queue whose jobs
all carry `PRIORITY 7` (a queue that uses one priority, not the default),
each run right after its plain twin; the ratio (priority / plain) is the
cost of the option and of a queue of another level (docs/priorities.md:
at most 10 % slower).

Stalls: PING round trips from a second connection while a fresh node takes
1,000,000 pipelined ADDJOBs; the longest is the longest stop of the node.

Memory: a fresh node gets N (200,000) ADDJOBs of 100-byte bodies over one
pipelined connection; the RSS growth measured once INFO has answered (the
node has processed everything), divided by N, is the memory per queued job.
The same figure for LPUSH on a fresh redis-server is printed as a reference.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    BODY,
    CLIENTS,
    ServerProcess,
    bare_server_argv,
    cpu_seconds,
    expect_success,
    jobs_server_argv,
    print_table,
    redis_benchmark,
    rss_bytes,
    send_pipelined,
    start_node,
)

from disque.testing.devcluster import command

PIPELINE = 16
TARGETS = {  # ADDJOB / Redis LPUSH, and bytes per queued job (README, Performance)
    "addjob_unpipelined_ratio": 0.45,
    "addjob_pipelined_ratio": 0.15,
    "bytes_per_job": 450,
}
ADDJOB = ["ADDJOB", "q", BODY, "0", "RETRY", "0"]
GETJOB = ["GETJOB", "NOHANG", "FROM", "q"]
LPUSH = ["LPUSH", "q", BODY]
RPOP = ["RPOP", "q"]
# (ours, its Redis counterpart); the pops run after the pushes, so every pop finds an element
COMMANDS = (("ADDJOB", ADDJOB, "LPUSH", LPUSH), ("GETJOB", GETJOB, "RPOP", RPOP))
# The priority twins of our two commands: one priority on a queue of its own.
WITH_PRIORITY = {"ADDJOB": ["ADDJOB", "pq", BODY, "0", "RETRY", "0", "PRIORITY", "7"], "GETJOB": ["GETJOB", "NOHANG", "FROM", "pq"]}
MODES = ((1, "unpipelined"), (PIPELINE, "pipelined"))


def _sizes(quick: bool) -> dict[str, int]:
    """Requests per run, sized for a few seconds each on 2 cores."""
    scale = 10 if quick else 1
    return {
        "node_unpipelined": 100_000 // scale,
        "node_pipelined": 300_000 // scale,
        "redis_unpipelined": 200_000 // scale,
        "redis_pipelined": 1_000_000 // scale,
        "memory_jobs": 200_000 // (4 if quick else 1),
        "stall_jobs": 1_000_000 // (5 if quick else 1),
    }


def _throughput(servers: dict[str, Any], sizes: dict[str, int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """ops/s and CPU µs per request (user, system) by server and
    "<command>_<mode>".  The servers run side by side and each of our runs
    follows the runs it is compared with, so that a change in the machine's
    load during the benchmark affects both sides of a ratio alike."""
    node, redis = servers["disque"], servers["redis"]
    for port, push, pop in ((node.port, ADDJOB, GETJOB), (redis.port, LPUSH, RPOP)):
        expect_success(port, *push)
        expect_success(port, *pop)
    ops: dict[str, Any] = {side: {} for side in servers}
    cpu: dict[str, Any] = {side: {} for side in servers}
    for name, argv, redis_name, redis_argv in COMMANDS:
        for pipeline, mode in MODES:
            runs = [
                ("redis", redis, f"{redis_name}_{mode}", redis_argv, sizes["redis_" + mode]),
                ("disque", node, f"{name}_{mode}", argv, sizes["node_" + mode]),
            ]
            runs.append(("disque", node, f"{name}_PRIORITY_{mode}", WITH_PRIORITY[name], sizes["node_" + mode]))
            if name == "ADDJOB":
                runs[1:1] = [
                    ("bare", servers["bare"], f"{name}_{mode}", argv, sizes["redis_" + mode]),
                    ("jobs", servers["jobs"], f"{name}_{mode}", argv, sizes["node_" + mode]),
                    ("disque", node, f"PING_{mode}", ["PING"], sizes["redis_" + mode]),
                ]
            for side, server, key, args, requests in runs:
                user, system = cpu_seconds(server.pid)
                ops[side][key] = redis_benchmark(server.port, requests, pipeline, *args)
                user2, system2 = cpu_seconds(server.pid)
                cpu[side][key] = ((user2 - user) / requests * 1e6, (system2 - system) / requests * 1e6)
    return ops, cpu


def _wire(argv: list[Any]) -> list[bytes]:
    return [a if isinstance(a, bytes) else a.encode() for a in argv]


def _growth_per_item(pid: int, port: int, argv: list[Any], count: int) -> float:
    """RSS growth of a server over `count` pipelined `argv`, per request."""
    before = rss_bytes(pid)
    send_pipelined(port, _wire(argv), count)
    command("127.0.0.1", port, "INFO")  # answered after everything before it
    time.sleep(0.5)
    return (rss_bytes(pid) - before) / count


def _stalls(port: int, count: int) -> dict[str, float]:
    """PING round trips (ms) from a second connection, one every 2 ms, while
    one pipelined connection adds `count` jobs: the longest shows how long
    the node stopped (garbage-collection passes over the growing backlog)."""
    rtts: list[float] = []
    done = threading.Event()

    def ping() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            while not done.is_set():
                started = time.perf_counter()
                s.sendall(b"PING\r\n")
                if not s.recv(64):
                    return
                rtts.append((time.perf_counter() - started) * 1000)
                time.sleep(0.002)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        send_pipelined(port, _wire(ADDJOB), count)
    finally:
        done.set()
        pinger.join()
    rtts.sort()
    return {"pings": len(rtts), "p99_ms": rtts[int(len(rtts) * 0.99)], "max_ms": rtts[-1]}


def run(quick: bool) -> dict[str, Any]:
    sizes = _sizes(quick)
    with tempfile.TemporaryDirectory(prefix="disque-bench-") as tmp:
        base = Path(tmp)
        servers = {
            "disque": start_node(base / "node"),
            "redis": ServerProcess(base / "redis"),
            "bare": ServerProcess(base / "bare", bare_server_argv),
            "jobs": ServerProcess(base / "jobs", jobs_server_argv),
        }
        try:
            for side in ("redis", "bare", "jobs"):
                servers[side].start()
            ops, cpu = _throughput(servers, sizes)
        finally:
            for server in servers.values():
                server.stop()
        node = start_node(base / "node-mem")
        try:
            job_bytes = _growth_per_item(node.pid, node.port, ADDJOB, sizes["memory_jobs"])
        finally:
            node.stop()
        node = start_node(base / "node-stall")
        try:
            stalls = _stalls(node.port, sizes["stall_jobs"])
        finally:
            node.stop()
        redis = ServerProcess(base / "redis-mem").start()
        try:
            element_bytes = _growth_per_item(redis.pid, redis.port, LPUSH, sizes["memory_jobs"])
        finally:
            redis.stop()

    rows, ratios = [], {}
    for pipeline, mode in MODES:
        for name, _, redis_name, _ in COMMANDS:
            ours, theirs = ops["disque"][f"{name}_{mode}"], ops["redis"][f"{redis_name}_{mode}"]
            ratios[f"{name.lower()}_{mode}_ratio"] = ours / theirs
            rows.append([name, f"-P {pipeline}", ours, redis_name, theirs, ours / theirs])
    print_table(
        f"Throughput, {CLIENTS} clients, 100-byte bodies (ratio = ours / the Redis command, same pipelining)",
        ["command", "pipeline", "ops/s", "redis", "redis ops/s", "ratio"],
        rows,
    )
    references = (
        ("bare", "ADDJOB", "bare Python loop, fixed reply"),
        ("jobs", "ADDJOB", "job-keeping Python loop, no checks"),
        ("disque", "PING", "our node, PING"),
    )
    print_table(
        "References (bench/bare_server.py: epoll, hiredis; PING: our request path with no command work)",
        ["server", "command", "pipeline", "ops/s", "ratio to LPUSH", "user µs", "system µs"],
        [[label, name, f"-P {pipeline}", ops[side][f"{name}_{mode}"], ops[side][f"{name}_{mode}"] / ops["redis"][f"LPUSH_{mode}"],
          *cpu[side][f"{name}_{mode}"]] for side, name, label in references for pipeline, mode in MODES],
    )  # fmt: skip
    print_table(
        "Server CPU per request, µs (user / system; from /proc, tick-grained)",
        ["command", "pipeline", "user", "system", "redis", "user", "system"],
        [[name, f"-P {pipeline}", *cpu["disque"][f"{name}_{mode}"], redis_name, *cpu["redis"][f"{redis_name}_{mode}"]]
         for pipeline, mode in MODES for name, _, redis_name, _ in COMMANDS],
    )  # fmt: skip
    priority_rows = []
    for pipeline, mode in MODES:
        for name, _, _, _ in COMMANDS:
            plain, with_priority = ops["disque"][f"{name}_{mode}"], ops["disque"][f"{name}_PRIORITY_{mode}"]
            ratios[f"{name.lower()}_priority_{mode}_ratio"] = with_priority / plain
            priority_rows.append([name, f"-P {pipeline}", plain, with_priority, with_priority / plain])
    print_table(
        "Priorities: one queue of PRIORITY 7 jobs vs the plain queue (ratio = with / without; goal >= 0.9)",
        ["command", "pipeline", "ops/s", "PRIORITY ops/s", "ratio"],
        priority_rows,
    )
    print_table(
        f"Memory, RSS growth over {sizes['memory_jobs']:,} queued 100-byte items",
        ["server", "bytes per item"],
        [["disque ADDJOB", job_bytes], ["redis LPUSH (reference)", element_bytes]],
    )
    print_table(
        f"Stalls: PING round trips while one pipelined client adds {sizes['stall_jobs']:,} jobs to a fresh node",
        ["pings", "p99 ms", "longest ms"],
        [[stalls["pings"], stalls["p99_ms"], stalls["max_ms"]]],
    )
    measured = {**ratios, "bytes_per_job": job_bytes}
    met = {key: measured[key] <= goal if key == "bytes_per_job" else measured[key] >= goal for key, goal in TARGETS.items()}
    print_table(
        "Targets",
        ["figure", "target", "measured", "met"],
        [[key, ("<= " if key == "bytes_per_job" else ">= ") + str(goal), measured[key], "yes" if met[key] else "NO"]
         for key, goal in TARGETS.items()],
    )  # fmt: skip
    return {
        "sizes": sizes,
        "ops_per_sec": ops,
        "cpu_us_per_request": cpu,
        "stalls": stalls,
        "ratios": ratios,
        "memory": {"disque_bytes_per_job": job_bytes, "redis_bytes_per_element": element_bytes},
        "targets": TARGETS,
        "targets_met": met,
    }
