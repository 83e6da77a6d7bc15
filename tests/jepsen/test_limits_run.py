"""jepsen-lite's `--limit`: a queue at QCONFIG concurrency 3 on a 3-node
cluster of real processes under partitions and a kill -9, its consumers
on every node; from their history, never more than 3 jobs out at once
outside the fault windows, and what the faults cost counted and printed
(disque/testing/checker_limits.py).  About two minutes: marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import jepsen_run

RUN = ["--limit", "3", "--faults", "halves,majority,kill", "--nodes", "3", "--duration", "48", "--fault-s", "4",
       "--gap-s", "12", "--producers", "1", "--consumers", "1", "--seed", "1"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_limit_holds_outside_the_faults(tmp_path: Path) -> None:
    done = jepsen_run(RUN, tmp_path, timeout=540)
    results, output = done.results, done.output
    limits = results["limits"]
    assert limits["limit"] == 3 and limits["jobs"] > 100 and limits["most"] == 3, output
    assert limits["violations"] == 0 and limits["valid"], output
    assert "limits VALID: " in output and results["valid"] and done.returncode == 0, output
