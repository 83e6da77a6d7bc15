"""Acknowledgements and their garbage collection with a peer: dummy ACKs,
SETACK/GOTACK with backoff, FASTACK's DELJOB."""

from __future__ import annotations

from disque.cluster import messages as m

from jobenv import EVEN_ID, ODD_ID, PEER, duo, from_peer
from support import NODE_ID, START_MS


def test_dummy_ack_retries_gc_with_backoff_until_peer_answers(duo):
    assert duo.s("ACKJOB", EVEN_ID) == 0 and duo.show(EVEN_ID) is None  # at-most-once: no dummy
    assert duo.s("ACKJOB", ODD_ID) == 0
    assert duo.sent() == [m.SetAck(ODD_ID, 0)]
    shown = duo.show(ODD_ID)
    assert (shown["queue"], shown["body"]) == (None, None)
    assert (shown["nodes-delivered"], shown["nodes-confirmed"]) == ([], [NODE_ID])
    assert shown["repl"] == 0 and duo.s("JSCAN", "BUSYLOOP") == [b"0", []]
    times = []
    for _ in range(400):
        duo.wait(100)
        from_peer(duo, m.Pong())  # keep the link up
        if [x for x in duo.sent() if isinstance(x, m.SetAck)]:
            times.append(duo.clock.ms - START_MS)
    assert len(times) >= 3
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:]))  # backing off
    assert duo.s("ACKJOB", ODD_ID) == 0  # already acked: not counted, one more GC attempt
    assert duo.sent() == [m.SetAck(ODD_ID, 0)]
    from_peer(duo, m.GotAck(ODD_ID, False))
    assert duo.show(ODD_ID) is None


def test_dummy_ack_deleted_when_cluster_shrinks_to_one(duo):
    duo.s("ACKJOB", ODD_ID)
    duo.core.membership.forget(PEER)
    duo.wait(2_000)
    assert duo.show(ODD_ID) is None


def test_setack_for_an_acked_job(duo):
    duo.s("ACKJOB", ODD_ID)
    duo.sent()
    from_peer(duo, m.SetAck(ODD_ID, 0))
    assert duo.state(ODD_ID) == "acked" and m.GotAck(ODD_ID, True) in duo.sent()
