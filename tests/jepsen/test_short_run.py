"""The short jepsen-lite run (`make jepsen`): a 5-node cluster of real
processes, random-halves, majority/minority and bridge partitions, one
kill -9 and restart and one step of a node's wall clock, with the
extensions on (NACK ... DELAY, MAXATTEMPTS and a dead-letter queue, WAITJOB), under a mixed at-least-once/at-most-once workload.

The run must be valid: no acknowledged job lost, nothing unexpected, no
at-most-once job delivered twice, nothing delivered after its TTL, and every
acknowledged job collected from every node after the heal."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import jepsen_run

SHORT = ["--extensions", "--faults", "halves,majority,bridge,kill,clock", "--duration", "60", "--fault-s", "8", "--gap-s", "4", "--seed", "1"]


@pytest.mark.timeout(600)
def test_short_run_loses_nothing(tmp_path: Path) -> None:
    done = jepsen_run(SHORT, tmp_path, timeout=540)
    results, output = done.results, done.output
    assert results["mode"] in ("netns", "proxy"), output
    assert sorted(f["fault"] for f in results["faults"]) == ["bridge", "clock", "halves", "kill", "majority"], output
    assert results["enqueued"] > 100, output
    assert results["checker"]["at_most_once_duplicated"] == 0, output
    assert (results["lost"], results["unexpected"]) == (0, 0), output
    assert (results["checker"]["late"], results["checker"]["uncollected"]) == (0, 0), output
    assert results["checker"]["phantom_acks"] == 0, output
    assert results["valid"], output
    for name in ("history.jsonl", "index.html", "latency.png", "throughput.png"):
        assert (tmp_path / "latest" / name).exists(), name


GROUPS_RUN = ["--workload", "groups", "--faults", "halves,kill", "--nodes", "3", "--duration", "24", "--fault-s", "6", "--gap-s", "4", "--seed", "1"]


@pytest.mark.timeout(600)
def test_groups_run_loses_nothing(tmp_path: Path) -> None:
    """`--workload groups`: three consumer groups read events added on every
    node; every group gets every event, and none gets an event again after
    acknowledging it except across a fault."""
    done = jepsen_run(GROUPS_RUN, tmp_path, timeout=540)
    results, output = done.results, done.output
    assert sorted(f["fault"] for f in results["faults"]) == ["halves", "kill"], output
    checker = results["checker"]
    assert results["enqueued"] > 100 and checker["deliveries"] >= 3 * results["enqueued"], output
    assert (checker["lost"], checker["unexpected"], checker["late"], checker["redelivered_after_ack"]) == (0, 0, 0, 0), output
    assert results["valid"] and done.returncode == 0, output
