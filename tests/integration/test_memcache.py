"""The Kestrel (memcache) port on real processes: a real memcache client
(pymemcache), raw sockets for exact bytes, the same jobs seen from RESP, bad
input, the password rule, and a reliable read across a 3-node cluster."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pymemcache.client.base import Client as Memcache
from pymemcache.exceptions import MemcacheUnexpectedCloseError

from clusterkit import Cluster, wait_for
from disque.devcluster import NodeProcess, free_port

HOST = "127.0.0.1"


@pytest.fixture
def kestrel(spawn: Callable[..., NodeProcess]) -> Callable[..., tuple[NodeProcess, int]]:
    """A node with its memcache port: (node, memcache port)."""

    def start(*extra: str) -> tuple[NodeProcess, int]:
        port = free_port()
        return spawn("--memcache-port", str(port), *extra), port

    return start


_opened: list[Any] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def raw(port: int) -> socket.socket:
    _opened.append(socket.create_connection((HOST, port), timeout=10))
    return _opened[-1]


def mc(port: int) -> Memcache:
    _opened.append(Memcache((HOST, port), timeout=10))
    return _opened[-1]


def r(node: NodeProcess) -> redis.Redis:
    _opened.append(redis.Redis(HOST, node.port, socket_timeout=10))
    return _opened[-1]


def exchange(sock: socket.socket, data: bytes, expect: int) -> bytes:
    """Send `data`, read until `expect` bytes came (or the peer closed)."""
    sock.sendall(data)
    out = b""
    while len(out) < expect and (chunk := sock.recv(65536)):
        out += chunk
    return out


def expect(sock: socket.socket, data: bytes, reply: bytes) -> None:
    assert exchange(sock, data, len(reply)) == reply


def until_end(sock: socket.socket, data: bytes) -> bytes:
    """Send `data`, read one reply that ends with END."""
    sock.sendall(data)
    out = b""
    while not out.endswith(b"END\r\n") and (chunk := sock.recv(65536)):
        out += chunk
    return out


def closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_memcache_client_works_unchanged(kestrel) -> None:
    node, port = kestrel()
    cache = mc(port)
    assert cache.set("work", b"hello", noreply=False) and cache.set("work", b"world", noreply=False)
    assert cache.get("work/peek") == b"hello"
    assert cache.get("work/open") == b"hello"
    assert cache.get("work/close/open") == b"world"
    assert cache.get("work/close") is None and cache.get("work") is None
    stats = cache.stats()
    assert stats[b"cmd_set"] == 2 and stats[b"get_hits"] == 2 and stats[b"queue_work_items"] == 0
    assert cache.version().decode() == r(node).execute_command("INFO", "server")["disque_version"]
    cache.set("many", b"x" * 100_000, noreply=False)
    assert cache.get("many") == b"x" * 100_000


def test_exact_bytes_of_the_worked_exchange(kestrel) -> None:
    _, port = kestrel()
    a = raw(port)
    expect(a, b"set work 0 0 5\r\nhello\r\n", b"STORED\r\n")
    expect(a, b"get work/open\r\n", b"VALUE work/open 0 5\r\nhello\r\nEND\r\n")
    expect(a, b"get work\r\n", b"ERROR\r\n")
    assert closed(a)
    b = raw(port)  # the item is back at the head
    expect(b, b"get work/close/open\r\n", b"VALUE work/close/open 0 5\r\nhello\r\nEND\r\n")
    expect(b, b"get work/close\r\ndelete work\r\nget work\r\n", b"END\r\nEND\r\nEND\r\n")
    assert exchange(b, b"version\r\n", 9).startswith(b"VERSION ")


def test_the_same_jobs_from_resp(kestrel) -> None:
    node, port = kestrel()
    client = r(node)
    cache = mc(port)
    cache.set("shared", b"from memcache", noreply=False)
    assert client.execute_command("QLEN", "shared") == 1
    job = client.execute_command("GETJOB", "FROM", "shared")
    assert job[0][2] == b"from memcache"
    client.execute_command("ADDJOB", "shared", "from resp", 0)
    assert cache.get("shared") == b"from resp" and client.execute_command("QLEN", "shared") == 0


def test_a_waiting_get_is_served_by_a_resp_producer(kestrel) -> None:
    node, port = kestrel()
    waiting = raw(port)
    waiting.sendall(b"get q/t=5000\r\n")
    wait_for(lambda: r(node).execute_command("INFO", "clients")["blocked_clients"] == 1, what="the GET to wait")
    r(node).execute_command("ADDJOB", "q", "late", 0)
    expect(waiting, b"", b"VALUE q/t=5000 0 4\r\nlate\r\nEND\r\n")


def test_bad_input_closes_that_connection_only(kestrel) -> None:
    node, port = kestrel()
    cases = [
        (b"bogus\r\n", b"CLIENT_ERROR\r\n"),
        (b"get /open\r\n", b"CLIENT_ERROR\r\n"),
        (b"get q/peek/open\r\n", b"CLIENT_ERROR\r\n"),
        (b"set q 0 0 5\r\nhello world\r\n", b"CLIENT_ERROR\r\n"),  # longer than its count
        (b"set q.x 0 0 1\r\nx\r\n", b"CLIENT_ERROR\r\n"),
        (b"\x00\xff\xfe garbage\r\n", b"CLIENT_ERROR\r\n"),
    ]
    bystander = mc(port)
    for request, reply in cases:
        sock = raw(port)
        expect(sock, request, reply)
        assert closed(sock), request
        assert bystander.set("ok", b"1", noreply=False)
    half = raw(port)
    half.sendall(b"set q 0 0 10\r\nhalf")  # disconnects mid-SET: nothing is stored
    half.close()
    assert bystander.get("q") is None and r(node).execute_command("QLEN", "q") == 0
    assert r(node).execute_command("QLEN", "ok") == len(cases)


def test_queue_settings_bind_both_protocols(kestrel) -> None:
    node, port = kestrel()
    conf = node.workdir / "disque.conf"
    conf.write_text(conf.read_text() + "queue small max_items 2\n")
    cache = mc(port)
    assert cache.get("small") is None  # RELOAD applies it without a restart
    sock = raw(port)
    expect(sock, b"reload\r\n", b"Reloaded config.\r\n")
    assert cache.set("small", b"1", noreply=False) and cache.set("small", b"2", noreply=False)
    expect(sock, b"set small 0 0 1\r\n3\r\n", b"NOT_STORED\r\n")
    with pytest.raises(redis.ResponseError, match="MAXLEN Queue is full"):
        r(node).execute_command("ADDJOB", "small", "4", 0)
    assert b"  max_items=2\r\n" in until_end(sock, b"dump_config\r\n")


def test_with_a_password_loopback_clients_need_no_auth(kestrel) -> None:
    node, port = kestrel()
    r(node).execute_command("CONFIG", "SET", "requirepass", "s3cret")
    cache = mc(port)
    assert cache.set("q", b"x", noreply=False) and cache.get("q") == b"x"
    with pytest.raises(redis.AuthenticationError):
        r(node).execute_command("QLEN", "q")


@pytest.fixture
def trio_nodes(tmp_path: Path) -> Iterator[tuple[Cluster, list[int]]]:
    ports = [free_port() for _ in range(3)]
    cluster = Cluster(tmp_path, 3)
    for node, port in zip(cluster.nodes, ports):
        node.extra += ["--memcache-port", str(port)]
    with cluster:
        yield cluster, ports


def test_a_reliable_read_on_another_node_comes_back_when_its_connection_dies(trio_nodes) -> None:
    cluster, ports = trio_nodes
    mc(ports[0]).set("work", b"payload", noreply=False)  # replicated to all three
    reader = raw(ports[1])
    expect(reader, b"get work/open/t=5000\r\n", b"VALUE work/open/t=5000 0 7\r\npayload\r\nEND\r\n")
    reader.close()  # killed with the read open: it goes back to the head, on node 2
    again = mc(ports[1])
    assert again.get("work/t=5000") == b"payload"
    cluster.wait(lambda: not any(cluster.registered_jobs(i) for i in range(3)), what="the item gone from every node")


def test_with_a_password_the_port_refuses_other_hosts(tmp_path: Path) -> None:
    """memcache has no AUTH: while requirepass is set, a client from another
    host is turned away with a SERVER_ERROR line; loopback still works."""
    from netns import ADDRS, namespace_pair

    code = ("import socket, sys; s = socket.create_connection((sys.argv[1], 22133), timeout=10); "
            "s.sendall(b'get q\\r\\n'); sys.stdout.write(s.recv(1000).decode())")  # fmt: skip
    with namespace_pair() as pair:
        pair.start_node(0, tmp_path, "memcache-port 22133\nrequirepass pw\n")
        wait_for(lambda: pair.ask(0, "127.0.0.1", "PING").startswith(b"-NOAUTH"), timeout=20, what="the node to start")
        denied = pair.run(1, code.replace("sys.argv[1]", repr(ADDRS[0])))
        assert denied.startswith("SERVER_ERROR DENIED") and denied.count("\n") == 1  # (text mode: CRLF read as LF)
        assert pair.run(0, code.replace("sys.argv[1]", "'127.0.0.1'")) == "END\n"


def test_fanout_children_named_on_one_node_receive_sets_on_another(trio_nodes) -> None:
    cluster, ports = trio_nodes
    audit, billing = mc(ports[1]), mc(ports[2])
    assert audit.get("orders+audit") is None and billing.get("orders+billing") is None  # they join
    producer = mc(ports[0])
    children = lambda: r(cluster.nodes[0]).execute_command("INFO", "kestrel")["fanout_children"]  # noqa: E731
    cluster.wait(lambda: children() == 2, what="node 1 to learn both children")
    assert producer.set("orders", b"order 1", noreply=False)
    assert audit.get("orders+audit/t=5000") == b"order 1"  # copied on node 1, fetched across the cluster
    assert billing.get("orders+billing/t=5000") == b"order 1"
    assert producer.get("orders") == b"order 1"  # and the parent keeps its own
    billing.delete("orders+billing")
    cluster.wait(lambda: children() == 1, what="node 1 to learn that one child left")
    producer.set("orders", b"order 2", noreply=False)
    assert audit.get("orders+audit/t=5000") == b"order 2"
    assert billing.get("orders+billing/t=300") is None  # deleted: it stopped receiving


def test_the_memcache_tls_port(tmp_path: Path, spawn) -> None:
    """memcache-tls-port: Kestrel's protocol over TLS with the tls-* settings
    (mutual TLS by default: a client certificate is required)."""
    import ssl
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "disque.cli", "tls-keygen", str(tmp_path)], capture_output=True, check=True)
    port = free_port()
    spawn("--memcache-tls-port", str(port), "--tls-cert-file", str(tmp_path / "node.crt"),
          "--tls-key-file", str(tmp_path / "node.key"), "--tls-ca-cert-file", str(tmp_path / "ca.crt"))  # fmt: skip
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    context.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
    cache = Memcache((HOST, port), timeout=10, tls_context=context)
    _opened.append(cache)
    assert cache.set("secure", b"over tls", noreply=False) and cache.get("secure/peek") == b"over tls"
    anonymous = Memcache((HOST, port), timeout=5, tls_context=ssl.create_default_context(cafile=str(tmp_path / "ca.crt")))
    _opened.append(anonymous)
    with pytest.raises((ssl.SSLError, OSError, MemcacheUnexpectedCloseError)):
        anonymous.get("secure")


def test_a_node_that_dies_with_an_open_read_loses_no_item(trio_nodes) -> None:
    """The open read is a delivered job: when its node dies, the other nodes
    queue it again after its RETRY (1 s here, set by a RESP producer)."""
    cluster, ports = trio_nodes
    cluster.call(0, "ADDJOB", "work", "precious", 5000, "RETRY", 1)
    reader = raw(ports[1])
    expect(reader, b"get work/open/t=5000\r\n", b"VALUE work/open/t=5000 0 8\r\nprecious\r\nEND\r\n")
    cluster.kill(1)
    assert mc(ports[2]).get("work/t=10000") == b"precious"
