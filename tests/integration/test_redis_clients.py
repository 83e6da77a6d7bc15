"""Stock Redis clients against a real node: redis-py 8 with its default
settings (RESP3 handshake), redis-py with RESP2, and `redis-cli` when it is
installed."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from disque.testing.devcluster import NodeProcess
from integration.rawsock import q, shared_node  # noqa: F401

REDIS_CLI = shutil.which("redis-cli")
needs_cli = pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli is not installed")


@pytest.fixture
def client(shared_node: NodeProcess) -> Iterator[Callable[..., redis.Redis]]:
    """`client(**kwargs)`: redis-py connected to the shared node."""
    made: list[redis.Redis] = []

    def make(**kwargs: object) -> redis.Redis:
        made.append(redis.Redis(host=shared_node.host, port=shared_node.port, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for c in made:
        c.close()


# ---------------------------------------------------------------- redis-py, default settings


def test_job_lifecycle(client: Callable[..., redis.Redis], q: bytes) -> None:
    r = client()
    assert r.ping() is True
    job_id = r.execute_command("ADDJOB", q, "payload", 0)
    assert isinstance(job_id, bytes) and len(job_id) == 48
    assert r.execute_command("QLEN", q) == 1
    assert r.execute_command("QPEEK", q, 1) == [[q, job_id, b"payload"]]
    assert r.execute_command("GETJOB", "FROM", q) == [[q, job_id, b"payload"]]
    assert r.execute_command("GETJOB", "NOHANG", "FROM", q) is None
    assert r.execute_command("GETJOB", "TIMEOUT", 50, "FROM", q) is None
    assert r.execute_command("ACKJOB", job_id) == 1
    assert r.execute_command("SHOW", job_id) is None


def test_resp3_maps(client: Callable[..., redis.Redis], q: bytes) -> None:
    r = client()
    job_id = r.execute_command("ADDJOB", q, "payload", 0, "RETRY", 30)
    job = r.execute_command("SHOW", job_id)
    assert isinstance(job, dict) and len(job) == 15
    assert (job[b"id"], job[b"queue"], job[b"state"], job[b"retry"]) == (job_id, q, b"queued", 30)
    stat = r.execute_command("QSTAT", q)
    assert stat == {
        b"name": q, b"len": 1, b"age": 0, b"idle": 0, b"blocked": 0, b"import-from": [],
        b"import-rate": 0, b"jobs-in": 1, b"jobs-out": 0, b"pause": b"none",
    }  # fmt: skip
    assert r.config_get("hz") == {"hz": "10"}
    assert r.execute_command("CONFIG", "GET", "maxmemory") == {b"maxmemory": b"1073741824"}
    cursor, items = r.execute_command("JSCAN", "BUSYLOOP", "QUEUE", q, "REPLY", "ALL")
    assert cursor == b"0" and [item[b"id"] for item in items] == [job_id]
    assert r.execute_command("JSCAN", "BUSYLOOP", "QUEUE", q) == [b"0", [job_id]]
    hello = r.execute_command("HELLO")  # bare HELLO keeps Disque's reply
    assert hello[0] == 1 and hello[1] == r.execute_command("CLUSTER", "MYID")


def test_pipeline(client: Callable[..., redis.Redis], q: bytes) -> None:
    r = client()
    pipe = r.pipeline(transaction=False)
    for i in range(3):
        pipe.execute_command("ADDJOB", q, f"job{i}", 0)
    pipe.execute_command("QLEN", q)
    pipe.execute_command("GETJOB", "COUNT", 3, "FROM", q)
    pipe.execute_command("GETJOB", "TIMEOUT", 20, "FROM", q)
    pipe.ping()
    *ids, qlen, jobs, nothing, pong = pipe.execute()
    assert qlen == 3 and nothing is None and pong is True
    assert jobs == [[q, job_id, f"job{i}".encode()] for i, job_id in enumerate(ids)]


@pytest.mark.parametrize(
    ("args", "exception", "message"),
    [
        (("SHOW", "nope"), redis.ResponseError, "BADID Invalid Job ID format."),
        (("ADDJOB", "q", "x", 0, "REPLICATE", 2), redis.ResponseError, "NOREPL Not enough reachable nodes for the requested replication level"),
        (("ADDJOB", "q", "x", 0, "TTL", 0), redis.ResponseError, "TTL must be a number > 0"),
        (("NOSUCH",), redis.ResponseError, "unknown command 'NOSUCH'"),
        (("WORKING", "DI" + "0" * 44 + "SQ"), redis.ResponseError, "NOJOB Job not known in the context of this node."),
    ],
)  # fmt: skip
def test_errors(client: Callable[..., redis.Redis], args: tuple, exception: type, message: str) -> None:
    with pytest.raises(exception) as info:
        client().execute_command(*args)
    assert str(info.value) == message


def test_server_helpers(client: Callable[..., redis.Redis], q: bytes) -> None:
    r = client(client_name="worker-7")
    assert r.client_getname() == "worker-7"
    r.execute_command("ADDJOB", q, "x", 0)
    info = r.info()
    assert info["registered_jobs"] >= 1 and info["multiplexing_api"] == "trio"
    assert r.info("queues")["registered_queues"] >= 1
    seconds, micros = r.time()
    assert abs(seconds + micros / 1e6 - time.time()) < 5
    me = r.client_id()
    assert any(c["id"] == str(me) and c["name"] == "worker-7" for c in r.client_list())
    assert r.echo("hi") == b"hi"
    assert r.config_set("slowlog-max-len", 100) is True
    assert r.config_get("slowlog-max-len") == {"slowlog-max-len": "100"}
    r.config_set("slowlog-max-len", 128)


def test_resp2_client(client: Callable[..., redis.Redis], q: bytes) -> None:
    r = client(protocol=2)
    job_id = r.execute_command("ADDJOB", q, "payload", 0)
    show = r.execute_command("SHOW", job_id)
    assert isinstance(show, list) and len(show) == 30 and show[:2] == [b"id", job_id]
    assert r.execute_command("QSTAT", q)[:4] == [b"name", q, b"len", 1]
    assert r.execute_command("QSTAT", q + b"missing") is None
    assert r.config_get("hz") == {"hz": "10"}
    assert r.execute_command("GETJOB", "FROM", q) == [[q, job_id, b"payload"]]


def test_password(spawn: Callable[..., NodeProcess]) -> None:
    node = spawn()
    admin = redis.Redis(host=node.host, port=node.port)
    clients = [admin]
    try:
        assert admin.config_set("requirepass", "s3cret") is True
        good = redis.Redis(host=node.host, port=node.port, password="s3cret")
        no_retry = Retry(NoBackoff(), 0)  # an AuthenticationError is a ConnectionError, retried by default
        bad = redis.Redis(host=node.host, port=node.port, password="wrong", retry=no_retry)
        anonymous = redis.Redis(host=node.host, port=node.port, retry=no_retry)
        clients += [good, bad, anonymous]
        assert good.ping() is True
        assert good.execute_command("ADDJOB", "q", "x", 0)
        with pytest.raises(redis.AuthenticationError):
            bad.ping()
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
    finally:
        for c in clients:
            c.close()


# ---------------------------------------------------------------- redis-cli


def cli(node: NodeProcess, *args: str, stdin: bytes | None = None) -> str:
    assert REDIS_CLI is not None
    result = subprocess.run(
        [REDIS_CLI, "-h", node.host, "-p", str(node.port), *args],
        input=stdin, capture_output=True, timeout=10, check=True,
    )  # fmt: skip
    return result.stdout.decode()


@needs_cli
def test_redis_cli_commands(shared_node: NodeProcess, q: bytes) -> None:
    queue = q.decode()
    assert cli(shared_node, "PING") == "PONG\n"
    job_id = cli(shared_node, "ADDJOB", queue, "hello world", "0").strip()
    assert len(job_id) == 48 and job_id.startswith("DI")
    assert cli(shared_node, "QLEN", queue) == "1\n"
    assert cli(shared_node, "QSTAT", queue).split("\n")[:4] == ["name", queue, "len", "1"]
    assert cli(shared_node, "--no-raw", "QSTAT", queue).split("\n")[:4] == [' 1) "name"', f' 2) "{queue}"', ' 3) "len"', " 4) (integer) 1"]
    assert cli(shared_node, "-3", "QSTAT", queue).split("\n")[:2] == [f"name {queue}", "len 1"]
    assert cli(shared_node, "SHOW", "bad") == "BADID Invalid Job ID format.\n\n"
    assert cli(shared_node, "GETJOB", "FROM", queue) == f"{queue}\n{job_id}\nhello world\n"
    assert cli(shared_node, "GETJOB", "NOHANG", "FROM", queue) == "\n"
    piped = cli(shared_node, stdin=f"ADDJOB {queue} x 0\nQLEN {queue}\nACKJOB {job_id}\n".encode())
    assert piped.split("\n")[1:] == ["1", "1", ""]


@needs_cli
def test_redis_cli_interactive(shared_node: NodeProcess, q: bytes) -> None:
    """A real terminal session: redis-cli sends COMMAND DOCS first."""
    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [REDIS_CLI, "-h", shared_node.host, "-p", str(shared_node.port)], stdin=slave, stdout=slave, stderr=slave,
        env={**os.environ, "TERM": "dumb"},
    )  # fmt: skip
    os.close(slave)

    def until_prompt() -> bytes:
        out, deadline = b"", time.monotonic() + 5
        while not out.endswith(b"> ") and time.monotonic() < deadline:
            if select.select([master], [], [], 0.05)[0]:
                out += os.read(master, 4096)
        return out

    try:
        assert until_prompt().endswith(b"%d> " % shared_node.port)
        os.write(master, b"addjob %s x 0\r" % q)
        assert b"DI" in until_prompt()
        os.write(master, b"qlen %s\r" % q)
        assert b"(integer) 1\r\n" in until_prompt()
        os.write(master, b"quit\r")
        assert proc.wait(5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
