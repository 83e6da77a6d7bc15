"""`AsyncClient` under asyncio and under trio (through anyio), against a real
node, and the syntax of NACK DELAY, ADDJOB MAXATTEMPTS/DEADLETTER and WAITJOB
as both clients send it (checked against a recording stand-in for a node,
then against a real node once the server has the commands)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import hiredis
import pytest
from client_helpers import client, queue, rng_trying_first, shared_node  # noqa: F401  (fixtures)

from disque.client import AsyncClient, Client, DisqueConnectionError, DisqueReplyError, Job
from disque.testing.devcluster import NodeProcess, command, free_port

BACKENDS = ["asyncio", "trio"]


def run(backend: str, scenario: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(scenario, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_commands_and_a_worker(backend: str, shared_node: NodeProcess, queue: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(f"{shared_node.host}:{shared_node.port}") as c:
            assert await c.ping() == "PONG"
            first = await c.add_job(queue, b"one", retry=30)
            second = await c.add_job(queue, "two")
            assert [j.id for j in await c.qpeek(queue, 5)] == [first, second]
            assert {i async for i in c.jscan(queue, count=1)} == {first, second}
            job = await c.get_job(queue)
            assert job == Job(first, queue, b"one", 0, 0) and job.deliveries == 1
            assert await c.working(first) == 30
            assert await c.nack(first) == 1
            again = await c.get_job(queue)
            assert again is not None and (again.id, again.nacks, again.deliveries) == (first, 1, 2)
            assert await c.ack(first) == 1
            assert (await c.hello()).node_id == c.node_id
            with pytest.raises(DisqueReplyError, match="^ERR unknown command"):
                await c.execute_command("NOPE")
            seen = []

            async def handler(job: Job) -> None:
                seen.append(job.body)

            assert await c.worker(queue, handler, max_jobs=1) == 1
            assert seen == [b"two"] and await c.qlen(queue) == 0
        assert c.address is None  # closed by `async with`

    run(backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_jobs_and_a_pipeline(backend: str, shared_node: NodeProcess, queue: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(f"{shared_node.host}:{shared_node.port}") as c:
            ids = await c.add_jobs(queue, [b"a", "b", b"c"], priority=2)
            assert [j.body for j in await c.get_jobs(queue, count=2, acking=[])] == [b"a", b"b"]
            assert await c.pipeline().ack(ids[0]).fast_ack(ids[1]).qlen(queue).execute() == [1, 1, 1]
            assert [j.id for j in await c.get_jobs(queue, acking=ids[:2])] == [ids[2]]

    run(backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_block_results_and_after(backend: str, shared_node: NodeProcess, queue: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(f"{shared_node.host}:{shared_node.port}") as c:
            async with c.batch(on_complete=(queue + "-done", "over")) as batch:
                first = await batch.add_job(queue, "a")
                await c.add_job(queue, "b", after=[first])
            (job,) = await c.get_jobs(queue, count=10, nohang=True)
            assert job.id == first and await c.ack(first, result="ra") == 1
            (second,) = await c.get_jobs(queue, count=10, nohang=True)  # released by the ACK
            assert second.body == b"b" and await c.result(first) == b"ra"
            callback = await c.get_job(queue + "-done", timeout_ms=5000)  # the batch: closed, its job done
            assert callback is not None and callback.body == b"over"
            assert (await c.batch_show(batch.id))["complete_fired"] == 1

    run(backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tasks_share_a_client_and_cancel_a_request(backend: str, shared_node: NodeProcess, queue: str) -> None:
    async def scenario() -> None:
        async with AsyncClient((shared_node.host, shared_node.port)) as consumer, AsyncClient((shared_node.host, shared_node.port)) as c:
            got: list[Job | None] = []

            async def consume() -> None:
                got.append(await consumer.get_job(queue))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(consume)
                with anyio.fail_after(10):
                    while (stats := await c.qstat(queue)) is None or stats.blocked != 1:
                        await anyio.sleep(0.02)
                job_id = await c.add_job(queue, "for the blocked task")
            assert got[0] is not None and got[0].id == job_id
            with anyio.move_on_after(0.1):
                await consumer.get_job(queue)  # blocks, then is cancelled mid-request
            with anyio.fail_after(5):  # on the old connection PING would wait behind the GETJOB
                assert await consumer.ping() == "PONG"

    run(backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_failover_and_connection_errors(backend: str, spawn: Callable[..., NodeProcess], shared_node: NodeProcess, queue: str) -> None:
    first = spawn()
    addresses = [(first.host, first.port), (shared_node.host, shared_node.port)]

    async def scenario() -> None:
        async with AsyncClient(addresses, rng=rng_trying_first(addresses, addresses[0])) as c:
            await c.connect()
            assert c.address == addresses[0]
            first.kill()
            assert await c.qlen(queue) == 0  # sent again on the other seed
            assert c.address == addresses[1]
        with pytest.raises(DisqueConnectionError, match=r"^Could not connect to Disque at 127\.0\.0\.1:\d+: Connection refused$"):
            await AsyncClient(("127.0.0.1", free_port())).ping()
        async with AsyncClient((shared_node.host, shared_node.port), failover=False) as once:
            await once.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no")
            with pytest.raises(DisqueConnectionError, match=rf"^127\.0\.0\.1:{shared_node.port}: "):  # closed or reset
                await once.ping()
            assert await once.ping() == "PONG"  # the next command connects again

    run(backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_heartbeat_keeps_a_long_job(backend: str, shared_node: NodeProcess, queue: str) -> None:
    """RETRY 1: without WORKING the node would queue the job again after about a second."""

    async def scenario() -> None:
        async with AsyncClient((shared_node.host, shared_node.port)) as c, AsyncClient((shared_node.host, shared_node.port)) as observer:
            await c.add_job(queue, "slow", retry=1)
            job = await c.get_job(queue)
            assert job is not None
            with anyio.move_on_after(2.5):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(c.heartbeat, job.id, 0.4)
                    while await observer.qlen(queue) == 0:
                        await anyio.sleep(0.05)
                    tasks.cancel_scope.cancel()
            assert await observer.qlen(queue) == 0
            assert await c.ack(job.id) == 1

    run(backend, scenario)


# --------------------------------------------------------------------------
# The new commands' syntax


class Recorder:
    """A stand-in for a node on a loopback port: records every request and
    answers +OK to ADDJOB (a job ID would do as well) and :1 to the rest."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.requests: list[list[bytes]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            with conn:
                reader = hiredis.Reader()
                while data := conn.recv(65536):
                    reader.feed(data)
                    while (request := reader.gets()) is not False:
                        self.requests.append(request)
                        conn.sendall(b"+OK\r\n" if request[0] == b"ADDJOB" else b":1\r\n")

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], list[bytes]]] = [
    ("nack", ("DI1", "DI2"), {"delay": 30}, [b"NACK", b"DI1", b"DI2", b"DELAY", b"30"]),
    ("nack", ("DI1",), {}, [b"NACK", b"DI1"]),
    ("wait_job", ("DI1", "DI2"), {"timeout_ms": 500}, [b"WAITJOB", b"DI1", b"DI2", b"TIMEOUT", b"500"]),
    ("wait_job", ("DI1",), {}, [b"WAITJOB", b"DI1"]),
    ("add_job", ("q", "b"), {"max_attempts": 3, "dead_letter": "dead", "retry": 5},
     [b"ADDJOB", b"q", b"b", b"30000", b"RETRY", b"5", b"MAXATTEMPTS", b"3", b"DEADLETTER", b"dead"]),
    ("add_job", ("q", "b"), {"max_attempts": 1, "asynchronous": True}, [b"ADDJOB", b"q", b"b", b"30000", b"MAXATTEMPTS", b"1", b"ASYNC"]),
]  # fmt: skip


