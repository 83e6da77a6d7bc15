"""Errors are values: every refusal is a fresh error carrying its code, and
nothing of the refused request outlives the reply.

A raised exception keeps its traceback, and the traceback every frame and
argument of the request that failed.  An error object raised again and again
(a module-level instance) grows one traceback that keeps them all; these
tests refuse many large requests and check that memory stays flat, that a
reply keeps no traceback, and that no module of the package holds an
exception instance it could raise twice."""

from __future__ import annotations

import gc
import importlib
import pkgutil
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import disque
from disque.core import errors
from disque.core.errors import DisqueError
from disque.store.aof import parse_record
from support import Session, make_core

BIG = object()  # stands for a fresh 64 kB argument in each request

REFUSALS = [
    (("ADDJOB", "q", BIG, 0, "BOGUSOPTION"), "ERR syntax error"),
    (("ADDJOB", "q", BIG, "soon"), "ERR timeout is not an integer or out of range"),
    (("ADDJOB", "q", BIG, 0, "TTL", "0"), "ERR TTL must be a number > 0"),
    (("GETJOB", "COUNT", "x", "FROM", BIG), "ERR COUNT must be a number greater than zero"),
    (("QPEEK", BIG, "x"), "ERR value is not an integer or out of range"),
    (("QSCAN", "COUNT", "1", BIG), "ERR invalid cursor or option name"),
    (("ACKJOB", BIG), "BADID Invalid Job ID format."),
    (("CLIENT", "NOPE", BIG), "ERR Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME connection-name)"),
    (("CLUSTER", "NOPE", BIG), "ERR Wrong CLUSTER subcommand or number of arguments"),
    (("CLUSTER", "RESET", BIG), "ERR syntax error"),
]


def growth(action: Callable[[], object], times: int) -> int:
    """Bytes still allocated after running `action` `times` times."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(times):
            action()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def refuse(s: Session, argv: tuple[Any, ...]) -> DisqueError:
    reply = s(*[b"x" * 65536 if a is BIG else a for a in argv])
    assert isinstance(reply, DisqueError)
    return reply


@pytest.mark.parametrize("argv, wire", REFUSALS, ids=[" ".join(str(a) for a in argv if a is not BIG) for argv, _ in REFUSALS])
def test_refused_requests_leave_memory_flat(argv, wire):
    """200 refusals of 64 kB requests: before errors were values, each one
    kept its request alive (12.8 MB here)."""
    core, _, _ = make_core()
    s = Session(core)
    assert refuse(s, argv).wire() == wire.encode()
    assert growth(lambda: refuse(s, argv), 200) < 1 << 20


def test_an_error_reply_is_a_fresh_value_without_traceback():
    core, _, _ = make_core()
    s = Session(core)
    first, second = refuse(s, ("ADDJOB", "q", BIG, "soon")), refuse(s, ("ADDJOB", "q", BIG, "soon"))
    assert first is not second and first == second and hash(first) == hash(second)
    for reply in (first, second):
        assert reply.__traceback__ is None and reply.__context__ is None and reply.__cause__ is None
    assert first != errors.syntax() and first != "ERR timeout is not an integer or out of range"


def test_catalogue_entries_make_a_new_error_at_each_call():
    assert errors.syntax() is not errors.syntax()
    assert (errors.nojob().code, errors.nojob().message) == ("NOJOB", "Job not known in the context of this node.")


def test_an_incomplete_aof_record_leaves_memory_flat():
    """The AOF parser stops at an incomplete record by raising internally;
    a shared exception kept every buffer it was raised over."""
    assert parse_record(b"*2\r\n$7", 0) is None
    assert growth(lambda: parse_record(b"x" * 65536 + b"*2\r\n$7", 65536), 100) < 1 << 20


def exception_instances(value: Any, depth: int = 3) -> bool:
    """Is `value`, or anything in the containers it is, an exception instance?"""
    if isinstance(value, BaseException):
        return True
    if depth and isinstance(value, dict):
        value = list(value.values())
    if depth and isinstance(value, (list, tuple, set, frozenset)):
        return any(exception_instances(item, depth - 1) for item in value)
    return False


def holders(module: Any) -> Iterator[str]:
    """Names of the module's attributes, and of the class attributes of the
    classes it defines, that hold an exception instance."""
    for name, value in vars(module).items():
        if exception_instances(value):
            yield f"{module.__name__}.{name}"
        elif isinstance(value, type) and value.__module__ == module.__name__:
            yield from (f"{module.__name__}.{name}.{k}" for k, v in vars(value).items() if exception_instances(v))


def test_no_module_holds_an_exception_instance():
    """An error is created where it is raised: a module-level instance (alone
    or in a table) would collect the traceback of every raise."""
    modules = [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(disque.__path__, "disque.")
        if not info.name.endswith("__main__")  # importing it starts a node
    ]
    assert len(modules) > 30
    assert [name for module in modules for name in holders(module)] == []
