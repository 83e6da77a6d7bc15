"""The cluster-wide views against three real nodes: `disque qlen/qstat/top`
by default and `qscan/jscan/export` with `--cluster` merge what every node
holds, `--local` shows the connected node's figures, and the server commands
(QLEN, QSTAT) answer what the node answers; a node HELLO lists that cannot be
reached is named on stderr with exit status 1.  The merge rules themselves
are checked without nodes at the end."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest.mock import ANY

import pytest
from click.testing import CliRunner, Result
from client_helpers import mesh, start_all

from disque.cli.cluster import merge_jobs, merge_lengths, merge_queues, merge_stats
from disque.cli.main import cli
from disque.client import Client, JobInfo, QueueStats
from disque.testing.devcluster import NodeProcess, free_port


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    started = [NodeProcess(free_port(), tmp_path_factory.mktemp("cli-cluster")) for _ in range(3)]
    try:
        start_all([node.start for node in started])
        mesh(started)
        yield started
    finally:
        for node in started:
            node.stop()


@pytest.fixture
def queue() -> str:
    return "cq-" + secrets.token_hex(3)


@pytest.fixture
def clients(nodes: list[NodeProcess]) -> Iterator[list[Client]]:
    opened = [Client((n.host, n.port), failover=False) for n in nodes]
    yield opened
    for c in opened:
        c.close()


@pytest.fixture
def disque(nodes: list[NodeProcess]) -> Callable[..., Result]:
    """`disque -p <first node> ARGS...`, in-process, stdout not a terminal."""
    runner = CliRunner(env={"COLUMNS": None})
    return lambda *args: runner.invoke(cli, ["-p", str(nodes[0].port), *args], catch_exceptions=False)


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def queue_on_each(clients: list[Client], queue: str) -> dict[str, int]:
    """1, 2 and 3 jobs queued on the three nodes (RETRY 0: no replica queued
    anywhere else); the node IDs and their index."""
    for n, c in enumerate(clients):
        for _ in range(n + 1):
            c.add_job(queue, f"on node {n}", retry=0, replicate=1)
    return {c.hello().node_id: n for n, c in enumerate(clients)}


def test_qlen_adds_up_every_node(disque: Callable[..., Result], clients: list[Client], queue: str) -> None:
    ids = queue_on_each(clients, queue)
    assert ok(disque("qlen", queue)) == "6\n"  # piped: the sum, bare
    assert ok(disque("qlen", queue, "--local")) == ok(disque("--local", "qlen", queue)) == ok(disque("QLEN", queue)) == "1\n"
    merged = json.loads(ok(disque("--json", "qlen", queue)))
    assert (merged["queue"], merged["len"]) == (queue, 6)
    assert sorted((ids[row["node"]], row["len"]) for row in merged["nodes"]) == [(0, 1), (1, 2), (2, 3)]
    shown = ok(disque("--no-raw", "qlen", queue))
    assert "cluster-wide, 3 node(s)" in shown and re.search(r"^len\s+6$", shown, re.M) and "per node" in shown
    for node_id, n in ids.items():  # a row per node: its ID, address and length
        assert re.search(rf"{node_id}\s*│\s*127\.0\.0\.1:{clients[n].address[1]}\s*│\s*{n + 1}\s*│", shown)
    assert ok(disque("qlen", "missing-" + queue)) == "0\n"


def test_qstat_adds_up_every_node(disque: Callable[..., Result], clients: list[Client], queue: str) -> None:
    ids = queue_on_each(clients, queue)
    assert json.loads(ok(disque("--json", "qstat", queue, "--local")))["len"] == 1  # the connected node alone
    assert json.loads(ok(disque("--json", "QSTAT", queue)))["len"] == 1  # and the server command
    merged = json.loads(ok(disque("--json", "qstat", queue)))
    assert (merged["name"], merged["len"], merged["jobs_in"], merged["pause"]) == (queue, 6, 6, "none")
    assert sorted((ids[row["node"]], row["len"]) for row in merged["nodes"]) == [(0, 1), (1, 2), (2, 3)]
    assert json.loads(ok(disque("--cluster", "--json", "qstat", queue))) == {**merged, "age": ANY, "idle": ANY, "nodes": ANY}
    raw = ok(disque("qstat", queue)).splitlines()  # piped: the merged record, as QSTAT prints it
    assert raw[:4] == ["name", queue, "len", "6"]
    shown = ok(disque("--no-raw", "qstat", queue))
    assert "cluster-wide, 3 node(s)" in shown and "per node" in shown and all(node_id in shown for node_id in ids)
    assert ok(disque("--json", "qstat", "missing-" + queue)) == "null\n"
    clients[1].add_job("one-" + queue, "x", retry=0, replicate=1)  # a queue on one node of the three
    shown = ok(disque("--no-raw", "qstat", "one-" + queue))
    assert "cluster-wide, 3 node(s), 1 holding it" in shown and re.search(r"^len\s+1$", shown, re.M)
    assert "cluster-wide, 3 node(s)" in ok(disque("--no-raw", "qlen", "one-" + queue))  # the same count as qlen's


def test_qscan_sums_lengths_and_filters_on_the_sum(disque: Callable[..., Result], clients: list[Client], queue: str) -> None:
    clients[1].add_job(queue, "a", retry=0, replicate=1)
    clients[2].add_job(queue, "b", retry=0, replicate=1)
    clients[2].add_job(queue + "-other", "c", retry=0, replicate=1)
    rows = [r for r in json.loads(ok(disque("--cluster", "--json", "qscan"))) if r["queue"].startswith(queue)]
    assert rows == [{"queue": queue, "len": 2}, {"queue": queue + "-other", "len": 1}]
    assert [r["queue"] for r in json.loads(ok(disque("--json", "qscan"))) if r["queue"].startswith(queue)] == []  # not on the first node
    long_ones = ok(disque("qscan", "--cluster", "--minlen", "2")).split()
    assert queue in long_ones and queue + "-other" not in long_ones  # 1 + 1 on two nodes passes --minlen 2


def test_jscan_and_export_list_each_job_once(disque: Callable[..., Result], clients: list[Client], queue: str, tmp_path: Path) -> None:
    replicated = clients[0].add_job(queue, "on all three", replicate=3, retry=60)
    alone = clients[2].add_job(queue, "on the third", replicate=1, retry=0)
    jobs = json.loads(ok(disque("--json", "jscan", "--cluster", "--queue", queue)))
    assert sorted((j["id"], j["state"]) for j in jobs) == sorted([(replicated, "queued"), (alone, "queued")])
    assert sorted(ok(disque("jscan", "--cluster", "--queue", queue, "--ids")).split()) == sorted([replicated, alone])
    assert [j["id"] for j in json.loads(ok(disque("--json", "jscan", "--queue", queue)))] == [replicated]  # one node's view
    dump = tmp_path / "jobs.jsonl"
    result = disque("export", "--cluster", queue, str(dump))
    assert result.exit_code == 0 and result.stderr.endswith(f"exported 2 job(s) from {queue}\n")
    assert sorted(json.loads(line)["body"] for line in dump.read_text().splitlines()) == ["on all three", "on the third"]


def test_keys_adds_up_every_node(disque: Callable[..., Result], clients: list[Client], queue: str) -> None:
    """"a" has 1, 2 and 3 jobs on the three nodes, "b" 2 on the second, "c" 1 on the third; a plain job is no key's."""
    for n, c in enumerate(clients):
        for key in "a" * (n + 1) + "b" * (2 * (n == 1)) + "c" * (n == 2):
            c.add_job(queue, f"{key} on node {n}", retry=0, replicate=1, key=key)
    clients[0].add_job(queue, "plain", retry=0, replicate=1)
    ids = {c.hello().node_id: n for n, c in enumerate(clients)}
    merged = json.loads(ok(disque("--json", "keys", queue)))
    assert (merged["queue"], merged["keys"], merged["jobs"]) == (queue, 5, 9)  # "a" counts on each node that has jobs of it
    assert merged["busiest"] == [{"key": "a", "jobs": 6}, {"key": "b", "jobs": 2}, {"key": "c", "jobs": 1}]
    assert sorted((ids[r["node"]], r["keys"], r["jobs"]) for r in merged["nodes"]) == [(0, 1, 1), (1, 2, 4), (2, 2, 4)]
    assert json.loads(ok(disque("--json", "keys", queue, "--count", "1")))["busiest"] == [{"key": "a", "jobs": 6}]
    assert ok(disque("keys", queue)).splitlines() == ["5", "9", "a\t6", "b\t2", "c\t1"]  # piped: keys, jobs, then key<TAB>jobs
    assert ok(disque("keys", queue, "--local")).splitlines() == ok(disque("--local", "keys", queue)).splitlines() == ["1", "1", "a\t1"]
    shown = ok(disque("--no-raw", "keys", queue))
    assert f"{queue}: 5 key(s) with jobs queued, 9 keyed job(s), 3 node(s)" in shown and "per node" in shown
    assert re.search(r"^│\s*a\s*│\s*6\s*│$", shown, re.M) and all(node_id in shown for node_id in ids)
    assert "per node" not in ok(disque("--no-raw", "keys", queue, "--local"))
    assert json.loads(ok(disque("--json", "keys", "missing-" + queue)))["busiest"] == []
    bad = disque("keys", queue, "--count", "1001")
    assert bad.exit_code == 2 and "1001 is not in the range 1<=x<=1000" in bad.stderr


