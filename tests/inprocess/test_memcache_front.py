"""The memcache port's front end through the session runner, in process under
the fake clock: the key of the VALUE line in both `memcache-value-key`
modes, the item size cap and the input it leaves in the memory account,
memcached's ASCII authentication over the core's AUTH path, and `/t=`
waits that end at their millisecond."""

from __future__ import annotations

from typing import Any

import pytest

from disque.core.config import Config, ConfigError, ConfigFileError, config_set, parse_config_text
from disque.core.timeouts import COMPACT_SLACK
from disque.protocols.memcache.front import memcache_front
from disque.shell.session import Sessions
from support import Deaf, Nowhere, Session, make_core, session_runner

TOO_LARGE = b"SERVER_ERROR object too large for cache\r\n"


def sessions(**config: Any) -> Sessions:
    core, _, _ = make_core(**config)
    core.tick()  # the first client cron: from now on the shell sleeps until the next one
    return session_runner(core, Nowhere(), Nowhere())


class Port:
    """A memcache connection served by the session runner, as on a node's
    memcache port; call it with bytes, get back what it was answered."""

    def __init__(self, runner: Sessions, authenticated: bool = True, addr: str = "127.0.0.1:40000") -> None:
        self.runner = runner
        self.conn = Deaf(runner.new_client(addr), memcache_front(runner.core.config))
        self.conn.client.authenticated = authenticated  # memcache-auth loopback, or no password
        runner.opened(self.conn)

    def __call__(self, data: bytes) -> bytes:
        assert self.runner.received(self.conn, data)
        self.runner.run(self.conn)
        return self.answered()

    def answered(self) -> bytes:
        out = b"".join(self.conn.out)
        self.conn.out.clear()
        return out


def tick(runner: Sessions, ms: int) -> None:
    runner.core.clock.advance(ms)  # type: ignore[attr-defined]
    runner.core.tick()
    runner.effects.apply(None)


# ------------------------------------------------------------------ the VALUE line

# Every GET that answers with an item, as Kestrel allows its options (spec/kestrel.md §3.1):
# in any order, t= with anything, unknown and empty pieces ignored.
FETCHING_KEYS = [
    b"work", b"work/t=10", b"work/t=0", b"work/t=-5", b"work/open", b"work/close/open", b"work/open/close",
    b"work/open/t=500", b"work/t=500/close/open", b"work/peek", b"work/peek/t=10", b"work/t=10/peek",
    b"work/x/open", b"work//peek", b"work+audit/open", b"work+audit/peek",
]  # fmt: skip


@pytest.mark.parametrize("mode", ["bare", "echo"])
@pytest.mark.parametrize("key", FETCHING_KEYS)
def test_the_value_line_names_the_bare_queue_or_echoes_the_key(mode: str, key: bytes) -> None:
    port = Port(sessions(memcache_value_key=mode))
    queue = key.split(b"/")[0]
    assert port(b"set %s 0 0 5\r\nhello\r\n" % queue) == b"STORED\r\n"
    named = queue if mode == "bare" else key
    assert port(b"get %s\r\n" % key) == b"VALUE %s 0 5\r\nhello\r\nEND\r\n" % named


@pytest.mark.parametrize("mode", ["bare", "echo"])
def test_the_gets_that_take_nothing_answer_end_in_both_modes(mode: str) -> None:
    port = Port(sessions(memcache_value_key=mode))
    port(b"set work 0 0 5\r\nhello\r\n")
    assert port(b"get work/open\r\n").startswith(b"VALUE ")
    assert port(b"get work/close\r\nget work/close\r\nget work/abort\r\n") == b"END\r\n" * 3  # acknowledged: gone
    assert port(b"get work/peek\r\nget work/t=0/open\r\nget work\r\n") == b"END\r\n" * 3


@pytest.mark.parametrize(("mode", "named"), [("bare", b"q"), ("echo", b"q/open/t=500")])
def test_a_waiting_get_served_later_names_its_key_as_the_mode_says(mode: str, named: bytes) -> None:
    runner = sessions(memcache_value_key=mode)
    waiting, producer = Port(runner), Port(runner)
    assert waiting(b"get q/open/t=500\r\n") == b""
    assert producer(b"set q 0 0 2\r\nhi\r\n") == b"STORED\r\n"
    assert waiting.answered() == b"VALUE %s 0 2\r\nhi\r\nEND\r\n" % named


