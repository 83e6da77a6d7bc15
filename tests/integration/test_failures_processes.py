"""A failing job's reason, end to end: a `disque worker` process whose
handler raises; its job's dead letter shows the exception's type, message
and traceback, the worker's host and PID, the original job ID and queue, on
the node that dead-lettered it after a restart from its AOF (and from the
rewritten AOF), and on the node that holds its replica."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from client_helpers import mesh, start_all
from support import wait_for

from disque.client import Client, JobInfo
from disque.testing.devcluster import NodeProcess

TASKS = """
from disque.client.worker import App

app = App()  # $DISQUE_NODES


@app.job("emails", max_attempts=1, dead_letter="emails-failed")
def send(job):
    raise ValueError(f"no such address: {job.body.decode()}")
"""


def test_a_dead_letter_says_why_after_a_restart_and_on_its_replica(spawn: Callable[..., NodeProcess], tmp_path: Path) -> None:
    nodes = start_all([lambda: spawn("--appendonly", "yes", "--appendfsync", "always")] * 2)
    mesh(nodes)
    (tmp_path / "tasks.py").write_text(TASKS)
    addresses = [f"{n.host}:{n.port}" for n in nodes]
    with Client(addresses[0]) as producer:
        job_id = producer.add_job("emails", "bob@", replicate=2, retry=60, max_attempts=1, dead_letter="emails-failed")
    env = {**os.environ, "DISQUE_NODES": addresses[0]}
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "disque.cli", "worker", "tasks:app", "--burst"],
                                  cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)  # fmt: skip
        try:
            assert worker.wait(30) == 0, (tmp_path / "worker.log").read_text()
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    first = Client(addresses[0])
    [dead] = first.qpeek("emails-failed", 1)

    def check(info: JobInfo | None) -> None:
        assert info is not None
        assert (info.queue, info.dead_letter_of, info.dead_letter_from) == ("emails-failed", job_id, "emails")
        assert (info.error_type, info.error_message) == ("ValueError", "no such address: bob@")
        assert info.error_traceback is not None and 'raise ValueError(f"no such address' in info.error_traceback
        assert (info.error_host, info.error_pid) == (socket.gethostname(), worker.pid)

    check(first.show(dead.id))
    first.close()
    with Client(addresses[1]) as second:  # the replica of the dead letter
        wait_for(lambda: second.show(dead.id) is not None, what="the dead letter's replica")
        check(second.show(dead.id))
    nodes[0].stop()
    nodes[0].start()
    with Client(addresses[0]) as restarted:
        check(restarted.show(dead.id))
        assert restarted.execute_command("BGREWRITEAOF")  # the rewritten file keeps it too
        wait_for(lambda: restarted.info("persistence")["Persistence"]["aof_rewrite_in_progress"] == "0", what="the rewrite")
    nodes[0].stop()
    nodes[0].start()
    with Client(addresses[0]) as rewritten:
        check(rewritten.show(dead.id))
