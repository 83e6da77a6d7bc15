"""Tests for disque.store.queue_config: Kestrel's per-queue options."""

from __future__ import annotations

import pytest

from disque.store.queue_config import (
    BAD_ARITY,
    DEFAULTS,
    INT64_MAX,
    OPTIONS,
    QueueConfig,
    QueueConfigError,
    QueueSettings,
    fanout_parent,
)


def test_kestrel_defaults() -> None:
    assert DEFAULTS.pairs() == [
        ("max_items", "2147483647"),
        ("max_size", "9223372036854775807"),
        ("max_item_size", "9223372036854775807"),
        ("max_age", "0"),
        ("discard_old_when_full", "false"),
        ("journal", "true"),
        ("sync_journal", "false"),
        ("max_journal_size", "16777216"),
        ("max_journal_overflow", "10"),
        ("max_memory_size", "134217728"),
        ("max_journal_size_absolute", "9223372036854775807"),
        ("move_expired_to", ""),
        ("priority", "5"),  # not Kestrel's: PRIORITY's default for the queue
    ]
    assert OPTIONS == tuple(name for name, _ in DEFAULTS.pairs())
    assert QueueConfig().settings(b"anything") is DEFAULTS


def test_defaults_then_queue_then_child() -> None:
    config = QueueConfig()
    config.set_queue(["jobs", "max_items", "10", "journal", "no"])
    config.set_defaults(["max_items", "100", "max_age", "60000", "sync_journal", "yes"])
    jobs = config.settings(b"jobs")
    assert (jobs.max_items, jobs.max_age, jobs.journal, jobs.sync_journal) == (10, 60000, False, True)
    other = config.settings(b"other")
    assert (other.max_items, other.max_age, other.journal, other.sync_journal) == (100, 60000, True, True)
    assert config.settings(b"jobs+audit") is jobs  # a child uses its parent's settings
    assert config.settings(b"jobs+a+b") is jobs  # split at the first '+'
    assert config.settings(b"other+x") == other


def test_later_lines_win_option_by_option() -> None:
    config = QueueConfig()
    config.set_queue(["q", "max_items", "1", "max_size", "2"])
    config.set_queue(["q", "max_items", "3"])
    config.set_defaults(["max_items", "7"])
    config.set_defaults(["max_size", "8"])
    q = config.settings(b"q")
    assert (q.max_items, q.max_size) == (3, 2)
    assert (config.settings(b"r").max_items, config.settings(b"r").max_size) == (7, 8)


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("TRUE", True), ("yes", True), ("On", True), ("false", False), ("No", False), ("off", False)],
)
def test_booleans(text: str, value: bool) -> None:
    config = QueueConfig()
    config.set_defaults(["discard_old_when_full", text])
    assert config.settings(b"q").discard_old_when_full is value


