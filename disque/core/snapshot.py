"""What an AOF rewrite must hold, as one stream of records.

Theory of operation: a rewrite (shell/aof_rewrite.py) takes a `Snapshot` on
the event loop (`NodeCore.snapshot`): the journaled jobs in memory that are
active or queued, the jobs read-behind keeps on disk (their segments held
until `release`), and the records of the state that is not jobs (consumer
groups' progress, schedules).  A worker thread then writes `records()`: a
job whose state changed meanwhile is written as it is then, one that left
`active`/`queued` is left out, and the rewrite buffer replays what happened
since.  `stop` is asked every 1,024 jobs: a cancelled rewrite stops reading,
and its caller throws the partial file away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from disque.core.read_behind import SpilledJobs
from disque.store.aof import encode_loadjob, loadjob_record
from disque.store.job import Job, State

_ACTIVE, _QUEUED = State.ACTIVE, State.QUEUED
STOP_EVERY = 1024  # jobs between two questions to `stop`


def _never() -> bool:
    return False


def snapshot_jobs(jobs: Iterable[Job], journaled: Callable[[Job], bool]) -> list[Job]:
    """The jobs of a snapshot among those in memory."""
    return [job for job in jobs if (job.state is _ACTIVE or job.state is _QUEUED) and journaled(job)]


class Snapshot:
    def __init__(self, jobs: list[Job], spilled: SpilledJobs, other: list[bytes]) -> None:
        self.jobs = jobs  # in memory
        self.spilled = spilled
        self.other = other  # the records of the state that is not jobs

    def __len__(self) -> int:
        """Jobs, in memory and on disk."""
        return len(self.jobs) + len(self.spilled)

    def queued(self) -> int:
        """Jobs in memory that were queued when it was taken."""
        return sum(1 for job in self.jobs if job.state is _QUEUED)

    def records(self, stop: Callable[[], bool] = _never) -> Iterator[bytes]:
        """One LOADJOB per job (in memory, then on disk), then the state's
        records.  Raises SpillCorrupt or OSError when a job on disk cannot
        be read: a snapshot without it must not replace the file."""
        for i, job in enumerate(self.jobs):
            if not i % STOP_EVERY and stop():
                return
            state = job.state
            if state is _ACTIVE or state is _QUEUED:
                yield encode_loadjob(job)
        for i, payload in enumerate(self.spilled.payloads()):
            if not i % STOP_EVERY and stop():
                return
            yield loadjob_record(payload)
        yield from self.other

    def release(self) -> None:
        self.spilled.release()
