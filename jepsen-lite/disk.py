"""The disk fault: what a lying disk does to one node's AOF (docs/persistence.md).

Each step hits one node (a minority) in one of four ways, drawn by the plan:

* `lose-tail`: a power cut.  The node is killed (-9) and its file cut back
  to `aof_fsynced_size` (INFO), its size at its last fsync read just before:
  everything written since is lost, as the page cache would be;
* `torn`: killed, and its last record cut in the middle (a write torn by
  the crash);
* `bitflip`: killed, and `flips` bits flipped at random offsets of the
  file (bit rot, a bad sector);
* `full`: the file cannot grow (RLIMIT_FSIZE: writes fail with EFBIG, as
  on a full disk) while the fault holds; the node keeps running (MISCONF).

When the fault ends a killed node is started again on what is left.  The
checker then counts acknowledged jobs lost and bodies altered.
"""

from __future__ import annotations

import random
import resource
from typing import Any

from cluster import Node, call_once

KINDS = ("lose-tail", "torn", "bitflip", "full")
FLIPS = 8  # bits flipped by one bitflip step
TORN_MAX = 200  # bytes a torn write leaves out of the last record, at most


def plan(rng: random.Random, node: int) -> dict[str, Any]:
    kind = rng.choice(KINDS)
    step: dict[str, Any] = {"node": node, "how": kind}
    if kind == "bitflip":
        step["flips"] = FLIPS
    step["seed"] = rng.randrange(1 << 30)
    return step


def _info(node: Node, field: str) -> int:
    text = call_once(node.host, node.port, "INFO", "persistence", timeout=5).decode()
    return int(next(line.split(":", 1)[1] for line in text.splitlines() if line.startswith(field + ":")))


def apply(step: dict[str, Any], node: Node, on: bool) -> None:
    how = step["how"]
    path = node.workdir / "disque.aof"
    if how == "full":
        assert node.proc is not None
        limit = _info(node, "aof_current_size") + 64 if on else resource.RLIM_INFINITY
        resource.prlimit(node.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        return
    if not on:
        node.start()
        return
    rng = random.Random(step["seed"])
    synced = _info(node, "aof_fsynced_size") if how == "lose-tail" else 0
    node.kill9()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if how == "lose-tail":
            f.truncate(min(synced, size))
        elif how == "torn":
            f.truncate(max(0, size - rng.randint(1, TORN_MAX)))
        else:
            for _ in range(step["flips"]):
                at = rng.randrange(size)
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ (1 << rng.randrange(8))]))
    step["damage"] = {"size_before": size, "size_after": path.stat().st_size}
