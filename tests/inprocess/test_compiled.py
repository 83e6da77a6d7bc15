"""The compiled core (disque/compiled.py, disque/compiled.txt): which build runs, and the way back
to the sources when the extensions are stale or DISQUE_PURE is set."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from disque import compiled

ROOT = compiled.ROOT
WHICH = (
    "import importlib, disque.compiled as c; "
    "print(*(importlib.import_module(p[:-3].replace('/', '.')).__file__.rsplit('.', 1)[1] for p in c.MODULES))"
)


def run_in(root: Path, code: str, pure: bool = False) -> tuple[str, str]:
    """The stdout and stderr of `code` in a fresh process importing `disque` from `root`."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISQUE_PURE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(root)
    if pure:
        env["DISQUE_PURE"] = "1"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True, timeout=60)
    return done.stdout, done.stderr


def loaded_as(root: Path, pure: bool) -> tuple[set[str], str]:
    """The file suffixes the compiled modules load from in a fresh process, and its stderr."""
    stdout, stderr = run_in(root, WHICH, pure)
    return set(stdout.split()), stderr


def test_this_run_loads_the_build_it_asked_for() -> None:
    if not compiled.built():
        pytest.skip("installed without a C compiler: there is no compiled build to load")
    pure = bool(os.environ.get("DISQUE_PURE"))
    assert compiled.active() is not pure
    for path in compiled.MODULES:
        module = importlib.import_module(path[:-3].replace("/", "."))
        assert (module.__file__ or "").endswith(".py") is pure, module.__file__


def test_disque_pure_loads_every_module_from_its_source() -> None:
    assert loaded_as(ROOT, pure=True)[0] == {"py"}


def test_the_stamp_records_the_compiled_sources(tmp_path: Path) -> None:
    for path in compiled.MODULES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    assert compiled.stale(tmp_path)  # no stamp: nothing is known to match
    (tmp_path / "disque" / compiled.STAMP).write_text(compiled.stamp(tmp_path))
    assert not compiled.stale(tmp_path)
    touched = tmp_path / compiled.MODULES[-1]
    os.utime(touched, ns=(0, 0))  # a checkout that rewrote it unchanged: the sizes or mtimes differ, the hash does not
    assert not compiled.stale(tmp_path)
    with open(touched, "a") as source:
        source.write("# edited\n")
    assert compiled.stale(tmp_path)
    touched.unlink()
    assert compiled.stale(tmp_path)


def test_the_makefile_reads_the_same_list() -> None:
    printed = subprocess.run(
        ["make", "-s", "-f", "-", "list"],
        input="include Makefile\nlist:\n\t@echo $(COMPILED)\n",
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    assert tuple(printed.split()) == compiled.MODULES and len(compiled.MODULES) > 20


def test_a_stale_build_runs_the_sources_and_says_so(tmp_path: Path) -> None:
    if not compiled.built():
        pytest.skip("installed without a C compiler: there is no compiled build to go stale")
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "disque", copy / "disque", ignore=shutil.ignore_patterns("__pycache__"))
    for library in ROOT.glob(f"{compiled.GROUP}__mypyc*"):
        shutil.copy(library, copy)
    assert loaded_as(copy, pure=False) == ({"so"}, "")
    with open(copy / compiled.MODULES[0], "a") as source:
        source.write("# edited after the build\n")
    checked = run_in(copy, "import disque.core.errors, sys; print(any(type(f).__name__ == 'FirstCompiledImport' for f in sys.meta_path))")
    assert checked == ("True\n", "")  # no compiled module imported yet: nothing checked, nothing said
    suffixes, stderr = loaded_as(copy, pure=False)
    assert suffixes == {"py"}
    assert "the compiled core is older than its sources" in stderr
