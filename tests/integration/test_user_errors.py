"""Every error a user meets following the README and docs/, as the user
meets it (the real `disque-server`, `disque` and `disque worker` processes
against a real node): each says what went wrong and what to do, in a few
lines, with no traceback.

One row per mistake: the program's arguments ({port}: the node's; {closed}:
a port nobody listens on), a file to write first where the mistake is in a
file, and the words the output must hold.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from client_helpers import shared_node  # noqa: F401  (fixture)
from disque.testing.devcluster import NodeProcess, free_port

SERVER = [sys.executable, "-m", "disque"]
CLI = [sys.executable, "-m", "disque.cli", "-p", "{port}"]

BAD_CRON_APP = """\
from disque.client.worker import App

app = App(["127.0.0.1:{port}"])


@app.cron("0 25 * * *", "reports", name="nightly")
def report(job):
    pass
"""

ERRORS = [
    # disque-server's options and config file (docs/running.md)
    ("option typo", [*SERVER, "--prot", "8731"], None, "disque-server: unknown option --prot (did you mean --port?)"),
    ("option value", [*SERVER, "--port", "99999"], None, 'disque-server: --port "99999": Invalid port'),
    ("option arity", [*SERVER, "--port"], None, "--port: Bad directive or wrong number of arguments"),
    ("config typo", [*SERVER, "disque.conf"], ("disque.conf", "prot 8731\n"), "'prot 8731'\nBad directive or wrong number of arguments\nDid you mean 'port'?"),
    ("queue option typo", [*SERVER, "--queue", "work", "max_itmes", "10"], None, "unknown queue option 'max_itmes' (did you mean 'max_items'?)"),
    ("missing config", [*SERVER, "nosuch.conf"], None, "Fatal error, can't open config file 'nosuch.conf'"),
    # CONFIG SET (docs/commands.md)
    ("CONFIG SET typo", [*CLI, "CONFIG", "SET", "maxmemroy", "1mb"], None, "Unsupported CONFIG parameter: maxmemroy (did you mean 'maxmemory'?)"),
    # schedules from the CLI (docs/schedules.md, docs/cli.md)
    ("cron field", [*CLI, "schedule", "add", "s", "q", "b", "--cron", "61 * * * *"], None, 'invalid CRON expression: the minute field "61" must be 0-59; 5 fields: minute hour day month weekday'),
    ("cron fields", [*CLI, "SCHEDULE", "ADD", "s", "q", "b", "CRON", "0 3 * *"], None, "invalid CRON expression: 4 fields, 5 fields: minute hour day month weekday"),
    ("period unit", [*CLI, "schedule", "add", "s", "q", "b", "--every", "5"], None, "not a period: '5' (a number and its unit: 250ms, 90s, 5m, 1h, 1d)"),
    ("every or cron", [*CLI, "schedule", "add", "s", "q", "b"], None, "give one of --every and --cron"),
    ("zone", [*CLI, "schedule", "add", "s", "q", "b", "--cron", "0 3 * * *", "--tz", "Paris"], None, "TZ must be a zone name such as Europe/Paris"),
    # the worker (README's "A worker", docs/client.md)
    ("bad schedule in the app", [sys.executable, "-m", "disque.cli", "worker", "tasks:app"], ("tasks.py", BAD_CRON_APP),
     """Error: schedule 'nightly' (queue 'reports'): invalid CRON expression: the hour field "25" must be 0-23"""),
    ("no such module", [sys.executable, "-m", "disque.cli", "worker", "nosuch:app"], None, "Error: No module named 'nosuch'"),
    # the Quick start's commands (README)
    ("no cluster", [sys.executable, "-m", "disque.cli", "-p", "{closed}", "PING"], None, "Could not connect to Disque at 127.0.0.1:{closed}: Connection refused"),
    ("ADDJOB arity", [*CLI, "ADDJOB", "myqueue"], None, "ERR wrong number of arguments for 'addjob' command"),
    ("ADDJOB timeout", [*CLI, "ADDJOB", "myqueue", "hello", "soon"], None, "ERR"),
    ("ACKJOB id", [*CLI, "ACKJOB", "nosuchid"], None, "BADID"),
]


@pytest.mark.parametrize(("argv", "file", "said"), [row[1:] for row in ERRORS], ids=[row[0] for row in ERRORS])
def test_an_error_says_what_to_do(
    argv: list[str], file: tuple[str, str] | None, said: str, shared_node: NodeProcess, tmp_path: Path
) -> None:
    names = {"port": shared_node.port, "closed": free_port()}
    if file is not None:
        (tmp_path / file[0]).write_text(file[1].format(**names))
    done = subprocess.run([a.format(**names) for a in argv], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert said.format(**names) in output, output
    assert "Traceback" not in output and "ExceptionGroup" not in output, output
    errors = [line for line in output.splitlines() if line and "worker started" not in line]
    assert len(errors) <= 6, output  # a few lines, not a page
