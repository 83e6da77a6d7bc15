"""The HTTP port of a real node: Prometheus metrics, the JSON API, the password rule."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from support import wait_for
from disque.testing.devcluster import NodeProcess, free_port

PASSWORD = "s3cret"


def http(port: int, path: str, body: Any = None, auth: str | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if auth:
        request.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = http(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


@pytest.fixture
def metrics_node(spawn: Callable[..., NodeProcess]) -> tuple[NodeProcess, int, redis.Redis]:
    port = free_port()
    node = spawn("--metrics-port", str(port))
    client = redis.Redis(port=node.port)
    yield node, port, client
    client.close()


def test_metrics_follow_jobs_queues_and_commands(metrics_node) -> None:
    node, port, r = metrics_node
    assert r.execute_command("CONFIG", "GET", "metrics-port") == {b"metrics-port": str(port).encode()}
    for i in range(3):
        r.execute_command("ADDJOB", "orders", f"job {i}", 0, "RETRY", 60)
    [[_, job_id, _]] = r.execute_command("GETJOB", "FROM", "orders")
    assert r.execute_command("NACK", job_id) == 1
    r.execute_command("GETJOB", "FROM", "orders")
    before = samples(port)
    assert before[("disque_jobs", (("state", "queued"),))] == 2
    assert before[("disque_jobs", (("state", "active"),))] == 1
    assert before[("disque_queue_length", (("queue", "orders"),))] == 2
    assert before[("disque_queue_jobs_in_total", (("queue", "orders"),))] == 4
    assert before[("disque_queue_nacks_total", (("queue", "orders"),))] == 1
    assert before[("disque_command_calls_total", (("command", "addjob"),))] == 3
    assert before[("disque_command_duration_seconds_count", (("command", "addjob"),))] == 3
    assert before[("disque_command_duration_seconds_bucket", (("command", "addjob"), ("le", "+Inf")))] == 3
    assert before[("disque_aof_enabled", ())] == 0 and before[("disque_connected_clients", ())] >= 1
    assert before[("process_resident_memory_bytes", ())] > 10_000_000
    assert before[("disque_queue_oldest_job_age_seconds", (("queue", "orders"),))] >= 0
    r.execute_command("ADDJOB", "orders", "one more", 0)
    r.execute_command("PAUSE", "orders", "out")
    # the figures are rendered at most once a second, shared by every scrape meanwhile
    after = wait_for(lambda: got if (got := samples(port))[("disque_queue_length", (("queue", "orders"),))] == 3 else None)
    assert after[("disque_command_calls_total", (("command", "addjob"),))] == 4
    assert after[("disque_queue_paused", (("pause", "out"), ("queue", "orders")))] == 1
    assert after[("disque_net_input_bytes_total", ())] > before[("disque_net_input_bytes_total", ())]


def test_metrics_of_consumer_groups(metrics_node) -> None:
    node, port, r = metrics_node
    for i in range(3):
        r.execute_command("QADD", "events", 60, f"e{i}")
    r.execute_command("QACK", "events", "billing", r.execute_command("QGET", "events", "billing")[0])
    r.execute_command("QGET", "events", "billing")
    got = samples(port)
    key = (("group", "billing"), ("queue", "events"))
    figures = {name: got[(f"disque_group_{name}", key)] for name in ("total", "inprogress", "redo", "done", "available", "consumers")}
    assert figures == {"total": 3, "inprogress": 1, "redo": 0, "done": 1, "available": 1, "consumers": 0}
    assert got[("disque_events_added_total", ())] == 3 and got[("disque_events_handed_out_total", ())] == 2
    assert got[("disque_events_acked_total", ())] == 1


def test_the_json_api_and_what_it_refuses(metrics_node) -> None:
    node, port, r = metrics_node
    job_id = r.execute_command("ADDJOB", "q", "body", 0).decode()
    status, body = http(port, "/api/overview")
    overview = json.loads(body)
    assert status == 200 and overview["jobs"]["queued"] == 1
    assert [q["name"] for q in overview["queues"]] == ["q"]
    status, body = http(port, f"/api/jobs/{job_id}")
    assert status == 200 and json.loads(body)["job"]["body"] == "body"
    assert json.loads(http(port, "/api/jobs/DI" + "0" * 44 + "SQ")[1]) == {"job": None}
    assert http(port, "/api/jobs/nonsense")[0] == 400
    assert http(port, "/nowhere")[0] == 404
    assert http(port, "/static/../shell/http.py")[0] == 404
    assert http(port, "/api/queues/q/pause", {"state": "sideways"})[0] == 400
    status, body = http(port, "/api/queues/q/pause", {"state": "in"})  # no password set: open
    assert status == 200 and json.loads(body) == {"queue": "q", "pause": "in"}
    assert r.execute_command("PAUSE", "q", "state") == b"in"
    page = http(port, "/")[1]
    assert b"<title>disque dashboard</title>" in page and b"/static/app.js" in page


def test_changing_state_needs_the_nodes_password(spawn) -> None:
    port = free_port()
    node = spawn("--metrics-port", str(port))
    with redis.Redis(port=node.port) as setup:
        assert setup.execute_command("CONFIG", "SET", "requirepass", PASSWORD) == b"OK"
    r = redis.Redis(port=node.port, password=PASSWORD)
    r.execute_command("ADDJOB", "q", "x", 0)
    assert http(port, "/api/overview")[0] == 200  # reading is open, as /metrics is
    assert http(port, "/api/queues/q/pause", {"state": "in"})[0] == 401
    assert http(port, "/api/queues/q/pause", {"state": "in"}, auth="Bearer wrong")[0] == 401
    assert r.execute_command("PAUSE", "q", "state") == b"none"
    assert http(port, "/api/queues/q/pause", {"state": "in"}, auth=f"Bearer {PASSWORD}")[0] == 200
    assert r.execute_command("PAUSE", "q", "state") == b"in"
    basic = base64.b64encode(f"anyone:{PASSWORD}".encode()).decode()
    assert http(port, "/api/queues/q/pause", {"state": "none"}, auth=f"Basic {basic}")[0] == 200
    assert r.execute_command("PAUSE", "q", "state") == b"none"
    r.close()


def test_garbage_on_the_http_port_closes_that_connection_only(metrics_node) -> None:
    node, port, r = metrics_node
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"\x00\xffNOT HTTP\r\n\r\n")
        assert s.recv(4096).startswith(b"") and s.recv(4096) == b""  # closed
    assert r.ping() and http(port, "/metrics")[0] == 200


def test_the_grafana_dashboard_only_asks_for_metrics_a_node_serves(metrics_node) -> None:
    """Every metric name in examples/grafana-dashboard.json is one /metrics has."""
    import re
    from pathlib import Path

    node, port, r = metrics_node
    r.execute_command("ADDJOB", "q", "x", 0)
    text = http(port, "/metrics")[1].decode()
    served = {n for f in text_string_to_metric_families(text) for n in (f.name, *(s.name for s in f.samples))}
    dashboard = json.loads((Path(__file__).parents[2] / "examples" / "grafana-dashboard.json").read_text())
    wanted = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b((?:disque|process)_[a-z_]+)", target["expr"])
    }
    assert len(wanted) >= 10 and wanted <= served, sorted(wanted - served)


# --------------------------------------------------------------------------
# What a hostile or careless HTTP client can cost


def test_head_answers_as_get_without_a_body(metrics_node) -> None:
    """HEAD (load balancers, health checks) gets GET's status and headers,
    no body, and the keep-alive connection goes on."""
    import http.client

    node, port, r = metrics_node
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for path, status in (("/", 200), ("/metrics", 200), ("/api/overview", 200), ("/nowhere", 404)):
        conn.request("GET", path)
        response = conn.getresponse()
        length = len(response.read())
        conn.request("HEAD", path)
        head = conn.getresponse()
        assert head.status == response.status == status and head.read() == b""
        if path != "/metrics":  # (the figures may have been rendered again in between)
            assert int(head.headers["content-length"]) == length
    conn.close()
    result = subprocess.run(["curl", "-sSI", f"http://127.0.0.1:{port}/"], capture_output=True, text=True, timeout=10)
    assert result.stdout.startswith("HTTP/1.1 200 OK")
    deadline = time.monotonic() + 3  # what brought a node down did so about 2 s after the HEAD
    while time.monotonic() < deadline:
        assert r.ping() and node.proc.poll() is None
        time.sleep(0.1)


def test_the_password_is_checked_before_the_body_and_a_nested_body_is_refused(spawn) -> None:
    """1,500 `[`: 401 without the password (the body is never parsed), 400
    with it; the node answers throughout."""
    port = free_port()
    node = spawn("--metrics-port", str(port))
    with redis.Redis(port=node.port) as setup:
        assert setup.execute_command("CONFIG", "SET", "requirepass", PASSWORD) == b"OK"
    nested = b"[" * 1500
    for auth, status in ((None, 401), ("Bearer wrong", 401), (f"Bearer {PASSWORD}", 400)):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/queues/q/pause", data=nested, method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        if auth:
            request.add_header("Authorization", auth)
        try:
            urllib.request.urlopen(request, timeout=10)
            got = 200
        except urllib.error.HTTPError as e:
            got = e.code
        assert got == status, auth
    with redis.Redis(port=node.port, password=PASSWORD) as r:
        assert r.ping() and r.execute_command("PAUSE", "q", "state") == b"none"


def test_connections_beyond_the_limit_are_answered_503(metrics_node) -> None:
    from disque.shell.http import MAX_CONNECTIONS

    node, port, r = metrics_node
    rejected = r.info("stats")["rejected_connections"]
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        wait_for(lambda: http(port, "/api/overview")[0] == 503, what="the limit to be reached")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            extra.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            assert extra.recv(100).startswith(b"HTTP/1.1 503 ")
        assert r.info("stats")["rejected_connections"] >= rejected + 2
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: http(port, "/api/overview")[0] == 200, what="room again")


def test_the_pause_endpoint_waits_for_client_pause(metrics_node) -> None:
    """During CLIENT PAUSE the pause request is held as a client's command
    would be, and carried out after it; metrics are still served."""
    node, port, r = metrics_node
    assert r.execute_command("CLIENT", "PAUSE", 1500) == b"OK"
    start = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(http, port, "/api/queues/q/pause", {"state": "in"})
        assert http(port, "/metrics")[0] == 200 and time.monotonic() - start < 1.2  # reads go on
        assert not pending.done()
        status, body = pending.result(timeout=10)
    assert status == 200 and json.loads(body)["pause"] == "in"
    assert time.monotonic() - start >= 1.4
    assert r.execute_command("PAUSE", "q", "state") == b"in"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.slow
def test_scrapes_of_many_queues_by_clients_that_never_read_cost_little(metrics_node) -> None:
    """10,000 queues, 60 scrapers that never read their response: the node
    renders the figures once per interval, off the event loop and capped
    (MAX_QUEUE_SERIES queues in detail, totals for the rest), holds one copy
    for all of them, keeps answering PING quickly, and drops the scrapers
    once WRITE_TIMEOUT has passed."""
    from disque.shell.http import MAX_QUEUE_SERIES, WRITE_TIMEOUT

    node, port, r = metrics_node
    pipe = r.pipeline(transaction=False)
    for i in range(10_000):
        pipe.execute_command("ADDJOB", f"queue-{i:05d}", "x" * (i % 3), 0)
    pipe.execute()
    text = http(port, "/metrics")[1].decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert got[("disque_queues", ())] == 10_000 and got[("disque_other_queues", ())] == 10_000 - MAX_QUEUE_SERIES
    assert sum(1 for name, _ in got if name == "disque_queue_length") == MAX_QUEUE_SERIES
    shown = sum(v for (name, _), v in got.items() if name == "disque_queue_length")
    assert shown + got[("disque_other_queues_length", ())] == 10_000
    before = rss_mb(node.pid)
    scrapers = []
    for _ in range(60):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n" * 5)
        scrapers.append(s)
    try:
        worst = 0.0
        end = time.monotonic() + 3
        while time.monotonic() < end:
            start = time.monotonic()
            assert r.ping()
            worst = max(worst, time.monotonic() - start)
            time.sleep(0.01)
        grown = rss_mb(node.pid) - before
        assert worst < 0.25, f"a PING waited {worst:.2f} s"
        assert grown < 40, f"the node grew by {grown:.0f} MB for 60 scrapers that do not read"

        # the scrapers are dropped once WRITE_TIMEOUT has passed, cut short
        wait_for(lambda: samples(port)[("disque_http_connections", ())] == 1, timeout=WRITE_TIMEOUT + 10,
                 interval=0.5, what="the scrapers to be dropped")  # fmt: skip
        s = scrapers[0]
        got = 0
        s.settimeout(5)
        try:
            while data := s.recv(1 << 20):
                got += len(data)
        except ConnectionResetError:
            pass
        assert 0 < got < 5 * len(text)
    finally:
        for s in scrapers:
            s.close()
    assert r.ping() and http(port, "/metrics")[0] == 200


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_another_sites_page_cannot_change_state(metrics_node) -> None:
    """What a page of another site can send without a CORS preflight (a
    text/plain or form POST, any Origin) is refused 403 and changes nothing;
    the dashboard's own JSON request, and a script's without Origin, pass."""
    node, port, r = metrics_node
    body = b'{"state": "in"}'
    r.execute_command("ADDJOB", "q-dead", "x", 0)
    for headers in (
        {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}, {},
        {"Content-Type": "text/plain", "Origin": f"http://127.0.0.1:{port}"},
        {"Content-Type": "application/json", "Origin": "http://evil.example"},
        {"Content-Type": "application/json", "Origin": "null"},
        {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port + 1}"},
    ):  # fmt: skip
        assert post(port, "/api/queues/q/pause", body, headers) == 403, headers
        assert post(port, "/api/deadletters/q-dead/requeue", b"{}", headers) == 403, headers
    assert r.execute_command("PAUSE", "q", "state") == b"none"
    own = {"Content-Type": "application/json; charset=utf-8", "Origin": f"http://127.0.0.1:{port}"}
    assert post(port, "/api/queues/q/pause", body, own) == 200
    assert r.execute_command("PAUSE", "q", "state") == b"in"
    assert post(port, "/api/queues/q/pause", b'{"state": "none"}', {"Content-Type": "application/json"}) == 200
    assert r.execute_command("PAUSE", "q", "state") == b"none"


def test_metrics_show_each_limited_queue(metrics_node) -> None:
    node, port, r = metrics_node
    r.execute_command("QCONFIG", "stripe", "SET", "rate-limit", "120/m", "concurrency", 5)
    r.execute_command("ADDJOB", "stripe", "charge", 0)
    assert r.execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", "stripe")  # (after the node's first lease time)
    got = samples(port)
    q = (("queue", "stripe"),)
    assert got[("disque_limited_queues", ())] == 1
    assert got[("disque_limit_concurrency", q)] == 5 and got[("disque_limit_rate_per_second", q)] == 2
    assert got[("disque_limit_jobs_out", q)] == 1 and got[("disque_limit_jobs_handed_total", q)] == 1
    assert got[("disque_limit_lease", q)] >= 1 and got[("disque_limit_waiting", q)] == 0
    assert got[("disque_limit_waited_seconds_total", q)] > 0  # it waited for the node's first lease time


def test_metrics_show_each_keyed_queue_and_its_busiest_keys(metrics_node) -> None:
    node, port, r = metrics_node
    for key, n in (("tenant-a", 3), ("tenant-b", 1)):
        for _ in range(n):
            r.execute_command("ADDJOB", "billing", "charge", 0, "KEY", key)
    first = r.execute_command("ADDJOB", "mail", "hello", 0, "KEY", "order-1", "DEDUP", 60_000)
    assert r.execute_command("ADDJOB", "mail", "again", 0, "KEY", "order-1", "DEDUP", 60_000) == first  # a dedup hit
    got = samples(port)
    billing, mail = (("queue", "billing"),), (("queue", "mail"),)
    assert got[("disque_queue_keys", billing)] == 2 and got[("disque_queue_keyed_jobs", billing)] == 4
    assert got[("disque_queue_key_jobs", (("key", "tenant-a"), ("queue", "billing")))] == 3
    assert got[("disque_queue_key_jobs", (("key", "tenant-b"), ("queue", "billing")))] == 1
    assert got[("disque_queue_keys", mail)] == 1 and got[("disque_dedup_hits_total", ())] == 1
