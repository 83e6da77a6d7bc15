"""Every reference to the behavioural contract resolves inside the repository.

The contract is `docs/spec/*.md`; code, tests, benchmarks, jepsen-lite and the
docs cite it in these forms, and nothing else uses the `§` sign:

* `spec/<file>.md §N[.M]`, with lists and ranges (`§2, §7`, `§5-§9`,
  `§8.2-8.4`) and a numbered step or item (`§8.2 step 3`, `§7 items 5-6`):
  the file is `docs/spec/<file>.md` and each section number is a heading
  of it (`## 8.`, `### 8.2 ...`); a step or item is a numbered list entry
  of that section;
* `spec/<file>.md` alone: the file exists;
* a bare `§N`: inside a Python module whose docstring names exactly one
  spec file (the section is that file's), or inside a spec file (its own
  section); the spec files cite each other as `<file>.md §N`;
* `house rule N`: rule N of the "House rules" section of docs/design.md.

A spec file named without `spec/` next to a section number (outside the
spec folder, `cluster.md` is the operator's page docs/cluster.md), a bare
`§` with no file to resolve against, and pointers to notes that are not in
the repository fail, each with its file and line.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "spec"
DESIGN = ROOT / "docs" / "design.md"
SCANNED = ("disque", "tests", "bench", "jepsen-lite", "docs", "examples", "conf", "README.md")
SUFFIXES = {".py", ".md", ".conf", ".txt", ".sh", ".toml", ".cfg", ".ini", ".html", ".js"}

NUM = r"\d+(?:\.\d+)*"
# One section, a range of them, and an optional numbered step or item.
SECTION = rf"§(?P<a>{NUM})(?:\s*[-–]\s*§?(?P<b>{NUM}))?(?:,?\s+(?:steps?|items?)\s+(?P<i>\d+)(?:\s*[-–]\s*(?P<j>\d+))?)?"
SECTION_RE = re.compile(SECTION)
ANY_SECTION = re.sub(r"\?P<\w+>", "", SECTION)
# `spec/x.md`, `x.md` or `` `x.md` ``, then a list of sections joined by commas or "and".
FILE_REF = re.compile(rf"(?:(?<![\w/.-])(?P<spec>(?:docs/)?spec/)|(?<![\w/.-]))(?P<name>[a-z][a-z0-9_-]*)\.md`?(?P<secs>\s*{ANY_SECTION}(?:\s*(?:,|and)\s*{ANY_SECTION})*)?")
BARE = re.compile(SECTION)
# A folder beside the checkout (the parent's `shared`), which a user's clone does not have.
OUTSIDE = "shared"
STRAY = re.compile(rf"ARCHITECTURE(?:\.md| habit)|(?:\.\./|/work/){OUTSIDE}\b|{OUTSIDE}/spec\b")
HOUSE_RULE = re.compile(r"[Hh]ouse rules? (\d+)(?:\s*(?:,|and|-|–)\s*(\d+))*")
HEADING = re.compile(rf"^#+\s+(?P<n>{NUM})\.?(?:\s|$)", re.M)


@dataclass(frozen=True)
class Ref:
    where: str  # path:line
    text: str  # the reference as written
    target: str  # the spec file, or "design.md" for a house rule
    sections: tuple[str, ...]  # section numbers the reference names
    items: tuple[int, ...]  # numbered steps/items within the (last) section


def spec_names() -> set[str]:
    return {p.stem for p in SPEC.glob("*.md")}


def headings(path: Path) -> dict[str, str]:
    """Section number -> the text of that section (to the next numbered heading)."""
    text = path.read_text()
    marks = list(HEADING.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m["n"]: text[m.end() : end] for m, end in zip(marks, ends)}


def house_rules() -> set[int]:
    text = DESIGN.read_text()
    part = text.split("\n## House rules", 1)
    if len(part) < 2:
        return set()
    body = part[1].split("\n## ", 1)[0]
    return {int(n) for n in re.findall(r"^(\d+)\. ", body, re.M)}


def module_spec(source: str) -> tuple[str | None, str]:
    """The one spec file a module's docstring names, or None and why."""
    try:
        doc = ast.get_docstring(ast.parse(source)) or ""
    except SyntaxError:
        return None, "not a parseable module"
    named = sorted({m["name"] for m in FILE_REF.finditer(doc) if m["spec"]})
    if len(named) == 1:
        return named[0], ""
    if not named:
        return None, "its module docstring names no spec/<file>.md"
    return None, f"its module docstring names several spec files ({', '.join(named)})"


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def sections_of(secs: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    numbers: list[str] = []
    items: tuple[int, ...] = ()
    for m in SECTION_RE.finditer(secs):
        numbers += [m["a"]] + ([m["b"]] if m["b"] else [])
        if m["i"]:
            items = (int(m["i"]),) + ((int(m["j"]),) if m["j"] else ())
    return tuple(numbers), items


def scan(rel: str, text: str, names: set[str]) -> tuple[list[Ref], list[str]]:
    """The references of one file, and the errors found without reading their targets."""
    refs: list[Ref] = []
    errors: list[str] = []
    in_spec = rel.startswith("docs/spec/")
    home, why = (Path(rel).stem, "") if in_spec else (None, "it is not a Python module")
    if rel.endswith(".py") and not in_spec:
        home, why = module_spec(text)
    taken: list[tuple[int, int]] = []
    for m in FILE_REF.finditer(text):
        name = m["name"]
        if name not in names:
            continue
        where = f"{rel}:{line_of(text, m.start())}"
        if not m["spec"] and not in_spec:
            if m["secs"] or not rel.endswith(".md"):
                # Outside docs/ a bare name is ambiguous; in docs/ only a section makes it the spec.
                errors.append(f"{where}: {m.group(0).strip()!r}: write spec/{name}.md")
            taken.append(m.span())
            continue
        if not m["spec"] and in_spec and not m["secs"]:
            taken.append(m.span())
            continue
        numbers, items = sections_of(m["secs"] or "")
        refs.append(Ref(where, m.group(0).strip(), name, numbers, items))
        taken.append(m.span())
    for m in BARE.finditer(text):
        if any(a <= m.start() < b for a, b in taken):
            continue
        where = f"{rel}:{line_of(text, m.start())}"
        if home is None:
            errors.append(f"{where}: {m.group(0)!r} has no spec file to resolve against: {why}")
            continue
        numbers, items = sections_of(m.group(0))
        refs.append(Ref(where, m.group(0), home, numbers, items))
    for m in STRAY.finditer(text):
        errors.append(f"{rel}:{line_of(text, m.start())}: {m.group(0)!r} points outside the repository")
    for m in HOUSE_RULE.finditer(text):
        rules = tuple(int(n) for n in re.findall(r"\d+", m.group(0)))
        refs.append(Ref(f"{rel}:{line_of(text, m.start())}", m.group(0), "design.md", (), rules))
    return refs, errors


def resolve(ref: Ref) -> str | None:
    """Why the reference does not resolve, or None."""
    if ref.target == "design.md":
        missing = [n for n in ref.items if n not in house_rules()]
        return f"docs/design.md has no house rule {missing}" if missing else None
    path = SPEC / f"{ref.target}.md"
    if not path.exists():
        return f"docs/spec/{ref.target}.md does not exist"
    heads = headings(path)
    for number in ref.sections:
        if number not in heads:
            return f"docs/spec/{ref.target}.md has no section {number}"
    if ref.items and ref.sections:
        body = heads[ref.sections[-1]]
        for item in ref.items:
            if not re.search(rf"^\s*{item}\. ", body, re.M):
                return f"section {ref.sections[-1]} of docs/spec/{ref.target}.md has no numbered entry {item}"
    return None


def files() -> list[Path]:
    out = []
    for entry in SCANNED:
        path = ROOT / entry
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        out += [p for p in candidates if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    # This file's strings are the checker's fixtures, broken references included.
    return [p for p in out if p != Path(__file__).resolve()]


def collect() -> tuple[list[Ref], list[str]]:
    names = spec_names()
    refs: list[Ref] = []
    errors: list[str] = []
    for path in files():
        found, wrong = scan(path.relative_to(ROOT).as_posix(), path.read_text(errors="replace"), names)
        refs += found
        errors += wrong
    return refs, errors


def test_the_contract_is_in_the_repository() -> None:
    assert spec_names() == {"commands", "cluster", "config", "persistence", "kestrel", "bananaq"}
    assert house_rules() >= set(range(1, 9))


def test_every_reference_resolves() -> None:
    refs, errors = collect()
    errors += [f"{ref.where}: {ref.text!r}: {why}" for ref in refs if (why := resolve(ref))]
    assert not errors, "\n".join(errors)
    # The scan finds what the code cites: a broken pattern would find nothing and pass.
    cited = {ref.target for ref in refs if not ref.where.startswith("docs/spec/")}
    assert cited >= {"commands", "cluster", "config", "persistence", "kestrel", "bananaq", "design.md"}
    assert sum(1 for ref in refs if ref.where.startswith("disque/")) >= 60


NAMES = {"cluster", "commands", "kestrel"}


@pytest.mark.parametrize(
    ("text", "target", "sections", "items"),
    [
        ("see spec/cluster.md §8.3.", "cluster", ("8.3",), ()),
        ("(spec/cluster.md §8.2 step 3, as upstream)", "cluster", ("8.2",), (3,)),
        ("spec/commands.md §7-9 and more", "commands", ("7", "9"), ()),
        ("spec/cluster.md §8.2-8.4, §8.8): REPLJOB", "cluster", ("8.2", "8.4", "8.8"), ()),
        ("spec/kestrel.md §1-§3.", "kestrel", ("1", "3"), ()),
        ("(spec/commands.md §12 item 5)", "commands", ("12",), (5,)),
        ("spec/kestrel.md.", "kestrel", (), ()),
    ],
)
def test_file_references_are_read_with_their_sections(text: str, target: str, sections: tuple[str, ...], items: tuple[int, ...]) -> None:
    (ref,), errors = scan("disque/x.py", f'"""{text}"""\n', NAMES)
    assert not errors
    assert (ref.target, ref.sections, ref.items) == (target, sections, items)


def test_a_bare_section_resolves_against_the_module_docstring() -> None:
    source = '"""Replication (spec/cluster.md §8.2)."""\n# the step (§8.2 step 1)\n'
    refs, errors = scan("disque/x.py", source, NAMES)
    assert not errors
    assert [(r.target, r.sections, r.items, r.where) for r in refs] == [
        ("cluster", ("8.2",), (), "disque/x.py:1"),
        ("cluster", ("8.2",), (1,), "disque/x.py:2"),
    ]


@pytest.mark.parametrize(
    ("rel", "text", "complaint"),
    [
        ("disque/x.py", '"""Jobs (cluster.md §8.0)."""\n', "write spec/cluster.md"),
        ("disque/x.py", '"""Jobs (cluster.md)."""\n', "write spec/cluster.md"),
        ("docs/x.md", "see cluster.md §7\n", "write spec/cluster.md"),
        ("disque/x.py", '"""No spec named."""\n# (§4)\n', "names no spec"),
        ("disque/x.py", '"""spec/cluster.md and spec/commands.md."""\n# (§4)\n', "several spec files"),
        ("docs/x.md", "a § 4 sign and §4 here\n", "not a Python module"),
        ("disque/x.py", '"""x"""\n# (ARCHITECTURE habit 5)\n', "points outside"),
        ("tests/x.py", f'SPEC = "../{OUTSIDE}/spec"\n', "points outside"),
    ],
)
def test_ambiguous_or_outside_references_are_errors(rel: str, text: str, complaint: str) -> None:
    _, errors = scan(rel, text, NAMES)
    assert len(errors) == 1 and complaint in errors[0], errors


def test_the_operator_pages_keep_their_plain_names() -> None:
    refs, errors = scan("docs/x.md", "[cluster](cluster.md#the-bus) and docs/cluster.md\n", NAMES)
    assert (refs, errors) == ([], [])


def test_a_missing_section_or_item_does_not_resolve() -> None:
    assert resolve(Ref("x:1", "", "cluster", ("8.3",), ())) is None
    assert resolve(Ref("x:1", "", "cluster", ("8.2",), (3,))) is None
    assert "no section 8.99" in (resolve(Ref("x:1", "", "cluster", ("8.99",), ())) or "")
    assert "no numbered entry 40" in (resolve(Ref("x:1", "", "cluster", ("8.2",), (40,))) or "")
    assert "does not exist" in (resolve(Ref("x:1", "", "nowhere", (), ())) or "")
    assert "no house rule [99]" in (resolve(Ref("x:1", "", "design.md", (), (99,))) or "")


def test_house_rules_are_references() -> None:
    (ref,), errors = scan("disque/x.py", '"""x"""\n# the link drops (house rule 5)\n', NAMES)
    assert not errors and (ref.target, ref.items) == ("design.md", (5,))
