"""Read-behind: a backlog many times the memory budget.

One node with `maxmemory` (512 MB; 128 MB in a quick run) and the AOF on
takes JOBS jobs of BODY bytes (4 million 1 KB jobs, 4 GB of bodies; 200,000
in a quick run) from one pipelining producer, is killed (-9) and started
again (`aof-enqueue-jobs-once yes`, so the backlog comes back queued), then
is drained by one consumer (GETJOB COUNT 100, then ACKJOB of those).  RSS is
sampled twice a second all along and drawn as a chart.  Next to it, the
same node with `read-behind no` takes and drains as many jobs as fit in its
memory: the ADDJOB and GETJOB+ACKJOB rates of the two are the price of
read-behind.  Finally, the memory a job costs while its body is on disk:
the RSS the fill added, divided by the jobs (all but `read-behind-prefetch`
of them are on disk by then).

`python bench/read_behind.py [--jobs N] [--body BYTES] [--maxmemory MB]`
runs it alone; `make bench` runs it with the others.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
from common import print_table, rss_bytes, send_pipelined, start_node

FULL = {"jobs": 4_000_000, "body": 1024, "maxmemory_mb": 512}
QUICK = {"jobs": 200_000, "body": 1024, "maxmemory_mb": 128}
IN_MEMORY_SHARE = 0.4  # of maxmemory: the jobs the reference node takes, all in memory


class RssSampler(threading.Thread):
    """RSS of `node`'s process (whichever it is: a restarted node is sampled
    while it loads) twice a second, with the phase of the run."""

    def __init__(self, node: Any) -> None:
        super().__init__(daemon=True)
        self.node, self.phase = node, "fill"
        self.start_time = time.monotonic()
        self.samples: list[tuple[float, int, str]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                self.samples.append((time.monotonic() - self.start_time, rss_bytes(self.node.proc.pid), self.phase))
            except (OSError, RuntimeError):
                pass  # between a kill and a start

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def chart(samples: list[tuple[float, int, str]], limit: int, width: int = 72, height: int = 14) -> str:
    """RSS over time as text: one column per time slice, the limit as a line of '-'."""
    if not samples:
        return "(no samples)"
    end = samples[-1][0] or 1
    top = max(limit, max(s[1] for s in samples)) * 1.05
    columns = [0] * width
    for t, rss, _ in samples:
        col = min(width - 1, int(t / end * (width - 1)))
        columns[col] = max(columns[col], rss)
    limit_row = height - 1 - int(limit / top * (height - 1))
    rows = []
    for r in range(height):
        level = top * (height - 1 - r) / (height - 1)
        cells = "".join("#" if c and c >= level else ("-" if r == limit_row else " ") for c in columns)
        rows.append(f"{level / 2**20:7.0f} MB |{cells}")
    phases: list[str] = []
    for t, _, phase in samples:
        if not phases or phases[-1].split("@")[0] != phase:
            phases.append(f"{phase}@{t:.0f}s")
    rows.append(" " * 11 + "+" + "-" * width)
    rows.append(" " * 12 + f"0 s{'':>{width - 10}}{end:.0f} s   phases: {', '.join(phases)}   (---: maxmemory)")
    return "\n".join(rows)


def _client(node: Any) -> redis.Redis:
    return redis.Redis(host=node.host, port=node.port, protocol=2, socket_timeout=600)


def fill(node: Any, jobs: int, body: int) -> float:
    """ADDJOB `jobs` times, pipelined; returns jobs per second."""
    payload = b"x" * body
    started = time.monotonic()
    done = 0
    while done < jobs:  # in slices: a long single run would hold one connection for minutes
        n = min(100_000, jobs - done)
        send_pipelined(node.port, ["ADDJOB", "backlog", payload, "0"], n, timeout=600)
        done += n
    return jobs / (time.monotonic() - started)


def drain(node: Any, jobs: int) -> float:
    """GETJOB COUNT 100 + ACKJOB of those until `jobs` were served; jobs per second."""
    client = _client(node)
    started = time.monotonic()
    served = 0
    while served < jobs:
        got = client.execute_command("GETJOB", "TIMEOUT", 10_000, "COUNT", 100, "FROM", "backlog")
        if not got:
            raise RuntimeError(f"the backlog ran dry after {served} of {jobs} jobs")
        client.execute_command("ACKJOB", *[job[1] for job in got])
        served += len(got)
    rate = served / (time.monotonic() - started)
    client.close()
    return rate


def wait_loaded(node: Any, timeout: float = 3600) -> None:
    client = _client(node)
    deadline = time.monotonic() + timeout
    while client.info("persistence").get("loading", 1):
        if time.monotonic() > deadline:
            raise RuntimeError("the AOF took too long to load")
        time.sleep(0.05)
    client.close()


def run(quick: bool, sizes: dict[str, int] | None = None) -> dict[str, Any]:
    sizes = sizes or (QUICK if quick else FULL)
    jobs, body, limit = sizes["jobs"], sizes["body"], sizes["maxmemory_mb"] << 20
    common = ("--maxmemory", f"{sizes['maxmemory_mb']}mb", "--appendonly", "yes", "--aof-enqueue-jobs-once", "yes")
    figures: dict[str, Any] = {"jobs": jobs, "body": body, "maxmemory": limit}
    with tempfile.TemporaryDirectory(prefix="bench-read-behind-") as tmp:
        # The reference: the same node without read-behind, as many jobs as fit in memory.
        fits = int(limit * IN_MEMORY_SHARE) // (body + 600)
        plain = start_node(Path(tmp) / "plain", *common, "--read-behind", "no")
        try:
            figures["memory_addjob_per_sec"] = fill(plain, fits, body)
            figures["memory_cycle_per_sec"] = drain(plain, fits)
        finally:
            plain.stop()
        figures["memory_jobs"] = fits

        node = start_node(Path(tmp) / "node", *common)
        sampler = RssSampler(node)
        sampler.start()
        try:
            client = _client(node)
            rss_idle = rss_bytes(node.pid)
            figures["disk_addjob_per_sec"] = fill(node, jobs, body)
            rss_after, rb = rss_bytes(node.pid), client.info("read-behind")
            client.close()
            figures["jobs_on_disk"] = rb["jobs_on_disk"]
            figures["rss_idle"], figures["rss_after_fill"] = rss_idle, rss_after
            figures["bytes_per_job_on_disk"] = (rss_after - rss_idle) / jobs
            figures["aof_bytes"] = os.path.getsize(node.workdir / "disque.aof")
            sampler.phase = "restart"
            os.kill(node.pid, signal.SIGKILL)
            node.proc.wait()
            started = time.monotonic()
            node.start(wait=600)  # (PING answers once the AOF is loaded)
            wait_loaded(node)
            figures["restart_seconds"] = time.monotonic() - started
            figures["rss_after_restart"] = rss_bytes(node.pid)
            sampler.phase = "drain"
            figures["disk_cycle_per_sec"] = drain(node, jobs)
            client = _client(node)
            rb = client.info("read-behind")
            client.close()
            figures["prefetch_hits"], figures["prefetch_misses"] = rb["prefetch_hits"], rb["prefetch_misses"]
        finally:
            sampler.stop()
            node.stop()
    figures["rss_peak"] = max(s[1] for s in sampler.samples)
    figures["rss_samples"] = [(round(t, 1), rss, phase) for t, rss, phase in sampler.samples]
    mb = 2**20
    print(f"\nRSS of the read-behind node over time ({jobs:,} jobs of {body} bytes, maxmemory {limit // mb} MB):")
    print(chart(sampler.samples, limit))
    print_table(
        f"Read-behind: {jobs:,} x {body} B = {jobs * body / 2**30:.1f} GB of bodies, maxmemory {limit // mb} MB",
        ["figure", "read-behind", "in memory", "ratio"],
        [
            ["ADDJOB/s (pipelined, 1 connection)", figures["disk_addjob_per_sec"], figures["memory_addjob_per_sec"],
             figures["disk_addjob_per_sec"] / figures["memory_addjob_per_sec"]],
            ["GETJOB COUNT 100 + ACKJOB, jobs/s", figures["disk_cycle_per_sec"], figures["memory_cycle_per_sec"],
             figures["disk_cycle_per_sec"] / figures["memory_cycle_per_sec"]],
        ],
    )  # fmt: skip
    print_table(
        "Read-behind: memory and restart",
        ["figure", "value"],
        [
            ["peak RSS, MB", figures["rss_peak"] / mb],
            ["RSS after the fill, MB", rss_after / mb],
            ["jobs on disk after the fill", figures["jobs_on_disk"]],
            ["idle RSS, MB", figures["rss_idle"] / mb],
            ["(RSS after the fill - idle RSS) / jobs, bytes", figures["bytes_per_job_on_disk"]],
            ["AOF size, MB", figures["aof_bytes"] / mb],
            ["restart (kill -9, AOF replay), s", figures["restart_seconds"]],
            ["RSS after the restart, MB", figures["rss_after_restart"] / mb],
            ["prefetch hits / misses while draining", f"{figures['prefetch_hits']:,} / {figures['prefetch_misses']:,}"],
        ],
    )
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=FULL["jobs"])
    parser.add_argument("--body", type=int, default=FULL["body"])
    parser.add_argument("--maxmemory", type=int, default=FULL["maxmemory_mb"], help="MB")
    args = parser.parse_args()
    import common as _common

    found = run(False, {"jobs": args.jobs, "body": args.body, "maxmemory_mb": args.maxmemory})
    print("figures written to", _common.write_results("read-behind", {"benchmark": "read-behind", **found}))
