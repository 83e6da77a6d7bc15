"""Hostile and unlucky clients on real processes: one that never reads its
replies while pipelining requests with huge ones, unauthenticated ones that
send huge requests, and password guessing."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import redis

from clusterkit import wait_for
from disque.devcluster import NodeProcess


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_client_that_never_reads_cannot_make_the_node_buffer_its_replies(spawn: Callable[..., NodeProcess]) -> None:
    """1,000 jobs of 1 KB; one write of 2,000 `QPEEK q 1000` (1 MB of reply
    each, 2 GB in all) from a socket that never reads.  The node holds about
    one reply's worth for it and other clients stay served."""
    node = spawn()
    r = redis.Redis(port=node.port)
    pipe = r.pipeline(transaction=False)
    for i in range(1000):
        pipe.execute_command("ADDJOB", "q", b"x" * 1024, 0)
    pipe.execute()
    before = rss_kb(node.pid)
    flood = socket.socket()
    flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: shrinking it later stalls loopback TCP
    flood.connect((node.host, node.port))
    request = b"*3\r\n$5\r\nQPEEK\r\n$1\r\nq\r\n$4\r\n1000\r\n" * 2000
    flood.sendall(request)
    try:
        worst = 0.0
        for _ in range(50):
            start = time.monotonic()
            assert r.ping()
            worst = max(worst, time.monotonic() - start)
        grown_mb = (rss_kb(node.pid) - before) / 1024
        assert worst < 1.0, f"a PING waited {worst:.2f} s"
        assert grown_mb < 64, f"the node grew by {grown_mb:.0f} MB for a client that does not read"
        # it is still served, as fast as it reads
        flood.setblocking(True)
        got = 0
        while got < 3 * 1024 * 1024:
            got += len(flood.recv(1 << 20))
        wait_for(lambda: r.execute_command("INFO", "stats") is not None)
    finally:
        flood.close()
    assert r.ping()
    r.close()


def locked(node: NodeProcess) -> NodeProcess:
    admin = redis.Redis(port=node.port)
    admin.config_set("requirepass", "secret")
    admin.close()
    return node


def test_unauthenticated_clients_cannot_make_the_node_buffer_huge_requests(spawn: Callable[..., NodeProcess]) -> None:
    """With requirepass, five connections announce a 500 MB AUTH argument and
    send 20 MB of it each: every one is told off and closed after 16 KB,
    and the node does not grow by what they sent."""
    node = locked(spawn())
    before = rss_kb(node.pid)
    chunk = b"x" * (1 << 20)
    replies = []
    for _ in range(5):
        sock = socket.create_connection((node.host, node.port))
        try:
            sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$524288000\r\n")
            for _ in range(20):
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(10)
        try:
            replies.append(sock.recv(200))
        except ConnectionResetError:
            replies.append(b"reset")
        sock.close()
    grown_mb = (rss_kb(node.pid) - before) / 1024
    assert grown_mb < 32, f"the node grew by {grown_mb:.0f} MB for 100 MB of unauthenticated input"
    assert all(r in (b"-ERR Protocol error: unauthenticated request too long\r\n", b"reset", b"") for r in replies), replies
    assert "unauthenticated client" in node.log_path.read_text()
    r = redis.Redis(port=node.port, password="secret")
    assert r.execute_command("ADDJOB", "q", "b" * 100_000, 0)  # authenticated clients are not capped
    r.close()


def test_password_guessing_is_slowed_counted_and_logged(spawn: Callable[..., NodeProcess]) -> None:
    """Seven wrong passwords pipelined on one connection: three are answered
    at once, then 100, 200, 400 and 800 ms apart; INFO counts them and the
    log says so."""
    node = locked(spawn())
    sock = socket.create_connection((node.host, node.port))
    start = time.monotonic()
    sock.sendall(b"AUTH guess\r\n" * 7)
    got = b""
    while got.count(b"\r\n") < 7:
        got += sock.recv(4096)
    elapsed = time.monotonic() - start
    sock.close()
    assert got == b"-ERR invalid password\r\n" * 7
    assert elapsed >= 1.5, f"seven wrong passwords answered in {elapsed:.2f} s"
    r = redis.Redis(port=node.port, password="secret")
    assert r.info("security")["auth_failures"] == 7
    r.close()
    assert "Failed AUTH from 127.0.0.1" in node.log_path.read_text()


def test_maxmemory_bounds_the_process(spawn: Callable[..., NodeProcess]) -> None:
    """Pipelined ADDJOBs until the node refuses them: its RSS stays under
    maxmemory and within 15 % of the used_memory it reports."""
    node = spawn("--maxmemory", "96mb")
    r = redis.Redis(port=node.port)
    accepted, refusal = 0, None
    while refusal is None:
        pipe = r.pipeline(transaction=False)
        for i in range(1000):
            pipe.execute_command("ADDJOB", "qt", b"%016d" % (accepted + i), 0, "RETRY", 300)
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception):
                refusal = str(reply)
                break
            accepted += 1
    memory = r.info("memory")
    r.close()
    assert "out of memory" in refusal and accepted > 20_000
    assert memory["used_memory_rss"] <= 96 << 20, memory
    assert memory["used_memory_rss"] <= 1.15 * memory["used_memory"], memory
    assert rss_kb(node.pid) * 1024 <= 96 << 20
