"""examples/producer.py, worker.py and batch.py against a real 3-node cluster,
and the Django and FastAPI examples against one node, as their docstrings
run them (with $DISQUE_NODES pointing at it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from disque.client import Client
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


def run_example(argv: list[str], cwd: Path, node: NodeProcess) -> str:
    env = {**os.environ, "DISQUE_NODES": f"{node.host}:{node.port}"}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_django_enqueues_on_commit(spawn: Callable[..., NodeProcess], tmp_path: Path) -> None:
    node = spawn()
    shutil.copy(EXAMPLES / "django_app.py", tmp_path)  # its SQLite file next to it
    shown = run_example([sys.executable, "django_app.py", "demo"], tmp_path, node)
    assert shown.splitlines() == ["200 {'order': 1}", "409 {'error': 'out of stock'}"]
    with Client((node.host, node.port)) as c:
        [job] = c.qpeek("receipts", 10)  # the committed order's job alone
        assert job.body == b"1"
    worker = str(Path(sys.executable).with_name("disque"))
    assert run_example([worker, "worker", "django_app:tasks", "--burst"], tmp_path, node) == "receipt mailed for order 1: lamp\n"


def test_fastapi_produces_and_works_in_the_app(spawn: Callable[..., NodeProcess], tmp_path: Path) -> None:
    node = spawn()
    shown = run_example([sys.executable, str(EXAMPLES / "fastapi_app.py")], tmp_path, node).splitlines()
    assert shown == ["queued DI cat", "queued DI dog", "queued DI owl", "thumbnails: cat.thumb.jpg, dog.thumb.jpg, owl.thumb.jpg"]
    with Client((node.host, node.port)) as c:
        assert c.qlen("thumbnails") == 0  # all taken and acknowledged
