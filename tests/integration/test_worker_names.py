"""Named connections on a real node: a client's `name=` (CLIENT SETNAME on
every connection it makes), a `disque worker` process's slots
(`worker:<host>:<pid>:<slot>`) and a Dramatiq consumer's GETJOB connection
(`dramatiq:<host>:<pid>:<queue>`), as CLIENT LIST and the CLI show them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from client_helpers import client, queue, shared_node  # noqa: F401  (fixtures)
from support import wait_for

from disque.client import Client, connection_name
from disque.testing.devcluster import NodeProcess

APP = """
from disque.client.worker import App

app = App()  # $DISQUE_NODES


@app.job("{queue}")
def handle(job):
    pass
"""


def clients(node: NodeProcess) -> list[dict[str, str]]:
    """CLIENT LIST, one dict of fields per connection."""
    with redis.Redis(node.host, node.port, protocol=2, decode_responses=True) as r:
        return r.client_list()  # type: ignore[no-any-return]


def named(node: NodeProcess, prefix: str) -> dict[str, str]:
    """name -> last command of the connections whose name starts with `prefix`."""
    return {c["name"]: c["cmd"] for c in clients(node) if c["name"].startswith(prefix)}


def test_connection_names_are_what_client_setname_accepts() -> None:
    name = connection_name("worker", "a queue\n")
    assert name.startswith("worker:") and name.endswith(f":{os.getpid()}:a_queue_")
    assert all("!" <= c <= "~" for c in name)


def test_a_client_names_every_connection_it_makes(shared_node: NodeProcess) -> None:
    with Client((shared_node.host, shared_node.port), name="billing:7") as c:
        assert c.execute_command("CLIENT", "GETNAME") == b"billing:7"
        [mine] = [entry for entry in clients(shared_node) if entry["name"] == "billing:7"]
        with redis.Redis(shared_node.host, shared_node.port, protocol=2) as r:
            assert r.client_kill(mine["addr"])
        assert c.execute_command("CLIENT", "GETNAME") == b"billing:7"  # connected again, named again
    with Client((shared_node.host, shared_node.port), name="bad name") as c, pytest.raises(Exception, match="cannot contain spaces"):
        c.ping()


def test_a_worker_names_the_connection_of_each_slot(tmp_path: Path, shared_node: NodeProcess, queue: str) -> None:
    (tmp_path / "tasks.py").write_text(APP.format(queue=queue))
    env = {**os.environ, "DISQUE_NODES": f"{shared_node.host}:{shared_node.port}"}
    argv = [sys.executable, "-m", "disque.cli", "worker", "tasks:app", "--concurrency", "2"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        prefix = connection_name("worker", "").replace(f":{os.getpid()}:", f":{proc.pid}:")  # the worker's pid
        slots = {prefix + "1": "getjob", prefix + "2": "getjob"}
        wait_for(lambda: named(shared_node, prefix) == slots, what="both slots, named, blocked in GETJOB")
        cli = subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(shared_node.port), "CLIENT", "LIST"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        assert prefix + "1" in cli.stdout and prefix + "2" in cli.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    wait_for(lambda: not named(shared_node, prefix), what="the worker's connections to close")


def test_a_dramatiq_consumer_names_its_getjob_connection(shared_node: NodeProcess, queue: str) -> None:
    pytest.importorskip("dramatiq")
    from disque.contrib.dramatiq import DisqueBroker

    broker = DisqueBroker([f"{shared_node.host}:{shared_node.port}"])
    consumer = broker.consume(queue, timeout=100)
    try:
        assert next(consumer) is None  # one GETJOB, timed out: the connection is made
        assert named(shared_node, "dramatiq:") == {connection_name("dramatiq", queue): "getjob"}
    finally:
        consumer.close()
        broker.close()
