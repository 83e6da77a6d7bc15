"""The trio bus shell over real loopback sockets, driven by a fake core.

`FakeCore` has the bus-facing surface of NodeCore: it wants the links the test
puts in `wanted`, sends a PING when a link comes up, answers PING with PONG on
the incoming connection, and records everything the bus reports.  Tests wait
on those records (`wait_for`), never on the clock.
"""

from __future__ import annotations

import logging
import random
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from disque.shell.bus import Bus
from disque.cluster.codec import FrameDecoder, encode_frame
from disque.store.records import job_to_wire
from disque.cluster.messages import GotJob, GotJobs, Header, Message, Pause, Ping, Pong, ReplJob, ReplJobs
from disque.store.job import Job
from disque.store.ids import new_job_id
from disque.testing.devcluster import free_port
from disque.core.effects import Answer, DropLink, Send

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Frame:
    header: Header
    msg: Message
    key: int | None
    conn: int | None
    peer_ip: str
    local_ip: str


class FakeCore:
    def __init__(self, node_id: str) -> None:
        self.id = node_id
        self.wanted: dict[int, tuple[str, int]] = {}
        self.effects: list[Any] = []
        self.frames: list[Frame] = []
        self.events: list[tuple[Any, ...]] = []  # ("up", key, None, t) / ("down", key, failed, t)
        self._changed = trio.Event()

    def _record(self, log: list[Any], item: Any) -> None:
        log.append(item)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
        with trio.fail_after(timeout):
            while not (result := predicate()):
                await self._changed.wait()
            return result

    # the interface the bus calls

    def header(self) -> Header:
        return Header(self.id, 7711, 0)

    def bus_links(self) -> dict[int, tuple[str, int]]:
        return dict(self.wanted)

    def link_connected(self, key: int) -> None:
        self._record(self.events, ("up", key, None, trio.current_time()))
        self.effects.append(Send(key, Ping()))

    def link_closed(self, key: int, connect_failed: bool) -> None:
        self._record(self.events, ("down", key, connect_failed, trio.current_time()))

    def handle_frames(
        self, frames: list[tuple[Header, Message]], *, key: int | None = None, conn: int | None = None,
        peer_ip: str = "", local_ip: str = "",
    ) -> None:  # fmt: skip
        for header, msg in frames:
            self._record(self.frames, Frame(header, msg, key, conn, peer_ip, local_ip))
            if isinstance(msg, Ping) and conn is not None:
                self.effects.append(Answer(conn, Pong()))

    # queries for wait_for

    def got(self, kind: type, **where: Any) -> list[Frame]:
        return [f for f in self.frames if type(f.msg) is kind and all(getattr(f, k) == v for k, v in where.items())]

    def seen(self, *event: Any) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[: len(event)] == event]


class Node:
    """A bus with its fake core, started and stopped inside a test's nursery."""

    def __init__(self, name: str, host: str = HOST, port: int | None = None, **options: Any) -> None:
        self.core = FakeCore(name * 40)
        self.host = host
        self.port = port or free_port(host)
        self.options = options
        self.bus = self._new_bus()
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()

    def _new_bus(self) -> Bus:
        return Bus(self.core, self.drain, port=self.port, bind=[self.host], **self.options)

    @property
    def addr(self) -> tuple[str, int]:
        return (self.host, self.port)

    def drain(self) -> None:
        core, bus = self.core, self.bus
        while core.effects:
            effects, core.effects = core.effects, []
            for e in effects:
                if type(e) is Send:
                    bus.send(e.key, e.msg)
                elif type(e) is Answer:
                    bus.answer(e.conn, e.msg)
                elif type(e) is DropLink:
                    bus.drop_link(e.key)

    def apply(self, *effects: Any) -> None:
        self.core.effects += effects
        self.drain()

    async def start(self, nursery: trio.Nursery) -> Node:
        await self.bus.listen()
        self._scope = await nursery.start(self._run)
        return self

    async def _run(self, task_status: Any) -> None:
        self._stopped = trio.Event()
        try:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await self.bus.run()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        assert self._scope is not None
        self._scope.cancel()
        await self._stopped.wait()

    async def restart(self, nursery: trio.Nursery) -> None:
        await self.stop()
        self.bus = self._new_bus()
        await self.start(nursery)


async def pair(nursery: trio.Nursery, **options: Any) -> tuple[Node, Node]:
    """A linked to B as link key 1, the first PONG received."""
    a = await Node("a", **options).start(nursery)
    b = await Node("b").start(nursery)
    a.core.wanted[1] = b.addr
    await a.core.wait_for(lambda: a.core.got(Pong, key=1))
    return a, b


