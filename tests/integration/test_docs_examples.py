"""Every example of README.md and docs/*.md runs as written.

The blocks are read from the Markdown and run against real nodes:

* ```console: a terminal transcript; each `$ ` line runs in bash and what it
  prints must match the lines below it, job IDs aside (the first time an ID
  of the text meets an ID of the run they are paired, and later commands use
  the run's ID);
* ```sh: one script; it must exit 0 and print no error reply (background
  processes it starts are stopped by PID when it ends);
* ```python: a program; it must exit 0.

Other blocks (config files, output, ```text) are not programs.  A block
preceded by `<!-- not run: reason -->` is skipped with that reason shown;
each reason names what covers the example instead.  The examples speak of
127.0.0.1:7711-7713 and the dashboards on 9711-9713, as `make run` starts
them: the test starts a 3-node cluster on free ports and rewrites those
numbers (and the memcache ports 22133-22135); a block that starts its own
servers gets ports of its own, and
paths under /var/lib/disque are moved into a temporary directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from disque.testing.devcluster import NodeProcess, free_port, join

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
JOB_ID = re.compile(r"D-?[0-9A-Za-z]{2}[0-9a-f]{40}[0-9a-f]{4}SQ|DI[0-9a-f]{44}SQ")
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>.*?) -->\s*\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
RUN = {"console", "sh", "python"}
# redis-cli exits 0 after an error reply: an error line in a script's output fails it too.
ERROR_REPLY = re.compile(r"^(\(error\) )?(ERR|NOREPL|NOJOB|PAUSED|BADID|LEAVING|NOAUTH|TOOLATE|MAXLEN|OOM|MISCONF|LOADING)\b", re.M)


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    lang: str
    body: str
    skip: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            if m["lang"] in RUN:
                line = text.count("\n", 0, m.start("body"))
                found.append(Example(str(page.relative_to(ROOT)), line, m["lang"], m["body"], m["why"]))
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The 3 nodes the examples talk to; yields the port rewrites."""
    base = tmp_path_factory.mktemp("docs-cluster")
    nodes: list[NodeProcess] = []
    ports = {}
    try:
        for i in range(3):
            port, http, memcache = free_port(), free_port(), free_port()
            nodes.append(NodeProcess(port, base / f"n{i}", "--metrics-port", str(http), "--memcache-port", str(memcache)).start())
            ports[str(7711 + i)], ports[str(9711 + i)], ports[str(22133 + i)] = str(port), str(http), str(memcache)
        join(nodes)
        yield ports
    finally:
        for node in nodes:
            node.stop()


def rewrite(text: str, ports: dict[str, str], tmp: Path) -> str:
    text = re.sub(r"\b(77\d\d|97\d\d|2213\d)\b", lambda m: ports.get(m[1], m[1]), text)
    return text.replace("/var/lib/disque", str(tmp / "var-lib-disque")).replace(".venv/bin/", f"{BIN}/")


def environment(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp), "PYTHONPATH": str(ROOT)}


def run_console(example: Example, ports: dict[str, str], tmp: Path) -> None:
    ids: dict[str, str] = {}  # ID in the text -> ID in this run
    steps = re.split(r"^\$ ", example.body, flags=re.M)[1:]
    for step in steps:
        command, _, expected = step.partition("\n")
        for theirs, ours in ids.items():
            command = command.replace(theirs, ours)
        done = subprocess.run(
            ["bash", "-c", rewrite(command, ports, tmp)], cwd=tmp, env=environment(tmp),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, f"{example}: `{command}` failed: {done.stderr}"
        got, want = done.stdout.splitlines(), expected.splitlines()
        assert len(got) == len(want), f"{example}: `{command}` printed {got!r}, the text shows {want!r}"
        for g, w in zip(got, want, strict=True):
            for theirs, ours in zip(JOB_ID.findall(w), JOB_ID.findall(g), strict=False):
                ids.setdefault(theirs, ours)
            assert JOB_ID.sub("<id>", g) == JOB_ID.sub("<id>", w), f"{example}: `{command}` printed {g!r}, not {w!r}"


def run_script(example: Example, ports: dict[str, str], tmp: Path) -> None:
    if example.lang == "python":
        argv = [sys.executable, "-c", rewrite(example.body, ports, tmp)]
    else:  # background jobs are stopped by PID when the script ends
        argv = ["bash", "-ec", "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n" + rewrite(example.body, ports, tmp)]
    done = subprocess.run(argv, cwd=tmp, env=environment(tmp), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{example} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    assert not ERROR_REPLY.search(done.stdout), f"{example} got an error reply:\n{done.stdout}"


@pytest.mark.timeout(360)  # the Spark examples start a JVM and Spark's Python workers: minutes on two busy cores
@pytest.mark.parametrize("example", examples(), ids=str)
def test_example_runs_as_written(example: Example, cluster: dict[str, str], tmp_path: Path) -> None:
    if example.skip:
        pytest.skip(example.skip)
    ports = cluster
    if "disque-server --port" in example.body:  # it starts its own nodes: ports of their own
        ports = {str(p): str(free_port()) for p in (7711, 7712, 7713)}
    if example.lang == "console":
        run_console(example, ports, tmp_path)
    else:
        run_script(example, ports, tmp_path)


def test_every_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme] == []


def test_every_transcript_runs_or_says_why() -> None:
    """A block that shows a shell session (`$ ...`) is a console block, or says
    what covers it instead."""
    silent = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            if m["body"].startswith("$ ") and m["lang"] != "console" and not m["why"]:
                silent.append(f"{page.name}:{text.count(chr(10), 0, m.start('body'))}")
    assert silent == []


def test_every_skipped_example_says_why() -> None:
    skipped = [e for e in examples() if e.skip is not None]
    assert all(len(e.skip) > 20 for e in skipped), [str(e) for e in skipped]
    assert len(skipped) < len(examples()) / 2
