"""jepsen-lite's `admin` fault (jepsen-lite/admin.py): administration
operations on real nodes, with what they wipe on purpose accounted for.

The schedule is checked without processes; the run (about 6 minutes: it
waits for the TTL of the jobs a node reset HARD held) is marked slow."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from support import jepsen_run


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jepsen-lite"))

import admin  # noqa: E402
import run  # noqa: E402

ADMIN = ["--faults", "admin", "--duration", "75", "--fault-s", "6", "--gap-s", "3", "--seed", "1"]


def test_eight_admin_steps_do_every_operation_once_on_a_seeded_node():
    plan = run.schedule(random.Random(1), ["admin"], 5, 75, 6, 3)
    assert [step["op"] for step in plan] == list(admin.OPERATIONS)
    assert all(step["node"] != step["peer"] and {step["node"], step["peer"]} <= set(range(5)) for step in plan)
    assert all(step["timeout_ms"] in admin.TIMEOUTS_MS for step in plan if step["op"] == "node-timeout")
    assert plan == run.schedule(random.Random(1), ["admin"], 5, 75, 6, 3)
    assert "admin" not in {step["fault"] for step in run.schedule(random.Random(1), ["halves", "kill"], 5, 48, 8, 4)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_admin_run_loses_nothing(tmp_path: Path) -> None:
    done = jepsen_run(ADMIN, tmp_path, timeout=840)
    results, output = done.results, done.output
    assert [f["op"] for f in results["faults"]] == list(admin.OPERATIONS), output
    history = [json.loads(line) for line in (tmp_path / "latest" / "history.jsonl").read_text().splitlines()]
    wipes = [r["value"]["action"] for r in history if r["op"] == "wipe"]
    assert wipes == ["flushall", "reset-soft", "reset-hard", "restart-noaof"], output
    assert results["enqueued"] > 100, output
    assert (results["lost"], results["unexpected"]) == (0, 0), output
    assert (results["checker"]["late"], results["checker"]["uncollected"]) == (0, 0), output
    assert results["checker"]["at_most_once_duplicated"] == 0, output
    assert results["valid"], output
