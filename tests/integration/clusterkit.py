"""A cluster of real `disque-server` processes on loopback, for the cluster
integration tests and the cluster benchmark.

`Cluster(base, size, *extra)` starts `size` nodes in parallel (each in its own
directory under `base`), joins them with a *chain* of CLUSTER MEETs (node i
meets node i-1 only, so the full mesh can only come from gossip), and offers
the operations the tests need: commands on node i, SHOW as a dict, which
nodes hold a job, the flags node i sees on node j, killing / pausing /
restarting a node (by PID), and `heal()` to bring a shared cluster back to a
clean, fully connected state between tests.

Every wait polls a condition against a deadline; on timeout the error
carries the tail of every node's log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import redis

from disque.testing.devcluster import NodeProcess, command, free_port
from support import wait_for

T = TypeVar("T")
HOST = "127.0.0.1"



def show_dict(reply: Any) -> dict[str, Any] | None:
    """SHOW's flat RESP2 array as a dict with str keys (None for nil)."""
    if reply is None:
        return None
    keys = [k.decode() for k in reply[::2]]
    return dict(zip(keys, reply[1::2]))


def parse_nodes(text: bytes) -> dict[str, dict[str, Any]]:
    """CLUSTER NODES -> {id: {addr, flags (set), link, zone}} (zone: "" when none)."""
    out = {}
    for line in text.decode().splitlines():
        parts = line.split()
        if len(parts) >= 6:
            zone = parts[6].removeprefix("zone=") if len(parts) > 6 else ""
            out[parts[0]] = {"addr": parts[1], "flags": set(parts[2].split(",")), "link": parts[5], "zone": zone}
    return out


def parse_info(text: bytes) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.decode().split("\r\n") if ":" in line)


