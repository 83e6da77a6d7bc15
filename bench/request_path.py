"""The request path: every per-request figure next to its references, in one run.

Each figure is `redis-benchmark -c 50` (100-byte bodies) against a fresh
node with the default config, run right after the same figure of its
references, so that the machine's load moves both sides of a ratio alike:

* redis-server (always): PING, LPUSH for ADDJOB, RPOP for GETJOB;
* C Disque, when DISQUE_C names its `disque-server` binary: the same
  commands, a single node and a 3-node cluster, and the ratios to it.

Single node: PING unpipelined; `ADDJOB q <body> 0 REPLICATE 1 RETRY 0` and
`GETJOB NOHANG FROM q` unpipelined and pipelined 16 (as many GETJOBs as
ADDJOBs, so every GETJOB takes a job); with the server's user and system
CPU per request (/proc) and redis-benchmark's p99 latency; then the system
calls per ADDJOB (unpipelined, pipelined 16) of each server, counted by
`strace -c -f` (fewer requests: tracing slows the server), and the
instructions per ADDJOB of bench/instructions.py under callgrind.  3 local nodes:
`ADDJOB ... REPLICATE 3` unpipelined and pipelined 16, and ASYNC pipelined
16.  The same path's other protocols: memcache SET/GET (4 connections,
bench/memcache.py's generator) next to memcached, and QADD/QGET (consumer
groups) next to LPUSH/RPOP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import instructions
import memcache
from common import BODY, CLIENTS, ServerProcess, c_disque_argv, cpu_seconds, expect_success, print_table, redis_benchmark_row, start_node

from disque.testing.devcluster import NodeProcess, command, free_port, join

C_DISQUE = os.environ.get("DISQUE_C")  # C Disque's disque-server, the reference of every ratio to C
PING = ["PING"]
ADDJOB = ["ADDJOB", "q", BODY, "0", "REPLICATE", "1", "RETRY", "0"]
GETJOB = ["GETJOB", "NOHANG", "FROM", "q"]
LPUSH = ["LPUSH", "q", BODY]
RPOP = ["RPOP", "q"]
R3 = ["ADDJOB", "r3", BODY, "0", "REPLICATE", "3"]
QADD = ["QADD", "g", "3600", BODY]
QGET = ["QGET", "g", "grp", "EX", "0"]
# figure -> (ours, its redis-server counterpart, pipeline); in this order, so that the pops find what the pushes left
SINGLE = {
    "PING_unpipelined": (PING, PING, 1),
    "ADDJOB_unpipelined": (ADDJOB, LPUSH, 1),
    "ADDJOB_pipelined": (ADDJOB, LPUSH, 16),
    "GETJOB_unpipelined": (GETJOB, RPOP, 1),
    "GETJOB_pipelined": (GETJOB, RPOP, 16),
    "QADD_unpipelined": (QADD, LPUSH, 1),
    "QGET_unpipelined": (QGET, RPOP, 1),
}
CLUSTER = {
    "R3_unpipelined": (R3, 1),
    "R3_pipelined": (R3, 16),
    "R3_ASYNC_pipelined": ([*R3, "ASYNC"], 16),
}
SYSCALLS = ("ADDJOB_unpipelined", "ADDJOB_pipelined")  # figures whose system calls per request are counted
# name -> (figure, reference, at least); references: "redis" or "c"
TARGETS = {
    "PING / redis PING, unpipelined": ("PING_unpipelined", "redis", 0.75),
    "ADDJOB / C, unpipelined": ("ADDJOB_unpipelined", "c", 0.5),
    "ADDJOB / C, pipelined 16": ("ADDJOB_pipelined", "c", 0.4),
    "ADDJOB / redis LPUSH, unpipelined": ("ADDJOB_unpipelined", "redis", 0.45),
    "GETJOB NOHANG / C, unpipelined": ("GETJOB_unpipelined", "c", 0.6),
    "REPLICATE 3 / C, unpipelined": ("R3_unpipelined", "c", 0.6),
    "REPLICATE 3 ASYNC / C, pipelined 16": ("R3_ASYNC_pipelined", "c", 0.5),
}
USER_US_TARGET = 25.0  # server user CPU per unpipelined ADDJOB
INSTRUCTIONS_TARGET = {1: 25_000, 16: 15_000}  # per ADDJOB, by pipeline depth: machine-free, unlike the ratios


def _sizes(quick: bool) -> dict[int, int]:
    """Requests per figure by pipeline: a few seconds each on 2 cores."""
    scale = 5 if quick else 1
    return {1: 100_000 // scale, 16: 300_000 // scale}


def _measure(server: Any, args: list[Any], requests: int, pipeline: int) -> dict[str, float]:
    """redis-benchmark's figures plus the server's CPU µs per request."""
    user, system = cpu_seconds(server.pid)
    row = redis_benchmark_row(server.port, requests, pipeline, *args)
    user2, system2 = cpu_seconds(server.pid)
    return {**row, "user_us": (user2 - user) / requests * 1e6, "system_us": (system2 - system) / requests * 1e6}


SYSCALL_REQUESTS = 20_000  # per count: strace slows the server, so fewer requests than the throughput figures


def syscalls_per_request(server: Any, args: list[Any], pipeline: int, requests: int = SYSCALL_REQUESTS) -> float:
    """System calls the server makes per request (every thread, `strace -c
    -f` attached for the run of `requests` requests): a count that does not
    depend on how fast the machine runs user code."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(["strace", "-c", "-f", "-o", out.name, "-p", str(server.pid)], stderr=subprocess.PIPE, text=True)
        assert tracer.stderr is not None
        while "attached" not in tracer.stderr.readline():  # traced from here on
            if tracer.poll() is not None:
                raise RuntimeError("strace could not attach (ptrace not permitted?)")
        redis_benchmark_row(server.port, requests, pipeline, *args)
        tracer.send_signal(signal.SIGINT)
        tracer.communicate(timeout=30)
        header, *lines = out.read().splitlines()
        total = next(line for line in lines if line.rstrip().endswith("total"))
    return int(total[: header.index("calls") + len("calls")].split()[-1]) / requests  # the column is right-aligned


