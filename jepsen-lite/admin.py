"""The `admin` fault: administration as a nemesis, on real nodes.

Each `admin` step of the schedule does one operation to one node, through
its client port as an operator would, when the fault starts, and undoes it
when the fault ends:

| op | start | end |
|---|---|---|
| `flushall` | DEBUG FLUSHALL | - |
| `reset-soft` | CLUSTER RESET SOFT | CLUSTER MEET a peer |
| `reset-hard` | CLUSTER RESET HARD, then CLUSTER FORGET of the old ID on every other node | CLUSTER MEET a peer |
| `forget` | CLUSTER FORGET of a live peer | CLUSTER MEET that peer |
| `leaving` | CLUSTER LEAVING yes | CLUSTER LEAVING no |
| `node-timeout` | CONFIG SET cluster-node-timeout 200, 3000 or 10000 | back to `--node-timeout-ms` |
| `restart` | SHUTDOWN by SIGTERM (clean AOF snapshot) | start, AOF reloaded |
| `restart-noaof` | kill -9, AOF file deleted | start with no jobs, same node ID |

Operations that destroy the node's jobs on purpose (flushall, both resets,
restart-noaof) are recorded as `wipe` records (disque/testing/checker.py) listing
every job ID the node held at that instant, so the checker excuses a job
wiped on as many nodes as it had copies, and only those.  To make the list
exact the node is cut off from its peers first (the network's partition),
then scanned (JSCAN BUSYLOOP), then wiped, then reconnected: a job that
reaches it after the scan can no longer be confirmed to its creator, so
every copy an acknowledged ADDJOB counted is in the list.  If the scan
fails the operation is skipped; if the wiping command's reply is lost the
wipe is recorded `info` (it may have happened), which the checker counts.

After a RESET HARD the old ID is forgotten everywhere, yet the other nodes'
acknowledged jobs may still list it among their holders: their garbage
collection can never be confirmed by that ID and they stay until their TTL
(spec/cluster.md §7).  `run.py` therefore waits, after a run with a
RESET HARD, until the TTL of every job the node could have held has passed
before it takes the final scans.
"""

from __future__ import annotations

import random
from typing import Any

from cluster import Node, call_once
from disque.testing.checker import INFO, OK, WIPE

OPERATIONS = ("flushall", "reset-soft", "reset-hard", "forget", "leaving", "node-timeout", "restart", "restart-noaof")
TIMEOUTS_MS = (200, 3000, 10_000)


def plan(rng: random.Random, nodes: list[int], k: int) -> dict[str, Any]:
    """The parameters of the `k`-th admin step (the operations in turn);
    `nodes` is a shuffled list of indexes."""
    op = OPERATIONS[k % len(OPERATIONS)]
    step: dict[str, Any] = {"op": op, "node": nodes[0], "peer": nodes[1]}
    if op == "node-timeout":
        step["timeout_ms"] = rng.choice(TIMEOUTS_MS)
    return step


class Admin:
    """Runs admin steps against the cluster; `wl` records the wipes."""

    def __init__(self, net: Any, nodes: list[Node], wl: Any, node_timeout_ms: int) -> None:
        self.net, self.nodes, self.wl = net, nodes, wl
        self.node_timeout_ms = node_timeout_ms

    def call(self, i: int, *args: Any) -> Any:
        node = self.nodes[i]
        reply = call_once(node.host, node.port, *args, timeout=10)
        if isinstance(reply, Exception):
            raise RuntimeError(f"node {i}: {' '.join(map(str, args))}: {reply}")
        return reply

    def bus_address(self, i: int) -> tuple[str, int]:
        """Where the other nodes reach node i (a proxy in proxy mode)."""
        host = self.net.public[i] if self.net.mode == "proxy" else self.nodes[i].host
        return host, self.nodes[i].port

    def apply(self, step: dict[str, Any], on: bool) -> None:
        op, i, peer = step["op"], step["node"], step["peer"]
        if on:
            if op == "flushall":
                self.wipe(i, op, lambda: self.call(i, "DEBUG", "FLUSHALL"))
            elif op == "reset-soft":
                self.wipe(i, op, lambda: self.call(i, "CLUSTER", "RESET", "SOFT"))
            elif op == "reset-hard":
                old_id = self.call(i, "CLUSTER", "MYID").decode()
                self.wipe(i, op, lambda: self.call(i, "CLUSTER", "RESET", "HARD"))
                for j in range(len(self.nodes)):
                    if j != i:
                        self.call(j, "CLUSTER", "FORGET", old_id)
            elif op == "forget":
                self.call(i, "CLUSTER", "FORGET", self.call(peer, "CLUSTER", "MYID").decode())
            elif op == "leaving":
                self.call(i, "CLUSTER", "LEAVING", "yes")
            elif op == "node-timeout":
                self.call(i, "CONFIG", "SET", "cluster-node-timeout", step["timeout_ms"])
            elif op == "restart":
                self.nodes[i].stop()
            else:
                self.wipe(i, op, lambda: self.kill_without_aof(i))
        elif op in ("reset-soft", "reset-hard", "forget"):
            self.call(i, "CLUSTER", "MEET", *self.bus_address(peer))
            self.call(peer, "CLUSTER", "MEET", *self.bus_address(i))  # the peer may have forgotten it (protected bus)
        elif op == "leaving":
            self.call(i, "CLUSTER", "LEAVING", "no")
        elif op == "node-timeout":
            self.call(i, "CONFIG", "SET", "cluster-node-timeout", self.node_timeout_ms)
        elif op in ("restart", "restart-noaof"):
            self.nodes[i].start()

    def kill_without_aof(self, i: int) -> None:
        node = self.nodes[i]
        node.kill9()
        for aof in node.workdir.glob("*.aof*"):
            aof.unlink()

    def wipe(self, i: int, op: str, action: Any) -> None:
        """Cut node i off, list what it holds, run `action`, reconnect, and
        record the wipe (see the module docstring)."""
        others = [j for j in range(len(self.nodes)) if j != i]
        self.net.partition([[i], others])
        try:
            node = self.nodes[i]
            _, ids = call_once(node.host, node.port, "JSCAN", 0, "BUSYLOOP", "COUNT", 1_000_000, timeout=10)
            held = sorted(job.decode() for job in ids)
            try:
                action()
            except (OSError, ConnectionError):
                self.wl.record(INFO, "nemesis", i, WIPE, value={"action": op, "held": held})
                raise
            self.wl.record(OK, "nemesis", i, WIPE, value={"action": op, "held": held})
        finally:
            self.net.heal()
