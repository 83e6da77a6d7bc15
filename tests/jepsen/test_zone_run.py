"""jepsen-lite's `zone` fault (docs/zones.md): six real nodes in three zones
of two, at-least-once jobs added with REPLICATE 3 ZONES 2, and every node of
one zone cut off or killed -9 at once (restarted with its AOF when the
fault ends).  The run must be valid: no acknowledged job lost, nothing
unexpected, nothing late, every acknowledged job collected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ZONE_RUN = ["--nodes", "6", "--zones", "3", "--min-zones", "2", "--replicate", "3", "--faults", "zone",
            "--duration", "40", "--fault-s", "8", "--gap-s", "4", "--seed", "1"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_zone_run_loses_nothing(tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "jepsen-lite" / "run.py"), *ZONE_RUN, "--runs-dir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=840)
    output = done.stdout + done.stderr
    results = json.loads((tmp_path / "latest" / "results.json").read_text())
    assert {f["fault"] for f in results["faults"]} == {"zone"}, output
    assert all(len(f["nodes"]) == 2 for f in results["faults"]), output
    assert results["enqueued"] > 100, output
    assert (results["lost"], results["unexpected"]) == (0, 0), output
    assert (results["checker"]["late"], results["checker"]["uncollected"]) == (0, 0), output
    assert results["valid"] and done.returncode == 0, output
