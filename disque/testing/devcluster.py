"""Start local nodes as real processes: `make run`, the integration tests,
the benchmarks and jepsen-lite all use this.

`python -m disque.testing.devcluster --nodes 3 --port 7711` starts three nodes on
127.0.0.1:7711-7713 with the embedded default config, joins them with
CLUSTER MEET, and stops them (by PID, SIGTERM) on Ctrl-C; their directories
(`--dir`, by default a new /tmp/disque-run-*) are kept, and it says where.
`--metrics-port 9711` (what `make run` passes) gives them metrics and the
dashboard on 9711-9713, `--memcache-port 22133` Kestrel's memcache port on
22133-22135.

Ports stay below Linux's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range,
32768-60999 by default), where the kernel takes the source ports of outgoing
connections, the cluster bus's own included: a node whose port sits there
finds it taken by some connection sooner or later.  A `--port` whose ports
(client, bus = client + 10000, metrics, memcache) overlap the range is
refused with a clear error; `--port auto` picks free ports below it.
`free_port()` draws from below the range too.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

DEFAULT_CONF = Path(__file__).parents[1] / "default.conf"


PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, where the file cannot be read
BUS_OFFSET = 10000
LOWEST_PORT = 1024  # below: privileged ports
_handed_out: set[int] = set()  # ports (client and bus) free_port gave: free now, taken once their nodes start
_claims: dict[int, int] = {}  # block of ports -> the open lock file that claims it from other processes
CLAIM_BLOCK = 1000  # ports claimed together: a run of hundreds of clusters holds a few lock files


def ephemeral_range(path: str = PORT_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections."""
    try:
        with open(path) as f:
            low, high = (int(word) for word in f.read().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return low, high


def overlap(ports: list[int], ephemeral: tuple[int, int] | None = None) -> list[int]:
    """The ports among `ports` that sit in the ephemeral range."""
    low, high = ephemeral or ephemeral_range()
    return [p for p in ports if low <= p <= high]


def node_ports(first: int, n: int, *firsts: int) -> list[int]:
    """Every port n nodes from `first` take: client and bus ports, and the
    ranges of the other per-node ports starting at `firsts` (0: off)."""
    ports = [first + i for i in range(n)] + [first + BUS_OFFSET + i for i in range(n)]
    return ports + [f + i for f in firsts if f for i in range(n)]


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _claim(ports: list[int]) -> bool:
    """Claim `ports` from other processes: two test runs at once search the
    same ports downwards from the same start (`ports_below_ephemeral`; the
    random ports of `free_port` seldom meet), and a port free when checked
    may be bound a moment later by the other's node.  A process claims
    ports by the block (CLAIM_BLOCK of them), with an exclusive lock on a
    file per block held until it exits; False when another process holds
    one of the blocks."""
    directory = Path(tempfile.gettempdir()) / "disque-ports"
    directory.mkdir(exist_ok=True)
    new = sorted({port // CLAIM_BLOCK for port in ports} - _claims.keys())
    for i, block in enumerate(new):
        fd = os.open(directory / str(block), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            for mine in new[:i]:  # none claimed, so as not to hold blocks the other process is using
                os.close(_claims.pop(mine))
            return False
        _claims[block] = fd
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A free client port below the ephemeral range whose bus port (+10000)
    is free and below it too, neither of them given before by this process
    (a node not started yet has not bound its ports: another node must not
    get one of them as its client port)."""
    top = ephemeral_range()[0] - BUS_OFFSET  # client ports below this keep their bus port below the range
    if top - LOWEST_PORT < 1000:  # a range starting too low to leave room: anywhere outside it
        top = 65536 - BUS_OFFSET
    while True:
        port = random.randrange(LOWEST_PORT, top)
        taken = {port, port + BUS_OFFSET} & _handed_out or overlap([port, port + BUS_OFFSET])
        if taken or not _bindable(host, port) or not _bindable(host, port + BUS_OFFSET):
            continue
        _handed_out.update((port, port + BUS_OFFSET))
        return port


def ports_below_ephemeral(n: int, host: str = "127.0.0.1", skip: int = 0) -> int:
    """A first port for n nodes whose client and bus ports are all free and
    below the ephemeral range, searched downwards from its start; `skip`
    leaves that many ports free above it (for a second cluster)."""
    first = ephemeral_range()[0] - BUS_OFFSET - n - skip
    while first >= LOWEST_PORT:
        ports = node_ports(first, n)
        if not {*ports} & _handed_out and all(_bindable(host, p) for p in ports) and _claim(ports):
            _handed_out.update(ports)
            return first
        first -= n
    raise RuntimeError(f"no {n} free client ports (and their bus ports) below the ephemeral range")


def command(host: str, port: int, *args: str | bytes, timeout: float = 5.0) -> bytes:
    """Send one command and return the raw reply line(s) (tiny helper, no client
    library needed)."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    payload = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(payload)
        return s.recv(1 << 20)


@contextlib.contextmanager
def signals_held(*signums: int) -> Iterator[None]:
    """Hold these signals in the block and raise them again after it.  A
    Ctrl-C between a child's fork and Popen's return would leave the child
    running with its PID lost, a node nobody stops.  (Only the main thread
    receives signals; elsewhere this does nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {signum: signal.signal(signum, lambda got, _: caught.append(got)) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in caught:
            signal.raise_signal(signum)


class NodeProcess:
    """One `disque-server` child process in its own directory."""

    def __init__(self, port: int, workdir: Path, *extra: str, host: str = "127.0.0.1", env: dict[str, str] | None = None) -> None:
        self.port = port
        self.host = host
        self.env = env  # added to the environment (the clock-step tests preload libfaketime)
        self.workdir = workdir.absolute()  # the node runs in it
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "log.txt"

    def start(self, wait: float = 10.0) -> NodeProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "disque.conf"
        if not conf.exists():
            # `dir` first: the log file is opened relative to it while parsing
            extra_conf = f'\ndir "{self.workdir}"\nport {self.port}\nbind {self.host}\nlogfile log.txt\n'
            conf.write_text(DEFAULT_CONF.read_text() + extra_conf)
        argv = [sys.executable, "-m", "disque", str(conf), *self.extra]
        # In its directory: a rewritten config may name the log file before `dir`.
        # In its own session: a Ctrl-C at the terminal reaches only the parent,
        # which stops the nodes by PID in order instead of racing their exits.
        with signals_held(signal.SIGINT, signal.SIGTERM):
            self.proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env=None if self.env is None else {**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _, err = self.proc.communicate()  # (and closes its stderr pipe)
                raise RuntimeError(f"node on port {self.port} exited with {self.proc.returncode}: {err.decode()}")
            try:
                # Ours, not another run's node on a port both picked at once (it answers first, ours fails to bind).
                if command(self.host, self.port, "PING", timeout=1).startswith(b"+PONG") and (
                    f"process_id:{self.proc.pid}\r\n".encode() in command(self.host, self.port, "INFO", "server", timeout=1)
                ):
                    return self
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"node on port {self.port} did not answer within {wait}s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM by PID, then SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL by PID (a crash: nothing is flushed)."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()


def join(nodes: list[NodeProcess], timeout: float = 15.0) -> None:
    """MEET every node with the first one and wait for the full mesh."""
    first = nodes[0]
    for node in nodes[1:]:
        command(node.host, node.port, "CLUSTER", "MEET", first.host, first.port)
    deadline = time.monotonic() + timeout
    for node in nodes:
        while b"cluster_reachable_nodes:%d" % (len(nodes) - 1) not in command(node.host, node.port, "CLUSTER", "INFO"):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not form in time")
            time.sleep(0.05)


def port_args(name: str, first: int, i: int) -> tuple[str, ...]:
    """`--<name> <first + i>` for node i, nothing when `first` is 0 (off)."""
    return (f"--{name}", str(first + i)) if first else ()


def check_ports(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The first node's port: `--port` checked against the ephemeral range
    (an error if any port of the cluster falls in it), or picked below it."""
    low, high = ephemeral_range()
    if args.port == "auto":
        port = ports_below_ephemeral(args.nodes, args.host)
        print(f"ports: {port}-{port + args.nodes - 1} (bus {port + BUS_OFFSET}-{port + BUS_OFFSET + args.nodes - 1}), "
              f"below the ephemeral range {low}-{high}", flush=True)  # fmt: skip
        return port
    try:
        port = int(args.port)
    except ValueError:
        parser.error(f"--port {args.port}: a port number, or auto")
    ports = node_ports(port, args.nodes, args.metrics_port, args.memcache_port)
    if max(ports) > 65535 or port < 1:
        parser.error(f"--port {port} with {args.nodes} nodes: the bus ports (port + {BUS_OFFSET}) go past 65535")
    if clash := overlap(ports, (low, high)):
        parser.error(
            f"ports {min(clash)}-{max(clash)} of this cluster (client ports, bus ports = port + {BUS_OFFSET}, metrics, memcache) "
            f"fall in the ephemeral range {low}-{high} ({PORT_RANGE_FILE}), where outgoing connections take their "
            f"source ports and would collide with the nodes' ports: use lower ports (e.g. --port {max(LOWEST_PORT, low - BUS_OFFSET - args.nodes)}"
            " or below), or --port auto"
        )
    return port


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a local Disque cluster (Ctrl-C stops it).")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--port", default="7711", help="port of the first node, or auto: free ports below the ephemeral range")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--metrics-port", type=int, default=0, help="metrics/dashboard port of the first node (0: off)")
    parser.add_argument("--memcache-port", type=int, default=0, help="memcache (Kestrel) port of the first node (0: off)")
    args = parser.parse_args()
    args.port = check_ports(parser, args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the nodes on SIGTERM too
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="disque-run-"))
    nodes = [
        NodeProcess(args.port + i, base / str(args.port + i), *port_args("metrics-port", args.metrics_port, i),
                    *port_args("memcache-port", args.memcache_port, i), host=args.host)  # fmt: skip
        for i in range(args.nodes)
    ]
    try:
        for node in nodes:
            node.start()
        if len(nodes) > 1:
            join(nodes, timeout=max(15.0, 0.6 * len(nodes)))
        print(f"{len(nodes)} node(s) on {args.host}:{args.port}-{args.port + len(nodes) - 1}.", flush=True)
        print(f"Data (configs, logs, AOF files) in {base}: kept when the cluster stops.", flush=True)
        print("Try: .venv/bin/disque -p %d ADDJOB q hello 0   (Ctrl-C stops the cluster)" % args.port, flush=True)
        if args.metrics_port:
            print(f"Dashboard: http://{args.host}:{args.metrics_port}/   metrics: /metrics", flush=True)
        if args.memcache_port:
            print(f"Kestrel clients: memcache protocol on {args.host}:{args.memcache_port}-{args.memcache_port + len(nodes) - 1}", flush=True)
        while all(node.alive() for node in nodes):
            time.sleep(0.5)
        print("a node exited; stopping the others", file=sys.stderr)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan nodes
        for node in nodes:
            node.stop()
        print(f"The data stays in {base} (rm -r {base} removes it).", flush=True)


if __name__ == "__main__":
    main()
