"""The node's bus entry points with a peer: the header, the links, answers
on the connection a message came on, broadcasts of FASTACK and PAUSE."""

from __future__ import annotations

from disque.cluster import messages as m
from disque.core.types import Status

from jobenv import ODD_ID, PEER, duo, from_peer
from support import NODE_ID


def test_fastack_and_pause_bcast_reach_the_peer(duo):
    assert duo.s("FASTACK", ODD_ID) == 0
    assert duo.sent() == [m.DelJob(ODD_ID)]
    assert duo.s("PAUSE", "q", "out", "bcast") == Status(b"out")
    assert duo.sent() == [m.Pause(b"q", 2)]
    assert duo.s("PAUSE", "q", "state", "bcast") == Status(b"out")
    assert duo.sent() == [m.Pause(b"q", 2)]


def test_link_state_and_answers(duo):
    core = duo.core
    key = core.membership.nodes[PEER].key
    assert core.header() == m.Header(NODE_ID, 7711, core.membership.myself.flags)
    assert core.bus_links() == {key: ("127.0.0.1", 17712)}
    core.handle_bus(m.Header(PEER, 7712, 0), m.Ping(), conn=99)
    assert [type(e).__name__ for e in core.out.effects] == ["Answer"] and core.out.effects[0].conn == 99
    core.out.effects.clear()
    core.link_closed(key, connect_failed=False)
    from_peer(duo, m.SetAck(ODD_ID, 1))  # an answer to a peer without a link is dropped
    assert duo.sent() == []