def _join_c(nodes: list[ServerProcess], timeout: float = 15.0) -> None:
    """CLUSTER MEET the C nodes and wait until each knows all of them (HELLO)."""
    for node in nodes[1:]:
        command("127.0.0.1", nodes[0].port, "CLUSTER", "MEET", "127.0.0.1", str(node.port))
    deadline = time.monotonic() + timeout
    for node in nodes:
        while not command("127.0.0.1", node.port, "HELLO").startswith(b"*%d\r\n" % (len(nodes) + 2)):
            if time.monotonic() > deadline:
                raise RuntimeError("the C Disque cluster did not form in time")
            time.sleep(0.05)
    time.sleep(1)  # its nodes mark each other reachable after a ping round


def _single(base: Path, sizes: dict[int, int]) -> dict[str, dict[str, dict[str, float]]]:
    servers: dict[str, Any] = {"redis": ServerProcess(base / "redis"), "ours": start_node(base / "node")}
    if C_DISQUE:
        servers["c"] = ServerProcess(base / "c", c_disque_argv)
    out: dict[str, dict[str, dict[str, float]]] = {side: {} for side in servers}
    try:
        for side in ("redis", "c"):
            if side in servers:
                servers[side].start()
        for figure, (ours, theirs, pipeline) in SINGLE.items():
            n = sizes[pipeline]
            out["redis"][figure] = _measure(servers["redis"], theirs, n, pipeline)
            if "c" in servers and not figure.startswith("Q"):
                out["c"][figure] = _measure(servers["c"], ours, n, pipeline)
            if figure == "QADD_unpipelined":
                expect_success(servers["ours"].port, *QADD)  # the group starts reading from here
                expect_success(servers["ours"].port, *QGET)
            out["ours"][figure] = _measure(servers["ours"], ours, n, pipeline)
        for figure in SYSCALLS:  # after the throughput figures: strace must not slow them
            ours, theirs, pipeline = SINGLE[figure]
            for side, server in servers.items():
                out[side][figure]["syscalls"] = syscalls_per_request(server, theirs if side == "redis" else ours, pipeline)
    finally:
        for server in servers.values():
            server.stop()
    return out


