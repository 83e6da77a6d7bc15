"""jepsen-lite's `--schedules`: three schedules ticking every second on a
3-node cluster of real processes under partitions, a kill -9, a pause and a
clock step; every tick delivered, and exactly once outside the fault
windows (disque/testing/checker_schedules.py).  About two and a half
minutes: marked slow (`make jepsen-long` runs a longer one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import jepsen_run

RUN = ["--schedules", "3", "--faults", "halves,majority,bridge,kill,pause,clock", "--nodes", "3", "--duration", "96",
       "--fault-s", "4", "--gap-s", "12", "--producers", "2", "--consumers", "2", "--seed", "1"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_tick_once_outside_the_faults(tmp_path: Path) -> None:
    done = jepsen_run(RUN, tmp_path, timeout=840)
    results, output = done.results, done.output
    schedules = results["schedules"]
    assert sorted(f["fault"] for f in results["faults"]) == ["bridge", "clock", "halves", "kill", "majority", "pause"], output
    assert schedules["schedules"] == 3 and schedules["ticks"] > 200 and schedules["outside"] > 30, output
    assert (schedules["missing"], schedules["duplicated_outside"], schedules["unexpected"]) == (0, 0, 0), output
    assert results["valid"] and done.returncode == 0, output
