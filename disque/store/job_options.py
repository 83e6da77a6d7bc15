"""The options a new job is made with, as one parsed record.

Theory of operation: each front end parses its command (ADDJOB, a memcache
SET, a schedule's tick, a fan-out copy) into one frozen `JobOptions`, and
`Lifecycle.add_job` takes that record: a new option is one field here and
one line in the parser that sets it, not another parameter on every path.
None stands for an option not given; the core fills in the defaults, since
some depend on the cluster (REPLICATE, MINREPL) or on the queue (PRIORITY).
The record is only checked where it is used (core/lifecycle.py), by the same
rules the bus and the AOF apply.  It is read-only once made (nothing assigns
its fields; `with_job_id` is a copy with another ID).  A plain class with
its own `__init__`, not a frozen dataclass: the compiled build makes that a
native constructor, where a frozen dataclass's generated one cost about
1,400 instructions a field on every ADDJOB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEDUP_ACTIVE: Final = -1  # JobOptions.dedup of DEDUP ACTIVE: the key held until the job is acknowledged
MAX_PARENTS: Final = 1000  # ADDJOB ... AFTER names at most this many jobs
ON_PARENT_FAIL: Final = ("fail", "run", "drop")  # ON-PARENT-FAIL's choices, by their code in a job (core/dependencies.py)


class JobOptions:
    def __init__(
        self,
        timeout: int = 0,  # ms the producer waits for the synchronous copies (0: forever)
        repl: int | None = None,  # REPLICATE
        ttl: int | None = None,  # TTL, seconds
        retry: int | None = None,  # RETRY, seconds
        delay: int | None = None,  # DELAY, seconds
        maxlen: int | None = None,  # MAXLEN: refused when the queue holds as many
        is_async: bool = False,  # ASYNC: answer before the copies are made
        max_attempts: int = 0,  # MAXATTEMPTS (0: no limit), an extension with DEADLETTER
        dead_letter: bytes | None = None,  # DEADLETTER (default `<queue>-dead`)
        zones: int | None = None,  # ZONES (docs/zones.md)
        priority: int | None = None,  # PRIORITY 0-9 (the queue's by default)
        minrepl: int | None = None,  # MINREPL (docs/replication.md)
        job_id: bytes | None = None,  # a schedule's tick brings its own ID (core/schedules.py)
        key: bytes = b"",  # KEY (docs/keys.md; b"": none), within store/job.py's key rule
        dedup: int = 0,  # DEDUP <ms>: the key held by the job that long (core/keys.py; 0: none, DEDUP_ACTIVE)
        workflow: Workflow | None = None,  # AFTER, ON-PARENT-FAIL, BATCH (one field: a plain job pays for one)
        debounce: int = 0,  # DEBOUNCE <ms>: queued that long after the key's last ADDJOB (core/keys.py; 0: none)
    ) -> None:
        self.timeout = timeout
        self.repl = repl
        self.ttl = ttl
        self.retry = retry
        self.delay = delay
        self.maxlen = maxlen
        self.is_async = is_async
        self.max_attempts = max_attempts
        self.dead_letter = dead_letter
        self.zones = zones
        self.priority = priority
        self.minrepl = minrepl
        self.job_id = job_id
        self.key = key
        self.dedup = dedup
        self.workflow = workflow
        self.debounce = debounce

    def with_job_id(self, job_id: bytes) -> JobOptions:
        """The same options for a job whose ID is `job_id`."""
        return JobOptions(
            self.timeout, self.repl, self.ttl, self.retry, self.delay, self.maxlen, self.is_async, self.max_attempts,
            self.dead_letter, self.zones, self.priority, self.minrepl, job_id, self.key, self.dedup, self.workflow,
            self.debounce,
        )


def debounce_problem(key: bool, dedup: bool, delay: bool) -> str | None:
    """The one rule DEBOUNCE is checked by, in ADDJOB (with KEY, without
    DEDUP or DELAY), a KEYCLAIM and a KEYHOLD record (never with DEDUP
    ACTIVE): the error text, None when it holds (docs/keys.md)."""
    if not key:
        return "DEBOUNCE needs KEY"
    if dedup:
        return "DEBOUNCE and DEDUP can't be used together"
    if delay:
        return "DEBOUNCE and DELAY can't be used together"
    return None


@dataclass(frozen=True, slots=True)
class Workflow:
    """ADDJOB's options of docs/workflows.md."""

    after: tuple[bytes, ...] = ()  # AFTER: the jobs this one waits for (core/dependencies.py)
    on_parent_fail: int = 0  # ON-PARENT-FAIL, its code in ON_PARENT_FAIL
    batch: bytes = b""  # BATCH: the batch the job joins (core/batches.py)
