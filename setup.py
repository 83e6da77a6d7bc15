"""Build hooks (everything else is in pyproject.toml).

* Built from a git checkout, the sdist and the wheel record its revision in
  disque/REVISION, which `--version` and INFO read once installed
  (disque/version.py).  A wheel built from the sdist keeps the sdist's record.
* Where a C compiler is found and DISQUE_PURE is not set, mypyc compiles the
  modules listed in disque/compiled.txt into extensions next to the sources,
  and disque/COMPILED records the hash, sizes and mtimes of the sources
  compiled (disque/compiled.py).  mypyc writes one C file per module
  (multi_file: a single 25 MB file took gcc minutes at -O3), compiled a
  file per CPU at once, largest first, with a line of progress at least
  every ten seconds (the Makefile's `run` builds this way: docs/running.md).
"""

import itertools
import os
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).parent.resolve()
sys.path.insert(0, str(HERE))

from disque import compiled  # noqa: E402  (the source tree being built)
from disque.version import RECORD, from_git  # noqa: E402


def write_record(package_dir: Path) -> None:
    revision = from_git(HERE)
    if revision is not None:
        target = package_dir / RECORD
        target.unlink(missing_ok=True)  # a release tree may hard-link files of the source tree
        target.write_text(revision.record())


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not (self.dry_run or self.editable_mode):  # an editable copy asks git (disque/version.py)
            write_record(Path(self.build_lib) / "disque")


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        write_record(Path(base_dir) / "disque")
        (Path(base_dir) / "disque" / compiled.STAMP).unlink(missing_ok=True)  # the checkout's build: a wheel writes its own


def progress(line: str) -> None:
    print(f"disque: {line}", flush=True)


@contextmanager
def ticking(what: str) -> Iterator[None]:
    """Say `what`, then how long it has taken, every ten seconds until it is done."""
    progress(what)
    start, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(10):
            progress(f"{what}: {time.monotonic() - start:.0f} s")

    clock = threading.Thread(target=tick, daemon=True)
    clock.start()
    try:
        yield
    finally:
        done.set()
        clock.join()


def in_parallel(compile_: Callable[..., list[str]], jobs: int) -> Callable[..., list[str]]:
    """`compile_` (a CCompiler's compile) run on `jobs` sources at once."""

    def run(sources: list[str], *args: object, **kwargs: object) -> list[str]:
        if len(sources) < 2:
            return compile_(sources, *args, **kwargs)
        start = time.monotonic()
        with ThreadPoolExecutor(jobs) as pool:  # gcc runs in its own process: threads are enough
            largest_first = sorted(sources, key=lambda s: -os.path.getsize(s))
            objects = {source: pool.submit(compile_, [source], *args, **kwargs) for source in largest_first}
            pending, said = set(objects.values()), start
            while pending:
                _, pending = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
                now = time.monotonic()
                if now - said >= 5 or not pending:  # a line at least every ten seconds, not one per file
                    progress(f"compiling the core: {len(objects) - len(pending)} of {len(objects)} C files, {now - start:.0f} s")
                    said = now
        return [obj for source in sources for obj in objects[source].result()]

    return run


class BuildExt(build_ext):
    def build_extensions(self) -> None:
        self.compiler.compile = in_parallel(self.compiler.compile, len(os.sched_getaffinity(0)))
        self.built, self.said = itertools.count(1), time.monotonic()  # count: safe from build_ext's threads (--parallel)
        super().build_extensions()

    def build_extension(self, ext: object) -> None:
        super().build_extension(ext)
        built = next(self.built)  # the core's shared library, then a small module per compiled source
        if time.monotonic() - self.said >= 5 or built == len(self.extensions):
            progress(f"building the extensions: {built} of {len(self.extensions)}")
            self.said = time.monotonic()

    def run(self) -> None:
        super().run()
        if not self.dry_run:
            package_dir = HERE / "disque" if self.inplace else Path(self.build_lib) / "disque"
            (package_dir / compiled.STAMP).write_text(compiled.stamp(HERE))


def can_compile() -> bool:
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return shutil.which(compiler) is not None and headers.exists()


def extensions() -> list:
    if os.environ.get("DISQUE_PURE") or not can_compile():
        print("disque: no C compiler or Python headers (or DISQUE_PURE set): the core stays pure Python")
        return []
    from mypyc.build import mypycify

    with ticking(f"type-checking the {len(compiled.MODULES)} modules of the core and writing their C (mypyc)"):
        return mypycify(list(compiled.MODULES), group_name=compiled.GROUP, multi_file=True)


setup(cmdclass={"build_py": BuildPy, "build_ext": BuildExt, "sdist": Sdist}, ext_modules=extensions())
