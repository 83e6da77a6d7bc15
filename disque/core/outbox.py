"""The node's outbox: every effect the core asks the shell to carry out.

Theory of operation: the core performs no I/O (core/effects.py).  Whatever a
step produces besides the caller's own reply goes here, in order: replies to
other clients (`reply_to`, `answer_producer` for an ADDJOB that waited for
its replicas), bus messages (`send`, `broadcast`, `answer` on an inbound
link), links to drop, clients to close, and AOF records (`aof_loadjob`,
`aof_deljob`, `aof_record`, for queues whose settings journal them).  The
shell takes the list after each entry point (`take`, through
`NodeCore.take_effects`).  Every concern that emits effects gets this object;
none of them needs the node for it.

`repl_waiters` maps the ID of a job waiting for its replication level to the
client whose ADDJOB waits for it, so that the answer goes to that ADDJOB's
place whichever concern ends the wait.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from disque.core.effects import Answer, AofAppend, CloseClient, DropLink, Reply, Send
from disque.core.types import SILENT, Connection, Stats
from disque.store.aof import AofStatus, encode_deljob, encode_loadjob
from disque.store.queue_config import DEFAULTS as NO_LIMITS, QueueSettings

if TYPE_CHECKING:
    from disque.cluster.membership import Membership
    from disque.store.job import Job


class Outbox:
    def __init__(self, membership: Membership, config: Any, stats: Stats, aof: AofStatus) -> None:
        self.membership = membership
        self.config = config
        self.stats = stats
        self.aof = aof
        self.effects: list[Any] = []
        self.repl_waiters: dict[bytes, Connection] = {}  # producers waiting for their job's replication

    def take(self) -> list[Any]:
        """The effects since the last take, in order."""
        effects, self.effects = self.effects, []
        return effects

    # ------------------------------------------------------------ clients

    def reply_to(self, client: Connection, value: Any, slot: bytes | None = None) -> None:
        if client.mute_next:  # silenced, but the session must still learn that the client waits no more
            client.mute_next = False
            value = SILENT
        self.effects.append(Reply(client.id, value, slot))

    def answer_producer(self, job_id: bytes, value: Any) -> None:
        """The ADDJOB of `job_id` stops waiting for its replicas: its client
        (if still there) gets `value` in that ADDJOB's place."""
        client = self.repl_waiters.pop(job_id, None)
        if client is not None:
            client.repl_jobs.pop(job_id, None)
            self.reply_to(client, value, job_id)

    def close_client(self, client: Connection) -> None:
        client.closing = True
        self.effects.append(CloseClient(client.id))

    # ------------------------------------------------------------ the bus

    def broadcast(self, node_ids: Iterable[str], msg: Any) -> None:
        membership = self.membership
        me = membership.my_id
        for node_id in node_ids:
            if node_id != me and membership.has_link(node_id):
                self.send(node_id, msg)

    def send(self, node_id: str, msg: Any) -> None:
        key = self.membership.key_of(node_id)
        if key is not None:
            self.send_key(key, msg)

    def send_key(self, key: int, msg: Any) -> None:
        self.stats.bus_sent += 1
        self.effects.append(Send(key, msg))

    def answer(self, conn: int, msg: Any) -> None:
        self.stats.bus_sent += 1
        self.effects.append(Answer(conn, msg))

    def drop_link(self, key: int) -> None:
        self.effects.append(DropLink(key))

    # ------------------------------------------------------------ the AOF

    def aof_loadjob(self, job: Job) -> None:
        if self.aof.state != "off":
            self.aof_record(job.queue, encode_loadjob(job))

    def aof_deljob(self, job: Job) -> None:
        if self.aof.state != "off":
            self.aof_record(job.queue, encode_deljob(job.id))

    def journaled(self, job: Job) -> bool:
        """Whether the job's queue is in the AOF (Kestrel's `journal` setting)."""
        return self.limits(job.queue).journal

    def limits(self, queue: bytes | None) -> QueueSettings:
        """A queue's settings; a job with no queue (an ACK placeholder) has none."""
        return NO_LIMITS if queue is None else self.config.queue_config.settings(queue)

    def aof_record(self, queue: bytes | None, record: bytes) -> None:
        limits = self.limits(queue)
        if limits.journal:
            self.effects.append(AofAppend(record, limits.sync_journal))
