"""jepsen-lite's `zone` fault (docs/zones.md): six real nodes in three zones
of two, at-least-once jobs added with REPLICATE 3 ZONES 2, and every node of
one zone cut off or killed -9 at once (restarted with its AOF when the
fault ends).  The run must be valid: no acknowledged job lost, nothing
unexpected, nothing late, every acknowledged job collected."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import jepsen_run

ZONE_RUN = ["--nodes", "6", "--zones", "3", "--min-zones", "2", "--replicate", "3", "--faults", "zone",
            "--duration", "40", "--fault-s", "8", "--gap-s", "4", "--seed", "1"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_zone_run_loses_nothing(tmp_path: Path) -> None:
    done = jepsen_run(ZONE_RUN, tmp_path, timeout=840)
    results, output = done.results, done.output
    assert {f["fault"] for f in results["faults"]} == {"zone"}, output
    assert all(len(f["nodes"]) == 2 for f in results["faults"]), output
    assert results["enqueued"] > 100, output
    assert (results["lost"], results["unexpected"]) == (0, 0), output
    assert (results["checker"]["late"], results["checker"]["uncollected"]) == (0, 0), output
    assert results["valid"] and done.returncode == 0, output