def _cluster(base: Path, sizes: dict[int, int]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {"ours": {}, "c": {}}
    ours = [NodeProcess(free_port(), base / f"node{i}") for i in range(3)]
    c = [ServerProcess(base / f"c{i}", c_disque_argv) for i in range(3)] if C_DISQUE else []
    try:
        for node in [*ours, *c]:
            node.start()
        join(ours)
        if c:
            _join_c(c)
        for figure, (args, pipeline) in CLUSTER.items():
            for side, nodes in (("c", c), ("ours", ours)):
                if nodes:
                    out[side][figure] = _measure(nodes[0], args, sizes[pipeline], pipeline)
                    for node in nodes:  # the next figure starts from empty nodes
                        command("127.0.0.1", node.port, "DEBUG", "FLUSHALL", timeout=120)
    finally:
        for node in [*ours, *c]:
            node.stop()
    return out


def _memcache(base: Path, requests: int) -> dict[str, float]:
    """SET/GET on our memcache port and on memcached (4 connections)."""
    port, memcached_port = free_port(), free_port()
    node = start_node(base / "mc-node", "--memcache-port", str(port))
    memcached = subprocess.Popen(["memcached", "-U", "0", "-p", str(memcached_port), "-l", "127.0.0.1", "-u", "root"])
    out = {}
    try:
        deadline = time.monotonic() + 10
        while b"STORED" not in _memcached_set(memcached_port):
            if time.monotonic() > deadline:
                raise RuntimeError("memcached did not answer in time")
            time.sleep(0.05)
        for pipeline in (1, 16):
            for name in ("SET", "GET"):
                out[f"memcached {name} -P {pipeline}"] = memcache.throughput(memcached_port, name, pipeline, requests)
                out[f"{name} -P {pipeline}"] = memcache.throughput(port, name, pipeline, requests)
    finally:
        memcached.terminate()
        memcached.wait()
        node.stop()
    return out


def _memcached_set(port: int) -> bytes:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"set probe 0 0 1\r\nx\r\n")
            return s.recv(64)
    except OSError:
        return b""


