"""Test doubles shared by the suites: a fake clock, a recording host, cores
built on them (alone or knowing peers from a nodes.conf text) and client
sessions."""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

from disque.cluster.membership import Membership
from disque.core.config import Config
from disque.core.node import NodeCore
from disque.core.read_behind import ReadBehind
from disque.core.replay import Replay
from disque.core.types import Status
from disque.protocols.resp.front import RESP
from disque.shell.segments import Segments
from disque.shell.dispatch import AofPort, BusPort, Dispatcher
from disque.shell.session import Conn, Sessions
from disque.testing.checker import History
from disque.store.aof import RecordReader

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "condition",
             logs: Callable[[], str] | None = None) -> T:  # fmt: skip
    """Poll `condition` until it returns something truthy, and return that;
    fail after `timeout` s, with `logs()` (the nodes' log tails) when given."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f"\n{logs()}" if logs else ""))
        time.sleep(interval)

START_MS = 1_790_000_000_000  # a fixed, realistic unix time


class FakeClock:
    def __init__(self, start_ms: int = START_MS) -> None:
        self.ms = self.read_ms = start_ms  # read_ms: at the last `now_ms()`

    def now_ms(self) -> int:
        self.read_ms = self.ms
        return self.ms

    def since_us(self) -> int:
        return (self.ms - self.read_ms) * 1000

    def wall_us(self) -> int:
        return self.ms * 1000

    def advance(self, ms: int) -> None:
        self.ms += ms


class FakeHost:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.shutdown_ok = True
        self.wakes: list[int] = []  # the deadlines the core asked the shell to wake up for

    def process_info(self) -> dict[str, Any]:
        return {
            "pid": 1, "rss": 10_000_000, "rss_startup": 9_000_000, "os": "Test", "executable": "/bin/disque-server",
            "git_sha1": "1a2b3c4d", "git_dirty": 0, "arch_bits": 64,
            "used_cpu_sys": 0.0, "used_cpu_user": 0.0, "used_cpu_sys_children": 0.0, "used_cpu_user_children": 0.0,
        }  # fmt: skip

    def rewrite_config(self) -> None:
        self.calls.append(("rewrite_config",))

    def reload_queue_config(self) -> None:
        self.calls.append(("reload_queue_config",))

    def apply_config(self, changed: list[str]) -> None:
        self.calls.append(("apply_config", tuple(changed)))

    def shutdown(self, rewrite_aof: bool) -> bool:
        self.calls.append(("shutdown", rewrite_aof))
        return self.shutdown_ok

    def save_cluster_config(self, fsync: bool) -> None:
        self.calls.append(("save_cluster_config", fsync))

    def reset_stats(self) -> None:
        self.calls.append(("reset_stats",))

    def bgrewriteaof(self) -> Any:
        self.calls.append(("bgrewriteaof",))
        return Status(b"Background append only file rewriting started")

    def debug(self, sub: str, args: list[bytes]) -> Any:
        self.calls.append(("debug", sub, tuple(args)))
        return Status(b"OK")

    def wake(self, at_ms: int) -> None:
        self.wakes.append(at_ms)


NODE_ID = "c0a3e3babc92560eea6b873cbf463cf54921aa2d"


def make_config(**overrides: Any) -> Config:
    config = Config()
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


# `DISQUE_TEST_READ_BEHIND=force` runs the cores of the core and simulation
# suites with read-behind forced on (docs/read-behind.md): every queue keeps
# two jobs in memory, every replica goes to disk.
FORCE_READ_BEHIND = os.environ.get("DISQUE_TEST_READ_BEHIND") == "force"
_bodies_root: list[str] = []
_open_stores: list[Segments] = []


def body_store() -> Segments:
    """A body store in a directory of its own, removed at exit; its files
    are closed after the test (`close_body_stores`)."""
    if not _bodies_root:
        _bodies_root.append(tempfile.mkdtemp(prefix="disque-bodies-"))
        atexit.register(shutil.rmtree, _bodies_root[0], True)
    store = Segments(tempfile.mkdtemp(dir=_bodies_root[0]))
    _open_stores.append(store)
    return store


def close_body_stores() -> None:
    """Close the segment files of the body stores made so far, as a node's
    exit does: a forced-on run makes thousands of cores, and their open files
    would pass select()'s limit of 1,024 descriptors in this process."""
    for store in _open_stores:
        for fd in store._fds.values():
            os.close(fd)
        store._fds.clear()
    _open_stores.clear()


def read_behind(config: Config) -> dict[str, Any]:
    """The NodeCore keyword arguments a test core gets: a body store when
    `config` asks for read-behind or the suite forces it on."""
    if FORCE_READ_BEHIND and config.read_behind == "yes":
        config.read_behind, config.read_behind_prefetch = "force", 2
    return {"bodies": body_store()} if config.read_behind == "force" else {}


def all_jobs(core: NodeCore) -> list[Any]:
    """Every job of a core: those in memory, then copies of those read-behind
    keeps on disk (read where they are: changing a copy changes nothing)."""
    jobs = list(core.jobs.values())
    spill = core.read_behind
    if isinstance(spill, ReadBehind):
        flags = spill.index.flags
        jobs += [job for slot in range(len(flags)) if flags[slot] & 1 and (job := spill.peek(slot)) is not None]
    return jobs


def make_core(seed: int = 1, node_id: str = NODE_ID, **overrides: Any) -> tuple[NodeCore, FakeClock, FakeHost]:
    clock, host = FakeClock(), FakeHost()
    config = make_config(**overrides)
    core = NodeCore(config, node_id, clock=clock, rng=random.Random(seed), host=host, **read_behind(config))
    return core, clock, host


