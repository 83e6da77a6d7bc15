"""The network under test: nodes in network namespaces, or TCP proxies.

`NetnsNet` (mode "netns") builds, for one run:

* a hub namespace `<tag>-hub` holding a bridge `br0`;
* one namespace per node `<tag>-n<i>` with a veth `eth0` plugged into the
  bridge and its own address 10.<net>.0.<11+i>/24;
* a client namespace `<tag>-c` (10.<net>.0.2) the harness process moves its
  own threads into (setns), so every client connection crosses the bridge.

Partitions are iptables DROP rules (INPUT from and OUTPUT to the peers a node
must not see) installed atomically with iptables-restore inside each node's
namespace; loss and delay are a tc netem qdisc on the node's eth0.  Where the
kernel has no netem, loss is iptables random drops and delay is a userspace
delayer (delayer.py) run inside the node's namespace, fed by an NFQUEUE rule
on the node's egress.  Nothing is changed outside these namespaces, and
`close()` deletes them all.

`NetnsNet.setup()` checks what the mode needs before the run starts (root,
`ip` from iproute2, `iptables-restore` from iptables, and that iptables works
inside a namespace) and raises `Unavailable` with one line saying why; tc is
optional (see `netem`).

`ProxyNet` (mode "proxy", the fallback when namespaces cannot be made) runs
every node on its own loopback address and routes every bus link through an
in-process TCP proxy that can cut, slow or break it (see the class).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

CLONE_NEWNET = 0x40000000
DELAYER = Path(__file__).resolve().parent / "delayer.py"


NEEDS = {"ip": "iproute2", "iptables-restore": "iptables"}  # command: Debian package (`make jepsen` installs them)


class Unavailable(Exception):
    """The netns mode cannot run on this machine; the message says why in one line."""


def sh(*argv: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=input, text=True, capture_output=True, check=check)


def _why(e: OSError | subprocess.CalledProcessError) -> str:
    if isinstance(e, subprocess.CalledProcessError):
        said = (e.stderr or "").strip().splitlines()
        return f"`{' '.join(e.cmd)}` failed: {said[-1] if said else f'exit status {e.returncode}'}"
    return str(e)


class NetnsNet:
    mode = "netns"

    def __init__(self, n: int, tag: str | None = None) -> None:
        self.n = n
        self.tag = tag or f"jl{os.getpid() % 100000}"
        self.net = 100 + os.getpid() % 100  # 10.<net>.0.0/24, unlikely to clash between runs
        self.hub = f"{self.tag}-hub"
        self.client_ns = f"{self.tag}-c"
        self.namespaces: list[str] = []
        self.hosts = [f"10.{self.net}.0.{11 + i}" for i in range(n)]
        self.netem_on: set[int] = set()
        self.notes: list[str] = []
        self.use_netem = True  # False: always the iptables / NFQUEUE fallback
        self.delayers: dict[int, subprocess.Popen[str]] = {}
        self.delayer_runs: list[dict[str, float]] = []
        self.netem_calls = 0

    def ns(self, i: int) -> str:
        return f"{self.tag}-n{i}"

    def _add_ns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def _plug(self, name: str, port: str, addr: str) -> None:
        sh("ip", "-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name)
        sh("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
        sh("ip", "-n", name, "addr", "add", f"{addr}/24", "dev", "eth0")
        sh("ip", "-n", name, "link", "set", "eth0", "up")

    def setup(self) -> None:
        """Build the namespaces, or raise Unavailable and leave nothing behind."""
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root")
        missing = [f"{cmd} (Debian package {pkg})" for cmd, pkg in NEEDS.items() if shutil.which(cmd) is None]
        if missing:
            raise Unavailable(f"not installed: {', '.join(missing)}")
        try:
            self._add_ns(self.hub)
            sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.hub, "link", "set", "br0", "up")
            for i in range(self.n):
                self._add_ns(self.ns(i))
                self._plug(self.ns(i), f"p{i}", self.hosts[i])
            self._add_ns(self.client_ns)
            self._plug(self.client_ns, "pc", f"10.{self.net}.0.2")
            self._filter(0, [])  # partitions need iptables inside a namespace: fail now, not mid-run
            self.enter(self.client_ns)
        except (OSError, subprocess.CalledProcessError) as e:
            self.close()
            raise Unavailable(_why(e)) from None
        except BaseException:
            self.close()
            raise

    @staticmethod
    def enter(name: str) -> None:
        """Move the calling thread (and the threads it starts later) into `name`."""
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {name}")
        finally:
            os.close(fd)

    def prefix(self, i: int) -> list[str]:
        """argv prefix that starts a process inside node i's namespace."""
        return ["ip", "netns", "exec", self.ns(i)]

    def partition(self, groups: Iterable[Iterable[int]]) -> None:
        """Node i sees node j when some group holds both."""
        groups = [set(g) for g in groups]
        for i in range(self.n):
            seen = set().union(*(g for g in groups if i in g)) if any(i in g for g in groups) else {i}
            rules = []
            for j in range(self.n):
                if j not in seen:
                    rules += [f"-A INPUT -s {self.hosts[j]} -j DROP", f"-A OUTPUT -d {self.hosts[j]} -j DROP"]
            self._filter(i, rules)

    def _filter(self, i: int, rules: list[str]) -> None:
        table = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
        sh("ip", "netns", "exec", self.ns(i), "iptables-restore", input=table + "".join(r + "\n" for r in rules) + "COMMIT\n")

    def netem(self, nodes: Iterable[int], loss: float, delay_ms: int, jitter_ms: int) -> None:
        """tc netem loss and delay on each node's eth0.  Where the kernel has no
        netem: loss by iptables random drops (INPUT and OUTPUT), delay by a
        delayer process that holds the node's outgoing packets (an NFQUEUE
        rule on OUTPUT -o eth0, like netem on the egress of eth0)."""
        self.netem_calls += 1
        for i in nodes:
            if self.use_netem:
                done = sh("ip", "netns", "exec", self.ns(i), "tc", "qdisc", "replace", "dev", "eth0", "root", "netem",
                          "delay", f"{delay_ms}ms", f"{jitter_ms}ms", "loss", f"{loss}%", check=False)  # fmt: skip
                if done.returncode == 0:
                    self.netem_on.add(i)
                    continue
                why = f"tc netem unavailable ({done.stderr.strip()})"
            else:
                why = "tc netem not used"
            rules = []
            if loss > 0:
                p = f"{loss / 100:.3f}"
                rules += [f"-A INPUT -i eth0 -m statistic --mode random --probability {p} -j DROP",
                          f"-A OUTPUT -o eth0 -m statistic --mode random --probability {p} -j DROP"]  # fmt: skip
            delay = "no delay"
            if delay_ms > 0 or jitter_ms > 0:
                failed = self._start_delayer(i, delay_ms, jitter_ms, seed=self.netem_calls * 1000 + i)
                if failed:
                    self.notes.append(f"no delay on node {i}: {failed}")
                else:
                    rules.append(f"-A OUTPUT -o eth0 -j NFQUEUE --queue-num {i} --queue-bypass")
                    delay = "delay by an NFQUEUE delayer (egress)"
            self._filter(i, rules)
            note = f"{why}: {delay}, {'loss by iptables random drops' if loss > 0 else 'no loss'}"
            if note not in self.notes:
                self.notes.append(note)

    def _start_delayer(self, i: int, delay_ms: float, jitter_ms: float, seed: int, timeout: float = 10.0) -> str | None:
        """Start delayer.py in node i's namespace on queue i and wait until it
        has bound the queue (it prints "ready").  None, or why it failed."""
        self._stop_delayer(i)
        argv = [*self.prefix(i), sys.executable, str(DELAYER), "--queue", str(i),
                "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms), "--seed", str(seed)]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else ""
        if line.strip() == "ready":
            self.delayers[i] = proc
            return None
        proc.kill()
        _, err = proc.communicate()
        return f"the delayer did not start ({line.strip() or 'no output'}; {err.strip()[-300:]})"

    def _stop_delayer(self, i: int) -> None:
        """SIGTERM by PID (it lets go of what it holds and prints a summary);
        SIGKILL if it does not exit in time."""
        proc = self.delayers.pop(i, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        lines = [x for x in out.splitlines() if x.startswith("{")]
        if proc.returncode == 0 and lines:
            self.delayer_runs.append({"node": i, **json.loads(lines[-1])})
        else:
            self.notes.append(f"the delayer of node {i} exited with {proc.returncode}: {err.strip()[-300:]}")

    def delayer_summary(self) -> str | None:
        """One line over every delayer run: packets held and the hold times."""
        runs = [r for r in self.delayer_runs if r.get("packets")]
        if not runs:
            return None
        n = sum(r["packets"] for r in runs)
        mean = sum(r["mean_ms"] * r["packets"] for r in runs) / n
        return (f"NFQUEUE delayer: {n} packets held in {len(runs)} node windows, hold min "
                f"{min(r['min_ms'] for r in runs):.1f} / mean {mean:.1f} / max {max(r['max_ms'] for r in runs):.1f} ms, "
                f"{sum(r.get('flushed', 0) for r in runs)} let go early at the ends of the windows")  # fmt: skip

    def heal(self) -> None:
        for i in range(self.n):
            self._filter(i, [])
        for i in sorted(self.delayers):  # after the NFQUEUE rules are gone
            self._stop_delayer(i)
        for i in sorted(self.netem_on):
            sh("ip", "netns", "exec", self.ns(i), "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        self.netem_on.clear()

    def close(self) -> None:
        for i in sorted(self.delayers):
            self._stop_delayer(i)
        summary = self.delayer_summary()
        if summary and summary not in self.notes:
            self.notes.append(summary)
        for name in reversed(self.namespaces):
            sh("ip", "netns", "del", name, check=False)
        self.namespaces.clear()


# ------------------------------------------------------------------ fallback


class ProxyNet:
    """Nodes on loopback addresses, every bus link through an in-process proxy.

    Node i binds its real address R_i = 127.0.1.<i+1> (client and bus port)
    and is known to its peers by its public address A_i = 127.0.2.<i+1>, where
    a proxy listens on the bus port.  The server dials peers from its bind
    address and learns a peer's address from where the peer's connection comes
    from, so: the proxy of node j accepts a connection from R_i (that names
    the source, i) and forwards it to R_j from A_i.  Every node therefore only
    ever sees public addresses, and each ordered pair (i -> j) of bus traffic
    crosses a proxy that can cut it (partitions), slow it or drop it (netem:
    a lost segment on TCP shows up as a broken link).  Clients talk to R_i
    directly.
    """

    mode = "proxy"

    def __init__(self, n: int, rng: random.Random) -> None:
        self.n = n
        self.rng = rng
        self.hosts = [f"127.0.1.{i + 1}" for i in range(n)]
        self.public = [f"127.0.2.{i + 1}" for i in range(n)]
        self.blocked: set[tuple[int, int]] = set()
        self.slow: set[int] = set()
        self.loss = 0.0
        self.delay = 0.0
        self.proxies: list[_Proxy] = []
        self.notes: list[str] = []

    def setup(self) -> None:
        pass

    def prefix(self, i: int) -> list[str]:
        return []

    def start_proxies(self, ports: list[int]) -> None:
        for j, port in enumerate(ports):
            p = _Proxy(self, j, (self.public[j], port + 10000), (self.hosts[j], port + 10000))
            self.proxies.append(p)
            p.start()

    def source(self, ip: str) -> int | None:
        return self.hosts.index(ip) if ip in self.hosts else None

    def partition(self, groups: Iterable[Iterable[int]]) -> None:
        groups = [set(g) for g in groups]
        self.blocked = {
            (i, j) for i in range(self.n) for j in range(self.n) if i != j and not any(i in g and j in g for g in groups)
        }
        for p in self.proxies:
            p.cut(lambda src, dst: (src, dst) in self.blocked)

    def netem(self, nodes: Iterable[int], loss: float, delay_ms: int, jitter_ms: int) -> None:
        self.slow = set(nodes)
        self.loss, self.delay = loss / 100, delay_ms / 1000

    def affected(self, src: int, dst: int) -> bool:
        return src in self.slow or dst in self.slow

    def heal(self) -> None:
        self.blocked = set()
        self.slow = set()
        self.loss = self.delay = 0.0

    def close(self) -> None:
        for p in self.proxies:
            p.stop()


class _Proxy(threading.Thread):
    """The bus listener of node `dst` at its public address."""

    def __init__(self, net: ProxyNet, dst: int, listen: tuple[str, int], target: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.net, self.dst, self.target = net, dst, target
        self.sock = socket.create_server(listen)
        self.pairs: list[tuple[int, socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        self.stopping = False

    def cut(self, which) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            keep = []
            for src, a, b in self.pairs:
                if which(src, self.dst):
                    _close(a, b)
                else:
                    keep.append((src, a, b))
            self.pairs = keep

    def stop(self) -> None:
        self.stopping = True
        self.sock.close()
        self.cut(lambda src, dst: True)

    def run(self) -> None:
        while not self.stopping:
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return
            src = self.net.source(addr[0])
            if src is None or (src, self.dst) in self.net.blocked:
                conn.close()
                continue
            try:
                up = socket.create_connection(self.target, timeout=2, source_address=(self.net.public[src], 0))
                up.settimeout(None)
            except OSError:
                conn.close()
                continue
            with self.lock:
                self.pairs.append((src, conn, up))
            threading.Thread(target=self._pump, args=(src, conn, up), daemon=True).start()

    def _pump(self, src: int, a: socket.socket, b: socket.socket) -> None:
        net = self.net
        try:
            while not self.stopping:
                r, _, _ = select.select([a, b], [], [], 0.5)
                if (src, self.dst) in net.blocked:
                    break
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        return
                    if net.affected(src, self.dst):
                        if net.loss and net.rng.random() < net.loss:
                            return  # a lost segment on TCP looks like a broken link
                        if net.delay:
                            time.sleep(net.delay)
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            _close(a, b)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def setup_proxies(net: ProxyNet, nodes: list) -> None:  # type: ignore[type-arg]
    """Start the proxies and introduce every node to node 0 by public address."""
    from cluster import call_once, wait_mesh

    net.start_proxies([node.port for node in nodes])
    for node in nodes[1:]:
        call_once(node.host, node.port, "CLUSTER", "MEET", net.public[0], nodes[0].port)
    if not wait_mesh(nodes, 30):
        raise RuntimeError("the cluster did not form through the proxies")
