"""Kestrel's semantics (spec/kestrel.md) over the core under the fake clock: the memcache
command table (SET, GET and its reliable reads, FLUSH, the figures) and the
queue settings that bind ADDJOB too."""

from __future__ import annotations

from typing import Any

import pytest

from disque.core.items import ITEM_TTL
from disque.core.types import BLOCKED, SILENT
from disque.protocols.base import ProtocolError
from disque.protocols.memcache.front import MEMCACHE, Requests
from disque.protocols.memcache.parser import Get, GetOptions
from support import Session, make_core


class Memcache:
    """One memcache connection to a core: call it with request lines."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.client = Session(core).client
        self.client.authenticated = True
        self.requests = Requests()

    def __call__(self, data: bytes) -> bytes:
        """Run every request of `data`; their replies as the front end encodes them."""
        self.requests.feed(data)
        out = []
        while (request := self.requests.next_command()) is not None:
            reply = self.core.handle_command(self.client, request, MEMCACHE.run)
            if reply is BLOCKED:
                out.append(b"<blocked>")
            elif reply is not SILENT:
                out.append(MEMCACHE.encode(reply, 2))
        return b"".join(out)

    def pending(self) -> bytes:
        from disque.core.effects import Reply

        mine = [e for e in self.core.out.effects if isinstance(e, Reply) and e.client_id == self.client.id]
        self.core.out.effects[:] = [e for e in self.core.out.effects if e not in mine]
        return b"".join(MEMCACHE.encode(e.value, 2) for e in mine if e.value is not SILENT)


@pytest.fixture
def node() -> Any:
    return make_core()[0]


def lines(*items: bytes) -> bytes:
    return b"".join(items)


def test_the_worked_exchange_of_the_spec(node: Any) -> None:
    a, b = Memcache(node), Memcache(node)
    assert a(b"set work 0 0 5\r\nhello\r\n") == b"STORED\r\n"
    assert a(b"get work/open\r\n") == b"VALUE work 0 5\r\nhello\r\nEND\r\n"
    assert a(b"get work\r\n") == b"ERROR\r\n" and a.client.closing  # a fetch while a read is open
    node.disconnect(a.client.id)  # the item goes back to the head
    assert b(b"get work/close/open\r\n") == b"VALUE work 0 5\r\nhello\r\nEND\r\n"
    assert b(b"get work/close\r\n") == b"END\r\n"
    assert b(b"delete work\r\n") == b"END\r\n"
    assert Session(node)("QLEN", "work") == 0 and len(node.jobs) == 0  # acknowledged and collected


def test_a_plain_get_takes_the_item_for_good_and_peek_takes_nothing(node: Any) -> None:
    mc, resp = Memcache(node), Session(node)
    first = resp("ADDJOB", "q", "one", 0)
    resp("ADDJOB", "q", "two", 0)
    assert mc(b"get q/peek\r\n") == b"VALUE q 0 3\r\none\r\nEND\r\n" and resp("QLEN", "q") == 2
    assert mc(b"get q\r\n") == b"VALUE q 0 3\r\none\r\nEND\r\n"
    assert resp("SHOW", first) is None  # gone everywhere, as FASTACK
    assert mc(b"get q\r\nget q\r\n") == b"VALUE q 0 3\r\ntwo\r\nEND\r\nEND\r\n"
    assert node.items.get_hits == 2 and node.items.get_misses == 1 and node.items.cmd_peek == 1


def test_abort_puts_the_item_back_at_the_head(node: Any) -> None:
    mc, resp = Memcache(node), Session(node)
    for body in ("a", "b"):
        mc(b"set q 0 0 1\r\n%s\r\n" % body.encode())
    assert mc(b"get q/open\r\n") == b"VALUE q 0 1\r\na\r\nEND\r\n"
    assert mc(b"get other/abort\r\n") == b"ERROR\r\n" and mc.client.closing  # another queue's open read
    other = Memcache(node)
    assert other(b"get q/open\r\nget q/abort\r\n") == b"VALUE q 0 1\r\nb\r\nEND\r\nEND\r\n"
    node.disconnect(mc.client.id)
    assert [entry[2] for entry in resp("QPEEK", "q", 2)] == [b"a", b"b"]
    job_id = resp("QPEEK", "q", 1)[0][1]
    assert Session(node).show(job_id)["nacks"] == 1  # an aborted read counts as a NACK


def test_close_acknowledges_cluster_wide_and_a_bare_close_is_harmless(node: Any) -> None:
    mc = Memcache(node)
    assert mc(b"get q/close\r\nget q/abort\r\n") == b"END\r\nEND\r\n"  # no open read: nothing to do
    mc(b"set q 0 0 1\r\nx\r\n")
    mc(b"get q/open\r\n")
    (job_id,) = [job.id for job in node.jobs.values()]
    assert mc(b"get q/close\r\n") == b"END\r\n" and mc.client.open_read is None
    assert Session(node)("SHOW", job_id) is None  # acknowledged (single node: collected at once)


def test_a_waiting_get_is_served_by_a_later_set_or_times_out(node: Any) -> None:
    waiting, producer = Memcache(node), Memcache(node)
    assert waiting(b"get q/open/t=500\r\n") == b"<blocked>"
    producer(b"set q 0 0 2\r\nhi\r\n")
    assert waiting.pending() == b"VALUE q 0 2\r\nhi\r\nEND\r\n" and waiting.client.open_read is not None
    late = Memcache(node)
    assert late(b"get q/t=300\r\n") == b"<blocked>"
    node.clock.advance(400)
    node.tick()
    assert late.pending() == b"END\r\n" and node.items.get_misses == 1


def test_set_expiry_and_the_item_ttl(node: Any) -> None:
    mc, resp = Memcache(node), Session(node)
    assert mc(b"set q 0 0 1\r\na\r\nset q 0 60 1\r\nb\r\nset q 0 -1 1\r\nc\r\n") == b"STORED\r\n" * 3
    ttls = sorted(resp.show(entry[1])["ttl"] for entry in resp("QPEEK", "q", 10))
    assert len(ttls) == 2 and 59 <= ttls[0] <= 60 and ITEM_TTL - 1 <= ttls[1] <= ITEM_TTL  # the expired one is not kept


def test_noreply_and_quit(node: Any) -> None:
    mc = Memcache(node)
    assert mc(b"set q 0 0 1 noreply\r\nx\r\nflush q noreply\r\nversion\r\n").startswith(b"VERSION ")
    assert mc(b"quit\r\n") == b"" and mc.client.closing


def test_figures_and_dumps(node: Any) -> None:
    mc = Memcache(node)
    mc(b"set q 0 0 3\r\nabc\r\nset q 0 0 2\r\nde\r\n")
    mc(b"get q/open\r\n")
    stats = mc(b"stats\r\n")
    for line in (b"STAT cmd_set 2\r\n", b"STAT curr_items 1\r\n", b"STAT queue_q_items 1\r\n", b"STAT queue_q_bytes 2\r\n",
                 b"STAT queue_q_total_items 2\r\n", b"STAT queue_q_open_transactions 1\r\n"):  # fmt: skip
        assert line in stats
    assert mc(b"dump_stats\r\n").startswith(b"queue 'q' {\r\n  items=1\r\n  bytes=2\r\n")
    assert b"  max_items=2147483647\r\n" in mc(b"dump_config\r\n")
    assert mc(b"flush_expired q\r\nflush_all_expired\r\n") == b"0\r\n0\r\n"
    assert mc(b"flush_all\r\n") == b"Flushed all queues.\r\n" and Session(node)("QLEN", "q") == 0
    assert mc(b"reload\r\n") == b"Reloaded config.\r\n" and ("reload_queue_config",) in node.host.calls
    info = Session(node)("INFO", "kestrel")
    assert info.startswith(b"# Kestrel\r\ncmd_get:1\r\ncmd_set:2\r\n") and info.endswith(b"open_reads:1\r\nfanout_children:0\r\n")
    assert b"# Kestrel" in Session(node)("INFO", "all") and b"# Kestrel" not in Session(node)("INFO")


def test_errors_and_protocol_errors(node: Any) -> None:
    mc = Memcache(node)
    node.config.requirepass = "secret"
    assert mc(b"set q 0 0 1\r\nx\r\n") == b"STORED\r\n"  # an authenticated client (memcache-auth loopback)
    stranger = Memcache(node)
    stranger.client.authenticated = False
    assert stranger(b"get q\r\n") == b"CLIENT_ERROR unauthenticated\r\n" and not stranger.client.closing
    with pytest.raises(ProtocolError, match="CLIENT_ERROR"):
        Memcache(node)(b"get /open\r\n")


@pytest.mark.parametrize(
    ("settings", "adds", "left", "replies"),
    [
        (["max_items", "2"], 3, [b"a", b"b"], [b"STORED", b"STORED", b"NOT_STORED"]),
        (["max_items", "2", "discard_old_when_full", "true"], 3, [b"b", b"c"], [b"STORED"] * 3),
        (["max_size", "2"], 3, [b"a", b"b"], [b"STORED", b"STORED", b"NOT_STORED"]),
        (["max_item_size", "0", "discard_old_when_full", "yes"], 1, [], [b"NOT_STORED"]),
    ],
)
def test_queue_limits(node: Any, settings: list[str], adds: int, left: list[bytes], replies: list[bytes]) -> None:
    node.config.queue_config.set_queue(["q", *settings])
    mc = Memcache(node)
    got = [mc(b"set q 0 0 1\r\n%s\r\n" % body).strip() for body in (b"a", b"b", b"c")[:adds]]
    assert got == replies
    assert [entry[2] for entry in Session(node)("QPEEK", "q", 10)] == left
    discarded = node.queues.get(b"q").discarded if node.queues.get(b"q") else 0
    assert discarded == (1 if "discard_old_when_full" in settings and adds == 3 else 0)


def test_qsettings_shows_a_queues_effective_settings(node: Any) -> None:
    node.config.queue_config.set_defaults(["max_items", "7"])
    node.config.queue_config.set_queue(["jobs", "discard_old_when_full", "yes"])
    shown = dict(Session(node)("QSETTINGS", "jobs+child"))
    assert shown[b"max_items"] == b"7" and shown[b"discard_old_when_full"] == b"true" and shown[b"move_expired_to"] == b""
    assert list(shown)[0] == b"max_items" and len(shown) == 13  # Kestrel's 12, and `priority`


def test_queue_limits_bind_addjob(node: Any) -> None:
    node.config.queue_config.set_defaults(["max_items", "1", "max_age", "1500"])
    resp = Session(node)
    job_id = resp("ADDJOB", "q", "a", 0, "TTL", 100)
    assert resp.show(job_id)["ttl"] <= 2  # max_age 1.5 s: the TTL is capped (rounded up to 2 s)
    assert str(resp("ADDJOB", "q", "b", 0)) == "MAXLEN Queue is full (its max_items or max_size setting)"
    node.config.queue_config.set_queue(["big", "max_item_size", "3"])
    assert str(resp("ADDJOB", "big", "four", 0)).startswith("TOOLARGE")


def test_get_key_keeps_what_the_client_sent() -> None:
    assert Requests().parser.next_request() is None
    requests = Requests()
    requests.feed(b"get q/t=5/open\r\n")
    request = requests.next_command()
    assert request == Get(b"q", GetOptions(open=True, timeout_ms=5)) and request.key == b"q/t=5/open"


def test_a_noreply_set_waiting_for_replicas_stays_silent() -> None:
    from support import NODE_ID, linked_core

    peer = "b0" * 20
    core, _, _ = linked_core(f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n{peer} 127.0.0.1:7712 noflags 0 0 connected\n", (peer,))
    mc = Memcache(core)
    assert mc(b"set q 0 0 1 noreply\r\nx\r\n") == b"<blocked>" and mc.client.mute_next
    assert MEMCACHE.overlaps(Get(b"q")) is False


def test_oversized_set_shutdown_and_the_front_end_seams(node: Any) -> None:
    mc = Memcache(node)
    mc.requests.parser.max_data = 4
    assert mc(b"set q 0 0 5\r\nhello\r\n") == b"SERVER_ERROR object too large for cache\r\n"
    assert node.items.cmd_set == 1 and mc.requests.buffered() == 0
    assert mc(b"set q 0 0 5 noreply\r\nhello\r\nversion\r\n").startswith(b"VERSION ")  # silent, as memcached
    assert MEMCACHE.encode_error("CLIENT_ERROR\r\n") == b"CLIENT_ERROR\r\n"
    assert MEMCACHE.encode_error("Protocol error: too long") == b"CLIENT_ERROR Protocol error: too long\r\n"
    node.host.shutdown_ok = False
    assert mc(b"shutdown\r\n").startswith(b"SERVER_ERROR ERR Errors trying to SHUTDOWN")
    node.host.shutdown_ok = True
    assert mc(b"shutdown\r\n") == b""


def pair() -> tuple[Any, Any]:
    """A core linked to one peer (whose ID comes second)."""
    from support import NODE_ID, linked_core

    peer = "b0" * 20
    conf = "{} 127.0.0.1:7711 myself 0 0 connected\n{} 127.0.0.1:7712 noflags 0 0 connected\n"
    a, _, _ = linked_core(conf.format(NODE_ID, peer), (peer,))
    return a, peer


def sent(core: Any) -> list[Any]:
    from support import bus_sent

    return bus_sent(core)


def test_fanout_children_join_cluster_wide_and_get_copies() -> None:
    from disque.cluster import messages as m

    core, peer = pair()
    mc = Memcache(core)
    assert mc(b"get jobs+audit\r\n") == b"END\r\n"
    assert m.Fanout(b"jobs+audit", True) in sent(core)
    core.handle_bus(m.Header(peer, 7712, 0), m.Fanout(b"jobs+billing"), key=core.membership.nodes[peer].key)
    assert core.items.children == {b"jobs": {b"jobs+audit": None, b"jobs+billing": None}}
    core.out.effects.clear()
    core.link_connected(core.membership.nodes[peer].key)  # a node that links up learns every child
    assert [msg for msg in sent(core) if isinstance(msg, m.Fanout)] == [m.Fanout(b"jobs+audit"), m.Fanout(b"jobs+billing")]
    mc(b"set jobs 0 0 2 noreply\r\nhi\r\n")
    resp = Session(core)
    assert resp("QLEN", "jobs+audit") == resp("QLEN", "jobs+billing") == 1  # copies, replicated asynchronously
    assert mc(b"delete jobs+billing\r\n") == b"END\r\n" and m.Fanout(b"jobs+billing", False) in sent(core)
    core.handle_bus(m.Header(peer, 7712, 0), m.Fanout(b"jobs+audit", False), key=core.membership.nodes[peer].key)
    core.handle_bus(m.Header(peer, 7712, 0), m.Fanout(b"other+x", False), key=core.membership.nodes[peer].key)
    assert core.items.children == {b"jobs": {}}  # the set stays, empty (spec §5)


def test_a_full_child_misses_the_copy(node: Any) -> None:
    node.config.queue_config.set_queue(["jobs", "max_items", "1"])
    mc = Memcache(node)
    mc(b"get jobs+audit\r\nset jobs 0 0 1\r\nx\r\nget jobs\r\n")
    assert mc(b"set jobs 0 0 1\r\ny\r\n") == b"STORED\r\n"
    assert [entry[2] for entry in Session(node)("QPEEK", "jobs+audit", 5)] == [b"x"]
    assert b"STAT queue_jobs_children jobs+audit\r\n" in mc(b"stats\r\n")
    mc(b"delete jobs+audit\r\n")
    assert b"STAT queue_jobs_children \r\n" in mc(b"stats\r\n")  # the set stays, empty (spec §5)


def test_journal_settings_choose_what_goes_to_the_aof(node: Any) -> None:
    from disque.core.effects import AofAppend

    node.aof.state = "on"
    node.config.queue_config.set_queue(["scratch", "journal", "false"])
    node.config.queue_config.set_queue(["durable", "sync_journal", "true"])
    resp = Session(node)
    for queue in ("scratch", "durable", "plain"):
        resp("ACKJOB", resp("ADDJOB", queue, "x", 0))
    records = [(e.record.split(b"\r\n")[2], e.sync) for e in node.out.effects if isinstance(e, AofAppend)]
    assert records == [(b"LOADJOB", True), (b"DELJOB", True), (b"LOADJOB", False), (b"DELJOB", False)]
    kept = resp("ADDJOB", "plain", "y", 0)
    resp("ADDJOB", "scratch", "y", 0)
    assert [job.id for job in node.snapshot().jobs] == [kept]  # what a rewrite keeps


def test_move_expired_to_gives_expired_jobs_a_new_queue(node: Any) -> None:
    node.config.queue_config.set_queue(["q", "move_expired_to", "late"])
    node.config.queue_config.set_queue(["late", "max_items", "1"])
    resp = Session(node)
    taken = resp("ADDJOB", "q", "a", 0, "TTL", 1)
    for body in ("b", "c"):
        resp("ADDJOB", "q", body, 0, "TTL", 1)
    assert resp("GETJOB", "FROM", "q")[0][2] == b"a"  # active when it expires: not moved
    node.clock.advance(2_100)
    node.tick()
    node.tick()
    assert [entry[2] for entry in resp("QPEEK", "late", 5)] == [b"b"]  # c found `late` full: dropped
    assert node.queues.get(b"q").expired == 2 and resp.show(taken) is None
    assert ITEM_TTL - 1 <= resp.show(resp("QPEEK", "late", 1)[0][1])["ttl"] <= ITEM_TTL
