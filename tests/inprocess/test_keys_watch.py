"""QKEYS (docs/keys.md "Watching keys"): a queue's keys with jobs queued
on this node and the busiest of them, read from the queue's lanes
(store/queue.py `Fair.busiest`); its bounds and errors, fuzzed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disque.core.errors import DisqueError, err, not_integer
from disque.core.figures import key_figures, node_figures
from disque.core.types import Map
from disque.protocols.resp.commands import QKEYS_MAX, QKEYS_SYNTAX

from jobenv import env, make_env  # noqa: F401 (fixtures)


def qkeys(env, queue="q", *opts) -> dict[bytes, object]:
    reply = env.s("QKEYS", queue, *opts)
    assert type(reply) is Map
    return dict(reply)


def test_a_queue_without_keyed_jobs_has_no_keys(env) -> None:
    assert qkeys(env, "missing") == {b"keys": 0, b"jobs": 0, b"busiest": []}
    env.add("q", "plain")
    assert qkeys(env) == {b"keys": 0, b"jobs": 0, b"busiest": []}  # plain jobs are no key's


def test_the_busiest_keys_most_jobs_first_ties_by_key(env) -> None:
    for key, n in (("c", 2), ("a", 3), ("b", 2), ("d", 1)):
        for i in range(n):
            env.add("q", f"{key}{i}", "KEY", key)
    env.add("q", "plain")
    assert qkeys(env) == {b"keys": 4, b"jobs": 8, b"busiest": [b"a", 3, b"b", 2, b"c", 2, b"d", 1]}
    assert qkeys(env, "q", "count", 2)[b"busiest"] == [b"a", 3, b"b", 2]
    assert qkeys(env, "q", "COUNT", QKEYS_MAX)[b"keys"] == 4
    env.check()


def test_keys_whose_jobs_are_gone_are_not_counted(env) -> None:
    a0 = env.add("q", "a0", "KEY", "a")
    env.add("q", "b0", "KEY", "b")
    env.add("q", "b1", "KEY", "b")
    assert env.s("DEQUEUE", a0) == 1  # a tombstone left in the lane of "a"
    assert qkeys(env) == {b"keys": 1, b"jobs": 2, b"busiest": [b"b", 2]}
    assert len(env.s("GETJOB", "COUNT", 2, "FROM", "q")) == 2
    assert qkeys(env) == {b"keys": 0, b"jobs": 0, b"busiest": []}
    env.check()


def test_the_reply_is_a_map_in_resp3(env) -> None:
    env.add("q", "a0", "KEY", "a")
    assert env.s.raw("HELLO", 3).startswith(b"%")
    assert env.s.raw("QKEYS", "q") == b"%3\r\n$4\r\nkeys\r\n:1\r\n$4\r\njobs\r\n:1\r\n$7\r\nbusiest\r\n*2\r\n$1\r\na\r\n:1\r\n"


def test_errors(env) -> None:
    assert env.s("QKEYS", "q", "COUNT", 0) == err(f"COUNT must be between 1 and {QKEYS_MAX}")
    assert env.s("QKEYS", "q", "COUNT", QKEYS_MAX + 1) == err(f"COUNT must be between 1 and {QKEYS_MAX}")
    assert env.s("QKEYS", "q", "COUNT", "many") == not_integer()  # a count of the wrong type
    assert env.s("QKEYS", "q", "COUNT") == err(QKEYS_SYNTAX)
    assert env.s("QKEYS", "q", "LIMIT", 5) == err(QKEYS_SYNTAX)
    assert env.s("QKEYS", "q", "COUNT", 1, "COUNT", 2) == err(QKEYS_SYNTAX)
    assert env.s("QKEYS") == err("wrong number of arguments for 'qkeys' command")


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(st.sampled_from([b"a", b"b", b"c", b"\xff", b"k" * 1024]), max_size=20),
    argv=st.lists(st.sampled_from([b"COUNT", b"count", b"1", b"3", b"0", b"-1", b"1000", b"1001", b"x", b""]), max_size=4),
)
def test_fuzzed_arguments_answer_the_spec_or_an_error(jobs: list[bytes], argv: list[bytes]) -> None:
    env = make_env()
    for key in jobs:
        env.add("q", "b", "KEY", key)
    reply = env.s("QKEYS", "q", *argv)
    if isinstance(reply, DisqueError):
        assert reply.code == "ERR" and reply.message in (QKEYS_SYNTAX, f"COUNT must be between 1 and {QKEYS_MAX}", not_integer().message)
        return
    count = int(argv[1]) if argv else 10
    shown = dict(reply)
    want = sorted({k: jobs.count(k) for k in jobs}.items(), key=lambda kv: (-kv[1], kv[0]))
    assert shown == {b"keys": len(want), b"jobs": len(jobs), b"busiest": [v for pair in want[:count] for v in pair]}


def test_the_figures_show_the_queues_with_the_most_keyed_jobs_and_their_busiest_keys(env) -> None:
    """/metrics and the dashboard (core/figures.py key_figures): bounded in queues and keys per queue."""
    for queue, keys in (("small", "a"), ("big", "xyyzzz"), ("mid", "pqq")):
        for key in keys:
            env.add(queue, "b", "KEY", key)
    env.add("plain", "b")
    assert node_figures(env.core)["key_list"] == [
        {"queue": "big", "keys": 3, "jobs": 6, "busiest": [["z", 3], ["y", 2], ["x", 1]]},
        {"queue": "mid", "keys": 2, "jobs": 3, "busiest": [["q", 2], ["p", 1]]},
        {"queue": "small", "keys": 1, "jobs": 1, "busiest": [["a", 1]]},
    ]
    env.add("mid", "b", "KEY", b"\xff")
    assert key_figures(env.core, max_queues=2, top=1) == [
        {"queue": "big", "keys": 3, "jobs": 6, "busiest": [["z", 3]]},
        {"queue": "mid", "keys": 3, "jobs": 4, "busiest": [["q", 2]]},
    ]
    assert key_figures(env.core, top=4)[1]["busiest"][-1] == ["\\xff", 1]  # a key that is not text, escaped
