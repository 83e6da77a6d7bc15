"""Build hooks (everything else is in pyproject.toml): built from a git
checkout, the sdist and the wheel record its revision in disque/REVISION,
which `--version` and INFO read once installed (disque/version.py).  A wheel
built from the sdist keeps the sdist's record."""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).parent.resolve()
sys.path.insert(0, str(HERE))

from disque.version import RECORD, from_git  # noqa: E402  (the source tree being built)


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


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
