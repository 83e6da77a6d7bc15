"""Shared helpers of the benchmarks: servers, redis-benchmark, RSS, output.

Every benchmark compares our node with a `redis-server` started in the same
run, on the same machine, driven by the same `redis-benchmark` binary, so the
ratios it prints do not depend on how fast the machine is.  Both servers and
the load generator share the machine's cores: a ratio is the figure to watch,
an absolute ops/s is only meaningful next to the Redis one printed with it.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from disque import compiled
from disque.client import encode_command
from disque.testing.devcluster import NodeProcess, command, free_port

RESULTS_DIR = Path(__file__).with_name("results")
BODY = b"x" * 100  # the job body / list element of every benchmark
CLIENTS = 50


def require_tools() -> None:
    missing = [tool for tool in ("redis-benchmark", "redis-server") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"{' and '.join(missing)} not found: `make bench` installs them (Debian packages redis-tools, redis-server)")


def environment() -> dict[str, object]:
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "core": "compiled" if compiled.active() else "pure Python",  # the nodes' (disque/compiled.py; DISQUE_PURE=1)
        "redis": next((w[2:] for w in version if w.startswith("v=")), "?"),
        "platform": platform.platform(),
        "load_average": os.getloadavg()[0],  # other work on the machine skews every figure
    }


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return "unknown CPU"


def start_node(workdir: Path, *extra: str) -> NodeProcess:
    """A fresh single node (default config) on a free port."""
    return NodeProcess(free_port(), workdir, *extra).start()


class ServerProcess:
    """A reference server (redis-server, or any command line taking a port)
    in its own directory, on a free port; ready once it answers PING."""

    host = "127.0.0.1"

    def __init__(self, workdir: Path, make_argv: Callable[[int, Path], list[str]] | None = None, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.argv = (make_argv or _redis_argv)(self.port, workdir)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: float = 10.0) -> ServerProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=self.workdir)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}, see {self.workdir}")
            try:
                if command("127.0.0.1", self.port, "PING", timeout=1).startswith(b"+"):
                    return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"{self.argv[0]} did not answer in time")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def c_disque_argv(port: int, workdir: Path) -> list[str]:
    """C Disque's disque-server, named by DISQUE_C: the reference of every ratio to C."""
    return [os.environ["DISQUE_C"], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
            "--logfile", "disque.log"]  # fmt: skip


def _redis_argv(port: int, workdir: Path) -> list[str]:
    """redis-server without persistence."""
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(workdir), "--logfile", "redis.log"]  # fmt: skip


def bare_server_argv(port: int, workdir: Path) -> list[str]:
    """bench/bare_server.py: epoll + hiredis + a fixed reply, no command logic."""
    return [sys.executable, str(Path(__file__).with_name("bare_server.py")), str(port)]


def jobs_server_argv(port: int, workdir: Path) -> list[str]:
    """bench/bare_server.py --jobs: the same loop keeping each ADDJOB's job, no checks."""
    return [*bare_server_argv(port, workdir), "--jobs"]


def expect_success(port: int, *args: str | bytes) -> bytes:
    """Run one command and return its reply; raise if it is an error (which
    redis-benchmark would count as a completed request)."""
    reply = command("127.0.0.1", port, *args)
    if not reply or reply.startswith(b"-"):
        raise RuntimeError(f"{args[0]!r} on port {port} failed: {reply[:200]!r}")
    return reply


def redis_benchmark(port: int, requests: int, pipeline: int, *args: str | bytes) -> float:
    """Requests per second of `redis-benchmark -c 50 -n requests -P pipeline <args>`."""
    return redis_benchmark_row(port, requests, pipeline, *args)["rps"]


def redis_benchmark_row(port: int, requests: int, pipeline: int, *args: str | bytes) -> dict[str, float]:
    """The figures of `redis-benchmark -c 50 -n requests -P pipeline <args>`:
    rps and, from redis-benchmark >= 6, the latency columns in ms
    (avg_latency_ms, p50_latency_ms, p99_latency_ms, ...)."""
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(CLIENTS), "-n", str(requests),
            "-P", str(pipeline), "--csv", *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, check=True)
    rows = [row for row in csv.reader(done.stdout.decode().splitlines()) if len(row) >= 2]
    try:
        values = [float(v) for v in rows[-1][1:]]  # the last row; redis-benchmark >= 6 puts a header first
    except (IndexError, ValueError):
        raise RuntimeError(f"unexpected redis-benchmark output: {done.stdout!r} {done.stderr!r}") from None
    names = rows[0][1:] if len(rows) > 1 else ["rps"]
    return dict(zip(names, values))


def send_pipelined(port: int, argv: list[str | bytes], count: int, batch: int = 1000, timeout: float = 30) -> list[bytes]:
    """Send one command `count` times over one connection, `batch` requests
    per write, reading all replies of a batch before the next.  The replies
    must be single lines (status, integer); an error reply raises.  Returns
    the reply lines without their type byte (job IDs for ADDJOB)."""
    request = encode_command(argv)
    out: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        while len(out) < count:
            n = min(batch, count - len(out))
            s.sendall(request * n)
            replies = bytearray()
            while replies.count(b"\r\n") < n:
                chunk = s.recv(1 << 20)
                if not chunk:
                    raise RuntimeError("connection closed during a pipelined run")
                replies += chunk
            lines = bytes(replies).split(b"\r\n")[:n]
            if any(line.startswith(b"-") for line in lines):
                raise RuntimeError(f"error reply: {lines[:3]!r}")
            out.extend(line[1:] for line in lines)
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds a process has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()  # the command name may hold spaces
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    """A plain aligned table; numbers right-aligned, floats with 2 decimals."""
    cells = [[_cell(v) for v in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(header))]
    print(f"\n{title}")
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_results(name: str, data: dict[str, object]) -> Path:
    """bench/results/<name>-<timestamp>.json (gitignored)."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
