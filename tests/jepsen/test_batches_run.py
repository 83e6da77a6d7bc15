"""jepsen-lite's `--batches`: parents, children AFTER them and a batch of the
parents on a 3-node cluster of real processes under partitions and a kill
-9; no child delivered before its parent's ACK, none left behind, no result
lost, the batch's callback delivered (disque/testing/checker_workflows.py).
About a minute: marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import jepsen_run

RUN = ["--batches", "40", "--faults", "halves,kill", "--nodes", "3", "--duration", "24", "--fault-s", "4",
       "--gap-s", "4", "--producers", "2", "--consumers", "2", "--seed", "1"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_children_wait_for_their_parents_and_the_batch_calls_back(tmp_path: Path) -> None:
    done = jepsen_run(RUN, tmp_path, timeout=540)
    results, output = done.results, done.output
    flows = results["workflows"]
    assert flows["children"] >= 10 and flows["results"] >= 20 and flows["batches"] == 1, output
    assert (flows["early"], flows["stuck"], flows["lost_results"], flows["callbacks_missing"]) == (0, 0, 0, 0), output
    assert results["valid"] and done.returncode == 0, output