class Cluster:
    def __init__(self, base: Path, size: int, *extra: str) -> None:
        self.base = base
        self.extra = extra
        self.generation = 0
        self.nodes = [NodeProcess(free_port(), base / f"node{i}", *extra) for i in range(size)]
        self.ids: list[str] = []
        self.paused: set[int] = set()
        self._clients: dict[int, redis.Redis] = {}

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 20.0) -> Cluster:
        """Start every node and join them; on any failure stop them all."""
        try:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda n: n.start(), self.nodes))
            self.ids = [self.call(i, "CLUSTER", "MYID").decode() for i in range(len(self.nodes))]
            for i in range(1, len(self.nodes)):
                prev = self.nodes[i - 1]
                assert self.call(i, "CLUSTER", "MEET", prev.host, prev.port) == b"OK"
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for i, node in enumerate(self.nodes):
            if i in self.paused:
                node.signal(signal.SIGCONT)
            node.stop()
        self.paused.clear()

    def rebuild(self) -> None:
        """Replace every node with a brand new one (new ports, new
        directories) and form a new cluster."""
        self.stop()
        self.generation += 1
        base = self.base / f"rebuilt{self.generation}"
        self.nodes = [NodeProcess(free_port(), base / f"node{i}", *self.extra) for i in self.indexes]
        self.start()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def indexes(self) -> range:
        return range(len(self.nodes))

    def alive(self, i: int) -> bool:
        return self.nodes[i].alive() and i not in self.paused

    def live(self) -> list[int]:
        return [i for i in self.indexes if self.alive(i)]

    def kill(self, i: int) -> None:
        """SIGKILL: no shutdown steps at all (a crash)."""
        self._drop_client(i)
        if i in self.paused:
            self.nodes[i].signal(signal.SIGCONT)
            self.paused.discard(i)
        node = self.nodes[i]
        node.kill()
        if node.proc is not None and node.proc.stderr is not None:
            node.proc.stderr.close()  # NodeProcess.kill leaves the pipe open

    def pause(self, i: int) -> None:
        """SIGSTOP: the node hangs, its sockets stay open."""
        self.nodes[i].signal(signal.SIGSTOP)
        self.paused.add(i)

    def resume(self, i: int) -> None:
        self.nodes[i].signal(signal.SIGCONT)
        self.paused.discard(i)

    def restart(self, i: int) -> None:
        """Start a dead node again in the same directory (same port, same
        nodes.conf, hence the same node ID)."""
        assert not self.nodes[i].alive()
        self._drop_client(i)
        self.nodes[i].start()
        assert self.call(i, "CLUSTER", "MYID").decode() == self.ids[i]

    def restart_all(self) -> None:
        """Stop every node cleanly (SIGTERM), then start them all again."""
        for i in self.indexes:
            self._drop_client(i)
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.stop(), self.nodes))
            list(pool.map(self.restart, self.indexes))

    # ------------------------------------------------------------ commands

    def client(self, i: int) -> redis.Redis:
        if i not in self._clients:
            node = self.nodes[i]
            self._clients[i] = redis.Redis(host=node.host, port=node.port, protocol=2, socket_timeout=30)
        return self._clients[i]

    def _drop_client(self, i: int) -> None:
        client = self._clients.pop(i, None)
        if client is not None:
            client.close()

    def call(self, i: int, *args: Any) -> Any:
        return self.client(i).execute_command(*args)

    def raw(self, i: int, *args: Any) -> bytes:
        """The raw reply bytes (to check an exact error text or reply type)."""
        node = self.nodes[i]
        return command(node.host, node.port, *[a if isinstance(a, bytes) else str(a) for a in args])

    def addjob(self, i: int, queue: str, body: str = "body", timeout: int = 5000, *opts: Any) -> str:
        return self.call(i, "ADDJOB", queue, body, timeout, *opts).decode()

    def show(self, i: int, job_id: str) -> dict[str, Any] | None:
        return show_dict(self.call(i, "SHOW", job_id))

    def holders(self, job_id: str, among: Iterable[int] | None = None) -> dict[int, str]:
        """node index -> job state, for the (live) nodes that know the job."""
        out = {}
        for i in self.live() if among is None else among:
            info = self.show(i, job_id)
            if info is not None:
                out[i] = info["state"].decode()
        return out

    def qlen(self, i: int, queue: str) -> int:
        return int(self.call(i, "QLEN", queue))

    def nodes_view(self, i: int) -> dict[str, dict[str, Any]]:
        return parse_nodes(self.call(i, "CLUSTER", "NODES"))

    def flags(self, observer: int, target: int) -> set[str]:
        entry = self.nodes_view(observer).get(self.ids[target])
        return set() if entry is None else entry["flags"]

    def info(self, i: int) -> dict[str, str]:
        return parse_info(self.call(i, "CLUSTER", "INFO"))

    def registered_jobs(self, i: int) -> int:
        return int(self.call(i, "INFO", "jobs")["registered_jobs"])  # redis-py parses INFO

    def index_of(self, node_id: str) -> int:
        return self.ids.index(node_id)

    # ------------------------------------------------------------ waiting

    def logs(self, tail: int = 25) -> str:
        out = []
        for i, node in enumerate(self.nodes):
            try:
                lines = node.log_path.read_text(errors="replace").splitlines()[-tail:]
            except OSError:
                lines = ["(no log)"]
            state = "alive" if node.alive() else "dead"
            out.append(f"--- node{i} port {node.port} {state} {self.ids[i] if self.ids else ''}\n" + "\n".join(lines))
        return "\n".join(out)

    def wait(self, condition: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
        return wait_for(condition, timeout, what=what, logs=self.logs)

    def healthy(self) -> bool:
        """Every node alive, knows exactly the others, none flagged."""
        n = len(self.nodes)
        for i in self.indexes:
            if not self.alive(i):
                return False
            try:
                view = self.nodes_view(i)
            except (redis.ConnectionError, redis.TimeoutError):
                self._drop_client(i)
                return False
            if set(view) != set(self.ids):
                return False
            for node_id, entry in view.items():
                expected = {"myself"} if node_id == self.ids[i] else {"noflags"}
                if entry["flags"] != expected or entry["link"] != "connected":
                    return False
            if self.info(i)["cluster_reachable_nodes"] != str(n - 1):
                return False
        return True

    def wait_healthy(self, timeout: float = 20.0) -> None:
        self.wait(self.healthy, timeout, what="a healthy full mesh")

    def heal(self) -> None:
        """Back to a clean state: every node running, not leaving, full mesh
        without flags, no jobs and no queues anywhere."""
        for i in list(self.paused):
            self.resume(i)
        for i in self.indexes:
            if not self.nodes[i].alive():
                self.restart(i)
        for i in self.indexes:
            if self.call(i, "CLUSTER", "LEAVING") != b"no":
                self.call(i, "CLUSTER", "LEAVING", "no")
        self.wait_healthy()
        self.flush()

    def flush(self, timeout: float = 10.0) -> None:
        """DEBUG FLUSHALL everywhere until no node holds a job: a message sent
        before a peer's flush can land on a node already flushed."""

        def flushed() -> bool:
            for i in self.live():
                assert self.call(i, "DEBUG", "FLUSHALL") == b"OK"
            return all(self.registered_jobs(i) == 0 for i in self.live())

        self.wait(flushed, timeout, what="every node flushed")


def run_dramatiq(cluster: Cluster, base: Path, tasks: str, producer: str) -> Any:
    """Write `tasks.py` and `producer.py` in `base`, run a `dramatiq tasks`
    worker process (1 process, 2 threads) against `cluster` while the
    producer runs (DISQUE_NODES: the nodes' addresses), stop the worker, and
    return what the producer printed, as JSON."""
    (base / "tasks.py").write_text(tasks)
    (base / "producer.py").write_text(producer)
    env = {**os.environ, "DISQUE_NODES": ",".join(f"{n.host}:{n.port}" for n in cluster.nodes),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(base), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    with open(base / "worker.log", "wb") as log:
        worker = subprocess.Popen([str(Path(sys.executable).with_name("dramatiq")), "tasks", "--processes", "1", "--threads", "2"],
                                  cwd=base, env=env, stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
        try:
            produced = subprocess.run([sys.executable, "producer.py"], cwd=base, env=env, capture_output=True, text=True, timeout=90)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
    assert produced.returncode == 0, produced.stderr + (base / "worker.log").read_text()
    return json.loads(produced.stdout)
