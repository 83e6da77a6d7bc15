"""Clusters of many idle nodes: how long N local nodes take to join, what
they cost idle (CPU of all of them together, RSS per node), and whether they
stay joined with no node flagged fail? or fail; next to C Disque started and
MEET-ed the same way in the same run when DISQUE_C names its binary.

    python bench/scale.py --nodes 24,48,100 --idle 60     (bench/run.py --only scale)
    DISQUE_C=/path/to/disque-server python bench/scale.py --nodes 100 --hold 300

The machine's other work skews idle CPU: the ratio to C Disque measured in
the same run is the figure to watch (`--repeat` measures the pair again).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from disque.testing.devcluster import NodeProcess, command, ephemeral_range, ports_below_ephemeral  # noqa: E402

DISQUE_C = os.environ.get("DISQUE_C", "")


def pss_bytes(pid: int) -> int:
    """Proportional set size: RSS with shared pages divided among their users."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def join(nodes: list, timeout: float) -> float:
    """MEET every node with the first; seconds until each knows all others reachable."""
    started = time.monotonic()
    first = nodes[0]
    for node in nodes[1:]:
        command(node.host, node.port, "CLUSTER", "MEET", first.host, str(first.port))
    want = b"cluster_reachable_nodes:%d\r" % (len(nodes) - 1)
    pending = list(nodes)
    while pending:
        pending = [n for n in pending if want not in command(n.host, n.port, "CLUSTER", "INFO")]
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"{len(pending)} of {len(nodes)} nodes not joined after {timeout:.0f} s")
        if pending:
            time.sleep(0.2)
    return time.monotonic() - started


def failing_flags(nodes: list) -> int:
    """How many (observer, node) pairs show fail? or fail in CLUSTER NODES
    (a node that does not answer counts as one)."""
    bad = 0
    for node in nodes:
        try:
            reply = command(node.host, node.port, "CLUSTER", "NODES", timeout=10)
        except OSError as e:
            print(f"node on port {node.port} did not answer: {e}", file=sys.stderr)
            bad += 1
            continue
        for line in reply.decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) > 2 and ("fail" in parts[2].split(",") or "fail?" in parts[2].split(",")):
                bad += 1
    return bad


def messages_sent(nodes: list) -> int:
    """Bus messages all nodes have sent (CLUSTER INFO, ours and C Disque's)."""
    total = 0
    for node in nodes:
        info = command(node.host, node.port, "CLUSTER", "INFO").decode()
        total += int(info.partition("cluster_stats_messages_sent:")[2].split()[0])
    return total


def idle(nodes: list, seconds: float) -> dict[str, float]:
    """CPU of all nodes together (% of one core) and bus messages sent per
    node per second over `seconds`, checking flags every 10 s; RSS and PSS
    per node at the end."""
    pids = [n.pid for n in nodes]
    before = [sum(common.cpu_seconds(p)) for p in pids]
    sent = messages_sent(nodes)
    started = time.monotonic()
    flagged = 0
    while (left := started + seconds - time.monotonic()) > 0:
        time.sleep(min(10.0, left))
        flagged = max(flagged, failing_flags(nodes))
    elapsed = time.monotonic() - started
    used = sum(sum(common.cpu_seconds(p)) - b for p, b in zip(pids, before))
    sent = messages_sent(nodes) - sent
    return {
        "cpu_pct": 100 * used / elapsed,
        "msgs_per_node_s": sent / len(nodes) / elapsed,
        "rss_mb": sum(common.rss_bytes(p) for p in pids) / len(pids) / 2**20,
        "pss_mb": sum(pss_bytes(p) for p in pids) / len(pids) / 2**20,
        "flagged": flagged,
    }


def measure(kind: str, n: int, first_port: int, base: Path, seconds: float) -> dict[str, float]:
    if kind == "ours":
        nodes: list = [NodeProcess(first_port + i, base / f"ours-{n}-{i}") for i in range(n)]
    else:
        nodes = [common.ServerProcess(base / f"c-{n}-{i}", common.c_disque_argv, port=first_port + i) for i in range(n)]
    try:
        for node in nodes:
            node.start()
        joined = join(nodes, timeout=max(60.0, n * 1.5))
        return {"joined_s": joined, **idle(nodes, seconds)}
    finally:
        for node in nodes:
            node.stop()


def run(quick: bool, sizes: tuple[int, ...] | None = None, seconds: float | None = None, repeat: int = 1) -> dict[str, object]:
    sizes = sizes or ((12, 24) if quick else (24, 48, 100))
    seconds = seconds or (20.0 if quick else 60.0)
    low, _ = ephemeral_range()
    base = Path(tempfile.mkdtemp(prefix="disque-scale-"))
    rows, figures = [], []
    for n in sizes:
        ours_port, c_port = ports_below_ephemeral(n), ports_below_ephemeral(n, skip=n)
        for attempt in range(repeat):
            ours = measure("ours", n, ours_port, base, seconds)
            c = measure("c", n, c_port, base, seconds) if DISQUE_C else None
            ratio = ours["cpu_pct"] / c["cpu_pct"] if c and c["cpu_pct"] else float("nan")
            figures.append({"nodes": n, "ours": ours, "c": c, "cpu_ratio": ratio})
            rows.append([n, attempt + 1, ours["joined_s"], ours["cpu_pct"], ours["msgs_per_node_s"], ours["rss_mb"], ours["pss_mb"],
                         ours["flagged"], c["joined_s"] if c else "-", c["cpu_pct"] if c else "-",
                         c["msgs_per_node_s"] if c else "-", c["rss_mb"] if c else "-", f"{ratio:.1f} x" if c else "-"])  # fmt: skip
    common.print_table(
        f"Idle clusters ({seconds:.0f} s idle; CPU = all nodes together, % of one core; ports below {low})",
        ["N", "run", "join s", "CPU %", "msgs/s/node", "RSS MB/node", "PSS MB/node", "fail flags", "C join s", "C CPU %",
         "C msgs/s/node", "C RSS MB", "CPU ours/C"],  # fmt: skip
        rows,
    )
    return {"sizes": list(sizes), "idle_seconds": seconds, "runs": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="24,48,100", help="cluster sizes, comma-separated")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle measurement per cluster")
    parser.add_argument("--hold", type=float, default=0.0, help="idle seconds instead of --idle (e.g. 300: stay joined 5 minutes)")
    parser.add_argument("--repeat", type=int, default=1, help="measure each size this many times")
    args = parser.parse_args()
    run(False, tuple(int(n) for n in args.nodes.split(",")), args.hold or args.idle, args.repeat)


if __name__ == "__main__":
    main()
