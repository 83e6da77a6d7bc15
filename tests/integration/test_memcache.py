"""The Kestrel (memcache) port on real processes: a real memcache client
(pymemcache), raw sockets for exact bytes, the same jobs seen from RESP, bad
input, oversized items against real memcached, authentication, waits to the
millisecond, and a reliable read across a 3-node cluster."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pymemcache.client.base import Client as Memcache
from pymemcache.exceptions import MemcacheClientError, MemcacheUnexpectedCloseError

from clusterkit import Cluster
from support import wait_for
from disque.testing.devcluster import NodeProcess, free_port

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


def test_a_memcache_client_works_unchanged_with_the_key_echoed(kestrel) -> None:
    """pymemcache checks that a VALUE line names the key it asked for:
    `memcache-value-key echo` is its setting (docs/kestrel.md)."""
    node, port = kestrel("--memcache-value-key", "echo")
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


def test_in_kestrels_mode_pymemcache_reads_plain_gets_only(kestrel) -> None:
    _, port = kestrel()
    cache = mc(port)
    assert cache.set("work", b"hello", noreply=False) and cache.get("work") == b"hello"
    cache.set("work", b"again", noreply=False)
    with pytest.raises(KeyError):  # `VALUE work ...` answers another key than "work/peek" to it
        cache.get("work/peek")


def test_exact_bytes_of_the_worked_exchange(kestrel) -> None:
    _, port = kestrel()
    a = raw(port)
    expect(a, b"set work 0 0 5\r\nhello\r\n", b"STORED\r\n")
    expect(a, b"get work/open\r\n", b"VALUE work 0 5\r\nhello\r\nEND\r\n")
    expect(a, b"get work\r\n", b"ERROR\r\n")
    assert closed(a)
    b = raw(port)  # the item is back at the head
    expect(b, b"get work/close/open\r\n", b"VALUE work 0 5\r\nhello\r\nEND\r\n")
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
    expect(waiting, b"", b"VALUE q 0 4\r\nlate\r\nEND\r\n")


@pytest.mark.parametrize("mode", ["bare", "echo"])
def test_exact_value_lines_in_both_modes(kestrel, mode: str) -> None:
    node, port = kestrel("--memcache-value-key", mode)
    sock = raw(port)
    for key in (b"q", b"q/t=10", b"q/open", b"q/t=100/close/open", b"q/peek", b"q/peek/t=5", b"q+c/open/close"):
        queue = key.split(b"/")[0]
        expect(sock, b"set %s 0 0 2\r\nhi\r\n" % queue, b"STORED\r\n")
        named = queue if mode == "bare" else key
        expect(sock, b"get %s\r\n" % key, b"VALUE %s 0 2\r\nhi\r\nEND\r\n" % named)
        expect(sock, b"get %s/close\r\ndelete %s\r\n" % (queue, queue), b"END\r\nEND\r\n")
    r(node).execute_command("CONFIG", "SET", "memcache-value-key", "echo" if mode == "bare" else "bare")
    expect(sock, b"set q 0 0 1\r\nx\r\n", b"STORED\r\n")
    expect(sock, b"get q/peek\r\n", b"VALUE %s 0 1\r\nx\r\nEND\r\n" % (b"q/peek" if mode == "bare" else b"q"))


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


def test_with_a_password_every_client_authenticates_as_with_memcached(kestrel) -> None:
    """memcached's ASCII authentication: the first SET carries `default
    <password>`; until then even a loopback client can neither read, write,
    FLUSH_ALL nor SHUTDOWN."""
    node, port = kestrel()
    r(node).execute_command("ADDJOB", "q", "precious", 0)
    r(node).execute_command("CONFIG", "SET", "requirepass", "s3cret")
    sock = raw(port)
    expect(sock, b"flush_all\r\nshutdown\r\n", b"CLIENT_ERROR unauthenticated\r\n" * 2)
    expect(sock, b"set auth 0 0 13\r\ndefault wrong\r\n", b"CLIENT_ERROR authentication failure\r\n")
    cache = mc(port)
    with pytest.raises(MemcacheClientError, match="unauthenticated"):
        cache.get("q")
    assert cache.set("auth", b"default s3cret", noreply=False)  # pymemcache, unchanged
    assert cache.get("q") == b"precious"
    client = redis.Redis(HOST, node.port, password="s3cret", socket_timeout=10)
    _opened.append(client)
    assert client.execute_command("INFO", "security")["auth_failures"] == 1  # the core's AUTH path counted it


def test_memcache_auth_loopback_trusts_loopback_clients(kestrel) -> None:
    node, port = kestrel("--memcache-auth", "loopback")
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
        node.extra += ["--memcache-port", str(port), "--memcache-value-key", "echo"]  # for pymemcache
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


def test_with_a_password_other_hosts_authenticate_or_with_loopback_trust_are_refused(tmp_path: Path) -> None:
    """While requirepass is set: with `memcache-auth password` a client from
    another host is served once it authenticates; with `loopback` it is
    turned away with a SERVER_ERROR line, and loopback clients need nothing."""
    from netns import ADDRS, namespace_pair

    code = ("import socket, sys; s = socket.create_connection((HOST, 22133), timeout=10); s.sendall(DATA); "
            "sys.stdout.write(s.recv(1000).decode())")  # fmt: skip

    def send(side: int, host: str, data: bytes) -> str:
        """What a client in namespace `side` is answered (in text mode: CRLF read as LF)."""
        return pair.run(side, code.replace("HOST", repr(host)).replace("DATA", repr(data)))

    with namespace_pair() as pair:
        pair.start_node(0, tmp_path / "trusting", "memcache-port 22133\nrequirepass pw\nmemcache-auth loopback\n")
        pair.start_node(1, tmp_path / "asking", "memcache-port 22133\nrequirepass pw\n")
        for side in (0, 1):
            wait_for(lambda: pair.ask(side, "127.0.0.1", "PING").startswith(b"-NOAUTH"), timeout=20, what="the nodes to start")  # noqa: B023
        denied = send(1, ADDRS[0], b"get q\r\n")
        assert denied.startswith("SERVER_ERROR DENIED") and denied.count("\n") == 1
        assert send(0, "127.0.0.1", b"get q\r\n") == "END\n"
        assert send(0, ADDRS[1], b"get q\r\n") == "CLIENT_ERROR unauthenticated\n"
        assert send(0, ADDRS[1], b"set a 0 0 10\r\ndefault pw\r\n") == "STORED\n"


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
    spawn("--memcache-tls-port", str(port), "--memcache-value-key", "echo", "--tls-cert-file", str(tmp_path / "node.crt"),
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


@pytest.fixture
def memcached() -> Iterator[int]:
    """A real memcached 1.6 on a free loopback port (`make tools-memcached`)."""
    binary = shutil.which("memcached")
    if binary is None:
        pytest.skip("memcached is not installed (make tools-memcached)")
    port = free_port()
    proc = subprocess.Popen([binary, "-u", "root", "-l", HOST, "-p", str(port), "-U", "0"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip

    def listening() -> bool:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
        except OSError:
            return False
        return True

    try:
        wait_for(listening, what="memcached to listen")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def answers(port: int, data: bytes, end: bytes) -> bytes:
    """Send `data` on a new connection; read until the answers end with `end`."""
    sock = raw(port)
    sock.sendall(data)
    out = b""
    while not out.endswith(end) and (chunk := sock.recv(65536)):
        out += chunk
    return out


def test_an_oversized_set_is_answered_and_swallowed_as_real_memcached_does(kestrel, memcached: int) -> None:
    """Both at their default item size (1 MB): the same bytes in, the same
    bytes out, and the connection goes on."""
    _, port = kestrel()
    big = b"x" * (2 << 20)
    exchanges = [
        b"set big 0 0 %d\r\n%s\r\nget big\r\n" % (len(big), big),
        b"set big 0 0 %d noreply\r\n%s\r\nget big\r\n" % (len(big), big),  # noreply silences the error too
        b"set big 0 0 %d\r\n%sZZget big\r\n" % (len(big), big),  # the two bytes after the block go unchecked
    ]
    for data in exchanges:
        theirs = answers(memcached, data, b"END\r\n")
        assert answers(port, data, b"END\r\n") == theirs and theirs.endswith(b"END\r\n")
    assert theirs == b"SERVER_ERROR object too large for cache\r\nEND\r\n"


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_huge_sets_are_not_buffered(kestrel) -> None:
    """Three connections each announcing 500 MB and sending 40 MB of it: the
    node's memory does not grow with what they send."""
    node, port = kestrel()
    before = rss(node.pid)
    socks = [raw(port) for _ in range(3)]
    chunk = b"x" * (1 << 20)
    for sock in socks:
        sock.sendall(b"set big 0 0 500000000\r\n")
    for _ in range(40):
        for sock in socks:
            sock.sendall(chunk)
    stats = lambda: r(node).execute_command("INFO", "stats")["total_net_input_bytes"]  # noqa: E731
    wait_for(lambda: stats() >= 3 * 40 * len(chunk), what="the node to read all of it")
    assert rss(node.pid) - before < 20 << 20, (before, rss(node.pid))
    assert r(node).execute_command("INFO", "memory")["used_memory"] < 20 << 20


def test_a_waiting_get_ends_at_its_millisecond_not_at_the_next_100_ms_cron(kestrel) -> None:
    """`get q/t=20` answered END in its 20th ms and well before 80, five times in
    a row: each starts right after the previous answer, which under a 100 ms
    cron would make every one after the first wait about 100 ms."""
    _, port = kestrel()
    sock = raw(port)
    for _ in range(5):
        start = time.monotonic()
        expect(sock, b"get q/t=20\r\n", b"END\r\n")
        elapsed = time.monotonic() - start
        # A timeout counts whole milliseconds of the node's clock, as C Disque's
        # and Redis's do: a request read late in a millisecond waits up to 1 ms less.
        assert 0.019 <= elapsed < 0.080, elapsed
