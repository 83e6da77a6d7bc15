"""Tests for disque.protocols.memcache.encoder: Kestrel's exact reply bytes."""

from __future__ import annotations

import pytest

from disque.protocols.memcache import encoder as enc
from disque.store.queue_config import QueueSettings


def test_fixed_replies() -> None:
    assert (enc.STORED, enc.NOT_STORED, enc.DELETED, enc.END, enc.ERROR) == (
        b"STORED\r\n", b"NOT_STORED\r\n", b"DELETED\r\n", b"END\r\n", b"ERROR\r\n",
    )  # fmt: skip
    assert enc.FLUSHED_ALL == b"Flushed all queues.\r\n"
    assert enc.RELOADED == b"Reloaded config.\r\n"


def test_value_uses_flags_zero_and_the_exact_length() -> None:
    assert enc.value(b"work", b"hello") == b"VALUE work 0 5\r\nhello\r\nEND\r\n"
    assert enc.value(b"q", b"") == b"VALUE q 0 0\r\n\r\nEND\r\n"
    assert enc.value(b"q", b"a\r\nb") == b"VALUE q 0 4\r\na\r\nb\r\nEND\r\n"


def test_error_lines_cannot_break_the_framing() -> None:
    assert enc.client_error() == b"CLIENT_ERROR\r\n"
    assert enc.client_error("bad data chunk") == b"CLIENT_ERROR bad data chunk\r\n"
    assert enc.client_error("a\r\nb") == b"CLIENT_ERROR a  b\r\n"
    assert enc.server_error("out of memory") == b"SERVER_ERROR out of memory\r\n"
    assert enc.server_error("x\ny") == b"SERVER_ERROR x y\r\n"


def test_version_and_count() -> None:
    assert enc.version("1.2") == b"VERSION 1.2\r\n"
    assert enc.count(0) == b"0\r\n"
    assert enc.count(17) == b"17\r\n"


GLOBAL = {
    "uptime": 10, "time": 1700000000, "version": "1.2", "curr_items": 3, "total_items": 9,
    "bytes": 30, "curr_connections": 2, "total_connections": 5, "cmd_get": 4, "cmd_set": 9,
    "cmd_peek": 1, "get_hits": 3, "get_misses": 1, "bytes_read": 100, "bytes_written": 200,
}  # fmt: skip


def queue_stats(items: int, **extra: object) -> dict[str, object]:
    fields: dict[str, object] = {name: 0 for name in enc.QUEUE_STATS}
    fields["items"] = items
    return fields | extra


def test_stats_order_and_format() -> None:
    shuffled = dict(reversed(list(GLOBAL.items())))  # the encoder, not the mapping, fixes the order
    queues = [
        (b"jobs", dict(reversed(list(queue_stats(2, age=15).items())))),
        (b"a_b+c", queue_stats(1)),
        (b"p", queue_stats(0, children=[b"p+x", b"p+y"])),
    ]
    lines = enc.stats(shuffled, queues).split(b"\r\n")
    assert lines[:15] == [
        b"STAT uptime 10", b"STAT time 1700000000", b"STAT version 1.2", b"STAT curr_items 3",
        b"STAT total_items 9", b"STAT bytes 30", b"STAT curr_connections 2", b"STAT total_connections 5",
        b"STAT cmd_get 4", b"STAT cmd_set 9", b"STAT cmd_peek 1", b"STAT get_hits 3", b"STAT get_misses 1",
        b"STAT bytes_read 100", b"STAT bytes_written 200",
    ]  # fmt: skip
    assert lines[15:26] == [
        b"STAT queue_jobs_items 2", b"STAT queue_jobs_bytes 0", b"STAT queue_jobs_total_items 0",
        b"STAT queue_jobs_logsize 0", b"STAT queue_jobs_expired_items 0", b"STAT queue_jobs_mem_items 0",
        b"STAT queue_jobs_mem_bytes 0", b"STAT queue_jobs_age 15", b"STAT queue_jobs_discarded 0",
        b"STAT queue_jobs_waiters 0", b"STAT queue_jobs_open_transactions 0",
    ]  # fmt: skip
    assert lines[26] == b"STAT queue_a_b+c_items 1"  # the name goes in as it is
    assert lines[36:38] == [b"STAT queue_a_b+c_open_transactions 0", b"STAT queue_p_items 0"]
    assert lines[47:] == [b"STAT queue_p_open_transactions 0", b"STAT queue_p_children p+x,p+y", b"END", b""]


