"""examples/producer.py, worker.py and batch.py against a real 3-node cluster,
as their docstrings run them (with $DISQUE_NODES pointing at it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from disque.testing.devcluster import NodeProcess, join

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_producer_worker_and_batch(spawn: Callable[..., NodeProcess]) -> None:
    nodes = [spawn() for _ in range(3)]
    join(nodes)
    every = ",".join(f"{n.host}:{n.port}" for n in nodes)
    first = f"{nodes[0].host}:{nodes[0].port}"

    def run(*argv: str, cwd: Path = ROOT, nodes: str = every) -> str:
        env = {**os.environ, "DISQUE_NODES": nodes}
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    # --burst stops when the node it reads is empty: it reads the node the producer used.
    produced = run(sys.executable, str(EXAMPLES / "producer.py"), nodes=first).splitlines()
    assert len(produced) == 10 and all(line.startswith("queued DI") for line in produced)
    worker = str(Path(sys.executable).with_name("disque"))
    greeted = run(worker, "worker", "worker:app", "--burst", cwd=EXAMPLES, nodes=first)
    assert sorted(greeted.splitlines()) == sorted(f"greeted: hello #{n}" for n in range(10))
    assert run(sys.executable, str(EXAMPLES / "batch.py")) == "100 of 100 jobs acknowledged\n"
