"""jepsen-lite with one node of five down for the whole run (`--down 1`,
back only at the heal), the usual partitions and a kill on the others, and
producers sending ADDJOB with no option but its TTL (REPLICATE 3 MINREPL 2,
the defaults: docs/replication.md).  Outside the fault windows nearly every
add must be answered with an ID, and the run must be valid: nothing lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import jepsen_run

DOWN_RUN = ["--workload", "default", "--down", "1", "--faults", "halves,majority,kill",
            "--duration", "30", "--fault-s", "6", "--gap-s", "4", "--seed", "1"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_node_down_the_whole_run_and_writes_go_on(tmp_path: Path) -> None:
    done = jepsen_run(DOWN_RUN, tmp_path, timeout=840)
    results, output = done.results, done.output
    outside = results["adds"]["outside"]
    assert outside["all"] > 200 and outside["rate"] >= 0.99, output
    assert "success rate outside the fault windows" in output
    assert (results["lost"], results["unexpected"]) == (0, 0), output
    assert results["valid"] and done.returncode == 0, output
