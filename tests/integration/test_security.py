"""Security end to end, on real nodes over loopback (and, for protected mode,
over a veth pair between two network namespaces made by the test).

* Bus authentication: a cluster with a secret refuses a node without one, a
  node with a wrong one and hand-forged frames (CLUSTER NODES, job state and
  INFO counters say so); a frame replayed inside a live link and a whole
  recorded link replayed on a new connection are rejected (a recording proxy
  sits between two nodes); secrets roll node by node, never all at once;
  CONFIG SET cluster-secret is a start-up operation.
* TLS: redis-py, the client library and the CLI over the tls-port, mutual TLS
  refusing a client without a certificate, a TLS-only node (port 0), and a
  3-node cluster whose bus runs over TLS.
* Clients: protected mode, the idle timeout, and output-buffer limits against
  consumers that stop reading.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
import trio
from clusterkit import parse_nodes
from support import wait_for

from disque.testing import devcluster
from disque.client import AsyncClient, Client, DisqueConnectionError, DisqueReplyError
from disque.cluster.auth import AuthLink, Keyring, Secret
from disque.cluster.codec import encode_body, encode_frame
from disque.store.records import job_to_wire
from disque.cluster.messages import DelJob, Header, Ping, ReplJob
from disque.testing.devcluster import NodeProcess, command, free_port, join
from disque.store.job import Job, State
from integration.rawsock import rss
from integration.netns import ADDRS, namespace_pair

HOST = "127.0.0.1"
SECRET = "the cluster secret of the security tests"
SECRET2 = "the next cluster secret of the security tests"
WRONG = "not the cluster secret of the security tests"
BUS = 10000


# --------------------------------------------------------------------------
# Helpers


class Nodes:
    """Start nodes (in parallel); all are stopped by PID at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: list[NodeProcess] = []

    def start(self, *specs: tuple[str, ...]) -> list[NodeProcess]:
        ports: set[int] = set()
        while len(ports) < len(specs):
            ports.add(free_port())
        procs = [NodeProcess(port, self.base / f"node-{port}", *spec) for port, spec in zip(sorted(ports), specs)]
        self.started += procs
        with ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(lambda p: p.start(), procs))
        return procs

    def one(self, *extra: str) -> NodeProcess:
        return self.start(extra)[0]

    def stop(self) -> None:
        for node in self.started:
            node.stop()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    started = Nodes(tmp_path)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A throwaway CA and certificates, made by `disque tls-keygen`."""
    directory = tmp_path_factory.mktemp("certs")
    done = subprocess.run([sys.executable, "-m", "disque.cli", "tls-keygen", str(directory)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert "tls-cert-file" in done.stdout
    return {name: str(directory / name) for name in ("ca.crt", "node.crt", "node.key", "client.crt", "client.key")}


def plain_ping(port: int) -> None:
    """PING in plain RESP; ConnectionError unless PONG comes back."""
    reply = command(HOST, port, "PING", timeout=2)
    if not reply.startswith(b"+PONG"):
        raise ConnectionError(f"no PONG: {reply[:40]!r}")


def tls_args(certs: dict[str, str], *extra: str) -> tuple[str, ...]:
    return ("--tls-cert-file", certs["node.crt"], "--tls-key-file", certs["node.key"],
            "--tls-ca-cert-file", certs["ca.crt"], *extra)  # fmt: skip


def call(node: NodeProcess, *args: Any) -> Any:
    """One command, its reply as RESP2 gives it (no redis-py parsing)."""
    with redis.Redis(host=node.host, port=node.port, protocol=2) as r:
        r.response_callbacks.clear()
        return r.execute_command(*args)


def security(node: NodeProcess) -> dict[str, str]:
    text = call(node, "INFO", "security").decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def counter(node: NodeProcess, name: str) -> int:
    return int(security(node)[name])


def my_id(node: NodeProcess) -> str:
    return call(node, "CLUSTER", "MYID").decode()


def known(node: NodeProcess) -> dict[str, dict[str, Any]]:
    return parse_nodes(call(node, "CLUSTER", "NODES"))


def reachable(node: NodeProcess) -> int:
    text = call(node, "CLUSTER", "INFO").decode()
    return int(text.split("cluster_reachable_nodes:")[1].split()[0])


def log_of(node: NodeProcess) -> str:
    return node.log_path.read_text(errors="replace")


def bus_exchange(port: int, data: bytes, auth: AuthLink | None = None, timeout: float = 5.0) -> bytes:
    """Connect to a bus port, run `auth`'s handshake if given, send `data`;
    everything the node sent back until it closed the connection."""
    received = bytearray()
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        try:
            if auth is not None:
                s.sendall(auth.data_to_send())
                while not auth.established:
                    chunk = s.recv(4096)
                    if not chunk:
                        return bytes(received)
                    received += chunk
                    auth.receive_data(chunk)
                    auth.handshake_step()
                    if out := auth.data_to_send():
                        s.sendall(out)
            s.sendall(data)
            while chunk := s.recv(65536):
                received += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    return bytes(received)


def forged_job(owner: str) -> Job:
    return Job(id=b"DI" + owner[:8].encode() + b"0" * 32 + b"0011SQ", state=State.ACTIVE, queue=b"forged",
               body=b"injected", repl=1, ctime=0, etime=int(time.time()) + 3600, retry=60, nodes_delivered=(owner,))  # fmt: skip


# --------------------------------------------------------------------------
# Bus authentication


def test_a_cluster_with_a_secret_refuses_outsiders(nodes: Nodes) -> None:
    a, b, c = nodes.start(*[("--cluster-secret", SECRET)] * 3)
    join([a, b, c])
    members = {my_id(n) for n in (a, b, c)}
    b_id = my_id(b)
    job = call(a, "ADDJOB", "q", "body", 0, "REPLICATE", 3)
    wait_for(lambda: security(a)["cluster_auth_links"] == "4", what="a's four authenticated links")  # 2 out, 2 in
    assert counter(a, "cluster_auth_handshakes_ok") >= 4

    plain, wrong = nodes.start((), ("--cluster-secret", WRONG))
    outsiders = {my_id(plain), my_id(wrong)}
    for rogue in (plain, wrong):
        for target in (a, b):
            assert call(rogue, "CLUSTER", "MEET", HOST, target.port) == b"OK"
    # Hand-made attacks on a: a plain DELJOB and REPLJOB posing as b, a
    # handshake with a wrong secret, and one offering the right key ID (it is
    # public) without knowing the secret.
    header = Header(b_id, b.port, 0)
    forged = forged_job(b_id)
    plain_frames = encode_frame(header, DelJob(job)) + encode_frame(header, ReplJob(job_to_wire(forged, int(time.time() * 1000))))
    assert bus_exchange(a.port + BUS, plain_frames) == b""
    bus_exchange(a.port + BUS, plain_frames, AuthLink(Keyring(WRONG), initiator=True, random=os.urandom))
    sniffed = Keyring(WRONG)
    sniffed.secrets = (Secret(b"guess", Secret.derive(SECRET).key_id, b"\0" * 32),)
    bus_exchange(a.port + BUS, plain_frames, AuthLink(sniffed, initiator=True, random=os.urandom))

    # Each rogue has been refused by a and b, and retries with backoff.
    for target in (a, b):
        wait_for(lambda: counter(target, "cluster_auth_unauthenticated_peers") >= 2
                 and counter(target, "cluster_auth_handshakes_failed") >= 2, what="refused rogues")  # fmt: skip
    time.sleep(0.5)
    for n in (a, b, c):
        table = known(n)
        assert set(table) == members, table
        assert all(f"{HOST}:{rogue.port}" not in str(table) for rogue in (plain, wrong))
    for rogue in (plain, wrong):
        assert not set(known(rogue)) & members  # the rogues learned no member either
        assert reachable(rogue) == 0
    assert outsiders.isdisjoint(set().union(*(known(n) for n in (a, b, c))))

    # Not a single message got in: the job is intact everywhere, nothing was injected.
    for n in (a, b, c):
        show = call(n, "SHOW", job)
        assert show is not None and set(show[show.index(b"nodes-delivered") + 1]) == {m.encode() for m in members}
        assert call(n, "SHOW", forged.id) is None
    info = security(a)
    assert int(info["cluster_auth_unauthenticated_peers"]) >= 3  # the plain node's tries and the forged frames
    assert int(info["cluster_auth_handshakes_failed"]) >= 3  # the wrong node's tries, both forged handshakes
    log = log_of(a)
    assert "the peer did not authenticate" in log and "no common cluster secret" in log  # (rate-limited log)
    assert call(a, "ADDJOB", "q", "after", 0, "REPLICATE", 3)  # the cluster itself is unharmed


class RecordingProxy:
    """A TCP proxy in front of a bus port that records the frames going to
    the node, one list per connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()  # the client port to MEET: the proxy listens on its bus port
        self.listener = socket.create_server((HOST, self.port + BUS))
        self.sessions: list[list[bytes]] = []
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
                up = socket.create_connection((HOST, self.target_port))
            except OSError:
                return
            self.sockets += [down, up]
            frames: list[bytes] = []
            self.sessions.append(frames)
            threading.Thread(target=self._to_node, args=(down, up, frames), daemon=True).start()
            threading.Thread(target=self._copy, args=(up, down), daemon=True).start()

    def _to_node(self, src: socket.socket, dst: socket.socket, frames: list[bytes]) -> None:
        buf = b""
        try:
            while data := src.recv(65536):
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                    size = 4 + int.from_bytes(buf[:4], "big")
                    frame, buf = buf[:size], buf[size:]
                    dst.sendall(frame)
                    frames.append(frame)
        except OSError:
            pass
        self._shut(src, dst)

    def _copy(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        self._shut(src, dst)

    @staticmethod
    def _shut(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._shut(*self.sockets)
        for s in self.sockets:
            s.close()


def open_session(port: int, secret: str = SECRET) -> tuple[socket.socket, AuthLink]:
    """An authenticated bus connection made by the test itself, as a node would."""
    auth = AuthLink(Keyring(secret), initiator=True, random=os.urandom)
    s = socket.create_connection((HOST, port), timeout=5)
    s.sendall(auth.data_to_send())
    while not auth.established:
        chunk = s.recv(4096)
        assert chunk, "the node refused the handshake"
        auth.receive_data(chunk)
        auth.handshake_step()
        if out := auth.data_to_send():
            s.sendall(out)
    return s, auth


def closed_by_peer(s: socket.socket) -> bool:
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_replayed_and_tampered_frames_are_rejected(nodes: Nodes) -> None:
    a, b = nodes.start(*[("--cluster-secret", SECRET)] * 2)
    bus = a.port + BUS
    # Capture real traffic: b's first link to a goes through a recording proxy
    # (b then learns a's real address from a's own link and drops it).
    proxy = RecordingProxy(bus)
    try:
        assert call(b, "CLUSTER", "MEET", HOST, proxy.port) == b"OK"
        wait_for(lambda: reachable(a) == 1 and reachable(b) == 1, what="the two nodes to link")
        wait_for(lambda: proxy.sessions and len(proxy.sessions[0]) >= 3, what="a captured MEET")
    finally:
        proxy.close()
    captured = proxy.sessions[0]  # hello, proof, then b's sealed MEET (and maybe more)

    # 1. The whole captured link, replayed on a new connection: a challenges
    #    with a fresh nonce, so the recorded proof fails.
    with socket.create_connection((HOST, bus), timeout=5) as s:
        s.sendall(captured[0])
        assert b"DQA1C" in s.recv(4096)
        s.sendall(b"".join(captured[1:]))
        assert closed_by_peer(s)
    wait_for(lambda: counter(a, "cluster_auth_handshakes_failed") == 1, what="the stale proof to fail")

    # 2. The captured MEET, injected into a genuine new session: its MAC was
    #    made with that session's keys.
    s, auth = open_session(bus)
    with s:
        s.sendall(captured[2])
        assert closed_by_peer(s)
    wait_for(lambda: counter(a, "cluster_auth_bad_mac_frames") == 1, what="the bad MAC")

    # 3. Inside a live session: a frame sent twice, frames out of order, a flipped bit.
    ping = encode_body(Header("f" * 40, 1234, 0), Ping())
    s, auth = open_session(bus)
    with s:
        frame = auth.seal(ping)
        s.sendall(frame)
        assert b"DQA1" not in s.recv(65536)  # a PONG, sealed
        s.sendall(frame)
        assert closed_by_peer(s)
    s, auth = open_session(bus)
    with s:
        first, second = auth.seal(ping), auth.seal(ping)
        s.sendall(second + first)
        assert closed_by_peer(s)
    s, auth = open_session(bus)
    with s:
        frame = bytearray(auth.seal(ping))
        frame[20] ^= 1
        s.sendall(frame)
        assert closed_by_peer(s)
    wait_for(lambda: counter(a, "cluster_auth_bad_mac_frames") == 2, what="the flipped bit")
    info = security(a)
    assert (info["cluster_auth_replayed_frames"], info["cluster_auth_out_of_sequence_frames"]) == ("1", "1")
    assert "replayed frame" in log_of(a)
    # None of it reached the node table; the real link is untouched.
    assert set(known(a)) == {my_id(a), my_id(b)}
    assert call(b, "ADDJOB", "q", "x", 5000, "REPLICATE", 2)


def test_secrets_roll_one_node_at_a_time(nodes: Nodes) -> None:
    cluster = nodes.start(*[("--cluster-secret", SECRET)] * 3)
    join(cluster)
    ids = {my_id(n) for n in cluster}

    def restart(node: NodeProcess, *extra: str) -> None:
        node.stop()
        node.extra = list(extra)
        node.start()
        wait_for(lambda: all(reachable(n) == 2 for n in cluster), what="the cluster to heal")
        assert all(set(known(n)) == ids for n in cluster)
        assert call(node, "ADDJOB", "q", "x", 5000, "REPLICATE", 3)  # every node reaches every other

    # Phase 1: each node in turn learns the new secret, keeping the old one.
    restart(cluster[0], "--cluster-secret", SECRET2, "--cluster-secret-previous", SECRET)
    wait_for(lambda: security(cluster[0])["cluster_auth_links_previous_secret"] == "4",
             what="the links to and from both old nodes to use the old secret")  # fmt: skip
    restart(cluster[1], "--cluster-secret", SECRET2, "--cluster-secret-previous", SECRET)
    restart(cluster[2], "--cluster-secret", SECRET2, "--cluster-secret-previous", SECRET)
    wait_for(lambda: all(security(n)["cluster_auth_links_previous_secret"] == "0" for n in cluster),
             what="every link to use the new secret")  # fmt: skip
    # Phase 2: the old secret is dropped, again one node at a time.
    for node in cluster:
        restart(node, "--cluster-secret", SECRET2)
    assert security(cluster[0])["cluster_auth_secrets"] == "1"
    # A node that only knows the old secret is now an outsider.
    stale = nodes.one("--cluster-secret", SECRET)
    call(stale, "CLUSTER", "MEET", HOST, cluster[0].port)
    wait_for(lambda: counter(cluster[0], "cluster_auth_handshakes_failed") >= 1, what="the stale node to be refused")
    assert my_id(stale) not in known(cluster[0]) and reachable(stale) == 0


def test_cluster_secret_is_set_at_start_up_only(nodes: Nodes, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    a, b = nodes.start(("--cluster-secret-file", str(secret_file)), ())
    assert security(a)["cluster_auth"] == "yes" and security(b)["cluster_auth"] == "no"
    # b is fresh: it may still be given a secret.
    assert call(b, "CONFIG", "SET", "cluster-secret", SECRET) == b"OK"
    assert security(b)["cluster_auth"] == "yes"
    assert call(b, "CONFIG", "GET", "cluster-secret") == []  # never shown
    join([a, b])
    with pytest.raises(redis.ResponseError, match="only be changed at start-up"):
        call(b, "CONFIG", "SET", "cluster-secret", WRONG)
    with pytest.raises(redis.ResponseError, match="only be changed at start-up"):
        call(a, "CONFIG", "SET", "cluster-secret-previous", WRONG)
    assert call(a, "CONFIG", "GET", "cluster-secret-file") == [b"cluster-secret-file", str(secret_file).encode()]
    assert call(b, "ADDJOB", "q", "x", 5000, "REPLICATE", 2)  # unchanged: still linked
    # A node cannot start with both a secret and a secret file.
    port = free_port()
    bad = NodeProcess(port, tmp_path / "bad", "--cluster-secret", SECRET, "--cluster-secret-file", str(secret_file))
    nodes.started.append(bad)
    with pytest.raises(RuntimeError, match="exited with 1"):
        bad.start()
    assert "both set" in log_of(bad)


# --------------------------------------------------------------------------
# TLS


def test_tls_clients(nodes: Nodes, certs: dict[str, str]) -> None:
    tls_port = free_port()
    node = nodes.one(*tls_args(certs, "--tls-port", str(tls_port)))  # tls-auth-clients yes: the default
    ca, cert, key = certs["ca.crt"], certs["client.crt"], certs["client.key"]
    with redis.Redis(host=HOST, port=tls_port, ssl=True, ssl_ca_certs=ca, ssl_certfile=cert, ssl_keyfile=key) as r:
        assert r.ping() is True
        job = r.execute_command("ADDJOB", "q", "over tls", 0)
    assert call(node, "QLEN", "q") == 1  # the plain port serves the same node
    # Mutual TLS: no client certificate, no connection.
    with redis.Redis(host=HOST, port=tls_port, ssl=True, ssl_ca_certs=ca, socket_timeout=5) as r:
        with pytest.raises(redis.ConnectionError):
            r.ping()
    # Plain RESP to the TLS port gets no reply.
    with pytest.raises(OSError):
        plain_ping(tls_port)
    wait_for(lambda: counter(node, "tls_client_handshake_failures") >= 2, what="the failures to be counted")

    # The client library, sync and trio, and the CLI.
    with Client((HOST, tls_port), tls=True, tls_ca_cert=ca, tls_cert=cert, tls_key=key, failover=False) as client:
        assert client.get_job("q").id == job.decode()

    async def async_round() -> str:
        async with AsyncClient((HOST, tls_port), tls=True, tls_ca_cert=ca, tls_cert=cert, tls_key=key, failover=False) as c:
            return await c.add_job("q", b"from trio")

    assert trio.run(async_round).startswith("DI") and call(node, "QLEN", "q") == 1
    done = subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(tls_port), "--tls", "--cacert", ca,
                           "--cert", cert, "--key", key, "--raw", "QLEN", "q"], capture_output=True, text=True)  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stderr
    with Client((HOST, tls_port), tls=True, tls_ca_cert=ca, failover=False, connect_timeout=5, socket_timeout=5) as c:
        with pytest.raises(DisqueConnectionError):
            c.ping()

    # tls-auth-clients is reloaded by CONFIG SET; bad files are refused and change nothing.
    assert call(node, "CONFIG", "SET", "tls-auth-clients", "no") == b"OK"
    with redis.Redis(host=HOST, port=tls_port, ssl=True, ssl_ca_certs=ca) as r:
        assert r.ping() is True
    with pytest.raises(redis.ResponseError, match="Failed to load certificate"):
        call(node, "CONFIG", "SET", "tls-cert-file", "/nonexistent.crt")
    assert call(node, "CONFIG", "GET", "tls-cert-file")[1] == certs["node.crt"].encode()
    with redis.Redis(host=HOST, port=tls_port, ssl=True, ssl_ca_certs=ca) as r:
        assert r.ping() is True


def tls_command(ca: str, password: str | None = None) -> Callable[..., bytes]:
    """devcluster.command over TLS, for a node with no plain port: PING's
    reply as its status line, INFO's text as it is."""

    def command(host: str, port: int, *args: Any, timeout: float = 5.0) -> bytes:
        with Client((host, port), tls=True, tls_ca_cert=ca, password=password, failover=False,
                    connect_timeout=timeout, socket_timeout=timeout) as c:  # fmt: skip
            reply = c.execute_command(*args)
            return b"+%s\r\n" % reply if args[0] == "PING" else reply

    return command


def test_a_tls_only_node_with_a_password(nodes: Nodes, certs: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setattr(devcluster, "command", tls_command(certs["ca.crt"], "pw"))
    node = NodeProcess(port, nodes.base / "tls-only", *tls_args(certs, "--port", "0", "--tls-port", str(port),
                       "--tls-auth-clients", "no", "--requirepass", "pw"))  # fmt: skip
    nodes.started.append(node)
    node.start()
    with Client((HOST, port), tls=True, tls_ca_cert=certs["ca.crt"], password="pw") as client:
        job = client.add_job("q", b"x")
        assert client.show(job).state == "queued"
        assert client.hello().nodes[0].port == port  # the tls-port is what the node announces
    with Client((HOST, port), tls=True, tls_ca_cert=certs["ca.crt"], failover=False) as anonymous:
        with pytest.raises(DisqueReplyError, match="NOAUTH"):
            anonymous.qlen("q")
    # Its bus listens on tls-port + 10000.
    socket.create_connection((HOST, port + BUS), timeout=2).close()


def test_a_tls_cluster_replicates_jobs(nodes: Nodes, certs: dict[str, str]) -> None:
    cluster = nodes.start(*[tls_args(certs, "--tls-cluster", "yes")] * 3)
    join(cluster)
    ids = {my_id(n) for n in cluster}
    job = call(cluster[0], "ADDJOB", "q", "body", 5000, "REPLICATE", 3)
    for n in cluster:
        show = call(n, "SHOW", job)
        assert show is not None and {i.decode() for i in show[show.index(b"nodes-delivered") + 1]} == ids
    assert call(cluster[1], "GETJOB", "TIMEOUT", 5000, "FROM", "q")[0][1] == job
    assert security(cluster[0])["tls_cluster"] == "yes"
    # Neither a node without TLS on its bus nor a raw plain connection gets in.
    outsider = nodes.one()
    call(outsider, "CLUSTER", "MEET", HOST, cluster[0].port)
    bus_exchange(cluster[0].port + BUS, b"\0\0\0\5hello")
    wait_for(lambda: counter(cluster[0], "tls_cluster_handshake_failures") >= 2, what="TLS refusals")
    time.sleep(0.3)
    assert my_id(outsider) not in known(cluster[0]) and reachable(outsider) == 0


# --------------------------------------------------------------------------
# A bus without a secret: protected mode, unidentified connections

PEEK = """
import socket
try:
    s = socket.create_connection(("{host}", {port}), timeout=5)
    s.sendall(b"\\0\\0\\0\\5hello")
    print(repr(s.recv(100)))
except (ConnectionResetError, BrokenPipeError):
    print("reset")
"""


def test_bus_protected_mode_admits_only_known_nodes_without_a_secret(tmp_path: Path) -> None:
    """Without a cluster secret the bus refuses a connection from an address
    that is neither loopback nor a node it knows: a stranger's frames and a
    one-sided MEET are refused; a MEET from the cluster's side lets the node
    in, and the stranger's connections are then accepted."""
    with namespace_pair() as pair:
        pair.start_node(0, tmp_path / "a")
        pair.start_node(1, tmp_path / "b")
        for side in (0, 1):
            wait_for(lambda: pair.ask(side, "127.0.0.1", "PING").startswith(b"+PONG"), timeout=20, what="the nodes to start")
        assert pair.run(1, PEEK.format(host=ADDRS[0], port=7711 + BUS)).strip() in ("b''", "reset")
        assert pair.ask(1, "127.0.0.1", "CLUSTER", "MEET", ADDRS[0], "7711") == b"+OK\r\n"
        refused = lambda: int(dict(  # noqa: E731
            line.split(":", 1) for line in pair.ask(0, "127.0.0.1", "INFO", "security").decode().splitlines() if ":" in line
        )["cluster_protected_mode_refused"])
        wait_for(lambda: refused() >= 2, what="the one-sided MEET to be refused")
        nodes_text = pair.ask(0, "127.0.0.1", "CLUSTER", "NODES").split(b"\r\n")[1]
        assert len(nodes_text.splitlines()) == 1, nodes_text  # itself only: no handshake entry for the stranger
        assert b"not a known node" in (tmp_path / "a" / "log.txt").read_bytes()
        assert pair.ask(0, "127.0.0.1", "CLUSTER", "MEET", ADDRS[1], "7711") == b"+OK\r\n"
        for side in (0, 1):
            wait_for(lambda: b"cluster_reachable_nodes:1" in pair.ask(side, "127.0.0.1", "CLUSTER", "INFO"), what="the two nodes to join")


def test_bus_connections_that_do_not_identify_are_closed(nodes: Nodes) -> None:
    """A bus connection must send a valid frame within 5 s, may not announce a
    first frame over 64 KB, and at most 128 may be waiting to do so: idle or
    greedy connections cannot hold the node's memory or slow its clients."""
    node = nodes.one()
    bus = node.port + BUS
    # A first frame announcing 64 MB is refused at its length prefix.
    greedy = []
    for _ in range(10):
        s = socket.create_connection((HOST, bus), timeout=5)
        s.sendall((64 << 20).to_bytes(4, "big") + b"x" * (1 << 16))
        greedy.append(s)
    assert all(drain_until_closed(s, 5) == 0 for s in greedy)
    # 200 idle connections: those past 128 are refused at once ...
    connected = time.monotonic()
    idle = [socket.create_connection((HOST, bus), timeout=10) for _ in range(200)]
    wait_for(lambda: counter(node, "cluster_unidentified_closed") >= 72, what="connections past the cap to be refused")
    started = time.monotonic()
    assert call(node, "PING") == b"PONG"
    assert time.monotonic() - started < 0.5
    # ... and the others closed 5 s after they connected.
    assert drain_until_closed(idle[0], 10) == 0
    assert 4.5 <= time.monotonic() - connected < 8.0
    wait_for(lambda: counter(node, "cluster_unidentified_closed") >= 200, what="every idle connection to be closed")
    for s in idle + greedy:
        s.close()
    # A real node still joins.
    other = nodes.one()
    join([node, other])


# --------------------------------------------------------------------------
# Clients: protected mode, idle timeout, output limits

def test_protected_mode_refuses_a_client_from_another_network_namespace(tmp_path: Path) -> None:
    with namespace_pair() as pair:
        pair.start_node(0, tmp_path)
        wait_for(lambda: pair.ask(0, "127.0.0.1", "PING").startswith(b"+PONG"), timeout=20, what="the node to start")
        denied = pair.ask(1, ADDRS[0], "PING")
        assert denied.startswith(b"-DENIED Disque is running in protected mode") and denied.endswith(b"\r\n")
        assert b"protected_mode_refused_clients:1" in pair.ask(0, "127.0.0.1", "INFO", "security")
        # A password lifts it (the client must then authenticate); so does protected-mode no.
        assert pair.ask(0, "127.0.0.1", "CONFIG", "SET", "requirepass", "pw") == b"+OK\r\n"
        assert pair.ask(1, ADDRS[0], "PING").startswith(b"-NOAUTH")
        assert pair.ask(0, "127.0.0.1", "AUTH", "pw") == b"+OK\r\n"


def test_idle_clients_are_closed_after_timeout(nodes: Nodes) -> None:
    node = nodes.one("--timeout", "1")
    with socket.create_connection((HOST, node.port), timeout=5) as idle, \
            socket.create_connection((HOST, node.port), timeout=5) as blocked:  # fmt: skip
        blocked.sendall(b"GETJOB TIMEOUT 0 FROM q\r\n")
        started = time.monotonic()
        assert idle.recv(100) == b""  # closed by the node
        assert 0.9 <= time.monotonic() - started < 4
        time.sleep(0.5)
        assert call(node, "ADDJOB", "q", "late", 0)  # the blocked client was exempt: it gets the job
        assert b"late" in blocked.recv(1000)


def drain_until_closed(sock: socket.socket, timeout: float = 10.0) -> int:
    """Read and discard until the peer closes; the bytes read."""
    sock.settimeout(timeout)
    total = 0
    try:
        while chunk := sock.recv(1 << 20):
            total += len(chunk)
    except (ConnectionResetError, BrokenPipeError):
        pass
    return total


def test_consumers_that_stop_reading_hit_the_output_limit(nodes: Nodes) -> None:
    node = nodes.one()
    assert call(node, "CONFIG", "SET", "client-output-buffer-limit", "normal 1mb 256kb 5") == b"OK"
    body = b"x" * 20_000
    with redis.Redis(host=HOST, port=node.port, protocol=2) as r:
        pipe = r.pipeline(transaction=False)
        for _ in range(40):
            pipe.execute_command("ADDJOB", "q", body, 0)
        pipe.execute()
    before = rss(node.pid)

    def stuck(*commands: bytes) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((HOST, node.port))
        s.sendall(b"".join(commands))
        return s

    # A pipelining consumer: 100 QPEEKs of 800 kB each, never read.
    peeker = stuck(b"QPEEK q 40\r\n" * 100)
    # A MONITOR that stops reading while a producer streams 64 kB jobs.
    monitor = stuck(b"MONITOR\r\n")
    with peeker, monitor:
        wait_for(lambda: b"cmd=monitor" in call(node, "CLIENT", "LIST"), what="MONITOR")
        with redis.Redis(host=HOST, port=node.port, protocol=2) as r:
            for _ in range(10):
                pipe = r.pipeline(transaction=False)
                for _ in range(30):
                    pipe.execute_command("ADDJOB", "big", b"y" * 65_536, 0)
                pipe.execute()
        wait_for(lambda: counter(node, "output_limit_closed_clients") == 2, what="both consumers to be closed")
        assert drain_until_closed(peeker) < 1 << 23 and drain_until_closed(monitor) < 1 << 23
    plain_ping(node.port)
    assert call(node, "QLEN", "big") == 300 and b"cmd=monitor" not in call(node, "CLIENT", "LIST")
    assert log_of(node).count("overcoming of output buffer limits") == 2
    assert rss(node.pid) - before < 100 << 20
    assert call(node, "CONFIG", "RESETSTAT") == b"OK"
    assert counter(node, "output_limit_closed_clients") == 0
