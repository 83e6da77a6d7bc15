"""Homes by rendezvous hashing (core/homes.py)."""

from __future__ import annotations

from disque.core.homes import home, ranked, score

NODES = [f"{i:040x}" for i in range(1, 6)]


def test_every_node_picks_the_same_home_whatever_order_it_lists_nodes_in() -> None:
    for name in (b"payments", b"", b"q\0k"):
        order = ranked(name, NODES)
        assert sorted(order) == sorted(NODES)
        assert home(name, NODES) == home(name, NODES[::-1]) == order[0]
        assert ranked(name, NODES[::-1]) == order


def test_a_node_going_away_moves_only_the_names_it_was_home_for() -> None:
    names = [b"key-%d" % i for i in range(300)]
    before = {name: home(name, NODES) for name in names}
    gone = NODES[2]
    after = {name: home(name, [n for n in NODES if n != gone]) for name in names}
    moved = {name for name in names if before[name] != after[name]}
    assert moved == {name for name in names if before[name] == gone}
    assert 300 // 5 // 2 < len(moved) < 300 // 5 * 2  # about a fifth: the hash spreads names
    for name in moved:
        assert after[name] == ranked(name, NODES)[1]  # its first standby takes it


def test_score_is_that_of_a_schedule_tick() -> None:
    # core/schedules.py ranks a tick's nodes by the score of "<name>\0<tick>"
    assert score(b"s\x000", NODES[0]) != score(b"s\x001", NODES[0])
    assert len(score(b"s", NODES[0])) == 8
