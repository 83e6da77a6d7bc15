"""Homes: which node owns a name, by rendezvous hashing.

Theory of operation: cluster state that needs one owner (a key's dedup
window and the job it has out, a limit's budget, a batch's counters) lives
at its name's home.  Of the nodes a node sees up (`Membership.up_ids`:
itself and the peers not flagged failing, linked or not), the home is the
one with the lowest `score` of (name, node ID), and the next ones in that
order (`ranked`) are its standbys.  Every node that sees the same nodes
picks the same home without a message; a node that goes away moves only the
names it was home for, and a node that comes back takes them back.  Under a
partition each side ranks the nodes it sees, so a name may have a home on
each side: each concern that uses homes says what that costs.  A schedule's
tick ranks its nodes by the same score (core/schedules.py).

Pure functions of their arguments: the callers pass the node IDs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from hashlib import blake2b


def score(name: bytes, node_id: str) -> bytes:
    """A node's place in the order of `name` (the lowest is its home)."""
    return blake2b(b"%s\0%s" % (name, node_id.encode()), digest_size=8).digest()


def ranked(name: bytes, node_ids: Iterable[str]) -> list[str]:
    """`node_ids` in `name`'s order: its home first, then its standbys."""
    return sorted(node_ids, key=lambda node_id: score(name, node_id))


def home(name: bytes, node_ids: Sequence[str]) -> str:
    """The home of `name` among `node_ids` (not empty)."""
    if len(node_ids) == 1:  # a node alone: no hash to compute
        return node_ids[0]
    return min(node_ids, key=lambda node_id: score(name, node_id))
