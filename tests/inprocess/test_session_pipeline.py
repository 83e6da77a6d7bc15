"""The session runner with a pipeline of replicated ADDJOBs: they replicate
together, their answers keep the request order, and other commands wait."""

from __future__ import annotations

from typing import Any

from disque.client import encode_command
from disque.cluster import messages as m
from disque.protocols.resp.front import RESP
from disque.shell.session import Sessions
from support import NODE_ID, Deaf, Nowhere, linked_core, session_runner

PEER = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
CONF = f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n{PEER} 127.0.0.1:7712 noflags 0 0 connected\n"


class Wire(Nowhere):
    """Bus and AOF ports that keep what the node sends."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, key: int, msg: Any) -> None:
        self.sent.append(msg)


class Client(Deaf):
    def take(self) -> bytes:
        out = b"".join(self.out)
        self.out.clear()
        self.out_size = 0
        return out


def setup() -> tuple[Sessions, Wire, Client]:
    core, _, _ = linked_core(CONF, (PEER,))
    wire = Wire()
    runner = session_runner(core, wire, wire)
    conn = Client(runner.new_client("10.0.0.1:5000"), RESP)
    runner.opened(conn)
    return runner, wire, conn


def got(runner: Sessions, job_id: bytes) -> None:
    core = runner.core
    core.handle_bus(m.Header(PEER, 7712, 0), m.GotJob(job_id), key=core.membership.nodes[PEER].key)
    runner.effects.apply(None)


def test_pipelined_addjobs_replicate_together_and_answer_in_order() -> None:
    runner, wire, conn = setup()
    pipeline = [("ADDJOB", "q", f"b{i}", 0, "REPLICATE", 2) for i in range(3)]
    pipeline.insert(1, ("ADDJOB", "q", "x", 0, "REPLICATE", 5))  # refused at once: 2 nodes only
    pipeline += [("QLEN", "q"), ("ADDJOB", "q", "last", 0, "REPLICATE", 2)]
    runner.received(conn, b"".join(encode_command(args) for args in pipeline))
    runner.run(conn)
    ids = [msg.job["id"] for msg in wire.sent]
    assert len(ids) == 3 and conn.take() == b""  # three REPLJOBs at once; nothing answered yet
    got(runner, ids[1])
    assert conn.take() == b""  # the second waits for the first
    got(runner, ids[0])
    assert conn.take() == b"+%s\r\n-NOREPL Not enough reachable nodes for the requested replication level\r\n+%s\r\n" % (ids[0], ids[1])
    assert len(wire.sent) == 3  # QLEN waits for the third ADDJOB, and the last ADDJOB for QLEN
    got(runner, ids[2])
    assert conn.take() == b"+%s\r\n:3\r\n" % ids[2]
    (last,) = [msg.job["id"] for msg in wire.sent[3:]]
    got(runner, last)
    assert conn.take() == b"+%s\r\n" % last


def test_client_reply_skip_does_not_overlap() -> None:
    """A silenced ADDJOB keeps the old rule: the pipeline waits for it."""
    runner, wire, conn = setup()
    pipeline = [("CLIENT", "REPLY", "SKIP"), ("ADDJOB", "q", "a", 0, "REPLICATE", 2), ("ADDJOB", "q", "b", 0, "REPLICATE", 2)]
    runner.received(conn, b"".join(encode_command(args) for args in pipeline))
    runner.run(conn)
    assert len(wire.sent) == 1
    got(runner, wire.sent[0].job["id"])
    assert conn.take() == b"" and len(wire.sent) == 2
    got(runner, wire.sent[1].job["id"])
    assert conn.take() == b"+%s\r\n" % wire.sent[1].job["id"]


def test_output_limit_drops_what_waits_behind_an_addjob() -> None:
    runner, wire, conn = setup()
    runner.config.client_output_buffer_limit = (1, 0, 0)
    runner.received(conn, b"".join(encode_command(("ADDJOB", "q", f"b{i}", 0, "REPLICATE", 2)) for i in range(2)))
    runner.run(conn)
    got(runner, wire.sent[1].job["id"])  # held behind the first: over the 1-byte limit all the same
    assert conn.closing and conn.out_size == 0 and not conn.slots
