"""The one-node and two-node cores the job tests drive through commands:
`env` (one node), `duo` (a node linked to PEER, what it sends in its
effects), `from_peer` (a bus message from PEER), `fetched_with_a_replica`
(a job of both, delivered by `duo`) and the IDs, replies and limits
several of those tests share."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.types import BLOCKED, Status

from invariants import advance, check_core
from support import Env as CoreEnv
from support import NODE_ID, Session, bus_sent, linked_core, make_core


PEER = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
ODD_ID = b"DI" + b"f" * 40 + b"05a1SQ"  # unknown, at-least-once TTL field
EVEN_ID = b"DI" + b"f" * 40 + b"05a0SQ"
OK = Status(b"OK")


class Env(CoreEnv):
    """The shared Env with the job helpers these tests use."""

    def add(self, queue="q", body="b", *opts) -> bytes:
        reply = self.s("ADDJOB", queue, body, 0, *opts)
        assert isinstance(reply, Status), reply
        return bytes(reply)

    def show(self, job_id: bytes) -> dict | None:
        return self.s.show(job_id)

    def state(self, job_id: bytes) -> str | None:
        shown = self.show(job_id)
        return None if shown is None else shown["state"]

    def wait(self, ms: int) -> None:
        advance(self.core, self.clock, ms)

    def sent(self) -> list:
        return bus_sent(self.core)

    def check(self) -> None:
        check_core(self.core)


def make_env(**config) -> Env:
    return Env.of(*make_core(**config))


@pytest.fixture
def env() -> Env:
    return make_env()


@pytest.fixture
def duo() -> Env:
    """A node that knows one linked peer (PEER): what it sends is in effects."""
    conf = f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n{PEER} 127.0.0.1:7712 noflags 0 0 connected\n"
    return Env.of(*linked_core(conf, (PEER,)))


def fetched_with_a_replica(duo: Env, queue: str = "q") -> bytes:
    """A job of `queue` (RETRY 10) replicated to PEER and delivered here: its ID."""
    assert Session(duo.core)("ADDJOB", queue, "x", 0, "RETRY", 10) is BLOCKED
    (repl,) = duo.sent()
    job_id = repl.job["id"]
    from_peer(duo, m.GotJob(job_id))
    duo.s("GETJOB", "FROM", queue)
    duo.sent()
    return job_id


def from_peer(env: Env, msg) -> None:
    key = env.core.membership.nodes[PEER].key
    env.core.handle_bus(m.Header(PEER, 7712, 0), msg, key=key)


def level2_limit(used: int) -> int:
    """A maxmemory that puts `used` just above 95 %."""
    return (used - 1) * 100 // 95 // 100 * 100