def test_the_mode_is_config_set_able_and_applies_to_the_next_get() -> None:
    runner = sessions()
    port = Port(runner)
    port(b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n")
    assert port(b"get q/peek\r\n") == b"VALUE q 0 1\r\na\r\nEND\r\n"
    assert config_set(runner.config, "memcache-value-key", "echo") == ["memcache_value_key"]
    assert port(b"get q/peek\r\n") == b"VALUE q/peek 0 1\r\na\r\nEND\r\n"


# ------------------------------------------------------------------ item size and buffered input


def test_a_set_over_the_item_size_is_swallowed_unbuffered_and_refused_as_memcached_does() -> None:
    runner = sessions(memcache_max_item_size=1000)
    port = Port(runner)
    before = runner.core.memory.used
    port(b"set big 0 0 10000\r\n")
    for _ in range(3):  # 9,000 of the 10,000 bytes: none of them held
        assert port(b"x" * 3000) == b""
        assert port.conn.parser.buffered() == 0 and runner.core.memory.used == before
    assert port(b"x" * 1000 + b"\r\nget big\r\n") == TOO_LARGE + b"END\r\n"
    assert port(b"set big 0 0 10000 noreply\r\n" + b"x" * 10002 + b"get big\r\n") == b"END\r\n"  # silent
    assert runner.core.items.cmd_set == 2 and not port.conn.closing
    assert port(b"set ok 0 0 1000\r\n" + b"x" * 1000 + b"\r\n") == b"STORED\r\n"  # the limit itself fits


def test_config_set_of_the_item_size_reaches_open_connections() -> None:
    runner = sessions(memcache_max_item_size=1000)
    port = Port(runner)
    assert port(b"set q 0 0 2000\r\n" + b"x" * 2000 + b"\r\n") == TOO_LARGE
    config_set(runner.config, "memcache-max-item-size", "2kb")
    assert port(b"set q 0 0 2000\r\n" + b"x" * 2000 + b"\r\n") == b"STORED\r\n"


@pytest.mark.parametrize("value", ["0", "-1", "513mb", "1gb"])
def test_the_item_size_is_between_one_byte_and_512mb(value: str) -> None:
    config = Config()
    with pytest.raises(ConfigError, match="Invalid argument"):
        config_set(config, "memcache-max-item-size", value)
    with pytest.raises(ConfigFileError, match="between 1 and 512mb"):
        parse_config_text(f"memcache-max-item-size {value}", config)
    parse_config_text("memcache-max-item-size 512mb\nmemcache-value-key ECHO", config)
    assert (config.memcache_max_item_size, config.memcache_value_key, config.memcache_auth) == (512 << 20, "echo", "password")


def test_a_partial_request_counts_in_used_memory_until_it_is_run_or_gone() -> None:
    runner = sessions()
    core = runner.core
    port = Port(runner)
    before = core.memory.used
    assert port(b"set q 0 0 100000\r\n" + b"x" * 60_000) == b""
    held = port.conn.parser.buffered()
    assert held >= 60_000 and core.memory.used == before + held
    assert port(b"x" * 40_000 + b"\r\n") == b"STORED\r\n"
    assert port.conn.parser.buffered() == 0 and port.conn.input_counted == 0
    job_cost = core.memory.used - before  # the job (and its queue), no input left
    other = Port(runner)
    other(b"set r 0 0 100000\r\n" + b"y" * 50_000)
    assert core.memory.used == before + job_cost + other.conn.parser.buffered()
    runner.gone(other.conn)  # its input goes with it
    assert core.memory.used == before + job_cost


# ------------------------------------------------------------------ authentication


def test_with_a_password_a_client_authenticates_as_memcached_does_first() -> None:
    runner = sessions(requirepass="s3cret")
    core, host = runner.core, runner.core.host
    port = Port(runner, authenticated=False)
    unauthenticated = b"CLIENT_ERROR unauthenticated\r\n"
    assert port(b"get q\r\nflush_all\r\nshutdown\r\ndelete q\r\n") == unauthenticated * 4
    assert not port.conn.closing and ("shutdown", False) not in host.calls  # type: ignore[attr-defined]
    assert port(b"set any 0 0 11\r\ndefault bad\r\n") == b"CLIENT_ERROR authentication failure\r\n"
    assert port(b"set any 0 0 12\r\nadmin s3cret\r\n") == b"CLIENT_ERROR authentication failure\r\n"  # no such user
    assert core.stats.auth_failures == 2 and not port.conn.client.authenticated
    assert port(b"set any 0 0 14 noreply\r\ndefault s3cret\r\n") == b"STORED\r\n"  # answered even with noreply
    assert port(b"set q 0 0 1\r\nx\r\nget q\r\n") == b"STORED\r\nVALUE q 0 1\r\nx\r\nEND\r\n"
    assert core.queues.get(b"any") is None and core.items.cmd_set == 1  # the credentials are no item


def test_wrong_passwords_past_the_free_tries_are_answered_late() -> None:
    runner = sessions(requirepass="s3cret")
    port = Port(runner, authenticated=False)
    failure = b"CLIENT_ERROR authentication failure\r\n"
    wrong = b"set any 0 0 11\r\ndefault bad\r\n"
    assert port(wrong * 3) == failure * 3
    assert port(wrong + b"get q\r\n") == b""  # the core's AUTH slowdown: it waits, and so does what follows
    tick(runner, 99)
    assert port.answered() == b""
    tick(runner, 1)
    assert port.answered() == failure + b"CLIENT_ERROR unauthenticated\r\n"


def test_a_large_request_before_authenticating_closes_the_connection() -> None:
    runner = sessions(requirepass="s3cret")
    port = Port(runner, authenticated=False)
    out = port(b"set any 0 0 100000\r\n" + b"x" * 20_000)
    assert out.startswith(b"CLIENT_ERROR ") and out.endswith(b"\r\n") and port.conn.closing


# ------------------------------------------------------------------ /t= to the millisecond


def test_a_waiting_get_ends_exactly_t_ms_later_and_wakes_the_shell_for_it() -> None:
    runner = sessions()
    core, host = runner.core, runner.core.host
    promised = core.next_deadline()  # the shell sleeps until the next client cron
    port = Port(runner)
    start = core.clock.now_ms()
    assert port(b"get q/t=30\r\n") == b""
    assert host.wakes == [start + 30] and start + 30 < promised  # type: ignore[attr-defined]
    assert core.next_deadline() == start + 30
    tick(runner, 29)
    assert port.answered() == b""
    tick(runner, 1)
    assert port.answered() == b"END\r\n" and core.items.get_misses == 1
    assert Port(runner)(b"get q/t=500\r\n") == b"" and len(host.wakes) == 1  # type: ignore[attr-defined]  # later than the cron


def test_getjob_timeout_is_kept_to_the_millisecond_too() -> None:
    runner = sessions()
    core = runner.core
    resp = Session(core)
    assert resp("GETJOB", "TIMEOUT", 45, "FROM", "q") is not None  # BLOCKED
    core.clock.advance(44)  # type: ignore[attr-defined]
    core.tick()
    assert resp.pending() == []
    core.clock.advance(1)  # type: ignore[attr-defined]
    core.tick()
    assert len(resp.pending()) == 1 and not core.blocking.blocked


def test_served_waits_leave_no_wake_up_behind_and_their_entries_are_compacted() -> None:
    runner = sessions()
    core = runner.core
    producer = Port(runner)
    first, second = Port(runner), Port(runner)
    start = core.clock.now_ms()
    first(b"get q/t=40\r\n")
    second(b"get other/t=60\r\n")
    producer(b"set q 0 0 1\r\na\r\n")  # serves the first
    assert first.answered().startswith(b"VALUE") and core.next_deadline() == start + 60
    for _ in range(3 * COMPACT_SLACK):  # many waits served before their deadline
        Port(runner)(b"get q/t=5000\r\n")
        producer(b"set q 0 0 1\r\nb\r\n")
    assert len(core.blocking.timeouts.heap) <= 2 * core.blocking.timeouts.live + COMPACT_SLACK and core.blocking.timeouts.live == 1
    tick(runner, 60)
    assert second.answered() == b"END\r\n" and core.blocking.timeouts.live == 0
    core.clock.advance(5000)  # type: ignore[attr-defined]
    core.tick()  # the served waits' deadlines pass: nobody is answered twice
    assert core.blocking.timeouts.heap == [] and core.blocking.timeouts.next() is None


def test_a_set_over_max_job_size_names_it() -> None:
    """A SET the memcache port reads (within memcache-max-item-size) is still
    a job: over max-job-size it is refused with the setting's name."""
    port = Port(sessions(max_job_size=4))
    assert port(b"set q 0 0 5\r\nhello\r\n") == (
        b"SERVER_ERROR ERR Job body of 5 bytes is larger than max-job-size (4 bytes)\r\n"
    )
    assert port(b"set q 0 0 4\r\nhell\r\n") == b"STORED\r\n"
