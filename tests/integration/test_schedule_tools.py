"""Recurring jobs seen from the tools, on a real node: the tick counters on
/metrics, and `disque schedule add|list|show|pause|resume|stats|del`."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner, Result

from disque.cli.main import cli
from disque.testing.devcluster import NodeProcess, free_port
from support import wait_for
from test_metrics import samples


@pytest.fixture
def node(spawn: Callable[..., NodeProcess]) -> tuple[NodeProcess, int]:
    port = free_port()
    return spawn("--metrics-port", str(port), "--schedule-grace", "100"), port


@pytest.fixture
def disque(node: tuple[NodeProcess, int]) -> Callable[..., Result]:
    runner = CliRunner(env={"COLUMNS": "200"})
    return lambda *args: runner.invoke(cli, ["-p", str(node[0].port), *args], catch_exceptions=False)


def test_tick_counters_on_metrics(node) -> None:
    proc, port = node
    r = redis.Redis(port=proc.port)
    assert r.execute_command("SCHEDULE", "ADD", "s", "q", "x", "EVERY", 200, "TTL", 60) == b"OK"
    got = wait_for(lambda: m if (m := samples(port))[("disque_schedule_ticks_fired_total", ())] >= 2 else None)
    assert got[("disque_schedules", ())] == 1 and got[("disque_schedules_paused", ())] == 0
    assert got[("disque_schedule_ticks_refused_total", ())] == got[("disque_schedule_ticks_collapsed_total", ())] == 0
    assert got[("disque_schedule_ticks_late_total", ())] <= got[("disque_schedule_ticks_fired_total", ())]
    assert r.execute_command("PAUSE", "q", "in") == b"in"  # ADDJOB would refuse the ticks' jobs
    refused = wait_for(lambda: m if (m := samples(port))[("disque_schedule_ticks_refused_total", ())] >= 1 else None)
    assert refused[("disque_schedule_ticks_fired_total", ())] >= got[("disque_schedule_ticks_fired_total", ())]
    r.execute_command("SCHEDULE", "PAUSE", "s")
    assert wait_for(lambda: samples(port)[("disque_schedules_paused", ())] == 1)
    r.close()


def test_the_schedule_subcommands(disque) -> None:
    def ok(*args: str) -> str:
        result = disque(*args)
        assert result.exit_code == 0, result.output
        return result.stdout

    def rows() -> list[dict]:
        return json.loads(ok("--json", "schedule", "list"))

    assert ok("schedule", "add", "s", "q", "tick", "--every", "200ms", "--ttl", "60", "--retry", "5") == "OK\n"
    assert ok("schedule", "add", "n", "q", "x", "--cron", "0 3 * * *", "--tz", "Europe/Paris", "--max-attempts", "2") == "OK\n"
    assert ok("schedule", "list") == "n\ns\n"  # bare names when piped
    [n, s] = wait_for(lambda: (found := rows())[1]["last-tick"] and found)
    assert (s["name"], s["queue"], s["when"], s["paused"], s["options"]) == ("s", "q", "every 200 ms", False, "TTL 60 RETRY 5")
    assert s["next-tick"] > s["last-tick"] and len(s["last-node"]) == 8
    assert (n["when"], n["options"], n["last-tick"], n["next-tick"][11:16]) == ("0 3 * * * Europe/Paris", "MAXATTEMPTS 2", "", n["next-tick"][11:16])
    table = ok("--no-raw", "schedule", "list")
    assert "2 schedule(s)" in table and "every 200 ms" in table
    # nobody takes the jobs of `s`: the list says so, until a consumer takes one
    s = wait_for(lambda: (found := rows()[1])["jobs"] >= 2 and found)
    assert s["stalled"] and s["consumer"] == "NONE: jobs pile up, none ever taken"
    assert "NONE: jobs pile up" in ok("--no-raw", "schedule", "list")
    assert ok("GETJOB", "FROM", "q").count("tick") == 1
    s = rows()[1]
    assert not s["stalled"] and s["consumer"].startswith("last taken ")
    assert "queue" in ok("schedule", "show", "s").split()  # bare field, value lines

    assert ok("schedule", "pause", "s") == "OK\n" and rows()[1]["paused"] is True
    assert ok("schedule", "resume", "s") == "OK\n" and rows()[1]["paused"] is False
    stats = json.loads(ok("--json", "schedule", "stats"))
    assert stats["fired"] >= 1 and [node["fired"] for node in stats["nodes"]] == [stats["fired"]]
    local = json.loads(ok("--json", "schedule", "stats", "--local"))
    assert local["fired"] >= stats["fired"] and len(local["nodes"]) == 1

    assert ok("schedule", "del", "s") == "1\n" and ok("schedule", "del", "s") == "0\n"
    missing = disque("schedule", "show", "s")
    assert missing.exit_code == 1 and "no such schedule: s" in missing.output
    assert disque("schedule", "pause", "s").exit_code == 1  # the server's error
    assert "give one of --every and --cron" in disque("schedule", "add", "x", "q", "b").output
    assert "not a period" in disque("schedule", "add", "x", "q", "b", "--every", "soon").output
    assert "invalid CRON expression" in disque("schedule", "add", "x", "q", "b", "--cron", "61 * * * *").output