def test_option_names_are_case_insensitive_and_take_dashes() -> None:
    config = QueueConfig()
    config.set_defaults(["MAX-ITEMS", "4", "Max_Memory_Size", "1024", "move-expired-to", "dlq"])
    q = config.settings(b"q")
    assert (q.max_items, q.max_memory_size, q.move_expired_to) == (4, 1024, b"dlq")
    config.set_defaults(["move_expired_to", ""])
    assert config.settings(b"q").move_expired_to is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], BAD_ARITY),
        (["max_items"], BAD_ARITY),
        (["max_items", "1", "journal"], BAD_ARITY),
        (["max_itemz", "1"], "unknown queue option 'max_itemz' (did you mean 'max_items'?)"),
        (["frobnicate", "1"], "unknown queue option 'frobnicate'"),
        (["max_items", "-1"], f"queue option 'max_items' must be an integer from 0 to {INT64_MAX}"),
        (["max_items", "1k"], f"queue option 'max_items' must be an integer from 0 to {INT64_MAX}"),
        (["max_items", ""], f"queue option 'max_items' must be an integer from 0 to {INT64_MAX}"),
        (["max_items", "\u0661"], f"queue option 'max_items' must be an integer from 0 to {INT64_MAX}"),
        (["max_size", str(INT64_MAX + 1)], f"queue option 'max_size' must be an integer from 0 to {INT64_MAX}"),
        (["journal", "1"], "queue option 'journal' must be true, false, yes or no"),
    ],
)
def test_bad_defaults(args: list[str], message: str) -> None:
    config = QueueConfig()
    config.set_defaults(["max_items", "5"])
    with pytest.raises(QueueConfigError) as info:
        config.set_defaults(args)
    assert str(info.value) == message
    assert config.settings(b"q").max_items == 5  # nothing of the bad line was kept


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], BAD_ARITY),
        (["q"], BAD_ARITY),
        (["q", "max_items"], BAD_ARITY),
        (["", "max_items", "1"], "the queue name is empty"),
        (["p+c", "max_items", "1"], "queue 'p+c' is a fanout child: it uses the settings of queue 'p'"),
        (["q", "max_items", "1", "bogus", "2"], "unknown queue option 'bogus'"),
    ],
)
def test_bad_queue_lines(args: list[str], message: str) -> None:
    config = QueueConfig()
    with pytest.raises(QueueConfigError) as info:
        config.set_queue(args)
    assert str(info.value) == message
    assert config.settings(b"q") is DEFAULTS
    assert config.directives() == []


def test_max_size_and_sizes_take_int64() -> None:
    config = QueueConfig()
    config.set_queue(["q", "max_size", str(INT64_MAX), "max_item_size", "0"])
    assert (config.settings(b"q").max_size, config.settings(b"q").max_item_size) == (INT64_MAX, 0)


def test_directives_rebuild_the_same_configuration() -> None:
    config = QueueConfig()
    config.set_defaults(["max_items", "100", "journal", "off"])
    config.set_queue(["jobs", "max_age", "1800000", "discard_old_when_full", "yes", "move_expired_to", "dead"])
    config.set_queue(["caf\udce9", "move_expired_to", ""])  # a non-UTF-8 name survives
    config.set_queue(["jobs", "max_age", "5"])
    lines = config.directives()
    assert lines == [
        ["queue-defaults", "max_items", "100", "journal", "false"],
        ["queue", "jobs", "max_age", "5", "discard_old_when_full", "true", "move_expired_to", "dead"],
        ["queue", "caf\udce9", "move_expired_to", ""],
    ]
    again = QueueConfig()
    for directive, *args in lines:
        (again.set_defaults if directive == "queue-defaults" else again.set_queue)(args)
    for name in (b"jobs", b"caf\xe9", b"other", b"jobs+x"):
        assert again.settings(name) == config.settings(name)
    assert again.directives() == lines


def test_fanout_parent() -> None:
    assert fanout_parent(b"q") is None
    assert fanout_parent(b"a+b") == b"a"
    assert fanout_parent(b"a+b+c") == b"a"


def test_full_tests_sizes_before_the_new_item() -> None:
    s = QueueSettings(max_items=2, max_size=100)
    assert not s.full(1, 99)
    assert s.full(2, 0)
    assert s.full(0, 100)
    assert not DEFAULTS.full(10**9, 10**15)


@pytest.mark.parametrize(
    ("max_age", "item_expiry", "added", "expiry"),
    [
        (0, 0, 1000, 0),  # no cap, no expiry
        (0, 5000, 1000, 5000),
        (500, 0, 1000, 1500),  # the cap alone
        (500, 5000, 1000, 1500),  # the earlier of the two
        (500, 1200, 1000, 1200),
    ],
)
def test_expiry_is_capped_by_max_age(max_age: int, item_expiry: int, added: int, expiry: int) -> None:
    assert QueueSettings(max_age=max_age).expiry(item_expiry, added) == expiry
