"""The compiled core: which modules mypyc turns into C extensions, and when
their Python sources run instead.

Theory of operation: where a C compiler is found, the install (setup.py)
compiles MODULES with mypyc: the sans-IO core's job path, and the shell's
per-request path (the epoll client loop, the session runner, the node
clock, the RESP encoder and argument parsers).  The RESP request parser
stays Python: it is mostly calls into hiredis, and it works on bytearrays,
which the compiled build would treat as bytes.  Each extension
sits next to its source and Python's import system prefers it; the sources
stay the plain typed modules they are.  Next to the extensions the build
writes STAMP, a hash of the sources it compiled.  `choose()` runs when
`disque` is first imported: when DISQUE_PURE is set in the environment, or
when the sources no longer hash to STAMP (edited since the build: the
extensions are stale), it makes the import system load every module under
`disque/` from its source, so a stale extension never runs.  Without
extensions (no compiler, or DISQUE_PURE set at install) there is nothing
to choose.  docs/performance.md, "The compiled core".
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from importlib.abc import PathEntryFinder
from importlib.machinery import EXTENSION_SUFFIXES, SOURCE_SUFFIXES, FileFinder, SourceFileLoader
from pathlib import Path

MODULES = (
    "disque/core/node.py",
    "disque/core/outbox.py",
    "disque/core/memory.py",
    "disque/core/lifecycle.py",
    "disque/core/blocking.py",
    "disque/core/gate.py",
    "disque/store/ids.py",
    "disque/core/effects.py",
    "disque/core/acks.py",
    "disque/core/items.py",
    "disque/core/read_behind.py",
    "disque/core/types.py",
    "disque/store/job.py",
    "disque/store/jobs.py",
    "disque/store/queue.py",
    "disque/store/collected.py",
    "disque/store/scan.py",
    "disque/core/replication.py",
    "disque/core/handlers.py",
    "disque/cluster/messages.py",
    "disque/cluster/membership.py",
    "disque/core/federation.py",
    "disque/protocols/resp/commands.py",
    "disque/protocols/resp/table.py",
    "disque/protocols/resp/encoder.py",
    "disque/shell/clock.py",
    "disque/shell/session.py",
    "disque/shell/tcp.py",
)
STAMP = "COMPILED"  # in the package directory: the hash of the sources the extensions were built from
GROUP = "disque_core"  # mypyc's shared library is disque_core__mypyc, a top-level module

ROOT = Path(__file__).resolve().parent.parent  # the directory `disque/` is in


def sources_hash(root: Path = ROOT) -> str:
    digest = hashlib.sha256()
    for path in MODULES:
        digest.update((root / path).read_bytes())
    return digest.hexdigest()


def built(root: Path = ROOT) -> bool:
    """An extension of MODULES[0] is there."""
    source = root / MODULES[0]
    return any(source.with_suffix(suffix).exists() for suffix in EXTENSION_SUFFIXES)


def stale(root: Path = ROOT) -> bool:
    stamp = root / "disque" / STAMP
    return not stamp.exists() or stamp.read_text().strip() != sources_hash(root)


def choose() -> None:
    if not built():
        return
    if not os.environ.get("DISQUE_PURE"):
        if not stale():
            return
        logging.getLogger("disque").warning(
            "the compiled core is older than its sources: running the sources (reinstall, or `make`, to rebuild)"
        )
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
