"""The `disque` command-line tool against a real node: one-shot commands in
every output mode, the helper subcommands, errors and exit codes, the console
script itself, and the interactive prompt driven through a pseudo-terminal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from datetime import datetime
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from client_helpers import PtyProcess, client, queue, shared_node  # noqa: F401  (fixtures)
from support import wait_for

from disque.client import Client, QueueStats
from disque.cli.cluster import QueueRates
from disque.cli.main import cli
from disque.testing.devcluster import NodeProcess, free_port

ID = r"DI[0-9a-f]{44}SQ"


@pytest.fixture
def disque(shared_node: NodeProcess) -> Callable[..., Result]:
    """Run `disque -p <shared node> ARGS...` in-process."""
    runner = CliRunner(env={"COLUMNS": None})

    def run(*args: str, port: int = shared_node.port, input: str | None = None) -> Result:
        return runner.invoke(cli, ["-p", str(port), *args], input=input, catch_exceptions=False)

    return run


@pytest.fixture
def pretty(disque: Callable[..., Result]) -> Callable[..., Result]:
    """`disque --no-raw ...`: tables, as on a terminal."""
    return lambda *args, **kwargs: disque("--no-raw", *args, **kwargs)


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def fields(text: str) -> dict[str, str]:
    """A key/value block as printed in pretty mode."""
    return {k: v.strip() for k, v in (line.split(None, 1) for line in text.splitlines() if len(line.split(None, 1)) == 2)}


# --------------------------------------------------------------------------
# One-shot server commands


def test_plain_replies_print_like_redis_cli(disque: Callable[..., Result], pretty: Callable[..., Result], queue: str) -> None:
    assert ok(pretty("PING")) == "PONG\n"
    assert re.fullmatch(ID + "\n", ok(pretty("ADDJOB", queue, "hello world", "0")))
    assert ok(pretty("QLEN", queue)) == "(integer) 1\n"
    assert ok(pretty("GETJOB", "NOHANG", "FROM", "empty-" + queue)) == "(nil)\n"
    listing = ok(pretty("COMMAND", "INFO", "addjob", "nope"))
    assert listing.splitlines() == [
        "1) 1) addjob",
        "   2) (integer) -4",
        "   3) 1) write",
        "      2) denyoom",
        "      3) fast",
        "   4) (integer) 0",
        "   5) (integer) 0",
        "   6) (integer) 0",
        "2) (nil)",
    ]
    assert ok(disque("--raw", "QLEN", queue)) == ok(disque("QLEN", queue)) == "1\n"  # piped: bare values by default
    assert ok(disque("--json", "QLEN", queue)) == "1\n"
    assert ok(disque("--json", "GETJOB", "NOHANG", "FROM", "empty-" + queue)) == "null\n"


def test_arguments_pass_through_untouched(disque: Callable[..., Result], client: Client, queue: str) -> None:
    job_id = ok(disque("ADDJOB", queue, "--help", "0", "RETRY", "5")).strip()
    assert client.show(job_id).body == b"--help"  # type: ignore[union-attr]
    jobs = ok(disque("--json", "QPEEK", queue, "-1"))  # a negative number, not an option
    assert [j["id"] for j in json.loads(jobs)] == [job_id]


def test_errors_go_to_stderr_with_exit_status_1(disque: Callable[..., Result]) -> None:
    result = disque("NOPE", "x")
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", "ERR unknown command 'NOPE'\n")
    result = disque("--json", "SHOW", "bad-id")
    assert (result.exit_code, result.stderr) == (1, "BADID Invalid Job ID format.\n")
    port = free_port()
    result = disque("PING", port=port)
    assert (result.exit_code, result.stderr) == (1, f"Could not connect to Disque at 127.0.0.1:{port}: Connection refused\n")
    result = disque("-h", "localhost", "PING", port=port)
    assert result.exit_code == 1 and f"localhost:{port}" in result.stderr


def test_commands_piped_in(disque: Callable[..., Result], queue: str) -> None:
    result = disque(input=f"ADDJOB {queue} 'a b' 0\n\nQLEN {queue}\nhelp qpeek\n")
    assert result.exit_code == 0
    assert re.fullmatch(rf"{ID}\n1\nQPEEK queue count\n  Look at the oldest .*\n", result.stdout)
    result = disque("--raw", input=f"nope\nQLEN {queue}\nquit\nQLEN {queue}\n")
    assert (result.exit_code, result.stdout, result.stderr) == (1, "1\n", "(error) ERR unknown command 'nope'\n")


def test_password(disque: Callable[..., Result], client: Client) -> None:
    client.execute_command("CONFIG", "SET", "requirepass", "pw")
    client.password = "pw"  # to reset it, should this connection be lost
    try:
        result = disque("PING")
        assert (result.exit_code, result.stderr) == (1, "NOAUTH Authentication required.\n")
        assert ok(disque("-a", "pw", "PING")) == "PONG\n"
        assert ok(disque("--password", "pw", "QLEN", "q")) == "0\n"
    finally:  # open connections need AUTH too once a password is set
        client.execute_command("AUTH", "pw")
        client.execute_command("CONFIG", "SET", "requirepass", "")


# --------------------------------------------------------------------------
# Structured replies in the three modes


def test_show(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    job_id = client.add_job(queue, "the body", retry=9)
    shown = fields(ok(pretty("show", job_id)))
    assert (shown["id"], shown["queue"], shown["state"], shown["retry"], shown["body"]) == (job_id, queue, "queued", "9", "the body")
    assert (shown["nodes-delivered"], shown["nodes-confirmed"]) == (client.hello().node_id, "(empty)")
    assert fields(ok(pretty("SHOW", job_id))).keys() == shown.keys()  # the server command gets the same view
    data = json.loads(ok(disque("--json", "show", job_id)))
    assert {k: data[k] for k in ("id", "queue", "state", "retry", "body", "nacks")} == {"id": job_id, "queue": queue, "state": "queued", "retry": 9, "body": "the body", "nacks": 0}
    assert set(data) >= {"nodes_delivered", "next_requeue_within", "additional_deliveries", "ctime"}
    raw = ok(disque("--raw", "SHOW", job_id)).splitlines()
    assert raw[:6] == ["id", job_id, "queue", queue, "state", "queued"] and raw[-2:] == ["body", "the body"]
    ctime = data["ctime"]  # nanoseconds in --json and --raw, a local time in tables
    assert raw[raw.index("ctime") + 1] == str(ctime) and abs(ctime / 1e9 - time.time()) < 60
    assert shown["ctime"] == datetime.fromtimestamp(ctime / 1e9).astimezone().isoformat(sep=" ", timespec="milliseconds")
    assert ok(pretty("SHOW", "DI" + "0" * 44 + "SQ")) == "(nil)\n"
    assert disque("show").exit_code == 2  # usage error: ID missing


def test_qstat(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    client.add_job(queue, "x")
    client.add_job(queue, "y")
    shown = fields(ok(pretty("qstat", queue)))
    assert (shown["name"], shown["len"], shown["jobs-in"], shown["pause"], shown["import-from"]) == (queue, "2", "2", "none", "(empty)")
    data = json.loads(ok(disque("--json", "QSTAT", queue)))
    assert data == {**data, "name": queue, "len": 2, "jobs_in": 2, "jobs_out": 0, "blocked": 0, "import_from": [], "pause": "none"}
    assert ok(disque("--raw", "qstat", queue)).splitlines()[:4] == ["name", queue, "len", "2"]
    assert ok(pretty("qstat", "missing-" + queue)) == "(nil)\n"
    assert ok(disque("--json", "qstat", "missing-" + queue)) == "null\n"


def test_qconfig(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    assert ok(disque("qconfig", "set", queue, "--rate", "100/s", "--concurrency", "5")) == "OK\n"
    shown = fields(ok(pretty("qconfig", "get", queue)))
    assert (shown["queue"], shown["rate-limit"], shown["concurrency"], shown["out"]) == (queue, "100/s", "5", "0")
    assert queue in ok(pretty("qconfig", "list"))
    data = json.loads(ok(disque("--json", "qconfig", "list")))
    assert {"queue": queue, "rate-limit": "100/s", "concurrency": 5}.items() <= next(r for r in data if r["queue"] == queue).items()
    result = disque("qconfig", "set", queue)
    assert result.exit_code != 0 and "give at least one of" in result.output
    assert "rate-limit must be" in disque("qconfig", "set", queue, "--rate", "fast").output
    assert ok(disque("qconfig", "del", queue)) == "1\n"
    assert queue not in ok(disque("qconfig", "list"))


def test_hello(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, shared_node: NodeProcess) -> None:
    my_id = client.hello().node_id
    shown = ok(pretty("HELLO"))
    assert f"HELLO v1, connected to {my_id}" in shown
    assert re.search(rf"{my_id}\s*│\s*:{shared_node.port}\s*│\s*1\s*│\s*\(this node\)", shown)
    assert json.loads(ok(disque("--json", "HELLO"))) == {"version": 1, "node_id": my_id, "nodes": [{"id": my_id, "host": "", "port": shared_node.port, "priority": 1}]}
    assert ok(disque("--raw", "HELLO")).splitlines() == ["1", my_id, my_id, "", str(shared_node.port), "1"]


def test_info(disque: Callable[..., Result], pretty: Callable[..., Result], shared_node: NodeProcess) -> None:
    shown = ok(pretty("INFO"))
    assert "# Server" in shown and "# Jobs" in shown
    assert re.search(rf"^tcp_port\s+{shared_node.port}\s*$", shown, re.M)
    data = json.loads(ok(disque("--json", "INFO")))
    assert data["Server"]["tcp_port"] == str(shared_node.port) and "registered_jobs" in data["Jobs"]
    assert json.loads(ok(disque("--json", "INFO", "queues"))).keys() == {"Queues"}
    raw = ok(disque("--raw", "INFO", "jobs"))
    assert raw.startswith("# Jobs") and re.search(r"^registered_jobs:\d+\r?$", raw, re.M)


def test_cluster_nodes_and_info(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, shared_node: NodeProcess) -> None:
    my_id = client.hello().node_id
    assert ok(pretty("cluster", "nodes")) == ok(pretty("CLUSTER", "NODES"))
    assert re.search(rf"{my_id}\s*│\s*:{shared_node.port}\s*│\s*myself\s*│\s*0\s*│\s*0\s*│\s*connected", ok(pretty("cluster", "nodes")))
    assert json.loads(ok(disque("--json", "cluster", "nodes"))) == [{"id": my_id, "address": f":{shared_node.port}", "flags": ["myself"], "ping_sent": 0, "pong_received": 0, "link": "connected"}]
    assert ok(disque("--raw", "cluster", "nodes")) == f"{my_id} :{shared_node.port} myself 0 0 connected\n\n"
    assert fields(ok(pretty("cluster", "info")))["cluster_known_nodes"] == "1"  # not a helper: sent as CLUSTER info
    assert json.loads(ok(disque("--json", "CLUSTER", "INFO")))["cluster_state"] == "ok"
    assert ok(disque("cluster", "myid")).strip() == my_id


def test_getjob_and_qpeek(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    first = client.add_job(queue, "one")
    second = client.add_job(queue, b"\xff binary")
    peek = ok(pretty("QPEEK", queue, "2"))
    assert "2 job(s)" in peek and re.search(rf"{queue}\s*│\s*{first}\s*│\s*one", peek) and "nacks" not in peek
    shown = ok(pretty("GETJOB", "WITHCOUNTERS", "FROM", queue))
    assert "1 job(s)" in shown and re.search(rf"│\s*{first}\s*│\s*one\s*│\s*0\s*│\s*0\s*│", shown)
    assert json.loads(ok(disque("--json", "GETJOB", "FROM", queue))) == [{"id": second, "queue": queue, "body": "\\xff binary", "nacks": None, "additional_deliveries": None, "priority": None, "key": None, "parent_results": None}]
    client.nack(first)
    assert ok(disque("--raw", "GETJOB", "WITHCOUNTERS", "FROM", queue)).splitlines() == [queue, first, "one", "nacks", "1", "additional-deliveries", "0"]


def test_tables_cut_long_bodies_and_full_prints_them(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    def squashed(text: str) -> str:  # the table's text without its wrapping and borders
        return re.sub(r"[\s│┃]", "", text)

    body = "0123456789" * 100_000  # a megabyte
    job_id = client.add_job(queue, body)
    cut = squashed("0123456789" * 20 + "... (1,000,000 bytes; --full prints it all)")
    assert cut in squashed(ok(pretty("show", job_id)))  # a record: the body's first 200 bytes, then its size
    for view in (("show", job_id), ("QPEEK", queue, "1"), ("JSCAN", "QUEUE", queue, "REPLY", "all"), ("jscan", "--queue", queue)):
        shown = ok(pretty(*view))
        assert "(1,000,000" in squashed(shown) and len(shown) < 10_000, view  # in a table's column too
        assert len(squashed(ok(pretty("--full", *view)))) > len(body), view
    assert json.loads(ok(disque("--json", "show", job_id)))["body"] == body  # --json and --raw are for programs: all of it
    assert body in ok(disque("--raw", "SHOW", job_id)).splitlines()
    short = client.add_job(queue, "x" * 200)  # up to 200 bytes: whole
    assert squashed(ok(pretty("show", short))).endswith("x" * 200 + "priority5")


def test_jscan_and_qscan_pages(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    job_id = client.add_job(queue, "x")
    page = ok(pretty("JSCAN", "QUEUE", queue, "REPLY", "all"))
    assert page.startswith("cursor: 0\n1 job(s)") and re.search(rf"{job_id}\s*│\s*{queue}\s*│\s*queued", page)
    assert json.loads(ok(disque("--json", "JSCAN", "QUEUE", queue))) == {"cursor": "0", "jobs": [job_id]}
    assert json.loads(ok(disque("--json", "JSCAN", "QUEUE", queue, "REPLY", "all")))["jobs"][0]["id"] == job_id
    assert ok(disque("--raw", "JSCAN", "QUEUE", queue)) == f"0\n{job_id}\n"
    data = json.loads(ok(disque("--json", "QSCAN", "BUSYLOOP", "MINLEN", "1")))
    assert data["cursor"] == "0" and queue in data["queues"]
    assert "queue(s)" in ok(pretty("QSCAN", "BUSYLOOP"))


# --------------------------------------------------------------------------
# Helper subcommands


def test_jscan_helper_iterates_to_the_end(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    ids = {client.add_job(queue, f"job {i}") for i in range(40)}
    taken = client.get_job(queue)
    assert taken is not None
    rows = json.loads(ok(disque("--json", "jscan", "--queue", queue, "--count", "3")))
    assert {r["id"] for r in rows} == ids and all(r["queue"] == queue for r in rows)
    assert set(ok(disque("--raw", "scanjobs", "--queue", queue, "--state", "queued", "--count", "3")).split()) == ids - {taken.id}
    assert json.loads(ok(disque("--json", "jscan", "--queue", queue, "--state", "active", "--ids"))) == [taken.id]
    shown = ok(pretty("jscan", "--queue", queue, "--state", "active"))
    assert re.search(rf"{taken.id}\s*│\s*{queue}\s*│\s*active\s*│", shown) and "1 job(s)" in shown
    assert "1 job(s)" in ok(pretty("jscan", "--queue", queue, "--state", "active", "--ids"))
    assert disque("jscan", "--state", "nonsense").exit_code == 2


def test_qscan_helper_iterates_to_the_end(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    names = [f"{queue}-{i:02}" for i in range(25)]
    for n, name in enumerate(names):
        for _ in range(n % 3):
            client.add_job(name, "x")
    rows = [r for r in json.loads(ok(disque("--json", "qscan", "--count", "2"))) if r["queue"].startswith(queue)]
    assert rows == [{"queue": name, "len": n % 3} for n, name in enumerate(names) if n % 3]  # no job, no queue
    assert set(ok(disque("--raw", "qscan", "--minlen", "2")).split()) >= {names[2], names[5]}
    assert names[1] not in ok(disque("--raw", "qscan", "--minlen", "2"))
    shown = ok(pretty("qscan", "--minlen", "2"))
    assert re.search(rf"{names[2]}\s*│\s*2", shown)


def test_queue_rates() -> None:
    def stats(name: str, jobs_in: int, jobs_out: int) -> QueueStats:
        return QueueStats(name, 3, 0, 0, 1, [], 0, jobs_in, jobs_out, "none")

    rates = QueueRates()
    first = rates.update([stats("a", 10, 5)], now=100.0)
    assert first == [{"queue": "a", "len": 3, "in_per_sec": None, "out_per_sec": None, "blocked": 1, "pause": "none"}]
    second = rates.update([stats("a", 30, 6), stats("b", 1, 0)], now=102.0)
    assert [(r["queue"], r["in_per_sec"], r["out_per_sec"]) for r in second] == [("a", 10.0, 0.5), ("b", None, None)]


def test_top(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    client.add_job(queue, "x")
    client.get_job("blocked-" + queue, nohang=True)  # creates an empty queue that top lists
    frames = [json.loads(line) for line in ok(disque("--json", "top", "-n", "2", "--interval", "0.05")).splitlines()]
    assert len(frames) == 2
    row = next(r for r in frames[1] if r["queue"] == queue)
    assert row == {"queue": queue, "len": 1, "in_per_sec": 0.0, "out_per_sec": 0.0, "blocked": 0, "pause": "none"}
    assert next(r for r in frames[0] if r["queue"] == queue)["in_per_sec"] is None
    shown = ok(pretty("top", "-n", "2", "--interval", "0.05"))
    assert shown.count("queue(s)") == 2 and re.search(r"queue\s*┃\s*len\s*┃\s*in/s\s*┃\s*out/s\s*┃\s*blocked\s*┃\s*pause", shown)
    assert re.search(rf"{queue}\s*│\s*1\s*│\s*0\s*│\s*0\s*│\s*0\s*│\s*none", shown)
    assert f"{queue}\t1\t-\t-\t0\tnone" in ok(disque("--raw", "top", "-n", "1")).splitlines()


def test_groups_views(disque: Callable[..., Result], pretty: Callable[..., Result], client: Client, queue: str) -> None:
    """qstat --groups and top --groups: QSTATUS as a table, JSON or tab-separated lines."""
    client.execute_command("QADD", queue, 60, "x")
    client.execute_command("QADD", queue, 60, "y")
    client.execute_command("QGET", queue, "billing", "EX", 0)
    row = {"queue": queue, "group": "billing", "total": 2, "inprogress": 0, "redo": 0, "done": 1, "available": 1, "consumers": 0}
    assert json.loads(ok(disque("--json", "qstat", "--groups", queue))) == [row]
    assert ok(disque("--raw", "qstat", "--groups", queue)) == f"{queue}\tbilling\t2\t0\t0\t1\t1\t0\n"
    shown = ok(pretty("qstat", "--groups", queue))
    assert "1 consumer group(s)" in shown and re.search(rf"{queue}\s*│\s*billing\s*│\s*2\s*│\s*0\s*│\s*0\s*│\s*1\s*│\s*1\s*│\s*0", shown)
    frames = [json.loads(line) for line in ok(disque("--json", "top", "--groups", "-n", "2", "--interval", "0.05")).splitlines()]
    assert len(frames) == 2 and row in frames[1]
    shown = ok(pretty("top", "--groups", "-n", "1"))
    assert "group(s)" in shown and re.search(r"queue\s*┃\s*group\s*┃\s*total", shown)


def test_export_and_import_round_trip(disque: Callable[..., Result], client: Client, queue: str, tmp_path: Path) -> None:
    bodies = [b"plain", "unicod\u00e9".encode(), b"\xff\x00binary"]
    for body in bodies:
        client.add_job(queue, body, retry=42, ttl=7200)
    client.add_job(queue, "at most once", retry=0, replicate=1)
    dump = tmp_path / "jobs.jsonl"
    result = disque("export", queue, str(dump))
    assert result.exit_code == 0 and result.stderr.endswith(f"exported 4 job(s) from {queue}\n")
    records = [json.loads(line) for line in dump.read_text().splitlines()]
    assert sorted(r.get("body", r.get("body_base64")) for r in records) == sorted(["plain", "unicod\u00e9", "/wBiaW5hcnk=", "at most once"])
    assert {r["retry"] for r in records} == {42, 0} and all(r["queue"] == queue for r in records)
    assert client.qlen(queue) == 4  # export leaves the jobs queued
    assert ok(disque("export", queue, "-")).count("\n") == 4

    result = disque("import", str(dump), "--queue", "copy-" + queue)
    assert result.exit_code == 0 and result.stderr.endswith("imported 4 job(s)\n")
    copies = list(client.jscan("copy-" + queue, details=True))
    assert sorted(j.body for j in copies) == sorted([*bodies, b"at most once"])
    assert {j.retry for j in copies} == {42, 0} and all(7100 < j.ttl <= 7200 for j in copies if j.retry)
    assert not {j.id for j in copies} & {r["id"] for r in records}  # new jobs, new IDs

    result = disque("import", str(dump))  # into the recorded queue
    assert result.exit_code == 0 and client.qlen(queue) == 8


def test_import_reports_the_bad_line(disque: Callable[..., Result], client: Client, queue: str, tmp_path: Path) -> None:
    dump = tmp_path / "bad.jsonl"
    dump.write_text(json.dumps({"queue": queue, "body": "ok", "ttl": 60, "retry": 5}) + "\n\n{not json\n")
    result = disque("import", str(dump))
    assert result.exit_code == 1 and result.stderr.startswith(f"{dump}:3: not a job record") and "1 job(s) imported before it" in result.stderr
    assert client.qlen(queue) == 1


def test_check_aof_delegates_to_the_checker(disque: Callable[..., Result], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "disque.cli.check_aof", None)  # as if not installed
    result = disque("check-aof", "--fix", "appendonly.aof")
    assert result.exit_code == 1 and "check-aof is not available" in result.stderr
    calls: list[list[str]] = []
    fake = types.SimpleNamespace(main=lambda argv: calls.append(argv) or 3)
    monkeypatch.setitem(sys.modules, "disque.cli.check_aof", fake)
    assert disque("check-aof", "--fix", "appendonly.aof").exit_code == 3
    assert calls == [["--fix", "appendonly.aof"]]


def test_help_lists_the_helpers_and_keeps_h_for_the_host(disque: Callable[..., Result]) -> None:
    text = CliRunner().invoke(cli, ["--help"]).stdout
    assert "-h, --host" in text and "--json" in text and "--raw" in text
    for name in ("qstat", "show", "jscan", "qscan", "cluster", "top", "export", "import", "check-aof"):
        assert re.search(rf"^  {name}\s", text, re.M), name
    assert "meet" in CliRunner().invoke(cli, ["cluster", "--help"]).stdout


def test_help_covers_every_command_of_the_node(disque: Callable[..., Result], client: Client) -> None:
    from disque.cli.main import SERVER_COMMANDS

    names = {entry[0].decode().upper() for entry in client.execute_command("COMMAND")}
    assert names - {"SCANJOBS"} <= set(SERVER_COMMANDS)  # SCANJOBS: the alias of JSCAN, and of the subcommand jscan
    listing = ok(disque("help"))
    for name in ("QADD", "QGET", "QACK", "QNOTIFY", "QFLUSH", "QSTATUS", "QINFO"):  # the consumer groups' commands
        assert re.search(rf"^  {name} ", listing, re.M), name
    assert ok(disque("help", "QADD")).startswith("QADD queue expire-sec contents [NOBLOCK]\n")
    assert "[MAXATTEMPTS n [DEADLETTER queue]]" in ok(disque("help", "ADDJOB"))


def test_options_of_disque_go_before_or_after_the_subcommand(disque: Callable[..., Result], client: Client, queue: str, tmp_path: Path) -> None:
    client.add_job(queue, "x")
    before = json.loads(ok(disque("--json", "qstat", queue)))
    after = json.loads(ok(disque("qstat", queue, "--json")))
    assert (before["len"], after["len"], after["name"]) == (1, 1, queue)
    assert json.loads(ok(disque("qlen", "--json", queue, "--local"))) == 1  # --local: QLEN's own reply
    assert ok(disque("qlen", queue, "--raw")) == ok(disque("qlen", queue, "--port=1", "-p", str(client.address[1]))) == "1\n"  # the last -p wins
    assert ok(disque("--cluster", "jscan", "--ids", "--queue", queue)).split() == ok(disque("jscan", "--queue", queue, "--ids")).split()
    result = disque("--cluster", "QLEN", queue)  # a server command answers what the node answers: no --cluster for it
    assert result.exit_code == 2 and "--cluster and --local apply to qlen, qstat, keys, top, qscan, jscan, export, not to QLEN" in result.stderr
    assert disque("show", "--local", "x").exit_code == 2
    body = ok(disque("ADDJOB", queue, "--json", "0")).strip()  # after a server command, words go as typed
    assert re.fullmatch(ID, body) and client.show(body).body == b"--json"  # type: ignore[union-attr]
    keys = tmp_path / "keys"
    assert "node.crt" in disque("tls-keygen", str(keys), "--host", "example.test").stderr  # its own --host, not the node's
    from cryptography import x509

    names = x509.load_pem_x509_certificate((keys / "node.crt").read_bytes()).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert names.value.get_values_for_type(x509.DNSName) == ["example.test"]


def test_help_and_clear_are_commands_of_the_table(disque: Callable[..., Result]) -> None:
    listing = ok(disque("help"))
    assert re.search(r"^  jscan +Every job", listing, re.M) and re.search(r"^  ADDJOB queue body ms-timeout", listing, re.M)
    top = ok(disque("help", "top"))
    assert top.startswith("Usage: disque top [OPTIONS]") and "--interval" in top and "--cluster" in top
    both = ok(disque("help", "jscan"))  # a subcommand and a server command of the same name: both
    assert "--queue TEXT" in both and "JSCAN [cursor] [COUNT n]" in both
    assert "Usage: disque cluster meet [OPTIONS] HOST PORT" in ok(disque("help", "cluster", "meet"))
    assert ok(disque("help", "nope")) == "No help for 'nope'\n"
    assert ok(disque("clear")) == ""  # not a terminal: nothing to clear


def test_the_lazy_worker_subcommand_is_summed_up_as_its_own_help() -> None:
    from disque.client.worker import worker_command

    stand_in = dict(cli.summaries(limit=1000))["worker"]
    assert stand_in == worker_command.get_short_help_str(limit=1000)


def test_version(disque: Callable[..., Result]) -> None:
    from disque import __version__

    head = subprocess.run(["git", "rev-parse", "--short=8", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True).stdout.strip()
    for flag in ("--version", "-v"):
        assert re.fullmatch(rf"disque {re.escape(__version__)} \(git {head}(, modified)?\)\n", ok(disque(flag)))
    server = subprocess.run([sys.executable, "-m", "disque", "--version"], capture_output=True, text=True, timeout=30).stdout
    assert re.fullmatch(rf"Disque server v={re.escape(__version__)} sha={head}:[01] malloc=pymalloc bits=64 build=0\n", server)


# --------------------------------------------------------------------------
# The console script and the prompt, as real processes


def disque_script() -> str:
    return str(Path(sys.executable).with_name("disque"))


def test_console_script(shared_node: NodeProcess, queue: str) -> None:
    done = subprocess.run([disque_script(), "-p", str(shared_node.port), "ADDJOB", queue, "from the script", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and re.fullmatch(ID + "\n", done.stdout)


def test_piped_output_is_bare_and_a_terminal_gets_tables(shared_node: NodeProcess, client: Client, queue: str) -> None:
    """OUT=$(disque GETJOB FROM q) captures the values, as with redis-cli."""
    job_id = client.add_job(queue, "first")
    client.add_job(queue, "second")
    argv = [disque_script(), "-p", str(shared_node.port), "GETJOB", "FROM", queue]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, f"{queue}\n{job_id}\nfirst\n")
    p = PtyProcess(argv, {**os.environ, "TERM": "xterm"})
    try:
        p.expect(r"1 job\(s\)")
        p.expect(rf"│\s*{re.escape(queue)}\s*│\s*{ID}\s*│\s*second\s*│")
        assert p.wait() == 0
    finally:
        p.close()


def test_one_shot_commands_load_neither_trio_rich_nor_prompt_toolkit(shared_node: NodeProcess) -> None:
    probe = """if True:
        import sys
        from disque.cli.main import main
        sys.argv = ["disque", *sys.argv[1:]]
        try:
            main()
        except SystemExit:
            pass
        heavy = ("trio", "rich", "prompt_toolkit", "disque.client", "disque.core.config", "disque.client.worker")
        print(sorted(m for m in sys.modules if m in heavy), file=sys.stderr)
    """

    def loaded(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stderr.strip()

    assert loaded("--help") == loaded("--version") == "[]"  # not even the client library
    assert loaded("-p", str(shared_node.port), "PING") == loaded("-p", str(shared_node.port), "qstat", "q") == "['disque.client']"
    assert "rich" in loaded("-p", str(shared_node.port), "--no-raw", "qstat", "q")  # tables: rich, and only then


class Prompt:
    """`disque` at its prompt: type a line, read up to the next prompt."""

    def __init__(self, process: PtyProcess, label: str) -> None:
        self.process, self.label = process, label
        self.process.expect(label)

    def run(self, line: str, *patterns: str) -> list[re.Match[bytes]]:
        self.process.send(line + "\r")
        matches = [self.process.expect(p) for p in patterns]
        self.process.expect(self.label)  # keys typed before the prompt is up would meet a cooked terminal
        return matches


@pytest.fixture
def prompt(shared_node: NodeProcess, tmp_path: Path) -> Iterator[Callable[..., Prompt]]:
    started: list[PtyProcess] = []
    env = {**os.environ, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1", "DISQUE_HISTFILE": str(tmp_path / "history")}

    def start(*args: str) -> Prompt:
        process = PtyProcess([sys.executable, "-m", "disque.cli", "-p", str(shared_node.port), *args], env)
        started.append(process)
        return Prompt(process, rf"127\.0\.0\.1:{shared_node.port}>")

    yield start
    for process in started:
        process.close()


def test_prompt_runs_commands_with_completion_help_and_errors(prompt: Callable[..., Prompt], client: Client, queue: str) -> None:
    p = prompt()
    [added] = p.run(f"ADDJOB {queue} 'hello world' 0", f"({ID})")
    job_id = added.group(1).decode()
    p.process.send("SHO\t")  # Tab completes the command name: the subcommand show, which sends SHOW
    p.process.expect("show")
    p.run(f" {job_id}", r"body\s+hello world")
    p.run(f"qstat {queue}", rf"len\s+1\s")
    p.run("help getjob", r"GETJOB \[NOHANG\] \[TIMEOUT ms\].*FROM queue.*\n\s+Fetch jobs")
    p.run("help", r"ADDJOB queue body ms-timeout", r"SHUTDOWN \[REWRITE-AOF\]")
    p.run("nope", r"\(error\) ERR unknown command 'nope'")
    p.run('ping "unbalanced', r"Invalid argument\(s\)")
    p.run(f"qlen {queue} --json", rf'{{"queue": "{queue}", "len": 1, "nodes": ')  # options of disque, for this line
    p.run(f"--raw qlen {queue}", r"\n1\r?\n")
    p.run(f"qlen {queue}", r"len\s+1\s")  # the prompt's own options again
    p.run("--json", r"Error: a command must follow the options")
    p.process.send("exit\r")
    assert p.process.wait() == 0
    assert client.qlen(queue) == 1


def test_the_prompt_runs_the_subcommands_as_disque_does(prompt: Callable[..., Prompt], client: Client, queue: str, tmp_path: Path) -> None:
    ids = sorted(client.add_job(queue, f"job {i}") for i in range(3))
    p = prompt()
    [listed] = p.run(f"jscan --queue {queue}", r"3 job\(s\)((?:.|\n)*?)└")  # every job, not one JSCAN page
    assert sorted(re.findall(ID.encode(), listed.group(1))) == [i.encode() for i in ids]
    assert listed.group(1).count(b"queued") == 3
    p.run(f"qstat {queue}", r"cluster-wide, 1 node\(s\)")
    p.run("top -n 1", rf"{re.escape(queue)}\s*│\s*3\s*│")
    dump = tmp_path / "dump.jsonl"
    p.run(f"export {queue} {dump}", rf"exported 3 job\(s\) from {re.escape(queue)}")
    assert len(dump.read_text().splitlines()) == 3
    p.run("help top", r"Usage: disque top \[OPTIONS\]", r"--interval")
    p.run("jscan --help", r"Usage: disque jscan \[OPTIONS\]")
    p.run("help", r"Subcommands", r"export", r"Server commands")
    p.run("qstat", r"Error: Missing argument 'QUEUE'")  # a usage error, and the prompt goes on
    p.run("clear")
    p.run(f"QLEN {queue}", r"\(integer\) 3")
    assert b"unknown command" not in p.process.output
    p.process.send("exit\r")
    assert p.process.wait() == 0


def test_prompt_history_survives_sessions_and_ctrl_d_leaves(prompt: Callable[..., Prompt], client: Client, queue: str, tmp_path: Path) -> None:
    first = prompt()
    first.run(f"ADDJOB {queue} remembered 0", ID)
    first.process.send("\x04")  # Ctrl-D on an empty line
    assert first.process.wait() == 0
    assert f"ADDJOB {queue} remembered 0" in (tmp_path / "history").read_text()
    second = prompt("--json")
    second.run("\x1b[A", f'"{ID}"')  # Up recalls the previous session's command
    second.process.send("quit\r")
    assert second.process.wait() == 0
    assert client.qlen(queue) == 2


def test_top_in_a_terminal(client: Client, queue: str, shared_node: NodeProcess) -> None:
    client.add_job(queue, "x")
    env = {**os.environ, "TERM": "xterm"}
    p = PtyProcess([disque_script(), "-p", str(shared_node.port), "top", "-n", "3", "--interval", "0.1"], env)
    try:
        p.expect(r"queue\(s\)")
        p.expect(rf"{re.escape(queue)}\s*│\s*1\s*│\s*0\s*│")  # rates appear from the second refresh on
        assert p.wait() == 0
    finally:
        p.close()


def test_monitor_streams_until_ctrl_c(client: Client, queue: str, shared_node: NodeProcess) -> None:
    client.connect()  # its HELLO before the watch starts
    p = PtyProcess([disque_script(), "-p", str(shared_node.port), "monitor"], {**os.environ, "TERM": "xterm"})
    try:
        p.expect(r"^OK\n")  # printed once the node answered MONITOR
        client.qlen(queue)
        p.expect(rf'\d+\.\d{{6}} \[127\.0\.0\.1:\d+\] "QLEN" "{re.escape(queue)}"\n')
        os.kill(p.proc.pid, signal.SIGINT)
        assert p.wait() == 0
    finally:
        p.close()


def test_monitor_at_the_prompt_gives_the_prompt_back_on_ctrl_c(prompt: Callable[..., Prompt], client: Client, queue: str) -> None:
    client.connect()
    p = prompt()
    p.process.send("monitor\r")
    p.process.expect(r"\nOK\n")
    client.add_job(queue, "seen")
    p.process.expect(rf'"ADDJOB" "{re.escape(queue)}" "seen" "30000"')
    os.kill(p.process.proc.pid, signal.SIGINT)  # Ctrl-C (the test's pty is not a controlling terminal)
    p.process.expect(p.label)  # back at the prompt, on a fresh connection
    p.run(f"QLEN {queue}", r"\(integer\) 1")


def test_ctrl_c_ends_a_blocked_command_not_the_prompt(prompt: Callable[..., Prompt], client: Client, queue: str) -> None:
    p = prompt()
    p.process.send(f"GETJOB FROM {queue}\r")  # blocks: the queue is empty
    p.process.expect(f"GETJOB FROM {re.escape(queue)}")
    wait_for(lambda: client.qstat(queue) and client.qstat(queue).blocked == 1, what="GETJOB to block")  # type: ignore[union-attr]
    os.kill(p.process.proc.pid, signal.SIGINT)
    p.process.expect(p.label)
    wait_for(lambda: (s := client.qstat(queue)) is None or s.blocked == 0, what="the interrupted GETJOB's connection to close")
    client.add_job(queue, "after the interrupt")
    p.run(f"QLEN {queue}", r"\(integer\) 1")  # a new connection answers


def test_batch_new_show_and_close(disque: Callable[..., Result], client: Client, queue: str) -> None:
    batch_id = ok(disque("batch", "new", "ON-COMPLETE", queue + "-done", "over")).strip()
    client.add_job(queue, "x", batch=batch_id)
    assert ok(disque("batch", "close", batch_id)).strip() == "OK"
    flat = json.loads(ok(disque("--json", "batch", "show", batch_id)))
    shown = dict(zip(flat[::2], flat[1::2]))
    assert (shown["closed"], shown["jobs"], shown["pending"]) == (1, 1, 1)
    assert "BATCH NEW [ON-SUCCESS queue body]" in ok(disque("help", "BATCH"))
