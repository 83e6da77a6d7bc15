"""jepsen-lite `--faults disk` (jepsen-lite/disk.py): one node at a time
loses the tail it had not fsynced, gets its last record torn, bits of its
AOF flipped, or a disk that cannot grow.  At-least-once jobs (REPLICATE 2
and 3) must all come back, and no delivered body may differ from the one
added under its job ID."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import jepsen_run

DISK = ["--faults", "disk", "--workload", "at-least-once", "--nodes", "3", "--duration", "60", "--fault-s", "5",
        "--gap-s", "3", "--seed", "3"]  # fmt: skip


@pytest.mark.timeout(600)
def test_disk_faults_lose_no_acknowledged_job_and_alter_no_body(tmp_path: Path) -> None:
    done = jepsen_run(DISK, tmp_path, timeout=540)
    results, output = done.results, done.output
    hows = {f["how"] for f in results["faults"]}
    assert {f["fault"] for f in results["faults"]} == {"disk"} and len(hows) >= 3, output
    assert results["enqueued"] > 100, output
    checker = results["checker"]
    assert (checker["lost"], checker["altered"], checker["unexpected"]) == (0, 0, 0), output
    assert results["valid"] and done.returncode == 0, output
