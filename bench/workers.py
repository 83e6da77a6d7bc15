"""Throughput as a Python team would compare us: one producer enqueues
10,000 100-byte jobs (a plain loop, then the system's bulk call where it has
one), then ONE worker process at concurrency 8 runs a no-op handler until
all are done, its start included; the first job's latency from the start.

The peers (Celery, RQ, Dramatiq, huey, arq, taskiq) run on a redis-server
without persistence started here, from the virtual environment of the
`bench` extra (BENCH_PYTHON, default .venv-bench/bin/python: `make bench`
makes it); ours on a node with AOF off (REPLICATE 1), then on three joined
nodes with REPLICATE 3.  bench/peers.py holds every system's producer and
handler.  A system that does not install or does not finish is shown as
such, and the others still run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ServerProcess, print_table
from disque.testing.devcluster import NodeProcess, command, free_port, join

HERE = Path(__file__).parent
BENCH_PYTHON = Path(os.environ.get("BENCH_PYTHON", HERE.parent / ".venv-bench" / "bin" / "python"))
DRAIN_LIMIT = 300.0  # s: a worker still draining then is reported as not finished

# name, BENCH_SYSTEM, has a bulk call, the worker's command line (bench/ as its directory)
PEERS: list[tuple[str, str, bool, list[str]]] = [
    ("Dramatiq (1 process, 8 threads)", "dramatiq", True, ["-m", "dramatiq", "peers", "--processes", "1", "--threads", "8"]),
    ("huey (8 threads)", "huey", False, ["-m", "huey.bin.huey_consumer", "peers.huey", "-w", "8", "-k", "thread"]),
    ("taskiq (no acks)", "taskiq", False, ["-m", "taskiq", "worker", "peers:broker", "--workers", "1", "--max-async-tasks", "8"]),
    ("Celery (threads, 8)", "celery", True,
     ["-m", "celery", "-A", "peers", "worker", "--pool", "threads", "-c", "8", "--without-gossip", "--without-mingle",
      "--without-heartbeat", "-l", "WARNING"]),
    ("arq (max_jobs 8)", "arq", False, ["-m", "arq", "peers.WorkerSettings"]),
    ("RQ SimpleWorker", "rq", True, ["-m", "rq.cli", "worker", "--url", "{url}", "--worker-class", "rq.worker.SimpleWorker", "bench"]),
]  # fmt: skip
OURS_WORKER = ["-m", "disque.cli", "worker", "peers:app", "-c", "8"]


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return "unknown CPU"


def _env(system: str, **more: str) -> dict[str, str]:
    return {**os.environ, "BENCH_SYSTEM": system, **more}


def produce(python: Path | str, env: dict[str, str], bulk: bool) -> float | None:
    """Jobs enqueued per second (None: the producer failed)."""
    done = subprocess.run([str(python), "-c", "import peers, sys; peers.timed(sys.argv[1])", "bulk" if bulk else "loop"], cwd=HERE, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  {env['BENCH_SYSTEM']} producer failed: {done.stderr.strip().splitlines()[-1:]}")
        return None
    return int(env["BENCH_JOBS"]) / float(done.stdout.split()[-1])


def drain(python: Path | str, env: dict[str, str], argv: list[str], out: Path) -> tuple[float | None, float | None]:
    """Start the worker and wait for its last job: (jobs per second, seconds to the first job)."""
    out.unlink(missing_ok=True)
    jobs = int(env["BENCH_JOBS"])
    argv = [a.format(url=env.get("BENCH_REDIS", "")) for a in argv]
    log = out.with_suffix(".log")
    started = time.time()
    with log.open("wb") as sink:
        proc = subprocess.Popen([str(python), *argv], cwd=HERE, env=env | {"BENCH_OUT": str(out)}, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=sink, start_new_session=True)  # fmt: skip
    try:
        while time.time() - started < DRAIN_LIMIT and proc.poll() is None:
            marks = dict(line.split() for line in out.read_text().splitlines()) if out.exists() else {}
            if str(jobs) in marks:
                return jobs / (float(marks[str(jobs)]) - started), float(marks["1"]) - started
            time.sleep(0.01)
        print(f"  {env['BENCH_SYSTEM']} worker did not finish, see {log}: {log.read_text()[-300:]!r}")
        return None, None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the worker and any child it forked
        proc.wait()


def measure(python: Path | str, env: dict[str, str], bulk: bool, argv: list[str], out: Path, flush: Any) -> dict[str, Any]:
    """Bulk enqueue (where the system has it), then a plain loop whose jobs the worker drains."""
    figures: dict[str, Any] = {"bulk": None}
    if bulk:
        figures["bulk"] = produce(python, env, bulk=True)
        flush()
    figures["loop"] = produce(python, env, bulk=False)
    figures["drain"], figures["first"] = drain(python, env, argv, out) if figures["loop"] else (None, None)
    flush()
    return figures


def run(quick: bool) -> dict[str, Any]:
    jobs = 2000 if quick else 10_000
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); {jobs:,} jobs of 100 bytes; one worker process at concurrency 8, no-op handler")
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="disque-bench-workers-") as tmp:
        base = Path(tmp)
        out = base / "marks"
        if BENCH_PYTHON.exists():
            redis = ServerProcess(base / "redis").start()
            url = f"redis://127.0.0.1:{redis.port}/0"
            try:
                for name, system, bulk, argv in PEERS:
                    env = _env(system, BENCH_REDIS=url, BENCH_JOBS=str(jobs))
                    rows[name] = measure(BENCH_PYTHON, env, bulk, argv, out, lambda: command("127.0.0.1", redis.port, "FLUSHALL"))
            finally:
                redis.stop()
        else:
            print(f"  the peers are skipped: {BENCH_PYTHON} does not exist (`make bench` installs the bench extra there)")
        for replicate in (1, 3):
            nodes = [NodeProcess(free_port(), base / f"r{replicate}-{i}") for i in range(replicate)]
            try:
                for node in nodes:
                    node.start()
                if replicate > 1:
                    join(nodes)
                addresses = ",".join(f"{n.host}:{n.port}" for n in nodes)
                env = _env("ours", DISQUE_NODES=addresses, BENCH_JOBS=str(jobs), BENCH_REPLICATE=str(replicate))

                def flush() -> None:
                    for node in nodes:
                        command(node.host, node.port, "DEBUG", "FLUSHALL")

                name = f"ours, {replicate} node{'s' if replicate > 1 else ''}, REPLICATE {replicate}"
                rows[name] = measure(sys.executable, env, True, OURS_WORKER, out, flush)
                rows[name]["redis-py pipeline"] = produce(sys.executable, env | {"BENCH_SYSTEM": "redis-py"}, bulk=True)
                flush()
            finally:
                for node in nodes:
                    node.stop()
    reference = next((r["drain"] for n, r in rows.items() if n.startswith("Dramatiq")), None)
    table = []
    for name, r in rows.items():
        ratio = r["drain"] / reference if r["drain"] and reference else None
        table.append([name, _num(r["loop"]), _num(r["bulk"]), _num(r.get("redis-py pipeline")), _num(r["drain"]),
                      f"{ratio:.2f}" if ratio else "-", f"{r['first']:.2f}" if r["first"] else "-"])  # fmt: skip
    print_table(
        "Workers (per second; drain x: against Dramatiq's; bulk: the system's own call, ours add_jobs)",
        ["system", "enqueue loop", "enqueue bulk", "redis-py pipeline", "drain", "drain x", "first job s"],
        table,
    )
    for name, r in rows.items():
        if r.get("redis-py pipeline") and r["bulk"]:
            print(f"{name}: add_jobs at {r['bulk'] / r['redis-py pipeline']:.2f}x redis-py's pipeline")
    return {"cpu_model": cpu_model(), "jobs": jobs, "workers": rows}


def _num(value: float | None) -> str:
    return f"{value:,.0f}" if value else "-"


if __name__ == "__main__":
    run("--quick" in sys.argv)
