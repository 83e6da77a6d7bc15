"""The package as a user gets it: an sdist and a wheel built from this
checkout (`python -m build`, which builds the wheel from the sdist), the
wheel installed in a fresh venv (pip may fetch the dependencies), and a node
started from that venv answering the client installed with it and redis-py;
and `make extras`, which adds an extra's requirements to the checkout's venv."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
import redis

from support import wait_for

from disque import __version__, compiled
from disque.testing.devcluster import free_port

ROOT = Path(__file__).resolve().parents[2]


def git_head() -> str | None:
    """This checkout's HEAD as `--version` shows it, or None outside a git work tree."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    return subprocess.run(["git", "rev-parse", "--short=8", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def built_head() -> str | None:
    """HEAD when the build starts: commits made in this work tree while it runs do not count."""
    return git_head()


# A wheel of the pure-Python core, and one whose core mypyc compiles (what
# a machine with a C compiler builds): compiling takes one to several
# minutes, so that build runs with the slow tests (`make test-slow`).
@pytest.fixture(scope="module", params=["pure", pytest.param("compiled", marks=pytest.mark.slow)])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def dist(kind: str, built_head: str | None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "DISQUE_PURE": "1"} if kind == "pure" else {k: v for k, v in os.environ.items() if k != "DISQUE_PURE"}
    argv = [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=800, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no system site-packages) with the wheel installed."""
    bin_dir = tmp_path_factory.mktemp("venv") / "bin"
    subprocess.run([sys.executable, "-m", "venv", str(bin_dir.parent)], check=True, timeout=120)
    [wheel] = dist.glob("*.whl")
    done = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir


@pytest.mark.timeout(900)
def test_sdist_and_wheel_are_named_and_record_the_revision(kind: str, dist: Path, built_head: str | None) -> None:
    [sdist] = dist.glob("*.tar.gz")
    [wheel] = dist.glob("*.whl")
    assert sdist.name == f"disque_server-{__version__}.tar.gz"
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"  # the compiled core: tools-cc installs gcc
    tags = f"{python}-{python}-{sysconfig.get_platform().replace('-', '_')}" if kind == "compiled" else "py3-none-any"
    assert wheel.name == f"disque_server-{__version__}-{tags}.whl"
    with tarfile.open(sdist) as tar:
        sdist_record = tar.extractfile(f"disque_server-{__version__}/disque/REVISION").read().decode()  # type: ignore[union-attr]
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        wheel_record = whl.read("disque/REVISION").decode()
        entry_points = whl.read(f"disque_server-{__version__}.dist-info/entry_points.txt").decode()
    assert wheel_record == sdist_record  # the wheel is built from the sdist and keeps its record
    if built_head is not None:
        assert re.fullmatch(rf"{built_head} [01]\n", wheel_record)
    assert {"disque/default.conf", "disque/cli/main.py", "disque/cli/server.py", "disque/shell/web/index.html", "disque/shell/web/app.js",
            "disque/py.typed"} <= set(names)  # fmt: skip
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    extensions = {path.replace(".py", suffix) for path in compiled.MODULES} | {f"{compiled.GROUP}__mypyc{suffix}"}
    if kind == "compiled":
        assert extensions <= set(names) and "disque/COMPILED" in names  # with its sources, which stay in the wheel
    else:
        assert not extensions & set(names) and "disque/COMPILED" not in names
    assert set(compiled.MODULES) <= set(names)
    assert not [n for n in names if n.startswith("tests/")]
    assert "disque = disque.cli.main:main" in entry_points and "disque-server = disque.cli.server:server_main" in entry_points


@pytest.mark.timeout(900)
def test_the_installed_wheel_runs_a_node(kind: str, venv: Path, built_head: str | None, tmp_path: Path) -> None:
    # Run away from the checkout, so nothing can be imported from it.
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    location = run(str(venv / "python"), "-c", "import disque; print(disque.__file__)").stdout
    assert location.startswith(str(venv.parent)), location
    which = run(str(venv / "python"), "-c", "from disque import compiled; print(compiled.active())")
    assert (which.stdout, which.stderr) == (f"{kind == 'compiled'}\n", "")  # installed extensions are not taken for stale ones
    head = built_head or "[0-9a-f]{8}"
    assert re.fullmatch(rf"disque {re.escape(__version__)} \(git {head}(, modified)?\)\n", run(str(venv / "disque"), "--version").stdout)
    assert re.fullmatch(rf"Disque server v={re.escape(__version__)} sha={head}:[01] .*\n", run(str(venv / "disque-server"), "--version").stdout)

    port, http_port = free_port(), free_port()
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    node = subprocess.Popen([str(venv / "disque-server"), "--port", str(port), "--dir", str(node_dir), "--logfile", "log.txt",
                             "--metrics-port", str(http_port)],
                            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:

        def ping() -> str | None:
            assert node.poll() is None, node.stderr.read() if node.stderr else ""
            done = run(str(venv / "disque"), "-p", str(port), "PING")
            return done.stdout if done.returncode == 0 else None

        assert wait_for(ping, timeout=30, what="the node to answer") == "PONG\n"
        with redis.Redis(port=port, socket_timeout=10) as r:  # any Redis client, from the test's venv
            assert r.ping() is True and r.execute_command("QLEN", "q") == 0
        job = run(str(venv / "disque"), "-p", str(port), "ADDJOB", "q", "from the wheel", "0").stdout.strip()
        assert run(str(venv / "disque"), "-p", str(port), "--json", "show", job).stdout.count('"body": "from the wheel"') == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/", timeout=10) as page:  # the dashboard ships
            assert b"<title>disque dashboard</title>" in page.read()
    finally:
        node.terminate()
        node.wait(timeout=30)
        if node.stderr:
            node.stderr.close()



# A user's code against the typed client (docs/client.md, "Types"): it must
# pass `mypy --strict`, with no Any leaking out of a command; and a mistake
# mypy must catch, which it cannot if the client's methods return Any.
USER_CODE = """\
from disque.client import AsyncClient, Client, Job, JobInfo, QueueStats


