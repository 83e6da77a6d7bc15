"""The session runner's limits, fuzzed in process: what a client that has not
authenticated can make the node buffer, and how much output a client that
never reads can make it hold."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque.protocols.resp.front import RESP
from disque.shell.session import OUTPUT_PAUSE, UNAUTHENTICATED_REQUEST_MAX, Sessions
from support import Deaf, Nowhere, make_core, session_runner

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def sessions(**config: Any) -> Sessions:
    core, _, _ = make_core(**config)
    return session_runner(core, Nowhere(), Nowhere())


def connect(runner: Sessions) -> Deaf:
    conn = Deaf(runner.new_client("10.0.0.1:5000"), RESP)
    runner.opened(conn)
    return conn


# Pieces an attacker would send before AUTH: huge declared lengths, the
# start of a huge argument, many small arguments, and noise.
pre_auth_chunks = st.lists(
    st.one_of(
        st.just(b"*2\r\n$4\r\nAUTH\r\n$524288000\r\n"),
        st.just(b"*1000000\r\n"),
        st.just(b"$1\r\na\r\n" * 500),
        st.builds(lambda n: b"x" * n, st.integers(1, 40_000)),
        st.just(b"AUTH wrong\r\n"),
        st.binary(max_size=300),
    ),
    min_size=1,
    max_size=30,
)


@FUZZ
@given(pre_auth_chunks)
def test_fuzz_an_unauthenticated_client_is_closed_before_it_buffers_more_than_the_cap(chunks: list[bytes]) -> None:
    runner = sessions(requirepass="secret")
    conn = connect(runner)
    for chunk in chunks:
        if not runner.received(conn, chunk):
            break
        runner.run(conn)
        if conn.closing:
            break
        assert conn.parser.buffered() <= UNAUTHENTICATED_REQUEST_MAX + 1024  # hiredis keeps up to 1 KiB it has read
    assert not conn.client.authenticated


def test_an_authenticated_client_may_send_large_requests() -> None:
    runner = sessions(requirepass="secret")
    conn = connect(runner)
    body = b"b" * (UNAUTHENTICATED_REQUEST_MAX * 4)
    runner.received(conn, b"AUTH secret\r\n*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$%d\r\n" % len(body))
    runner.run(conn)
    runner.received(conn, body[: len(body) // 2])
    runner.run(conn)
    assert not conn.closing
    runner.received(conn, body[len(body) // 2 :] + b"\r\n$1\r\n0\r\n")
    runner.run(conn)
    assert not conn.closing and runner.core.stats.commands == 2


@settings(FUZZ, max_examples=60)
@given(st.integers(1, 200), st.lists(st.integers(1, 64 * 1024), min_size=1, max_size=20))
def test_fuzz_a_client_that_never_reads_holds_at_most_the_pause_and_one_reply(requests: int, reads: list[int]) -> None:
    """However its pipeline of QPEEKs (50 KB of reply each) arrives, the
    runner stops executing it once the unsent output is past OUTPUT_PAUSE."""
    runner = sessions()
    loader = connect(runner)
    runner.received(loader, b"".join(b"ADDJOB q %s 0\r\n" % (b"j" * 1000) for _ in range(50)))
    runner.run(loader)
    one_reply = 50 * 1100  # a QPEEK of the 50 jobs is less
    conn = connect(runner)
    stream = b"QPEEK q 50\r\n" * requests
    pos = 0
    for size in reads * (len(stream) // sum(reads) + 1):
        runner.received(conn, stream[pos : pos + size])
        pos += size
        runner.run(conn)
        assert conn.out_size <= OUTPUT_PAUSE + one_reply
        if pos >= len(stream):
            break
    ran = runner.core.stats.calls["qpeek"][0]
    assert ran == requests or (conn.held and conn.out_size > OUTPUT_PAUSE and ran < 30)


def test_a_client_waiting_for_its_late_auth_answer_cannot_pile_up_input() -> None:
    """After three wrong passwords the fourth answer comes late and the
    client runs nothing meanwhile; what it sends in that time counts against
    the cap too."""
    runner = sessions(requirepass="secret")
    conn = connect(runner)
    runner.received(conn, b"AUTH wrong\r\n" * 4)
    runner.run(conn)
    assert conn.client.waiter is not None and not conn.closing
    runner.received(conn, b"PING\r\n" * 3000)  # 18 KB while it waits
    runner.run(conn)
    assert conn.closing and conn.out[-1] == b"-ERR Protocol error: unauthenticated request too long\r\n"
