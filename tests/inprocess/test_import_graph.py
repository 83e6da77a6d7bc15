"""The core's boundary and its import graph, read from the sources.

The core is every module under `disque/core`, `disque/store`,
`disque/cluster` and `disque/protocols` (the front ends).  It
must not reach the outside world (no trio, sockets, files, clocks, random
sources or processes: the shell injects those), must not import the shell
or the tools built on it, and must not import in a loop.  The folders are
layers, store <- cluster <- core <- protocols (<- shell): a module imports
only from its own layer or the layers below.  Imports inside functions
count, and so do `if TYPE_CHECKING:` ones, for the layers and for cycles: a
type-only back reference is still a dependency a reader has to hold in
their head.

`python tests/inprocess/test_import_graph.py` prints the graph, one module and
what it imports per line.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "disque"
CORE_FOLDERS = ("core", "store", "cluster", "protocols")
LAYERS = ("store", "cluster", "core", "protocols")  # bottom up: each may import the ones before it

FORBIDDEN = {
    "trio", "anyio", "socket", "os", "sys", "time", "random", "select", "selectors", "ssl", "signal",
    "fcntl", "subprocess", "threading", "asyncio", "pathlib", "shutil", "tempfile", "io",
}  # fmt: skip
OUTSIDE = ("disque.shell", "disque.cli", "disque.client", "disque.version", "disque.testing.devcluster")

def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_files() -> dict[str, Path]:
    files = [p for folder in CORE_FOLDERS for p in (PACKAGE / folder).rglob("*.py")]
    return {module_name(p): p for p in sorted(files)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, only for type checking) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, typing_only)
            else:
                visit_stmt(child, typing_only)

    def visit_stmt(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.append((target, typing_only))
            # `from disque.core import errors` imports the module disque.core.errors
            found.extend((f"{target}.{alias.name}", typing_only) for alias in node.names)
        visit(node, typing_only)

    visit(tree, False)
    return found


def graph() -> dict[str, set[str]]:
    files = core_files()
    return {
        name: {target for target, _ in imports(name, path) if target in files and target != name}
        for name, path in files.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


@pytest.mark.parametrize("name", sorted(core_files()))
def test_the_core_does_no_io_and_stays_inside(name: str) -> None:
    bad = sorted(
        target
        for target, typing_only in imports(name, core_files()[name])
        if (target.split(".")[0] in FORBIDDEN and not typing_only) or target.startswith(OUTSIDE)
    )
    assert not bad, f"{name} imports {bad}"


CLIENT_MAY_IMPORT = (
    "disque.client",  # its own modules
    "disque.core.errors",  # DisqueReplyError is a DisqueError
    "disque.store.ids",  # node_prefix: which node created a job (affinity)
    "disque.store.failure",  # LIMITS: a NACK ... ERROR's fields cut to the node's size rule
    "disque.shell.tls",  # client_context, imported only when tls=True
)


@pytest.mark.parametrize("path", sorted((PACKAGE / "client").glob("*.py")), ids=lambda p: p.name)
def test_the_client_is_a_leaf(path: Path) -> None:
    """The client library runs beside applications, not in a node: of the
    server it uses only the pure helpers above, so no node code loads with it."""
    name = module_name(path)
    bad = sorted(
        target
        for target, _ in imports(name, path)
        if target.startswith("disque") and not target.startswith(CLIENT_MAY_IMPORT)
    )
    assert not bad, f"{name} imports {bad}"


@pytest.mark.parametrize("name", sorted(core_files()))
def test_every_core_module_imports(name: str) -> None:
    """Importing each one also lets the coverage gate see a module no test uses."""
    assert importlib.import_module(name).__name__ == name


def test_the_core_imports_one_way() -> None:
    """No import loop, counting imports inside functions and those made for
    annotations only (TYPE_CHECKING): a concern gets its collaborators
    passed in and sees the ones above it through a small protocol of its
    own (core/lifecycle.py's hooks), never by importing them back."""
    assert cycles(graph()) == []


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[1])


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import of a module from a layer above its own."""
    return [f"{a} -> {b}" for a in sorted(edges) if a.count(".") > 1 for b in sorted(edges[a])
            if b.count(".") > 1 and layer(b) > layer(a)]  # fmt: skip


def test_the_folders_are_layers() -> None:
    """store <- cluster <- core <- protocols: nothing imports upward (the
    package markers `disque.core` etc. hold nothing and are left out)."""
    assert upward_imports(graph()) == []


def test_upward_imports_are_found() -> None:
    edges = {"disque.store.a": {"disque.cluster.b"}, "disque.cluster.b": {"disque.store.a"}, "disque.core.c": {"disque.core"}}
    assert upward_imports(edges) == ["disque.store.a -> disque.cluster.b"]


def state_assignments(path: Path) -> list[int]:
    """Lines that store to an attribute named `state`."""
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and t.attr == "state" and isinstance(t.ctx, ast.Store):
                    lines.append(t.lineno)
    return lines


@pytest.mark.parametrize("name", sorted(set(core_files()) - {"disque.store.job"}))
def test_a_job_changes_state_only_through_move(name: str) -> None:
    """`Job.move` in store/job.py is the one place a job's state changes."""
    assert state_assignments(core_files()[name]) == []


def test_state_assignments_are_found(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("job.state = 1\nx.y.state += 1\na, b.state = 1, 2\nstate = 3\nread = job.state\n")
    assert state_assignments(path) == [1, 2, 3]


def _chain(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def core_pokes(path: Path) -> set[str]:
    """`core.<attr>` chains the file assigns to (through `self.` or not)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store):
                    chain = _chain(t).removeprefix("self.")
                    if chain.startswith("core."):
                        found.add(chain)
    return found


def test_the_shell_calls_the_core_instead_of_writing_into_it() -> None:
    pokes = {chain for path in (PACKAGE / "shell").glob("*.py") for chain in core_pokes(path)}
    assert not pokes, f"the shell writes {sorted(pokes)} into the core: add an entry point"


def test_core_pokes_are_found(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("self.core.loading = True\ncore.stats.x += 1\nself.core_ish = 1\ncore = 2\n")
    assert core_pokes(path) == {"core.loading", "core.stats.x"}


def test_the_cycle_finder_sees_a_loop_and_a_dag() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_are_resolved_and_type_checking_is_told_apart(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\nimport os\nfrom . import sibling\nfrom ..up import thing\n"
        "if TYPE_CHECKING:\n    import random\n\ndef f():\n    from disque.shell import server\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    found = set(imports("disque.core.mod", path))
    assert ("os", False) in found and ("random", True) in found
    assert ("disque.core.sibling", False) in found and ("disque.up.thing", False) in found
    assert ("disque.shell.server", False) in found


if __name__ == "__main__":
    for module, targets in graph().items():
        print(f"{module} -> {', '.join(sorted(targets)) or '(nothing)'}")
    loops = cycles(graph())
    print("loops:", "; ".join(" -> ".join(c + c[:1]) for c in loops) if loops else "none", file=sys.stderr)