def test_a_parent_whose_children_were_all_deleted_keeps_a_trailing_space() -> None:
    reply = enc.stats(GLOBAL, [(b"p", queue_stats(0, children=[]))])
    assert reply.endswith(b"STAT queue_p_open_transactions 0\r\nSTAT queue_p_children \r\nEND\r\n")


def test_stats_without_queues_and_with_a_missing_field() -> None:
    assert enc.stats(GLOBAL, []).endswith(b"STAT bytes_written 200\r\nEND\r\n")
    assert b"STAT version 0.1\xff\r\n" in enc.stats(GLOBAL | {"version": b"0.1\xff"}, [])
    with pytest.raises(KeyError):
        enc.stats({k: v for k, v in GLOBAL.items() if k != "cmd_peek"}, [])
    with pytest.raises(KeyError):
        enc.dump_stats([(b"q", {"items": 1})])


def test_dump_stats_layout() -> None:
    assert enc.dump_stats([]) == b"\r\nEND\r\n"
    reply = enc.dump_stats([(b"a", queue_stats(1, bytes=5)), (b"p", queue_stats(0, children=[b"p+c"]))])
    assert reply == (
        b"queue 'a' {\r\n  items=1\r\n  bytes=5\r\n  total_items=0\r\n  logsize=0\r\n  expired_items=0\r\n"
        b"  mem_items=0\r\n  mem_bytes=0\r\n  age=0\r\n  discarded=0\r\n  waiters=0\r\n  open_transactions=0\r\n}\r\n"
        b"queue 'p' {\r\n  items=0\r\n  bytes=0\r\n  total_items=0\r\n  logsize=0\r\n  expired_items=0\r\n"
        b"  mem_items=0\r\n  mem_bytes=0\r\n  age=0\r\n  discarded=0\r\n  waiters=0\r\n  open_transactions=0\r\n"
        b"  children=p+c\r\n}\r\nEND\r\n"
    )


def test_dump_config_matches_kestrel() -> None:
    assert enc.dump_config([]) == b"\r\nEND\r\n"
    assert enc.dump_config([(b"jobs", QueueSettings())]) == (
        b"queue 'jobs' {\r\n"
        b"  max_items=2147483647\r\n"
        b"  max_size=9223372036854775807\r\n"
        b"  max_age=0\r\n"
        b"  max_journal_size=16777216\r\n"
        b"  max_memory_size=134217728\r\n"
        b"  max_journal_overflow=10\r\n"
        b"  max_journal_size_absolute=9223372036854775807\r\n"
        b"  discard_old_when_full=false\r\n"
        b"  journal=true\r\n"
        b"  sync_journal=false\r\n"
        b"  move_expired_to=(none)\r\n"
        b"}\r\n"
        b"END\r\n"
    )
    custom = QueueSettings(
        max_items=5, max_item_size=7, discard_old_when_full=True, journal=False, move_expired_to=b"dlq"
    )
    reply = enc.dump_config([(b"a", QueueSettings()), (b"b", custom)])
    assert reply.count(b"queue '") == 2
    assert b"}\r\nqueue 'b' {\r\n  max_items=5\r\n" in reply
    assert reply.endswith(
        b"  discard_old_when_full=true\r\n  journal=false\r\n  sync_journal=false\r\n"
        b"  move_expired_to=dlq\r\n}\r\nEND\r\n"
    )
    assert b"max_item_size" not in reply  # 1.2 does not show it