async def test_frames_round_trip_on_link_and_incoming_connection(nursery: trio.Nursery) -> None:
    a = await Node("a", host="127.0.0.2").start(nursery)  # outgoing links bind to 127.0.0.2
    b = await Node("b").start(nursery)
    a.core.wanted[1] = b.addr
    pong = (await a.core.wait_for(lambda: a.core.got(Pong, key=1)))[0]
    assert pong.header == Header("b" * 40, 7711, 0) and pong.conn is None
    ping = b.core.got(Ping)[0]
    assert ping.header.sender == "a" * 40 and ping.key is None
    assert (ping.peer_ip, ping.local_ip) == ("127.0.0.2", HOST)
    assert a.core.seen("up", 1)

    big = Pause(b"q" * 3_000_000, 1)  # spans many reads
    a.apply(Send(1, big), Send(1, Pause(b"small", 2)))
    got = await b.core.wait_for(lambda: len(b.core.got(Pause)) == 2 and b.core.got(Pause))
    assert [f.msg for f in got] == [big, Pause(b"small", 2)]
    assert {f.conn for f in got} == {ping.conn}

    # Messages for links that do not exist, or connections that are gone, vanish.
    a.apply(Send(99, Ping()), Answer(42, Pong()), DropLink(99))
    b.apply(Answer(ping.conn + 1, Pong()))


async def test_the_repljobs_and_gotjobs_of_one_step_leave_as_one_body(nursery: trio.Nursery) -> None:
    """On a link in the positional form, REPLJOBs (of the same `noreply`) or
    GOTJOBs in a row go as one REPLJOBS or GOTJOBS body, in their order with
    the other messages; every link gets its own; a peer that never said it
    reads that form gets them one by one."""
    a, b = await pair(nursery)
    c = await Node("c").start(nursery)
    a.core.wanted[2] = c.addr
    await a.core.wait_for(lambda: a.core.got(Pong, key=2))
    ids = [new_job_id("a" * 40, random.Random(i), 60, 30) for i in range(4)]
    wire = [job_to_wire(Job(job_id, b"q", b"body", repl=3, etime=2_000_000_000, retry=30), 1_790_000_000_000) for job_id in ids]
    repl = [ReplJob(w) for w in wire]
    a.apply(
        *(Send(key, r) for r in repl[:2] for key in (1, 2)), Send(1, ReplJob(wire[2], noreply=True)),
        Send(1, repl[3]), Send(1, GotJob(ids[0])), Send(1, GotJob(ids[1])), Send(1, Pause(b"q", 1)), Send(1, GotJob(ids[2])),
    )  # fmt: skip
    got = await b.core.wait_for(lambda: len(b.core.frames) >= 7 and b.core.frames[1:])  # after the PING
    assert [f.msg for f in got] == [
        ReplJobs(tuple(wire[:2])), ReplJob(wire[2], noreply=True), ReplJob(wire[3]), GotJobs((ids[0], ids[1])), Pause(b"q", 1), GotJob(ids[2]),
    ]  # fmt: skip
    assert [f.msg for f in await c.core.wait_for(lambda: c.core.got(ReplJobs))] == [ReplJobs(tuple(wire[:2]))]

    conn = b.core.got(Ping)[0].conn
    older = await trio.open_tcp_stream(*b.addr)  # its PING says nothing of the positional form
    await older.send_all(encode_frame(Header("c" * 40, 7711, 0), Ping()))
    conn = (await b.core.wait_for(lambda: b.core.got(Ping, conn=conn + 1)))[0].conn
    b.apply(Answer(conn, GotJob(ids[0])), Answer(conn, GotJob(ids[3])))
    decoder, received = FrameDecoder(), []
    with trio.fail_after(5):
        while len(received) < 3:
            decoder.feed(await older.receive_some())
            while (frame := decoder.next_frame()) is not None:
                received.append(frame[1])
    assert received == [Pong(), GotJob(ids[0]), GotJob(ids[3])]
    await older.aclose()