def test_top_merges_the_queues_of_every_node(disque: Callable[..., Result], clients: list[Client], queue: str) -> None:
    clients[1].add_job(queue, "x", retry=0, replicate=1)
    clients[2].add_job(queue, "y", retry=0, replicate=1)
    frames = [json.loads(line) for line in ok(disque("--json", "top", "-n", "2", "--interval", "0.05")).splitlines()]
    assert len(frames) == 2
    row = next(r for r in frames[1] if r["queue"] == queue)
    assert (row["len"], row["in_per_sec"], row["blocked"]) == (2, 0.0, 0)
    assert "cluster via" in ok(disque("--no-raw", "top", "-n", "1"))
    [local] = [json.loads(line) for line in ok(disque("--json", "top", "-n", "1", "--local")).splitlines()]
    assert queue not in {r["queue"] for r in local}  # the connected node has none of them


def test_a_node_that_cannot_be_reached_is_named_and_fails_the_command(spawn: Callable[..., NodeProcess], queue: str) -> None:
    a, b = start_all([spawn, spawn])
    mesh([a, b])
    with Client((b.host, b.port), failover=False) as c:
        c.add_job(queue, "on b", retry=0, replicate=1)
        b_id = c.hello().node_id
    b.stop()
    result = CliRunner().invoke(cli, ["-p", str(a.port), "--json", "qscan", "--cluster"])
    assert result.exit_code == 1
    assert f"node {b_id} at {b.host}:{b.port}: " in result.stderr and "1 node(s) left out of the view" in result.stderr
    assert json.loads(result.stdout) == []  # what the reachable node holds
    result = CliRunner().invoke(cli, ["-p", str(a.port), "qlen", queue])  # cluster-wide by default: the same
    assert (result.exit_code, result.stdout) == (1, "0\n") and f"node {b_id} at " in result.stderr


