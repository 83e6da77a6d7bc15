"""Paced dead-letter moves: DEADLETTER REQUEUE|DELETE ... RATE n.

Theory of operation: a DEADLETTER REQUEUE or DELETE sent with `RATE n` is
not done at once: it becomes a `Move` that the node's cron (every 100 ms)
runs, as SQS's redrive task and a RabbitMQ shovel move messages at a rate.
Each run takes at most what the rate allows since the last one (credit
that accrues at `rate` a second and never exceeds one second's worth, so a
cron that was held back gives no burst), through the lifecycle's own
`requeue_dead_letters` / `delete_dead_letters` with the move's filters.  A
move ends when a run finds fewer dead letters than it could take, when its
COUNT is reached, or on DEADLETTER STOP; a requeue waits while the node
is out of memory (level 2, where ADDJOB is refused).  There is one move per (queue,
verb): a new one replaces the old.  Moves are this node's and live in
memory: a restart forgets them (what they moved stays moved).

Called by: the DEADLETTER command (`start`, `stop`, `listing`) and
NodeCore's cron (`cron`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from disque.core.types import Map

if TYPE_CHECKING:
    from disque.core.lifecycle import DeadLetterFilter, Lifecycle


@dataclass(slots=True)
class Move:
    queue: bytes
    verb: bytes  # b"requeue" or b"delete"
    selection: DeadLetterFilter
    rate: int  # dead letters a second at most
    left: int  # COUNT still to go
    done: int = 0
    credit: int = 0  # thousandths of the dead letters it may move now
    last: int = 0  # ms of its last run


class Redrives:
    def __init__(self, life: Lifecycle) -> None:
        self.life = life
        self.moves: dict[tuple[bytes, bytes], Move] = {}

    def start(self, queue: bytes, verb: bytes, selection: DeadLetterFilter, rate: int, count: int) -> None:
        self.moves[queue, verb] = Move(queue, verb, selection, rate, count, last=self.life.now)

    def stop(self, queue: bytes) -> int:
        """DEADLETTER STOP: end the moves of `queue`; how many there were."""
        keys = [key for key in self.moves if key[0] == queue]
        for key in keys:
            del self.moves[key]
        return len(keys)

    def listing(self) -> list[Map]:
        """DEADLETTER MOVES: the moves running, oldest first."""
        return [
            Map([(b"queue", mv.queue), (b"verb", mv.verb), (b"rate", mv.rate), (b"done", mv.done), (b"left", mv.left)])
            for mv in self.moves.values()
        ]

    def cron(self) -> None:
        life = self.life
        now = life.now
        for key, mv in list(self.moves.items()):
            mv.credit = min(mv.rate * 1000, mv.credit + mv.rate * (now - mv.last))
            mv.last = now
            batch = min(mv.credit // 1000, mv.left)
            if not batch or (mv.verb == b"requeue" and life.memory.level() >= 2):  # out of memory: as ADDJOB, wait
                continue
            act = life.requeue_dead_letters if mv.verb == b"requeue" else life.delete_dead_letters
            moved = act(mv.queue, batch, mv.selection)
            mv.credit -= moved * 1000
            mv.done += moved
            mv.left -= moved
            if moved < batch or not mv.left:
                del self.moves[key]
