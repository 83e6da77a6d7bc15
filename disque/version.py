"""This copy's version and the git revision it was built from.

Theory of operation: run from a git checkout, the revision is asked of git,
so it is never stale; an installed copy reads `REVISION`, which setup.py
writes into the sdist and the wheel when it builds them from a checkout.
With neither, the revision is unknown and shows as Redis shows it,
`00000000`.  Only `--version` and the server's INFO ask, so git runs at most
once per process.  (No pathlib, and subprocess only when asking git:
`disque --version` should answer as fast as `disque --help`.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

from disque import __version__

PACKAGE = os.path.dirname(os.path.abspath(__file__))
RECORD = "REVISION"  # in the package directory of a built copy: "<sha> <dirty 0|1>"


@dataclass(frozen=True)
class Revision:
    sha: str  # the commit, abbreviated to 8 hex digits as Redis shows it
    dirty: bool  # tracked files differed from it

    def __str__(self) -> str:
        return f"git {self.sha}" + (", modified" if self.dirty else "")

    def record(self) -> str:
        return f"{self.sha} {int(self.dirty)}\n"

    @classmethod
    def parse(cls, text: str) -> Revision:
        sha, dirty = text.split()
        return cls(sha, dirty == "1")


def from_git(checkout: str | os.PathLike[str]) -> Revision | None:
    """HEAD of the work tree whose top is `checkout`; None if it is not one
    (an unpacked sdist inside some other repository must not take its HEAD)
    or git is missing."""
    if not os.path.exists(os.path.join(checkout, ".git")):
        return None
    import subprocess

    # No optional locks: `git status` must not take the index lock from someone committing.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=8", "HEAD"], cwd=checkout, env=env, capture_output=True, text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=checkout, env=env, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return Revision(sha, bool(status.stdout.strip()))


def recorded(package: str | os.PathLike[str] = PACKAGE) -> Revision | None:
    try:
        with open(os.path.join(package, RECORD), encoding="ascii") as f:
            return Revision.parse(f.read())
    except (OSError, ValueError):
        return None


@cache
def revision() -> Revision | None:
    return from_git(os.path.dirname(PACKAGE)) or recorded()


def describe(program: str) -> str:
    """`disque 0.2.0 (git 1a2b3c4d)`."""
    return f"{program} {__version__} ({revision() or 'git revision unknown'})"


def server_line() -> str:
    """`disque-server --version`, in the format of spec/config.md §1, which
    deployment tools parse."""
    rev = revision() or Revision("00000000", False)
    return f"Disque server v={__version__} sha={rev.sha}:{int(rev.dirty)} malloc=pymalloc bits=64 build=0"