# --------------------------------------------------------------------------
# The merge rules


def stats(name: str, length: int, age: int, idle: int, pause: str = "none", imports: list[str] | None = None) -> QueueStats:
    return QueueStats(name, length, age, idle, 1, imports or [], 2, length * 10, length, pause)


def test_merge_stats() -> None:
    merged = merge_stats([stats("q", 3, 10, 5, imports=["n1"]), stats("q", 4, 20, 2, imports=["n1", "n2"])])
    assert merged == QueueStats("q", 7, 20, 2, 2, ["n1", "n2"], 4, 70, 7, "none")
    assert merge_stats([stats("q", 1, 0, 0, "in"), stats("q", 1, 0, 0, "out")]).pause == "mixed"
    assert [(s.name, s.len) for s in merge_queues([stats("b", 1, 0, 0), stats("a", 2, 0, 0), stats("b", 3, 0, 0)])] == [("a", 2), ("b", 4)]
    assert merge_lengths([{"b": 1, "a": 2}, {"b": 3}]) == {"a": 2, "b": 4}


def test_merge_jobs_keeps_the_record_furthest_along() -> None:
    def info(job_id: str, state: str) -> JobInfo:
        return JobInfo(job_id, "q", state, 1, 60, 0, 0, 30, 0, 0, [], [], None, None, state.encode())

    merged = merge_jobs([[info("A", "active"), info("B", "wait-repl")], [info("B", "queued"), info("A", "acked")], [info("C", "active")]])
    assert [(j.id, j.state) for j in merged] == [("A", "acked"), ("B", "queued"), ("C", "active")]
    assert merge_jobs([["A", "B"], ["B", "C"]]) == ["A", "B", "C"]