def applied(core: NodeCore, blob: bytes) -> Replay:
    """A replay of the AOF records in `blob` on `core`, not finished yet."""
    rep = core.begin_load()
    reader = RecordReader()
    reader.feed(blob)
    for offset, args in reader:
        rep.apply(offset, args)
    return rep


def replay(core: NodeCore, blob: bytes) -> int:
    """`core` loads the AOF records in `blob`, as at start; the jobs it queued."""
    queued = applied(core, blob).finish()
    core.end_load()
    return queued


def linked_core(
    nodes_conf: str, linked: Iterable[str] = (), seed: int = 7, **overrides: Any
) -> tuple[NodeCore, FakeClock, FakeHost]:
    """A core (NODE_ID, port 7711) that loaded `nodes_conf` and has its
    outgoing links to the `linked` node IDs up; no effects are pending."""
    clock, host, rng = FakeClock(), FakeHost(), random.Random(seed)
    members = Membership.from_conf(nodes_conf, 7711, rng=rng, now=clock.ms)
    config = make_config(**overrides)
    core = NodeCore(config, NODE_ID, clock=clock, rng=rng, host=host, membership=members, **read_behind(config))
    for node_id in linked:
        core.link_connected(members.nodes[node_id].key)
    core.out.effects.clear()
    return core, clock, host


class Session:
    """One client connection to a core: call it with command arguments."""

    _next_id = 0

    def __init__(self, core: NodeCore, proto: int = 2) -> None:
        Session._next_id += 1
        self.core = core
        self.client = core.connect(Session._next_id, f"127.0.0.1:{40000 + Session._next_id}")
        self.client.proto = proto

    def __call__(self, *args: Any) -> Any:
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        return self.core.handle_command(self.client, argv, RESP.run)

    def raw(self, *args: Any) -> bytes:
        from disque.protocols.resp.encoder import encode

        return encode(self(*args), self.client.proto)

    def show(self, job_id: bytes) -> dict[str, Any] | None:
        """SHOW as a dict keyed by field name, None for an unknown job."""
        reply = self(b"SHOW", job_id)
        return None if reply is None else {k.decode(): v for k, v in reply}

    def pending(self) -> list[Any]:
        """Replies the core produced for this client since the last call."""
        from disque.core.effects import Reply

        mine = [e.value for e in self.core.out.effects if isinstance(e, Reply) and e.client_id == self.client.id]
        self.core.out.effects[:] = [e for e in self.core.out.effects if not (isinstance(e, Reply) and e.client_id == self.client.id)]
        return mine


class ClockedSession(Session):
    """A Session on a fresh core (`make_core`), with its fake clock."""

    def __init__(self, **overrides: Any) -> None:
        core, self.clock, _ = make_core(**overrides)
        super().__init__(core)


@dataclass
class Env:
    """A core, its clock and host, and one client session on it."""

    core: NodeCore
    clock: FakeClock
    host: FakeHost
    s: Session

    @classmethod
    def of(cls, core: NodeCore, clock: FakeClock, host: FakeHost) -> Any:
        return cls(core, clock, host, Session(core))


def bus_sent(core: NodeCore) -> list[Any]:
    """The bus messages the core sent since the last call (taken out of its effects)."""
    from disque.core.effects import Send

    out = [e.msg for e in core.out.effects if isinstance(e, Send)]
    core.out.effects[:] = [e for e in core.out.effects if not isinstance(e, Send)]
    return out


class Nowhere:
    """Bus and AOF ports of a session runner for a node that has neither."""

    def send(self, key: int, msg: Any) -> None: ...
    def answer(self, conn: int, msg: Any) -> None: ...
    def drop_link(self, key: int) -> None: ...
    def append(self, record: bytes, sync: bool = False) -> None: ...
    def flush(self, current: Any = None) -> None: ...


def session_runner(core: NodeCore, bus: BusPort, aof: AofPort, save_conf: Callable[[], None] = lambda: None) -> Sessions:
    """A node's session runner and its effect dispatcher, wired as the server
    wires them (`runner.effects` is the dispatcher)."""
    dispatch = Dispatcher(core, save_conf)
    runner = Sessions(core, core.config, dispatch)
    dispatch.plug(runner, bus, aof)
    return runner


class Deaf(Conn):
    """A session runner's client that never reads its replies: `out` only grows."""

    def kick(self) -> None: ...

    abort = kick


class HistoryScript:
    """A checker's history written by hand, at times the test sets (`at`: ms after T0)."""

    T0 = 1_000_000

    def __init__(self) -> None:
        self.now = self.T0
        self.history = History(lambda: self.now)

    def at(self, ms: int) -> Self:
        self.now = self.T0 + ms
        return self


@dataclass
class JepsenRun:
    results: dict[str, Any]  # the run's results.json
    output: str  # what it printed, for the assertions' messages
    returncode: int


def jepsen_run(args: list[str], runs_dir: Path, timeout: float) -> JepsenRun:
    """jepsen-lite/run.py with `args`, its runs under `runs_dir`."""
    argv = [sys.executable, str(Path(__file__).resolve().parents[1] / "jepsen-lite" / "run.py"), *args, "--runs-dir", str(runs_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    results = json.loads((runs_dir / "latest" / "results.json").read_text())
    return JepsenRun(results, done.stdout + done.stderr, done.returncode)
