"""Run the benchmarks (`make bench`): print tables, write bench/results/*.json.

Each benchmark is a module with `run(quick: bool) -> dict` that prints its
own tables and returns its figures; `--only` selects some of them.
"""

from __future__ import annotations

import argparse
import time

import big_jobs
import cluster
import common
import delivery
import groups
import memcache
import persistence
import read_behind
import request_path
import scale
import security
import single_node
import spark as spark_bench
import workers

BENCHMARKS = {
    "path": request_path,
    "single": single_node,
    "cluster": cluster,
    "big-jobs": big_jobs,
    "delivery": delivery,
    "memcache": memcache,
    "groups": groups,
    "persistence": persistence,
    "read-behind": read_behind,
    "security": security,
    "spark": spark_bench,
    "workers": workers,
    "scale": scale,  # 24, 48 and 100 local nodes: only with --only scale (make scale)
}
OPT_IN = {"scale"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (noisier figures)")
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), help="run only these (repeatable)")
    args = parser.parse_args()
    common.require_tools()
    env = common.environment()
    print(
        f"{env['cpus']} CPU(s), load average {env['load_average']:.1f}, Python {env['python']} (core {env['core']}), redis {env['redis']}."
        "  redis-benchmark runs on the same machine as the server it measures: they share these cores,"
        " so compare ratios, not absolute ops/s."
    )
    for name in args.only or [name for name in BENCHMARKS if name not in OPT_IN]:
        print(f"\n=== {name}")
        started = time.monotonic()
        figures = BENCHMARKS[name].run(args.quick)
        elapsed = time.monotonic() - started
        path = common.write_results(name, {"benchmark": name, "quick": args.quick, "seconds": elapsed, **env, **figures})
        print(f"\n{name}: {elapsed:.0f} s, figures written to {path}")


if __name__ == "__main__":
    main()
