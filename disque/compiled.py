"""The compiled core: which modules mypyc turns into C extensions, and when
their Python sources run instead.

Theory of operation: where a C compiler is found, the install (setup.py)
compiles MODULES with mypyc: the sans-IO core's job path, and the shell's
per-request path (the epoll client loop, the session runner, the node
clock, the RESP request parser, encoder and argument parsers).  The list is
LIST, a plain text file the Makefile reads too.  The request parser works
on bytearrays, which mypyc keeps apart from bytes since mypy 2.0 (the build
requirement).  Each extension sits next to its
source and Python's import system prefers it; the sources stay the plain
typed modules they are.  Next to the extensions the build writes STAMP: a
hash of the sources it compiled, then each source's size and mtime.

`choose()` runs when `disque` is first imported and costs a few stat calls:
with DISQUE_PURE set it makes the import system load every module under
`disque/` from its source; otherwise it only puts a finder in front of the
import system, which checks the build when the first compiled module is
imported (a program that imports only the client checks nothing it does not
load).  The sources are fresh when their sizes and mtimes are the recorded
ones (the rule Python's own bytecode cache follows) or, failing that, when
they hash to the recorded hash; stale (edited since the build), they run
instead of the extensions, with a warning, so a stale extension never runs.
Without extensions (no compiler, or DISQUE_PURE set at install) there is
nothing to choose.  docs/running.md, "The compiled core".
"""

from __future__ import annotations

import _thread
import os
import sys
from collections.abc import Iterable, Sequence
from importlib.machinery import EXTENSION_SUFFIXES, SOURCE_SUFFIXES, FileFinder, ModuleSpec, SourceFileLoader
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importlib.abc loads importlib.resources: a tenth of `disque --version`'s time
    from importlib.abc import PathEntryFinder

LIST = "compiled.txt"  # in the package directory: the modules to compile, one path a line
STAMP = "COMPILED"  # in the package directory: what the extensions were built from
GROUP = "disque_core"  # mypyc's shared library is disque_core__mypyc, a top-level module

ROOT = Path(__file__).resolve().parent.parent  # the directory `disque/` is in


def read_list(root: Path = ROOT) -> tuple[str, ...]:
    lines = (line.strip() for line in (root / "disque" / LIST).read_text().splitlines())
    return tuple(line for line in lines if line.startswith("disque/") and line.endswith(".py"))


MODULES = read_list()


def sources_hash(root: Path = ROOT) -> str:
    import hashlib  # only when a stamp is written or the sizes and mtimes differ

    digest = hashlib.sha256()
    for path in MODULES:
        digest.update((root / path).read_bytes())
    return digest.hexdigest()


def sources_stats(root: Path = ROOT) -> list[str]:
    stats = [((root / path).stat(), path) for path in MODULES]
    return [f"{stat.st_size} {stat.st_mtime_ns} {path}" for stat, path in stats]


def stamp(root: Path = ROOT) -> str:
    """What the build records in STAMP."""
    return "\n".join([sources_hash(root), *sources_stats(root)]) + "\n"


def built(root: Path = ROOT) -> bool:
    """An extension of MODULES[0] is there."""
    source = root / MODULES[0]
    return any(source.with_suffix(suffix).exists() for suffix in EXTENSION_SUFFIXES)


def stale(root: Path = ROOT) -> bool:
    try:
        recorded = (root / "disque" / STAMP).read_text().splitlines()
        return recorded[1:] != sources_stats(root) and recorded[:1] != [sources_hash(root)]
    except FileNotFoundError:  # no stamp, or a compiled source gone: nothing is known to match
        return True


def choose() -> None:
    if not built():
        return
    if os.environ.get("DISQUE_PURE"):
        run_sources()
    else:
        sys.meta_path.insert(0, FirstCompiledImport(p[:-3].replace("/", ".") for p in MODULES))


class FirstCompiledImport:
    """Checks the build when a compiled module is first imported, then steps
    aside: it finds nothing itself (a meta path finder: `find_spec` is all
    the import system asks of one)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.lock = _thread.allocate_lock()  # two threads importing two compiled modules: one check (threading's own lock, without loading threading)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> ModuleSpec | None:
        if fullname in self.names:
            with self.lock:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                    if stale():
                        import logging

                        logging.getLogger("disque").warning(
                            "the compiled core is older than its sources: running the sources (reinstall, or `make`, to rebuild)"
                        )
                        run_sources()
        return None


def run_sources() -> None:
    """Every module under `disque/` not imported yet loads from its source."""
    package = str(ROOT / "disque")
    sources = FileFinder.path_hook((SourceFileLoader, SOURCE_SUFFIXES))

    def sources_only(path: str) -> PathEntryFinder:
        if not path.startswith(package):
            raise ImportError  # not ours: the next hook's
        return sources(path)

    sys.path_hooks.insert(0, sources_only)
    for path in [p for p in sys.path_importer_cache if p.startswith(package)]:
        del sys.path_importer_cache[path]


def active() -> bool:
    """The job path runs compiled: NodeCore's module is an extension."""
    from disque.core import node

    return not (node.__file__ or "").endswith(".py")