def test_new_commands_syntax_sync(recorder: Recorder) -> None:
    with Client(recorder.address, failover=False) as c:
        for name, args, kwargs, _ in CALLS:
            getattr(c, name)(*args, **kwargs)
    assert recorder.requests == [wire for *_, wire in CALLS]


@pytest.mark.parametrize("backend", BACKENDS)
def test_new_commands_syntax_async(backend: str, recorder: Recorder) -> None:
    async def scenario() -> None:
        async with AsyncClient(recorder.address, failover=False) as c:
            for name, args, kwargs, _ in CALLS:
                await getattr(c, name)(*args, **kwargs)

    run(backend, scenario)
    assert recorder.requests == [wire for *_, wire in CALLS]


# --------------------------------------------------------------------------
# The new commands on a real node


def test_nack_delay_holds_the_job_back(client: Client, queue: str) -> None:
    job_id = client.add_job(queue, "x", retry=60)
    client.get_job(queue)
    assert client.nack(job_id, delay=1) == 1
    assert client.get_job(queue, nohang=True) is None  # not before the delay
    job = client.get_job(queue, timeout_ms=5000)
    assert job is not None and (job.id, job.nacks) == (job_id, 1)


def test_max_attempts_moves_the_job_to_the_dead_letter_queue(client: Client, queue: str) -> None:
    job_id = client.add_job(queue, "x", retry=60, max_attempts=2, dead_letter="dead-" + queue)
    for _ in range(2):
        job = client.get_job(queue, timeout_ms=5000)
        assert job is not None and job.id == job_id
        client.nack(job_id)
    assert client.get_job(queue, nohang=True) is None
    [dead] = client.qpeek("dead-" + queue, 1)
    assert dead.body == b"x"


def test_wait_job_returns_once_the_jobs_are_acked(client: Client, shared_node: NodeProcess, queue: str) -> None:
    ids = [client.add_job(queue, str(i)) for i in range(3)]
    assert client.wait_job(*ids, timeout_ms=100) == 0  # none acknowledged: the timeout
    for job_id in ids:
        command(shared_node.host, shared_node.port, "ACKJOB", job_id)
    assert client.wait_job(*ids, timeout_ms=5000) == 3