def produce(c: Client) -> str:
    return c.add_job("q", b"x", retry=10)


def consume(c: Client) -> bytes | None:
    job: Job | None = c.get_job("q", nohang=True)
    if job is None:
        return None
    info: JobInfo | None = c.show(job.id)
    stats: QueueStats | None = c.qstat("q")
    n: int = c.qlen("q") + c.ack(job.id)
    names = [name.upper() for name in c.qscan(minlen=1)]
    return job.body if info and stats and n and names else None


async def consume_async(c: AsyncClient) -> int:
    job = await c.get_job("q", timeout_ms=100)
    async for name in c.qscan():
        print(name.upper())
    await c.close()
    return await c.qlen("q") + (len(job.body) if job else 0)
"""
USER_MISTAKE = """\
from disque.client import Client


def produce(c: Client) -> int:
    return c.add_job("q", b"x")
"""


def check_types(python: Path, where: Path) -> None:
    """`mypy --strict` in a user's project, with the package as `python` has it installed."""
    (where / "app.py").write_text(USER_CODE)
    (where / "mistake.py").write_text(USER_MISTAKE)
    argv = [str(python), "-m", "mypy", "--strict", "--no-incremental"]
    done = subprocess.run([*argv, "app.py"], cwd=where, capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stdout) == (0, "Success: no issues found in 1 source file\n"), done.stdout + done.stderr
    done = subprocess.run([*argv, "mistake.py"], cwd=where, capture_output=True, text=True, timeout=600)
    assert 'mistake.py:5: error: Incompatible return value type (got "JobHandle", expected "int")' in done.stdout, done.stdout


@pytest.mark.timeout(900)
def test_the_installed_wheel_is_typed(venv: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(venv / "python"), "-m", "pip", "install", "-q", "mypy"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    check_types(venv / "python", tmp_path)


@pytest.mark.skipif(Path(sys.prefix) != ROOT / ".venv" or not (ROOT / ".venv" / ".installed-run").exists(),
                    reason="make run's editable install is in this checkout's .venv, which is not the one running the tests")  # fmt: skip
def test_the_editable_install_is_typed(tmp_path: Path) -> None:
    check_types(Path(sys.executable), tmp_path)  # mypy: a build requirement, which make run installs


def make_extras(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "extras", *args], capture_output=True, text=True, timeout=300)


def installed_record() -> str:
    """The RECORD of the package installed in this venv: a reinstall writes a new one."""
    return (Path(sysconfig.get_paths()["purelib"]) / f"disque_server-{__version__}.dist-info" / "RECORD").read_text()


@pytest.mark.skipif(Path(sys.prefix) != ROOT / ".venv" or not (ROOT / ".venv" / ".installed-run").exists(),
                    reason="make extras installs into this checkout's .venv, which is not the one running the tests")  # fmt: skip
def test_make_extras_adds_requirements_and_keeps_the_editable_install() -> None:
    before = installed_record()
    assert "__editable__" in before  # make run's editable install
    done = make_extras("EXTRAS=dramatiq")  # installed already (the test extra has it): pip has nothing to fetch
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installing the requirements of the extra(s) dramatiq into .venv" in done.stdout
    assert installed_record() == before  # the package was not reinstalled, as a copy or at all
    done = make_extras("EXTRAS=dramatiq,nope")
    assert done.returncode != 0 and "EXTRAS: one or more of test, spark, dramatiq, clients, otel, bench, comma-separated" in done.stderr
    assert make_extras().returncode != 0  # EXTRAS is required


def test_revision_record_and_git(tmp_path: Path) -> None:
    from disque.version import Revision, from_git, recorded

    assert from_git(tmp_path) is None  # not the top of a work tree: no revision, whatever encloses it
    assert recorded(tmp_path) is None
    (tmp_path / "REVISION").write_text(Revision("0123abcd", True).record())
    assert recorded(tmp_path) == Revision("0123abcd", True)
    assert str(recorded(tmp_path)) == "git 0123abcd, modified" and str(Revision("0123abcd", False)) == "git 0123abcd"
    (tmp_path / "REVISION").write_text("garbage\n")
    assert recorded(tmp_path) is None
    head = git_head()
    if head is not None:
        assert from_git(ROOT) is not None and from_git(ROOT).sha == head  # type: ignore[union-attr]


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    """examples/disque@.service, as instance 7711, with ExecStart pointing at this venv's disque-server
    (`make tools-systemd` installs systemd-analyze)."""
    unit = (ROOT / "examples" / "disque@.service").read_text()
    assert "ExecStart=/opt/disque/bin/disque-server " in unit
    instance = tmp_path / "disque@7711.service"
    instance.write_text(unit.replace("/opt/disque/bin/", f"{Path(sys.executable).parent}/"))
    done = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert instance.name not in done.stderr  # no warning about the unit (unknown keys only warn)
