"""Throughput as a Python team would compare us: one producer enqueues
10,000 100-byte jobs (a plain loop, then the system's bulk call where it has
one), then ONE worker process at concurrency 8 runs a no-op handler until
all are done, its start included; the first job's latency from the start.

The peers (Celery, RQ, Dramatiq, huey, arq, taskiq) run on a redis-server
without persistence started here, from the virtual environment of the
`bench` extra (BENCH_PYTHON, default .venv-bench/bin/python: `make bench`
makes it); ours on a node with AOF off (REPLICATE 1), then on three joined
nodes with REPLICATE 3.  bench/peers.py holds every system's producer and
handler.  Every server stays up for the whole run, and the systems run one
after the other in each of three rounds (one with --quick), so that a
change in the machine's load moves every system's figures alike; the table
gives the medians.  A system that does not install or does not finish is shown as
such, and the others still run.
"""

from __future__ import annotations

import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ServerProcess, cpu_model, print_table
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


ROUNDS = 3  # every system once per round, the rounds one after the other: the load of the machine moves every figure alike
SLOW = 60.0  # s: a system whose drain took longer in the first round is not run again (its figure is far off anyway)


def run(quick: bool) -> dict[str, Any]:
    jobs, rounds = (2000, 1) if quick else (10_000, ROUNDS)
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); {jobs:,} jobs of 100 bytes; one worker process at concurrency 8, "
          f"no-op handler; medians of {rounds} round(s)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="disque-bench-workers-") as tmp:
        base = Path(tmp)
        servers: list[Any] = []
        try:
            systems = _systems(base, jobs, servers)
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in systems}
            for _ in range(rounds):
                for name, python, env, bulk, argv, flush in systems:
                    if runs[name] and (runs[name][0]["drain"] or 0) < jobs / SLOW:
                        continue
                    figures = measure(python, env, bulk, argv, base / "marks", flush)
                    if env["BENCH_SYSTEM"] == "ours":
                        figures["redis-py pipeline"] = produce(python, env | {"BENCH_SYSTEM": "redis-py"}, bulk=True)
                        flush()
                    runs[name].append(figures)
        finally:
            for server in servers:
                server.stop()
    rows = {name: {key: _median([r.get(key) for r in done]) for key in done[0]} for name, done in runs.items()}
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
    return {"cpu_model": cpu_model(), "jobs": jobs, "rounds": runs, "workers": rows}


def _systems(base: Path, jobs: int, servers: list[Any]) -> list[tuple[str, Path | str, dict[str, str], bool, list[str], Any]]:
    """Start the servers (appended to `servers`, for the caller to stop) and
    list every system: name, Python, environment, bulk call, worker command, flush."""
    systems: list[tuple[str, Path | str, dict[str, str], bool, list[str], Any]] = []
    if BENCH_PYTHON.exists():
        redis = ServerProcess(base / "redis")
        servers.append(redis)
        redis.start()
        url = f"redis://127.0.0.1:{redis.port}/0"
        for name, system, bulk, argv in PEERS:
            systems.append((name, BENCH_PYTHON, _env(system, BENCH_REDIS=url, BENCH_JOBS=str(jobs)), bulk, argv,
                            lambda: command("127.0.0.1", redis.port, "FLUSHALL")))  # fmt: skip
    else:
        print(f"  the peers are skipped: {BENCH_PYTHON} does not exist (`make bench` installs the bench extra there)")
    for replicate in (1, 3):
        nodes = [NodeProcess(free_port(), base / f"r{replicate}-{i}") for i in range(replicate)]
        for node in nodes:
            servers.append(node)
            node.start()
        if replicate > 1:
            join(nodes)
        addresses = ",".join(f"{n.host}:{n.port}" for n in nodes)
        env = _env("ours", DISQUE_NODES=addresses, BENCH_JOBS=str(jobs), BENCH_REPLICATE=str(replicate))
        name = f"ours, {replicate} node{'s' if replicate > 1 else ''}, REPLICATE {replicate}"
        systems.append((name, sys.executable, env, True, OURS_WORKER, functools.partial(_flush_nodes, nodes)))
    return systems


def _flush_nodes(nodes: list[NodeProcess]) -> None:
    for node in nodes:
        command(node.host, node.port, "DEBUG", "FLUSHALL")


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _num(value: float | None) -> str:
    return f"{value:,.0f}" if value else "-"


if __name__ == "__main__":
    run("--quick" in sys.argv)