async def test_garbage_drops_only_that_connection(nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="disque")
    b = await Node("b").start(nursery)
    garbage = [
        b"\x00\x00\x00\x03abc",  # not msgpack
        b"\xff\xff\xff\xff",  # length prefix over the frame limit
        b"\x00\x00\x00\x01\xc0",  # msgpack nil, not a map
    ]
    for data in garbage:
        stream = await trio.open_tcp_stream(*b.addr)
        await stream.send_all(data)
        with trio.fail_after(5):
            try:
                assert await stream.receive_some() == b""
            except trio.BrokenResourceError:
                pass
        await stream.aclose()
    lines = [r.getMessage() for r in caplog.records if "Closing bus connection from 127.0.0.1" in r.getMessage()]
    assert lines and len(lines) < len(garbage)  # rate-limited
    assert "undecodable msgpack" in lines[0]

    a = await Node("a").start(nursery)
    a.core.wanted[1] = b.addr
    await a.core.wait_for(lambda: a.core.got(Pong, key=1))
    assert not b.core.frames[1:]  # nothing from the garbage reached the core


async def test_a_bug_handling_frames_drops_that_connection_only(nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected exception while the core handles a peer's frames closes
    that connection (logged with its traceback); the bus goes on serving."""
    caplog.set_level(logging.WARNING, logger="disque")
    b = await Node("b").start(nursery)
    handle = b.core.handle_frames

    def buggy(frames: list[tuple[Header, Message]], **where: Any) -> None:
        if any(isinstance(msg, Pause) for _, msg in frames):
            raise RuntimeError("a bug in a handler")
        handle(frames, **where)

    b.core.handle_frames = buggy  # type: ignore[method-assign]
    stream = await trio.open_tcp_stream(*b.addr)
    await stream.send_all(encode_frame(Header("c" * 40, 7711, 0), Ping()))
    await b.core.wait_for(lambda: b.core.got(Ping))
    await stream.send_all(encode_frame(Header("c" * 40, 7711, 0), Pause(b"q", 1)))
    with trio.fail_after(5):
        try:
            while await stream.receive_some():  # its PONG, then the close
                pass
        except trio.BrokenResourceError:
            pass
    await stream.aclose()
    [line] = [r.getMessage() for r in caplog.records if "error handling its frames" in r.getMessage()]
    assert "RuntimeError: a bug in a handler" in line and "bus connection from 127.0.0.1" in line
    a = await Node("a").start(nursery)
    a.core.wanted[1] = b.addr
    await a.core.wait_for(lambda: a.core.got(Pong, key=1))


async def test_reconnect_with_backoff_after_peer_restart(nursery: trio.Nursery) -> None:
    a, b = await pair(nursery)
    await b.stop()
    await a.core.wait_for(lambda: a.core.seen("down", 1, False))
    failed = await a.core.wait_for(lambda: len(a.core.seen("down", 1, True)) >= 3 and a.core.seen("down", 1, True))
    t = [e[3] for e in failed[:3]]
    assert 0.08 < t[1] - t[0] < t[2] - t[1]  # 100 ms, then 200 ms

    await b.restart(nursery)
    await a.core.wait_for(lambda: len(a.core.got(Pong, key=1)) == 2)
    assert len(a.core.seen("up", 1)) == 2


async def test_drop_link_closes_and_reconnects(nursery: trio.Nursery) -> None:
    a, b = await pair(nursery)
    a.apply(DropLink(1))
    await a.core.wait_for(lambda: len(a.core.got(Pong, key=1)) == 2)
    assert [e[:3] for e in a.core.events] == [("up", 1, None), ("down", 1, False), ("up", 1, None)]
    first, second = b.core.got(Ping)
    assert first.conn != second.conn


async def test_links_follow_bus_links(nursery: trio.Nursery) -> None:
    a, b = await pair(nursery)
    c = await Node("c").start(nursery)
    a.core.wanted[1] = c.addr  # the node moved: the old link goes, a new one comes
    await c.core.wait_for(lambda: c.core.got(Ping))
    await a.core.wait_for(lambda: len(a.core.got(Pong, key=1)) == 2)
    assert a.core.frames[-1].header.sender == "c" * 40
    del a.core.wanted[1]
    await a.core.wait_for(lambda: len(a.core.seen("down", 1)) == 2)
    assert len(a.core.seen("up", 1)) == 2


class KeptLinksCore(FakeCore):
    """Keeps its dict of wanted links until it changes, as the node's core
    does (a change replaces the dict)."""

    def bus_links(self) -> dict[int, tuple[str, int]]:
        return self.wanted


async def test_links_follow_a_core_that_keeps_its_dict(nursery: trio.Nursery) -> None:
    """Once every wanted link is up the cron has nothing to do until the
    dict changes or a link ends: both are still followed."""
    a = Node("a")
    a.core = KeptLinksCore(a.core.id)
    a.bus = a._new_bus()
    await a.start(nursery)
    b = await Node("b").start(nursery)
    c = await Node("c").start(nursery)
    a.core.wanted = {1: b.addr}
    await a.core.wait_for(lambda: a.core.got(Pong, key=1))
    with trio.fail_after(5):
        while a.bus._settled is not a.core.wanted:  # the cron found every link up
            await trio.sleep(0.01)
    a.apply(DropLink(1))  # a link that ends is made again
    await a.core.wait_for(lambda: len(a.core.got(Pong, key=1)) == 2)
    a.core.wanted = {1: c.addr}  # the node moved: the old link goes, a new one comes
    await c.core.wait_for(lambda: c.core.got(Ping))
    await a.core.wait_for(lambda: len(a.core.got(Pong, key=1)) == 3)
    assert a.core.frames[-1].header.sender == "c" * 40
    assert [e[:2] for e in a.core.events] == [("up", 1), ("down", 1), ("up", 1), ("down", 1), ("up", 1)]


async def test_connect_timeout_counts_as_failure(nursery: trio.Nursery) -> None:
    # A backlog of 0 fills with one pending connection; later SYNs go unanswered.
    with socket.socket() as full:
        full.bind((HOST, 0))
        full.listen(0)
        filler = socket.create_connection(full.getsockname())
        try:
            a = await Node("a", connect_timeout=0.2).start(nursery)
            a.core.wanted[1] = full.getsockname()
            await a.core.wait_for(lambda: a.core.seen("down", 1, True))
            assert not a.core.seen("up", 1)
        finally:
            filler.close()


async def test_peer_that_never_reads_blocks_nobody(nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="disque")
    with socket.socket() as deaf:  # the kernel accepts, nobody ever reads
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        deaf.bind((HOST, 0))
        deaf.listen(1)
        a, b = await pair(nursery, max_queue=1 << 20)
        a.core.wanted[2] = deaf.getsockname()
        await a.core.wait_for(lambda: a.core.seen("up", 2))
        chunk = Pause(b"x" * (256 << 10), 0)
        for i in range(1, 400):
            a.apply(Send(2, chunk), Send(1, Ping()))
            await b.core.wait_for(lambda: len(b.core.got(Ping)) == i + 1)  # link 1 keeps flowing
            if a.core.seen("down", 2):
                break
        assert a.core.seen("down", 2, False) and not a.core.seen("down", 1)
        assert any("the peer is not reading" in r.getMessage() for r in caplog.records)


async def test_a_dropped_link_never_delivers_its_backlog_later(nursery: trio.Nursery) -> None:
    """Frames still queued in the kernel when a link is dropped are discarded
    (the socket is reset), not retransmitted for minutes by an orphaned socket:
    after a partition heals they would describe a past state (a REPLJOB of a
    job acknowledged since)."""
    with socket.socket() as slow:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.bind((HOST, 0))
        slow.listen(1)
        a = await Node("a").start(nursery)
        a.core.wanted[2] = slow.getsockname()
        await a.core.wait_for(lambda: a.core.seen("up", 2))
        accepted, _ = slow.accept()
        with accepted:
            chunk = Pause(b"x" * (256 << 10), 0)
            a.apply(*(Send(2, chunk) for _ in range(8)))  # 2 MiB: far more than the socket buffers hold
            a.apply(DropLink(2))
            await a.core.wait_for(lambda: a.core.seen("down", 2))

            def read_all() -> tuple[int, BaseException | None]:
                accepted.settimeout(10)
                total = 0
                try:
                    while data := accepted.recv(1 << 16):
                        total += len(data)
                except OSError as e:
                    return total, e
                return total, None

            received, error = await trio.to_thread.run_sync(read_all)
        assert isinstance(error, ConnectionResetError)
        assert received < 1 << 20


async def test_listen_failure_raises() -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen(1)
        bus = Bus(FakeCore("a" * 40), lambda: None, port=taken.getsockname()[1], bind=[HOST])
        with pytest.raises(OSError):
            await bus.listen()


def test_server_exits_when_bus_port_is_taken(tmp_path: Any) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind((HOST, port + 10000))
        taken.listen(1)
        argv = [sys.executable, "-m", "disque", "--port", str(port), "--bind", HOST, "--dir", str(tmp_path)]
        proc = subprocess.run(argv, capture_output=True, timeout=30)
    assert proc.returncode == 1
    assert f"{HOST}:{port + 10000}" in proc.stdout.decode()
