"""The HTTP port of a real node: Prometheus metrics, the JSON API, the password rule."""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from disque.devcluster import NodeProcess, free_port

PASSWORD = "s3cret"


def http(port: int, path: str, body: Any = None, auth: str | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
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
    after = samples(port)
    assert after[("disque_queue_length", (("queue", "orders"),))] == 3
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
