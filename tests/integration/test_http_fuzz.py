"""Hypothesis against a real node's HTTP port: any method, route, headers
and body get an answer (or a closed connection) and never a crash; a
state-changing request that is not a same-origin JSON one is refused 403
and changes nothing; the node answers PING throughout."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings, strategies as st

from disque.testing.devcluster import NodeProcess, free_port

ROUTES = ("/api/queues/q/pause", "/api/deadletters/q-dead/requeue", "/api/overview", "/api/jobs/x", "/", "/metrics",
          "/api/queues//pause", "/api/deadletters/%ff/requeue")  # fmt: skip
MEDIA = ("application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "text/plain", "multipart/form-data",
         "application/x-www-form-urlencoded", "", "application/jsonx")  # fmt: skip


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProcess, int, redis.Redis]]:
    http = free_port()
    started = NodeProcess(free_port(), Path(tmp_path_factory.mktemp("http-fuzz")), "--metrics-port", str(http)).start()
    client = redis.Redis(port=started.port)
    try:
        yield started, http, client
    finally:
        client.close()
        started.stop()


def exchange(port: int, request: bytes) -> int | None:
    """The response's status, or None when the node closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        got = b""
        while b"\r\n" not in got:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            got += chunk
    return int(got.split(b" ", 2)[1])


_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
_bodies = st.one_of(
    st.binary(max_size=300), st.sampled_from([b'{"state": "in"}', b'{"scope": "node"}', b"[" * 2000, b"{}", b"null"]),
    st.dictionaries(_text, st.one_of(_text, st.integers(), st.none()), max_size=3).map(lambda d: json.dumps(d).encode()),
)  # fmt: skip


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["POST", "GET", "HEAD", "PUT", "OPTIONS"]), route=st.sampled_from(ROUTES),
       media=st.one_of(st.none(), st.sampled_from(MEDIA), _text), origin=st.one_of(st.none(), st.just("own"), _text),
       extra=st.lists(st.tuples(st.sampled_from(["authorization", "x-a", "cookie", "host"]), _text), max_size=3),
       body=_bodies)  # fmt: skip
def test_any_request_is_answered_and_only_a_same_origin_json_one_changes_state(node, method, route, media, origin, extra, body):
    started, port, client = node
    host = f"127.0.0.1:{port}"
    headers = [("host", host), ("content-length", str(len(body)))]
    headers += [("content-type", media)] if media is not None else []
    headers += [("origin", f"http://{host}" if origin == "own" else origin)] if origin is not None else []
    headers += [(name, value) for name, value in extra if name != "host"]
    head = f"{method} {route} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    status = exchange(port, head.encode() + body)
    json_media = media is not None and media.split(";")[0].strip().lower() == "application/json"
    same_origin = origin is None or origin == "own"
    if method == "POST" and route in ROUTES[:2] and status is not None:
        assert (status == 403) == (not (json_media and same_origin)), (status, media, origin)
    if not (json_media and same_origin):
        assert client.execute_command("PAUSE", "q", "state") == b"none"
    client.execute_command("PAUSE", "q", "none")
    assert client.ping()
