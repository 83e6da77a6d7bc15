"""What a concern may ask of its node: the one interface below NodeCore.

Theory of operation: NodeCore (node.py) is the entry module; it owns the
state and composes the concerns (replication, federation, ACK/GC, the job
message handlers), which it imports.  The concerns must not import it back,
so they are written against this Protocol instead: the node's shared state
(time, jobs, queues, membership, the collected-ID memory) and the job
lifecycle operations that keep the single-node invariants (register,
enqueue, dequeue, delete, adopt, reschedule) plus effect emission (send,
broadcast, reply, AOF records).  NodeCore satisfies it structurally; a
concern that needs another concern gets it passed in (Acks gets
Replication), never through the node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import random

    from disque.cluster.membership import Membership
    from disque.core.types import Client
    from disque.store.collected import Collected
    from disque.store.job import Job
    from disque.store.jobs import JobStore
    from disque.store.queue import Queue
    from disque.store.scan import BucketedDict


class Node(Protocol):
    now: int  # ms, the time of the current step
    rng: random.Random
    cluster: Membership
    jobs: JobStore
    queues: BucketedDict[bytes, Queue]
    collected: Collected
    repl_waiters: dict[bytes, Client]  # producers waiting for their job's replication
    clients: dict[int, Client]

    # effects
    def send(self, node_id: str, msg: Any) -> None: ...
    def broadcast(self, node_ids: Iterable[str], msg: Any) -> None: ...
    def reply_to(self, client: Client, value: Any, slot: bytes | None = None) -> None: ...
    def answer_producer(self, job_id: bytes, value: Any) -> None: ...
    def aof_loadjob(self, job: Job) -> None: ...
    def aof_deljob(self, job: Job) -> None: ...

    # the job lifecycle
    def register(self, job: Job) -> None: ...
    def queue_new_job(self, job: Job) -> None: ...
    def adopt(self, job: Job) -> Job: ...
    def enqueue(self, job: Job, nack: bool = False, queue: Queue | None = None) -> bool: ...
    def dequeue(self, job: Job) -> bool: ...
    def fetch(self, queue: Queue) -> Job | None: ...
    def reschedule(self, job: Job) -> None: ...
    def delete_job(self, job: Job, log: bool = True) -> None: ...
    def abort_replication(self, job: Job) -> None: ...
    def settle_waits(self, job_id: bytes, acked: bool) -> None: ...
    config: Any
    def add_job(
        self, client: Client, queue: bytes, body: bytes, timeout: int, repl: int | None, ttl: int | None,
        retry: int | None, delay: int | None, maxlen: int | None, is_async: bool,
    ) -> Any: ...
    def get_jobs(
        self, client: Client, names: list[bytes], count: int, nohang: bool, withcounters: bool, timeout: int
    ) -> Any: ...
    def job_entry(self, job: Job, withcounters: bool) -> list[Any]: ...

    # the node
    def mem_level(self) -> int: ...
    def jitter(self) -> int: ...
    def set_pause(self, name: bytes, flags: int) -> None: ...