def run(quick: bool) -> dict[str, Any]:
    sizes = _sizes(quick)
    with tempfile.TemporaryDirectory(prefix="disque-bench-path-") as tmp:
        base = Path(tmp)
        single = _single(base, sizes)
        cluster = _cluster(base, sizes)
        mc = _memcache(base, sizes[1] // 5)
    figures = {side: {**single.get(side, {}), **cluster.get(side, {})} for side in ("ours", "redis", "c")}
    ours, redis, c = figures["ours"], figures["redis"], figures["c"]

    def ratio(a: dict[str, float] | None, b: dict[str, float] | None) -> Any:
        return a["rps"] / b["rps"] if a and b else "-"

    def rps(row: dict[str, float] | None) -> Any:
        return row["rps"] if row else "-"

    def p99(row: dict[str, float] | None) -> Any:
        return row.get("p99_latency_ms", "-") if row else "-"

    rows = []
    for figure, (ours_args, redis_args, pipeline) in SINGLE.items():
        rows.append([figure.replace("_", " "), ours[figure]["rps"], p99(ours[figure]), redis_args[0], rps(redis[figure]),
                     p99(redis[figure]), ratio(ours[figure], redis[figure]), rps(c.get(figure)), p99(c.get(figure)),
                     ratio(ours[figure], c.get(figure))])  # fmt: skip
    for figure in CLUSTER:
        rows.append([figure.replace("_", " ") + " (3 nodes)", ours[figure]["rps"], p99(ours[figure]), "", "-", "-", "-",
                     rps(c.get(figure)), p99(c.get(figure)), ratio(ours[figure], c.get(figure))])  # fmt: skip
    print_table(
        f"Throughput, {CLIENTS} clients, 100-byte bodies, {sizes[1]:,} requests unpipelined / {sizes[16]:,} pipelined 16 per figure"
        + ("" if C_DISQUE else " (no C column: set DISQUE_C to C Disque's disque-server)"),
        ["figure", "ops/s", "p99 ms", "redis", "redis ops/s", "p99 ms", "/ redis", "C ops/s", "p99 ms", "/ C"],
        rows,
    )
    cpu_rows = []
    for figure in [*SINGLE, *CLUSTER]:
        line = [figure.replace("_", " "), ours[figure]["user_us"], ours[figure]["system_us"]]
        for side in (redis, c):
            row = side.get(figure)
            line += [row["user_us"], row["system_us"]] if row else ["-", "-"]
        cpu_rows.append(line)
    print_table(
        "Server CPU per request, µs (from /proc, tick-grained; 3 nodes: the node the clients talk to)",
        ["figure", "ours user", "system", "redis user", "system", "C user", "system"],
        cpu_rows,
    )
    print_table(
        f"System calls per request (strace -c -f on the server, {SYSCALL_REQUESTS:,} requests; the target: no more than C's)",
        ["figure", "ours", "redis", "C"],
        [[figure.replace("_", " "), *(side[figure]["syscalls"] if figure in side else "-" for side in (ours, redis, c))] for figure in SYSCALLS],
    )
    print("\nInstructions per ADDJOB (callgrind, bench/instructions.py: the whole process, 2,000 and 6,000 rounds)...")
    counts = {pipeline: instructions.per_request("addjob", pipeline) for pipeline in (1, 16)}
    print_table(
        "Instructions per ADDJOB REPLICATE 1 RETRY 0 (- : no valgrind, `make tools-valgrind`)",
        ["figure", "instructions", "target"],
        [["unpipelined", counts[1] or "-", f"<= {INSTRUCTIONS_TARGET[1]:,}"], ["pipelined 16", counts[16] or "-", f"<= {INSTRUCTIONS_TARGET[16]:,}"]],
    )
    mc_rows = [[f"{name} -P {p}", mc[f"{name} -P {p}"], mc[f"memcached {name} -P {p}"], mc[f"{name} -P {p}"] / mc[f"memcached {name} -P {p}"]]
               for p in (1, 16) for name in ("SET", "GET")]  # fmt: skip
    print_table(
        f"The memcache port, {memcache.WORKERS} connections, 100-byte items, {sizes[1] // 5:,} requests per figure",
        ["figure", "ops/s", "memcached ops/s", "ratio"],
        mc_rows,
    )
    measured: dict[str, Any] = {}
    for name, (figure, side, _) in TARGETS.items():
        measured[name] = ratio(ours[figure], (redis if side == "redis" else c).get(figure))
    user_us = ours["ADDJOB_unpipelined"]["user_us"]
    target_rows = [[name, f">= {goal}", measured[name], "-" if measured[name] == "-" else "yes" if measured[name] >= goal else "NO"]
                   for name, (_, _, goal) in TARGETS.items()]  # fmt: skip
    target_rows.append(["user µs per unpipelined ADDJOB", f"<= {USER_US_TARGET}", user_us, "yes" if user_us <= USER_US_TARGET else "NO"])
    print_table("Targets (- : needs DISQUE_C)", ["figure", "target", "measured", "met"], target_rows)
    return {"sizes": sizes, "figures": figures, "memcache": mc, "targets": measured, "addjob_user_us": user_us,
            "addjob_instructions": counts}  # fmt: skip


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
