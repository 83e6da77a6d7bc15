"""The node table: who is in the cluster, how to reach them, who is failing.

Theory of operation: `Membership` holds one `Node` entry per known node,
myself included, with the flags of cluster.md §2.1.  It answers the questions
the job layer asks: `size()` (known nodes not in handshake, myself and
failing nodes included: used for default REPLICATE, FAIL quorum and dummy
ACKs), `reachable()` (replication candidates: not myself, handshake, leaving,
PFAIL or FAIL) and `has_link()` (the shell reports outgoing links going up
and down; messages to a node without a link are skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

from disque.cluster.messages import FAIL, HANDSHAKE, LEAVING, MYSELF, NOADDR, PFAIL


@dataclass(slots=True)
class Node:
    id: str
    ip: str = ""
    port: int = 0
    flags: int = 0
    ping_sent: int = 0
    pong_received: int = 0
    ctime: int = 0
    fail_time: int = 0
    link: bool = False

    @property
    def bus_port(self) -> int:
        return self.port + 10000 if self.port else 0


FLAG_NAMES = ((MYSELF, "myself"), (PFAIL, "fail?"), (FAIL, "fail"), (HANDSHAKE, "handshake"), (NOADDR, "noaddr"), (LEAVING, "leaving"))

UNREACHABLE = HANDSHAKE | LEAVING | PFAIL | FAIL


def flags_text(flags: int) -> str:
    names = [name for bit, name in FLAG_NAMES if flags & bit]
    return ",".join(names) if names else "noflags"


class Membership:
    def __init__(self, myself_id: str, port: int) -> None:
        self.nodes: dict[str, Node] = {}
        self.myself = Node(myself_id, port=port, flags=MYSELF, link=True)
        self.nodes[myself_id] = self.myself

    @property
    def my_id(self) -> str:
        return self.myself.id

    @property
    def leaving(self) -> bool:
        return bool(self.myself.flags & LEAVING)

    def size(self) -> int:
        return sum(1 for n in self.nodes.values() if not n.flags & HANDSHAKE)

    def reachable(self) -> list[Node]:
        return [n for n in self.nodes.values() if not n.flags & (UNREACHABLE | MYSELF)]

    def has_link(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.link and not node.flags & MYSELF

    def linked_ids(self, include_handshake: bool = False) -> list[str]:
        skip = MYSELF if include_handshake else MYSELF | HANDSHAKE
        return [n.id for n in self.nodes.values() if n.link and not n.flags & skip]
