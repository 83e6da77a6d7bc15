"""jepsen-lite's `--keys`: keyed jobs with DEDUP, an ordered queue and DEBOUNCE bursts on a
3-node cluster of real processes under partitions and a kill -9, consumers
on every node; from their history (disque/testing/checker_keys.py): no
key with two jobs, no ordered key with two jobs out at once and no burst
with two runs or a stale body outside the fault windows, no keyed job lost, and what the faults cost (and the order
breaks) counted and printed.  About two minutes: marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import jepsen_run

RUN = ["--keys", "--faults", "halves,majority,kill", "--nodes", "3", "--duration", "48", "--fault-s", "4",
       "--gap-s", "12", "--producers", "1", "--consumers", "1", "--seed", "1"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_keys_hold_outside_the_faults(tmp_path: Path) -> None:
    done = jepsen_run(RUN, tmp_path, timeout=540)
    results, output = done.results, done.output
    dedup, ordered = results["keys"]["dedup"], results["keys"]["ordered"]
    assert dedup["keys"] > 20 and dedup["split_outside"] == 0 and dedup["lost"] == 0, output
    assert ordered["ordered_jobs"] > 50 and ordered["two_out_outside"] == 0 and ordered["ordered_lost"] == 0, output
    debounce = results["keys"]["debounce"]
    assert debounce["bursts"] > 20 and debounce["extra_outside"] == 0 and debounce["burst_lost"] == 0, output
    assert "keys VALID: " in output and results["valid"] and done.returncode == 0, output
