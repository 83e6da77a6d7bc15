"""Build hooks (everything else is in pyproject.toml).

* Built from a git checkout, the sdist and the wheel record its revision in
  disque/REVISION, which `--version` and INFO read once installed
  (disque/version.py).  A wheel built from the sdist keeps the sdist's record.
* Where a C compiler is found and DISQUE_PURE is not set, mypyc compiles the
  modules listed in disque/compiled.txt into extensions next to the sources,
  and disque/COMPILED records the hash, sizes and mtimes of the sources
  compiled (disque/compiled.py).
"""

import os
import shutil
import sys
import sysconfig
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


class BuildExt(build_ext):
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

    return mypycify(list(compiled.MODULES), group_name=compiled.GROUP)


setup(cmdclass={"build_py": BuildPy, "build_ext": BuildExt, "sdist": Sdist}, ext_modules=extensions())
