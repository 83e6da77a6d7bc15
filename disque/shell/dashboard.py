"""The dashboard's cluster view: the other nodes' HTTP ports, asked by this one.

Theory of operation: the page talks to one node; that node's HTTP port
(shell/http.py) gathers what the others say and hands the page one answer,
so the browser needs to reach one node only and no cross-origin request is
made.  Where a peer's HTTP port is: this node knows each peer's address and
client port from the cluster bus, and takes the peer's HTTP port to be as far
from its client port as its own is (`metrics-port` less `port`): so it is
for `make run`'s cluster (7711-7713, 9711-9713) and for nodes that all use
the same ports on their own hosts.  A peer found elsewhere, or down, is
shown as unreachable, with the error.

`Peers.each` asks every peer at once (GET or POST, h11 over TCP), each
within PEER_TIMEOUT and at most PEER_MAX_BYTES of answer, and never raises:
a peer that fails gives its error.  `Shared` computes a value at most once
per `max_age` for every request meanwhile (the cluster overview is asked
for by every open page every second).  `History` samples the queues'
counters into the rate history (core/rate_history.py) every slot.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import h11
import trio

from disque.cluster.membership import MYSELF
from disque.core.node import NodeCore
from disque.core.rate_history import RateHistory

log = logging.getLogger("disque")

PEER_TIMEOUT = 1.5  # seconds for a peer to answer a whole request
PEER_MAX_BYTES = 16 * 1024 * 1024  # an overview of 1,000 queues is about 300 KB
MAX_PEERS = 64  # peers asked (the first in the node table)
READ_SIZE = 64 * 1024
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PeerAddress:
    id: str
    host: str
    port: int  # its HTTP port, as this node guesses it


@dataclass(frozen=True, slots=True)
class Answer:
    peer: PeerAddress
    status: int  # 0: no answer (`error` says why)
    value: Any  # the JSON answer
    error: str = ""


class Peers:
    def __init__(self, core: NodeCore) -> None:
        self.core = core

    def listed(self) -> list[PeerAddress]:
        """The peers the bus knows, with the HTTP port each is taken to have."""
        config, cluster = self.core.config, self.core.membership
        offset = config.metrics_port - (config.port or config.tls_port)
        peers = [
            PeerAddress(node.id, node.ip, node.port + offset)
            for node in cluster.nodes.values()
            if not node.flags & MYSELF and node.ip and 0 < node.port + offset < 65536
        ]
        return peers[:MAX_PEERS]

    async def each(
        self, method: str, target: str, headers: tuple[tuple[str, str], ...] = (), body: bytes = b"", timeout: float = PEER_TIMEOUT
    ) -> list[Answer]:  # fmt: skip
        """`method target` on every peer at once, each within `timeout`
        seconds; answers in the peers' order."""
        peers = self.listed()
        answers: list[Answer | None] = [None] * len(peers)

        async def ask(i: int, peer: PeerAddress) -> None:
            answers[i] = await request(peer, method, target, headers, body, timeout)

        async with trio.open_nursery() as nursery:
            for i, peer in enumerate(peers):
                nursery.start_soon(ask, i, peer)
        return [a for a in answers if a is not None]


async def request(
    peer: PeerAddress, method: str, target: str, headers: tuple[tuple[str, str], ...], body: bytes, timeout: float
) -> Answer:  # fmt: skip
    """One HTTP request to a peer, its answer parsed as JSON (in a worker
    thread: an overview can be large); any failure is an error answer."""
    try:
        with trio.fail_after(timeout):
            status, payload = await _exchange(peer, method, target, headers, body)
        value = await trio.to_thread.run_sync(json.loads, payload)
    except trio.TooSlowError:
        return Answer(peer, 0, None, f"no answer within {timeout:g} s")
    except (OSError, h11.ProtocolError, ValueError, RecursionError) as e:
        return Answer(peer, 0, None, str(e) or type(e).__name__)
    return Answer(peer, status, value)


async def _exchange(peer: PeerAddress, method: str, target: str, headers: tuple[tuple[str, str], ...], body: bytes) -> tuple[int, bytes]:
    stream = await trio.open_tcp_stream(peer.host, peer.port)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        host = f"[{peer.host}]:{peer.port}" if ":" in peer.host else f"{peer.host}:{peer.port}"
        head = [("host", host), ("connection", "close"), ("content-length", str(len(body))), *headers]
        await stream.send_all(conn.send(h11.Request(method=method, target=target, headers=head)))
        if body:
            await stream.send_all(conn.send(h11.Data(data=body)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        status, chunks, size = 0, [], 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(READ_SIZE))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > PEER_MAX_BYTES:
                    raise ValueError(f"answer larger than {PEER_MAX_BYTES} bytes")
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return status, b"".join(chunks)
            else:  # ConnectionClosed before the end
                raise ValueError("connection closed before the end of the answer")


class Shared(Generic[T]):
    """A value computed at most once per `max_age` seconds and shared by
    the requests meanwhile; concurrent requests wait for the one computation."""

    def __init__(self, compute: Callable[[], Awaitable[T]], max_age: float) -> None:
        self.compute, self.max_age = compute, max_age
        self.value: T | None = None
        self.at = float("-inf")
        self.running: trio.Event | None = None

    async def get(self) -> T:
        while True:
            if self.value is not None and trio.current_time() - self.at < self.max_age:
                return self.value
            if self.running is not None:
                await self.running.wait()
                continue
            self.running = done = trio.Event()
            try:
                self.value = await self.compute()
                self.at = trio.current_time()
            finally:
                self.running = None
                done.set()


class History:
    """The node's rate history, sampled half a second before the end of
    each slot (a slot counts what its queues did from half a second before
    it began), and its JSON, rendered in a worker thread.  A sample walks
    the queue table on the event loop once per slot: O(queues), 10,000
    queues in tens of milliseconds."""

    def __init__(self, core: NodeCore, history: RateHistory | None = None) -> None:
        self.core = core
        self.history = history or RateHistory()
        self.rendered = json.dumps(self.history.snapshot()).encode()

    def sample(self) -> dict[str, Any]:
        """Sample now; the snapshot to render."""
        core = self.core
        counters = ((q.name, q.jobs_in, q.jobs_out) for q in core.queues.values())
        self.history.sample(core.clock.wall_us() / 1e6, counters)
        return self.history.snapshot()

    async def run(self) -> None:
        step = self.history.slot_seconds
        self.sample()  # what the queues did before the node served (an AOF loaded) is not counted; what follows is
        while True:
            now = self.core.clock.wall_us() / 1e6
            await trio.sleep((step - 0.5 - now % step) % step or step)
            self.rendered = await trio.to_thread.run_sync(lambda snap: json.dumps(snap).encode(), self.sample())