def test_deadletter_requeue_asks_every_node(disque: Callable[..., Result], clients: list[Client], queue: str) -> None:
    """`disque deadletter requeue` runs DEADLETTER REQUEUE on every node (in
    batches), or on the connected one with --local; each dead letter goes
    back to its queue."""
    ids = {c.hello().node_id: n for n, c in enumerate(clients)}
    for n, c in enumerate(clients):
        for i in range(n + 1):
            job_id = c.add_job(queue, f"{n}.{i}", retry=30, replicate=1, max_attempts=1)
            [job] = c.get_jobs(queue, count=1)
            assert job.id == job_id and c.execute_command("NACK", job_id) == 1
    dead = f"{queue}-dead"
    assert ok(disque("deadletter", "requeue", dead, "--local")) == "1\n"
    merged = json.loads(ok(disque("--json", "deadletter", "requeue", dead)))
    assert merged["requeued"] == 5 and sorted((ids[row["node"]], row["requeued"]) for row in merged["nodes"]) == [(0, 0), (1, 2), (2, 3)]
    assert [c.qlen(queue) for c in clients] == [1, 2, 3] and sum(c.qlen(dead) for c in clients) == 0
    assert "requeued" in ok(disque("--no-raw", "deadletter", "requeue", dead))
    assert ok(disque("deadletter", "requeue", dead, "--count", "1")) == "0\n"


def test_deadletter_list_delete_and_a_paced_requeue_with_filters(disque: Callable[..., Result], clients: list[Client], queue: str) -> None:
    """`disque deadletter list` shows every node's dead letters, error first,
    filtered by origin queue, error type and age; `delete` and `requeue`
    take the same filters, and `--rate` paces the batches; `show` puts the
    last error first."""
    errors = {0: ValueError("bad address"), 1: KeyError("to"), 2: ValueError("worse")}
    for n, c in enumerate(clients):
        origin = queue if n < 2 else queue + "-other"
        c.add_job(origin, f"job{n}", retry=30, replicate=1, max_attempts=1, dead_letter=queue + "-failed")
        [job] = c.get_jobs(origin, count=1)
        assert c.nack(job.id, error=errors[n]) == 1
    failed = queue + "-failed"
    rows = json.loads(ok(disque("--json", "deadletter", "list", failed)))
    assert sorted((r["error"], r["message"], r["from"]) for r in rows) == [
        ("KeyError", "'to'", queue), ("ValueError", "bad address", queue), ("ValueError", "worse", queue + "-other")
    ]
    assert len(json.loads(ok(disque("--json", "deadletter", "list", failed, "--error", "ValueError", "--from", queue)))) == 1
    assert len(json.loads(ok(disque("--json", "deadletter", "list", failed, "--since", "1h")))) == 3
    assert json.loads(ok(disque("--json", "deadletter", "list", failed, "--until", "1h"))) == []
    pretty = ok(disque("--no-raw", "deadletter", "list", failed))
    assert "3 dead letter(s)" in pretty and pretty.index("error") < pretty.index("from")
    [here] = [r for r in rows if r["message"] == "bad address"]  # dead-lettered by the connected node
    shown = ok(disque("--no-raw", "show", here["id"]))
    assert shown.index("error-type") < shown.index("error-traceback") < shown.index("queue") and "bad address" in shown
    result = disque("deadletter", "list", failed, "--since", "soon")
    assert result.exit_code == 2 and "--since" in result.output
    assert ok(disque("deadletter", "delete", failed, "--error", "KeyError")) == "1\n"
    assert ok(disque("deadletter", "requeue", failed, "--rate", "1", "--from", queue)) == "1\n"
    assert sum(c.qlen(queue) for c in clients) == 1 and sum(c.qlen(failed) for c in clients) == 1


def test_a_paced_bulk_command_sends_rate_a_second() -> None:
    """`--rate n`: batches of at most n, a second apart (less the time each took)."""
    from disque.cli import main

    class Node:
        left = 7
        sent: list[int] = []

        def execute_command(self, *words: object) -> int:
            batch = min(int(words[4]), self.left)  # type: ignore[call-overload]
            self.left -= batch
            self.sent.append(batch)
            return batch

    slept: list[float] = []
    node = Node()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(main.time, "sleep", slept.append)
        assert main.dead_letter_batches("REQUEUE", "q", None, [], 3)(node) == 7
    assert node.sent == [3, 3, 1] and len(slept) == 2 and all(0.9 < s <= 1.0 for s in slept)
    node = Node()
    node.sent = []
    assert main.dead_letter_batches("DELETE", "q", 5, [], None)(node) == 5 and node.sent == [5]
