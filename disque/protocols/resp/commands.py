"""The client command table: arity, flags, argument validation, replies.

Theory of operation: `run` answers QUIT, looks the command up and checks its
arity, then `NodeCore.execute` runs the rest of spec/commands.md §1.3 in order
(AUTH, memory, MISCONF, LOADING) and calls the handler.  Handlers parse and validate their arguments exactly as the spec
says (the first failing option decides the error), call the operations of
`NodeCore`, and return a reply value of `resp.py` (or `BLOCKED`, or
`SILENT` when nothing must be written).  A `DisqueError` raised anywhere
becomes the error reply.  Nothing here keeps state of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any, Final

from disque.protocols.resp import admin, groups  # noqa: F401 - groups registers the consumer-group commands
from disque.protocols.resp.table import (
    COMMANDS,
    FLAG_WORDS,
    INT64_MAX,
    OK,
    command,
    int_or,
    job_ids,
    parse_cursor,
    parse_int,
    parse_timeout,
    text,
)
from disque.core import errors
from disque.cluster import messages as m
from disque.core.errors import err
from disque.core.types import NIL_ARRAY, SILENT, Command, Connection, Map, Status
from disque.core.lifecycle import SLICE, DeadLetterFilter, check_job_options, check_size
from disque.core.node import NodeCore
from disque.core.schedules import MIN_EVERY, check_cron
from disque.store.failure import Failure, problem as failure_problem
from disque.store.limits import OptionError
from disque.store.schedule import Schedule, broken_rule
from disque.store.job import DEFAULT_PRIORITY, MAX_PRIORITY, STATE_BY_NAME, STATE_NAMES, Job, State, key_problem
from disque.store.job_options import DEDUP_ACTIVE, MAX_PARENTS, ON_PARENT_FAIL, JobOptions, Workflow, debounce_problem
from disque.store.queue import PAUSE_IN, PAUSE_NAMES, PAUSE_OUT, Queue
from disque.store.results import problem as result_problem

log = logging.getLogger("disque")

# ---------------------------------------------------------------- dispatch


def run(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """RESP's part of spec/commands.md §1.3: QUIT, lookup and arity, before
    `NodeCore.execute` applies the checks every front end shares."""
    name = argv[0].lower()
    if name == b"quit":
        node.out.close_client(client)
        return OK
    cmd = COMMANDS.get(name)
    if cmd is None:
        return errors.unknown_command(text(argv[0]))
    if (cmd.arity > 0 and len(argv) != cmd.arity) or len(argv) < -cmd.arity:
        return errors.wrong_arity(cmd.name)
    return node.execute(client, cmd, argv)


# ---------------------------------------------------------------- jobs


# option -> (position in cmd_addjob's values, lowest and highest valid value, error text)
ADDJOB_OPTS: Final[dict[bytes, tuple[int, int, int, str]]] = {  # Final: a static in the compiled build, not a module lookup
    b"replicate": (0, 1, 65535, "REPLICATE must be between 1 and 65535"),
    b"ttl": (1, 1, INT64_MAX, "TTL must be a number > 0"),
    b"retry": (2, 0, INT64_MAX, "RETRY time must be a non negative number"),
    b"delay": (3, 0, INT64_MAX, "DELAY time must be a non negative number"),
    b"maxlen": (4, 1, INT64_MAX, "MAXLEN must be a positive number"),
    b"maxattempts": (5, 1, 65535, "MAXATTEMPTS must be between 1 and 65535"),  # an extension, as DEADLETTER
    b"zones": (6, 1, 65535, "ZONES must be between 1 and 65535"),  # an extension: docs/zones.md
    b"priority": (7, 0, MAX_PRIORITY, "PRIORITY must be between 0 and 9"),  # an extension (docs/priorities.md)
    b"minrepl": (8, 1, 65535, "MINREPL must be between 1 and 65535"),  # an extension (docs/replication.md)
}
_DEDUP: Final = (0, 1, INT64_MAX, "DEDUP must be a number of ms > 0 or ACTIVE")  # (an ADDJOB_OPTS entry's shape)
_DEBOUNCE: Final = (0, 1, INT64_MAX, "DEBOUNCE must be a number of ms > 0")
# The same under their upper-case names, as clients send them: found without lowering the argument.
_ADDJOB_OPTS_UPPER: Final[dict[bytes, tuple[int, int, int, str]]] = {k.upper(): v for k, v in ADDJOB_OPTS.items()}


def _option(spec: tuple[int, int, int, str], raw: bytes) -> int:
    """The value of an ADDJOB option (`spec`: its ADDJOB_OPTS entry, range and error text)."""
    _, low, high, error = spec
    try:
        value = parse_int(raw)
    except ValueError:
        raise err(error) from None
    if not low <= value <= high:
        raise err(error)
    return value


def job_options(argv: list[bytes], i: int, raw_timeout: bytes | None = None) -> JobOptions:
    """ADDJOB's options from argv[i:] (ADDJOB_OPTS' values, ASYNC, DEADLETTER,
    KEY, DEDUP, DEBOUNCE, AFTER, ON-PARENT-FAIL, BATCH) and its `raw_timeout`, checked after them, as one record;
    SCHEDULE ADD takes the same options, without a timeout."""
    values: list[int | None] = [None] * len(ADDJOB_OPTS)  # None: not given
    is_async = False
    dead_letter = None
    key = b""
    dedup = debounce = 0
    after: list[bytes] | None = None  # (no list for a plain job)
    on_parent_fail = None
    batch = b""
    n = len(argv)
    while i < n:
        spec = _ADDJOB_OPTS_UPPER.get(argv[i])
        opt = b""  # the lowered name, needed only when that missed
        if spec is None:
            opt = argv[i].lower()
            spec = ADDJOB_OPTS.get(opt)  # one lookup, not a test and a lookup
        if spec is not None and i + 1 < n:
            values[spec[0]] = _option(spec, argv[i + 1])
            i += 2
        elif opt == b"async":
            is_async = True
            i += 1
        elif opt == b"deadletter" and i + 1 < n:
            dead_letter = argv[i + 1]
            i += 2
        elif opt == b"key" and i + 1 < n:
            key = argv[i + 1]
            if (problem := key_problem(key)) is not None:
                raise err(problem)
            i += 2
        elif opt == b"dedup" and i + 1 < n:
            dedup = DEDUP_ACTIVE if argv[i + 1].lower() == b"active" else _option(_DEDUP, argv[i + 1])
            i += 2
        elif opt == b"debounce" and i + 1 < n:
            debounce = _option(_DEBOUNCE, argv[i + 1])
            i += 2
        elif opt == b"after" and i + 1 < n:  # repeated, one parent each (docs/workflows.md)
            after = [] if after is None else after
            after.append(argv[i + 1])
            i += 2
        elif opt == b"batch" and i + 1 < n:  # docs/workflows.md
            batch = argv[i + 1]
            i += 2
        elif opt == b"on-parent-fail" and i + 1 < n:
            on_parent_fail = argv[i + 1].lower().decode("latin-1")
            i += 2
        else:
            raise errors.syntax()
    timeout = 0 if raw_timeout is None else parse_timeout(raw_timeout)
    repl, ttl, retry, delay, maxlen, max_attempts, zones, priority, minrepl = values
    if dead_letter is not None and max_attempts is None:
        raise err("DEADLETTER needs MAXATTEMPTS")
    if not (key or dedup or debounce or after or on_parent_fail is not None or batch):  # a plain job: positional, the cheapest call
        return JobOptions(
            timeout, repl, ttl, retry, delay, maxlen, is_async, max_attempts or 0, dead_letter, zones, priority, minrepl
        )
    if dedup and not key:
        raise err("DEDUP needs KEY")
    if debounce:  # queued `debounce` ms after the key's last ADDJOB: a DELAY of whole seconds for every copy but the first
        if (problem := debounce_problem(bool(key), bool(dedup), delay is not None)) is not None:
            raise err(problem)
        delay = -(-debounce // 1000)
    workflow = None
    if after or on_parent_fail is not None or batch:
        workflow = Workflow(_parents(after, on_parent_fail), ON_PARENT_FAIL.index(on_parent_fail or "fail"), batch)
    return JobOptions(
        timeout, repl, ttl, retry, delay, maxlen, is_async, max_attempts or 0, dead_letter, zones, priority, minrepl,
        None, key, dedup, workflow, debounce,
    )


def _parents(after: list[bytes] | None, on_parent_fail: str | None) -> tuple[bytes, ...]:
    """ADDJOB's AFTER IDs, each listed once, and its ON-PARENT-FAIL, checked."""
    if not after:
        if on_parent_fail is None:
            return ()
        raise err("ON-PARENT-FAIL needs AFTER")
    if on_parent_fail is not None and on_parent_fail not in ON_PARENT_FAIL:
        raise err("ON-PARENT-FAIL must be fail, run or drop")
    parents = tuple(dict.fromkeys(job_ids(after)))
    if len(parents) > MAX_PARENTS:
        raise err(f"AFTER names at most {MAX_PARENTS} jobs")
    return parents


@command("addjob", -4, "wmF")
def cmd_addjob(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    opts = job_options(argv, 4, argv[3])
    if opts.dedup or opts.debounce:  # the key's home decides first (core/keys.py)
        return node.keys.claim(client, argv[1], argv[2], opts)
    return node.lifecycle.add_job(client, argv[1], argv[2], opts)


@command("schedule", -2, "wm")
def cmd_schedule(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """SCHEDULE ADD|DEL|LIST|SHOW|PAUSE|RESUME (recurring jobs, core/schedules.py;
    spec/commands.md §14)."""
    sub, schedules = argv[1].lower(), node.schedules
    if sub == b"list" and len(argv) == 2:
        return schedules.names()
    if sub == b"add" and len(argv) >= 7:
        return _schedule_add(node, argv)
    if len(argv) != 3:
        raise err("Syntax error, try SCHEDULE ADD|DEL|LIST|SHOW|PAUSE|RESUME")
    if sub == b"del":
        return schedules.delete(argv[2])
    if sub == b"show":
        return schedules.show(argv[2])
    if sub in (b"pause", b"resume"):
        schedules.pause(argv[2], sub == b"pause")
        return OK
    raise err("Syntax error, try SCHEDULE ADD|DEL|LIST|SHOW|PAUSE|RESUME")


@command("qconfig", -2, "w")
def cmd_qconfig(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """QCONFIG <queue> SET <option> <value> ... | GET | DEL, QCONFIG LIST: a
    queue's cluster-wide limits (core/limits.py, docs/limits.md)."""
    limits = node.limits
    if len(argv) == 2 and argv[1].lower() == b"list":
        return limits.names()
    sub = argv[2].lower() if len(argv) > 2 else b""
    if sub == b"set" and len(argv) > 3:
        try:
            limits.set(argv[1], argv[3:])
        except OptionError as e:
            raise err(str(e)) from None
        return OK
    if len(argv) == 3 and sub == b"get":
        return limits.show(argv[1])
    if len(argv) == 3 and sub == b"del":
        return limits.delete(argv[1])
    raise err("Syntax error, try QCONFIG <queue> SET <option> <value> ... | GET | DEL, or QCONFIG LIST")


def bad_every() -> errors.DisqueError:
    return err(f"EVERY must be a number of ms, at least {MIN_EVERY}")


def _schedule_add(node: NodeCore, argv: list[bytes]) -> Any:
    """SCHEDULE ADD <name> <queue> <body> (EVERY <ms> | CRON <expr>) [TZ <zone>] [ADDJOB options]."""
    kind, spec = argv[5].lower(), argv[6]
    every, cron, tz, i = 0, b"", b"", 7
    if i + 1 < len(argv) and argv[i].lower() == b"tz":
        tz, i = argv[i + 1], i + 2
    if kind == b"every":
        every = int_or(spec, bad_every)
        if every < MIN_EVERY:
            raise bad_every()
        if tz:
            raise err("TZ goes with CRON")
    elif kind == b"cron":
        cron = spec
    else:
        raise errors.syntax()
    o = job_options(argv, i)  # ASYNC or not, a tick's job never waits: it has no client
    s = Schedule(
        argv[2], 0, "", argv[3], argv[4], every, cron, tz, since=node.now, repl=o.repl or 0, ttl=o.ttl or 0,
        retry=-1 if o.retry is None else o.retry, delay=o.delay or 0, maxlen=o.maxlen or 0,
        max_attempts=o.max_attempts, dead_letter=o.dead_letter or b"", zones=o.zones or 0,
        priority=-1 if o.priority is None else o.priority,
    )  # fmt: skip
    rule = broken_rule(s)  # the rules the bus and the AOF apply (before a long expression is parsed)
    if rule:
        raise err(rule)
    if cron:
        check_cron(cron, tz)
    if o.minrepl is not None:
        raise err("MINREPL does not apply to SCHEDULE: a tick's job never waits for its copies")
    if o.key:
        raise err("KEY and DEDUP do not apply to SCHEDULE")
    if o.workflow is not None:
        raise err("AFTER and BATCH do not apply to SCHEDULE: a tick's job waits for no other job, nor joins a batch")
    check_job_options(o.repl or 3, o.retry, o.delay or 0, o.ttl or 86400)
    check_size(argv[4], node.lifecycle.settings)
    if o.zones is not None and o.zones > (o.repl or 3):
        raise err("ZONES can't be greater than the replication level")
    node.schedules.add(s)
    return OK


@command("getjob", -2, "wF")
def cmd_getjob(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    nohang = withcounters = False
    timeout, count = 0, 1
    i, n = 1, len(argv)
    while i < n:
        opt = argv[i].lower()
        if opt == b"from":
            break
        if opt == b"nohang":
            nohang = True
        elif opt == b"withcounters":
            withcounters = True
        elif opt == b"timeout" and i + 1 < n:
            i += 1
            timeout = parse_timeout(argv[i])
        elif opt == b"count" and i + 1 < n:
            i += 1
            try:
                count = parse_int(argv[i])
            except ValueError:
                count = 0
            if count <= 0:
                raise err("COUNT must be a number greater than zero")
        else:
            raise errors.syntax()
        i += 1
    queues = argv[i + 1 :]
    if i >= n or not queues:
        raise errors.syntax()
    return node.blocking.get_jobs(client, queues, count, nohang, withcounters, timeout)


ACKJOB_SYNTAX: Final = "Syntax error, try ACKJOB <id> [RESULT <bytes>] [<id> [RESULT <bytes>] ...]"


def parse_ackjob(argv: list[bytes]) -> tuple[list[bytes], dict[bytes, bytes]]:
    """ACKJOB <id> [RESULT <bytes>] ...: the IDs, and the result each RESULT
    (an extension, docs/workflows.md) gives the ID before it, within
    store/results.py's size rule."""
    args = argv[1:]
    ids: list[bytes] = []
    results: dict[bytes, bytes] = {}
    i, n = 0, len(args)
    while i < n:
        if args[i].lower() != b"result":
            ids.append(args[i])
            i += 1
            continue
        if not ids or ids[-1] in results or i + 1 == n:
            raise err(ACKJOB_SYNTAX)
        if (problem := result_problem(args[i + 1])) is not None:
            raise err(problem)
        results[ids[-1]] = args[i + 1]
        i += 2
    return job_ids(ids), results


@command("ackjob", -1, "wF")
def cmd_ackjob(node: NodeCore, client: Connection, argv: list[bytes]) -> int:
    ack_job = node.acks.ack_job
    if len(argv) < 4 or not any(len(argv[i]) == 6 for i in range(1, len(argv))):  # no RESULT (an ID is never 6 bytes)
        return sum(ack_job(job_id) for job_id in job_ids(argv[1:]))
    ids, results = parse_ackjob(argv)
    return sum(ack_job(job_id, results.get(job_id)) for job_id in ids)


BATCH_SYNTAX: Final = "Syntax error, try BATCH NEW [ON-SUCCESS <queue> <body>] [ON-COMPLETE <queue> <body>] | SHOW <id> | CLOSE <id>"


@command("batch", -2, "wm")
def cmd_batch(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """BATCH NEW|SHOW|CLOSE (an extension, docs/workflows.md, core/batches.py)."""
    verb = argv[1].lower()
    if verb in (b"show", b"close") and len(argv) == 3:
        if verb == b"show":
            return Map(node.batches.show(argv[2]))
        node.batches.close(argv[2])
        return OK
    if verb != b"new" or len(argv) % 3 != 2:
        raise err(BATCH_SYNTAX)
    callbacks: dict[bytes, tuple[bytes, bytes]] = {}
    for i in range(2, len(argv), 3):
        word = argv[i].lower()
        if word not in (b"on-success", b"on-complete") or word in callbacks:
            raise err(BATCH_SYNTAX)
        callbacks[word] = (argv[i + 1], argv[i + 2])
    return Status(node.batches.new(callbacks.get(b"on-success"), callbacks.get(b"on-complete")))


@command("result", 2, "rF")
def cmd_result(node: NodeCore, client: Connection, argv: list[bytes]) -> bytes | None:
    """RESULT <id> (an extension, docs/workflows.md): the result the job was
    acknowledged with, nil when this node keeps none for it."""
    (job_id,) = job_ids(argv[1:])
    return node.lifecycle.results.get(job_id, node.now)


@command("fastack", -1, "wF")
def cmd_fastack(node: NodeCore, client: Connection, argv: list[bytes]) -> int:
    return sum(node.acks.fast_ack(job_id) for job_id in job_ids(argv[1:]))


def _each_known(node: NodeCore, client: Connection, argv: list[bytes], action: Callable[[Job], bool]) -> Any:
    """`action` on each job of the IDs argv names that this node knows (every
    ID checked first); how many it was true for.  Many IDs go SLICE at a time
    (Blocking.in_slices: other clients run in between)."""
    return node.blocking.in_slices(client, _each_in_slices(node, job_ids(argv[1:]), action))


def _each_in_slices(node: NodeCore, ids: list[bytes], action: Callable[[Job], bool]) -> Generator[None, None, int]:
    done = 0
    for n, job_id in enumerate(ids, 1):
        job = node.jobs.get(job_id)
        if job is not None and action(job):
            done += 1
        if not n % SLICE and n < len(ids):
            yield
    return done


@command("deljob", -1, "wF")
def cmd_deljob(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    def delete(job: Job) -> bool:
        node.lifecycle.delete_job(job)
        return True

    return _each_known(node, client, argv, delete)


@command("enqueue", -1, "mwF")
def cmd_enqueue(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    return _each_known(node, client, argv, lambda job: job.state == State.ACTIVE and node.lifecycle.enqueue(job))


# NACK's options (extensions, docs/commands.md) -> how many values follow the word.
NACK_OPTS: Final = {b"delay": 1, b"error": 2, b"traceback": 1, b"host": 1, b"pid": 1}


def parse_nack(argv: list[bytes]) -> tuple[list[bytes], int, Failure | None]:
    """NACK <id> ... [DELAY <s>] [ERROR <type> <message> [TRACEBACK <text>]
    [HOST <host>] [PID <pid>]]: the IDs, the delay (0: none) and the failure
    the consumer reports, checked against its size rule (store/failure.py)."""
    i = 1
    while i < len(argv) and argv[i].lower() not in NACK_OPTS:
        i += 1
    ids, opts, delay = argv[:i], {}, 0
    while i < len(argv):
        word = argv[i].lower()
        width = NACK_OPTS.get(word)
        if width is None or i + width >= len(argv):
            raise err("Syntax error, try NACK <id> ... [DELAY <seconds>] [ERROR <type> <message> [TRACEBACK <text>] [HOST <host>] [PID <pid>]]")
        opts[word] = argv[i + 1 : i + 1 + width]
        if word == b"delay":  # each one checked, as ADDJOB's: a DELAY given twice wins last, never unchecked
            delay = _option(ADDJOB_OPTS[b"delay"], opts[word][0])
        i += 1 + width
    if b"error" not in opts:
        if opts.keys() - {b"delay"}:
            raise err("TRACEBACK, HOST and PID need ERROR")
        return ids, delay, None
    pid = int_or(opts[b"pid"][0], errors.not_integer) if b"pid" in opts else 0  # its range: the size rule's
    kind, message = opts[b"error"]
    failure = Failure(kind, message, opts.get(b"traceback", [b""])[0], opts.get(b"host", [b""])[0], pid)
    if (problem := failure_problem(failure)) is not None:
        raise err(f"ERROR {problem}")
    return ids, delay, failure


@command("nack", -1, "mwF")
def cmd_nack(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """NACK <id> ... with our extensions DELAY and ERROR (parse_nack, node.lifecycle.nack)."""
    ids, delay, failure = parse_nack(argv)
    return _each_known(node, client, ids, lambda job: node.lifecycle.nack(job, delay, failure))


DEADLETTER_SYNTAX: Final = (
    "Syntax error, try DEADLETTER LIST|REQUEUE|DELETE <queue> [COUNT <n>] [FROM <queue>] [ERROR <type>] [SINCE <ms>] [UNTIL <ms>]"
    " [RATE <n>] | MOVES | STOP <queue>"
)
_DEADLETTER_OPTS: Final = (b"count", b"from", b"error", b"since", b"until", b"rate")


@command("deadletter", -2, "wm")
def cmd_deadletter(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """DEADLETTER LIST|REQUEUE|DELETE <queue> [COUNT n] [FROM q] [ERROR type]
    [SINCE ms] [UNTIL ms] [RATE n] (an extension, node.lifecycle.dead_letters):
    this node's dead letters queued in <queue>, those the filters take,
    oldest first; with RATE a paced move (core/redrives.py), which
    DEADLETTER MOVES lists and DEADLETTER STOP <queue> ends.  The CLI and
    the dashboard ask every node (docs/commands.md)."""
    verb = argv[1].lower()
    if verb == b"moves" and len(argv) == 2:
        return node.redrives.listing()
    if verb == b"stop" and len(argv) == 3:
        return node.redrives.stop(argv[2])
    if verb not in (b"list", b"requeue", b"delete") or len(argv) % 2 == 0:
        raise err(DEADLETTER_SYNTAX)
    opts: dict[bytes, bytes] = {}
    for i in range(3, len(argv), 2):
        word = argv[i].lower()
        if word not in _DEADLETTER_OPTS or (word == b"rate" and verb == b"list"):
            raise err(DEADLETTER_SYNTAX)
        opts[word] = argv[i + 1]
    count = 100 if verb == b"list" else INT64_MAX
    if b"count" in opts and (count := int_or(opts[b"count"], errors.not_integer)) <= 0:
        raise err("COUNT must be a number greater than zero")
    if b"rate" in opts and (rate := int_or(opts[b"rate"], errors.not_integer)) <= 0:
        raise err("RATE must be a number greater than zero")
    since, until = (int_or(opts.get(w, b"0"), errors.not_integer) for w in (b"since", b"until"))
    if since < 0 or until < 0:
        raise err("SINCE and UNTIL must be unix times in milliseconds")
    selection = DeadLetterFilter(opts.get(b"from"), opts.get(b"error"), since, until)
    life = node.lifecycle
    if b"rate" in opts:
        node.redrives.start(argv[2], verb, selection, rate, count)
        return OK
    if verb == b"list":
        return [dead_letter_entry(job) for job in life.dead_letters(argv[2], count, selection)]
    act = life.requeue_dead_letters if verb == b"requeue" else life.delete_dead_letters
    return node.blocking.in_slices(client, _dead_letters_in_slices(act, argv[2], count, selection))


def _dead_letters_in_slices(
    act: Callable[[bytes, int, DeadLetterFilter], int], name: bytes, count: int, selection: DeadLetterFilter
) -> Generator[None, None, int]:
    """DEADLETTER REQUEUE or DELETE SLICE dead letters at a time
    (Blocking.in_slices: other clients run in between); how many went."""
    done = 0
    while True:
        want = min(SLICE, count - done)
        moved = act(name, want, selection)
        done += moved
        if moved < want or done == count:
            return done
        yield


def dead_letter_entry(job: Job) -> Map:
    """One dead letter as DEADLETTER LIST shows it: SHOW's fields about where
    it came from and why, the time it was moved (unix ms), its traceback left
    to SHOW."""
    return Map(
        [
            (b"id", job.id), (b"dead-letter-of", job.origin), (b"dead-letter-from", job.dead_letter),
            (b"dead-lettered-at", job.ctime // 1_000_000), (b"nacks", job.nacks), (b"additional-deliveries", job.deliv),
        ]
        + [field for field in failure_fields(job) if field[0] != b"error-traceback"]
    )  # fmt: skip


@command("dequeue", -1, "wF")
def cmd_dequeue(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    return _each_known(node, client, argv, node.lifecycle.dequeue)


@command("working", 2, "wF")
def cmd_working(node: NodeCore, client: Connection, argv: list[bytes]) -> int:
    (job_id,) = job_ids(argv[1:])
    job = node.jobs.get(job_id)
    if job is None:
        raise errors.nojob()
    return node.lifecycle.working(job)


@command("waitjob", -2, "rF")
def cmd_waitjob(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """WAITJOB <id> ... [TIMEOUT <ms>] [WITHRESULTS] (an extension, node.wait_jobs)."""
    timeout = 0
    with_results = len(argv) >= 3 and argv[-1].lower() == b"withresults"
    if with_results:
        argv = argv[:-1]
    if len(argv) >= 3 and argv[-2].lower() == b"timeout":
        timeout = parse_timeout(argv[-1])
        argv = argv[:-2]
    if len(argv) < 2:
        raise errors.wrong_arity("waitjob")
    return node.blocking.wait_jobs(client, job_ids(argv[1:]), timeout, with_results)


@command("show", 2, "rF")
def cmd_show(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    (job_id,) = job_ids(argv[1:])
    job = node.jobs.get(job_id)
    return None if job is None else show(node, job)


def show(node: NodeCore, job: Job) -> Map:
    now = node.now
    dummy = job.is_dummy_ack
    return Map(
        [
            (b"id", job.id),
            (b"queue", job.queue),
            (b"state", STATE_NAMES[job.state]),
            (b"repl", 0 if dummy else job.repl),
            (b"ttl", max(0, job.etime - now // 1000)),
            (b"ctime", job.ctime),
            (b"delay", job.delay),
            (b"retry", job.retry),
            (b"nacks", job.nacks),
            (b"additional-deliveries", job.deliv),
            (b"nodes-delivered", list(job.nodes_delivered)),
            (b"nodes-confirmed", sorted(job.nodes_confirmed or ())),
            (b"next-requeue-within", max(0, job.qtime - now) if job.qtime else None),
            (b"next-awake-within", max(0, job.awake - now) if job.awake else None),
            (b"body", job.body),
        ]
        + ([(b"min-repl", minrepl)] if (minrepl := node.replication.minrepl_of(job.id)) is not None and minrepl < job.repl else [])
        # The MAXATTEMPTS extension, only for the jobs that use it: a dead-lettered
        # copy keeps its origin's MAXATTEMPTS and queue for DEADLETTER REQUEUE.
        + ([(b"max-attempts", job.max_attempts), (b"dead-letter", job.dead_letter)] if job.max_attempts and not job.origin else [])
        + ([(b"priority", job.priority)] if job.priority != DEFAULT_PRIORITY else [])  # PRIORITY, when used
        + ([(b"dead-letter-of", job.origin)] if job.origin else [])
        + ([(b"dead-letter-from", job.dead_letter)] if job.origin and job.dead_letter else [])
        + failure_fields(job)
        + ([(b"key", job.key)] if job.key else [])
        + ([(b"waits-for", list(job.parents)), (b"on-parent-fail", ON_PARENT_FAIL[job.on_parent_fail])] if job.parents else [])
        + ([(b"batch", job.batch)] if job.batch else [])
        + ([(b"after", list(job.after))] if job.after else [])  # every parent, acknowledged ones too
    )


def failure_fields(job: Job) -> list[tuple[bytes, Any]]:
    """The job's last failure (NACK ... ERROR) as SHOW's fields; none without one."""
    failure = job.failure
    if not failure:
        return []
    return [
        (b"error-type", failure.type), (b"error-message", failure.message), (b"error-traceback", failure.traceback),
        (b"error-host", failure.host), (b"error-pid", failure.pid), (b"error-time", failure.at),
    ]  # fmt: skip


@command("loadjob", 2, "w")
def cmd_loadjob(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    raise err("LOADJOB is a special command only processed from AOF")


# ---------------------------------------------------------------- scanning


def parse_scan(argv: list[bytes], numeric: tuple[bytes, ...], extra: dict[bytes, Callable[[bytes], Any]]) -> tuple[int, dict[bytes, Any]]:
    """Shared JSCAN/QSCAN argument parser: tokens in any order, one cursor."""
    cursor: int | None = None
    opts: dict[bytes, Any] = {b"count": 100}
    i, n = 1, len(argv)
    while i < n:
        tok = argv[i].lower()
        has_value = i + 1 < n
        if tok == b"busyloop":
            opts[tok] = True
        elif has_value and (tok in numeric or tok == b"count"):
            i += 1
            opts[tok] = int_or(argv[i], errors.not_integer)
        elif has_value and tok in extra:
            i += 1
            opts.setdefault(tok, []).append(extra[tok](argv[i]))
        else:
            if cursor is not None:
                raise errors.syntax()
            cursor = parse_cursor(argv[i])
        i += 1
    return cursor or 0, opts


def _scan(table: Any, cursor: int, opts: dict[bytes, Any]) -> tuple[int, list[Any]]:
    count = max(1, opts[b"count"])
    if opts.get(b"busyloop"):
        return table.scan(cursor, 1 << 62, None)
    return table.scan(cursor, count, count * 10)


def _job_state(raw: bytes) -> State:
    state = STATE_BY_NAME.get(text(raw).lower())
    if state is None:
        raise err("Invalid job state name")
    return state


def _reply_type(raw: bytes) -> bool:
    kind = raw.lower()
    if kind not in (b"id", b"all"):
        raise err("Invalid REPLY type, try ID or ALL")
    return kind == b"all"


@command("jscan", -1, "r")
def cmd_jscan(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    """JSCAN; a large COUNT (or BUSYLOOP) builds its reply SLICE jobs at a
    time (Blocking.in_slices: other clients run in between; a job deleted
    meanwhile may still be listed, as SCAN allows)."""
    cursor, opts = parse_scan(argv, (), {b"queue": bytes, b"state": _job_state, b"reply": _reply_type, b"key": bytes})
    cursor, jobs = _scan(node.jobs, cursor, opts)
    return node.blocking.in_slices(client, _jscan_reply(node, cursor, jobs, opts))


def _jscan_reply(node: NodeCore, cursor: int, jobs: list[Job], opts: dict[bytes, Any]) -> Generator[None, None, list[Any]]:
    queues = opts.get(b"queue")
    states = opts.get(b"state")
    keys = opts.get(b"key")
    reply_all = opts.get(b"reply", [False])[-1]
    items: list[Any] = []
    for n, job in enumerate(jobs, 1):
        if not (
            job.is_dummy_ack or (queues and job.queue != queues[-1]) or (states and job.state not in states)
            or (keys and job.key != keys[-1])
        ):
            items.append(show(node, job) if reply_all else Status(job.id))
        if not n % SLICE and n < len(jobs):
            yield
    return [str(cursor).encode(), items]


COMMANDS[b"scanjobs"] = Command("scanjobs", -1, "r", cmd_jscan)


@command("qscan", -1, "r")
def cmd_qscan(node: NodeCore, client: Connection, argv: list[bytes]) -> list[Any]:
    cursor, opts = parse_scan(argv, (b"minlen", b"maxlen", b"importrate"), {})
    cursor, queues = _scan(node.queues, cursor, opts)
    minlen, maxlen, rate = opts.get(b"minlen"), opts.get(b"maxlen"), opts.get(b"importrate")
    names = [
        q.name
        for q in queues
        if (minlen is None or len(q) >= minlen)
        and (maxlen is None or len(q) <= maxlen)
        and (rate is None or node.federation.import_rate(q) >= rate)
    ]
    return [str(cursor).encode(), names]


# ---------------------------------------------------------------- queues


@command("qlen", 2, "rF")
def cmd_qlen(node: NodeCore, client: Connection, argv: list[bytes]) -> int:
    queue = node.queues.get(argv[1])
    return 0 if queue is None else len(queue)


@command("qpeek", 3, "r")
def cmd_qpeek(node: NodeCore, client: Connection, argv: list[bytes]) -> list[Any]:
    count = int_or(argv[2], errors.not_integer)
    queue = node.queues.get(argv[1])
    if queue is None or count == 0:
        return []
    now, aging = node.now, node.config.priority_aging
    source = queue.oldest(now, aging) if count > 0 else queue.newest(now, aging)
    out: list[Any] = []
    for job in source:
        if len(out) == abs(count):
            break
        entry = node.blocking.job_entry(job, False)
        if job.priority != DEFAULT_PRIORITY:
            entry += [b"priority", job.priority]
        if job.rare is not None and job.rare.key:
            entry += [b"key", job.rare.key]
        out.append(entry)
    return out


@command("qstat", 2, "rF")
def cmd_qstat(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    queue = node.queues.get(argv[1])
    if queue is None:
        return NIL_ARRAY
    now = node.now
    return Map(
        [
            (b"name", queue.name),
            (b"len", len(queue)),
            (b"age", max(0, (now - queue.ctime) // 1000)),
            (b"idle", max(0, (now - queue.atime) // 1000)),
            (b"blocked", len(queue.waiters)),
            (b"import-from", node.federation.import_from(queue)),
            (b"import-rate", node.federation.import_rate(queue)),
            (b"jobs-in", queue.jobs_in),
            (b"jobs-out", queue.jobs_out),
            (b"pause", PAUSE_NAMES[queue.pause]),
        ]
        + ([(b"dead-lettered", queue.dead_lettered)] if queue.dead_lettered else [])  # the MAXATTEMPTS extension
        + _priorities(queue)
    )


def _priorities(queue: Queue) -> list[tuple[bytes, Any]]:
    """QSTAT's `priorities` (PRIORITY): the jobs queued at each priority,
    highest first, as [priority, count, ...], for a queue that holds any
    job of another priority than the default."""
    counts = [(level.priority, level.live) for level in queue.levels if level.live]
    if all(priority == DEFAULT_PRIORITY for priority, _ in counts):
        return []
    return [(b"priorities", [n for pair in counts for n in pair])]


QKEYS_MAX: Final = 1000  # busiest keys in one reply: a reply stays small, its sort short
QKEYS_SYNTAX: Final = "Syntax error, try QKEYS <queue> [COUNT <n>]"


@command("qkeys", -2, "r")
def cmd_qkeys(node: NodeCore, client: Connection, argv: list[bytes]) -> Map:
    """QKEYS <queue> [COUNT n] (an extension, docs/keys.md "Watching keys"):
    the keys with jobs queued in <queue> on this node, the keyed jobs
    queued, and the n keys with the most (default 10, at most QKEYS_MAX),
    as [key, jobs, ...], read from the queue's lanes (store/queue.py `Fair`)."""
    count = 10
    if len(argv) == 4 and argv[2].lower() == b"count":
        count = int_or(argv[3], errors.not_integer)
        if not 1 <= count <= QKEYS_MAX:
            raise err(f"COUNT must be between 1 and {QKEYS_MAX}")
    elif len(argv) != 2:
        raise err(QKEYS_SYNTAX)
    queue = node.queues.get(argv[1])
    fair = queue.fair if queue is not None else None
    if fair is None:  # no keyed job was ever queued here
        return Map([(b"keys", 0), (b"jobs", 0), (b"busiest", [])])
    keys, busiest = fair.busiest(count)
    return Map([(b"keys", keys), (b"jobs", fair.live), (b"busiest", [v for pair in busiest for v in pair])])


@command("qsettings", 2, "rF")
def cmd_qsettings(node: NodeCore, client: Connection, argv: list[bytes]) -> Map:
    """A queue's effective Kestrel settings (an extension, docs/kestrel.md):
    option -> value as the config file writes it, in Kestrel's order."""
    settings = node.config.queue_config.settings(argv[1])
    return Map((name.encode(), text.encode("utf-8", "surrogateescape")) for name, text in settings.pairs())


PAUSE_OPTS = {b"none": None, b"in": PAUSE_IN, b"out": PAUSE_OUT, b"all": PAUSE_IN | PAUSE_OUT}


@command("pause", -3, "rF")
def cmd_pause(node: NodeCore, client: Connection, argv: list[bytes]) -> Status:
    flags = 0
    change = bcast = False
    for raw in argv[2:]:
        opt = raw.lower()
        if opt in PAUSE_OPTS:
            bit = PAUSE_OPTS[opt]
            flags = 0 if bit is None else flags | bit
            change = True
        elif opt == b"bcast":
            bcast = True
        elif opt != b"state":
            raise errors.syntax()
    name = argv[1]
    if change:
        node.lifecycle.set_pause(name, flags)
    queue = node.queues.get(name)
    result = 0 if queue is None else queue.pause
    if bcast:
        msg = m.Pause(name, result)
        for node_id in node.membership.linked_ids():
            node.out.send(node_id, msg)
    return Status(PAUSE_NAMES[result].encode())


# ---------------------------------------------------------------- connection


@command("auth", 2, "rlF")
def cmd_auth(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    if not node.config.requirepass:
        raise errors.err("Client sent AUTH, but no password is set")
    return node.gate.authenticate(client, argv[1], errors.err("invalid password")) or OK


@command("ping", -1, "rF")
def cmd_ping(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    if len(argv) > 2:
        raise errors.wrong_arity("ping")
    return Status(b"PONG") if len(argv) == 1 else argv[1]


@command("echo", 2, "rF")
def cmd_echo(node: NodeCore, client: Connection, argv: list[bytes]) -> bytes:
    return argv[1]


@command("select", 2, "rlF")
def cmd_select(node: NodeCore, client: Connection, argv: list[bytes]) -> Status:
    if argv[1] != b"0":
        raise err("DB index is out of range")
    return OK


@command("time", 1, "rF")
def cmd_time(node: NodeCore, client: Connection, argv: list[bytes]) -> list[bytes]:
    us = node.clock.wall_us()
    return [str(us // 1_000_000).encode(), str(us % 1_000_000).encode()]


@command("hello", -1, "rlF")
def cmd_hello(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    if len(argv) == 1:
        return admin.hello(node)
    return admin.redis_hello(node, client, argv[1:])


@command("client", -2, "ar")
def cmd_client(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    return admin.client_command(node, client, argv)


@command("command", 0, "rl")
def cmd_command(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    if len(argv) == 1:
        return [_command_entry(c) for c in COMMANDS.values()]
    sub = argv[1].lower()
    if sub == b"count" and len(argv) == 2:
        return len(COMMANDS)
    if sub == b"info":
        return [None if (c := COMMANDS.get(a.lower())) is None else _command_entry(c) for a in argv[2:]]
    if sub == b"docs":
        return Map([])
    raise err("Unknown subcommand or wrong number of arguments.")


def _command_entry(cmd: Command) -> list[Any]:
    # Upstream lists the flags in a fixed order, whatever the table says.
    flags = [Status(word.encode()) for f, word in FLAG_WORDS.items() if f in cmd.flags]
    return [cmd.name, cmd.arity, flags, 0, 0, 0]


@command("monitor", 1, "ar")
def cmd_monitor(node: NodeCore, client: Connection, argv: list[bytes]) -> Status:
    node.gate.monitors[client.id] = client
    return OK


# ---------------------------------------------------------------- server


@command("info", -1, "rl")
def cmd_info(node: NodeCore, client: Connection, argv: list[bytes]) -> bytes:
    if len(argv) > 2:
        raise errors.syntax()
    return admin.info(node, text(argv[1]).lower() if len(argv) == 2 else "default")


@command("config", -2, "ar")
def cmd_config(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    return admin.config_command(node, argv)


@command("shutdown", -1, "arl")
def cmd_shutdown(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() != b"rewrite-aof"):
        raise errors.syntax()
    if not node.host.shutdown(len(argv) == 2):
        raise err("Errors trying to SHUTDOWN. Check logs.")
    return SILENT


@command("bgrewriteaof", 1, "ar")
def cmd_bgrewriteaof(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    return node.host.bgrewriteaof()


@command("debug", -2, "a")
def cmd_debug(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    return admin.debug_command(node, argv)


@command("slowlog", -2, "r")
def cmd_slowlog(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    if sub == b"len" and len(argv) == 2:
        return len(node.gate.slowlog)
    if sub == b"reset" and len(argv) == 2:
        node.gate.slowlog.clear()
        return OK
    if sub == b"get" and len(argv) <= 3:
        count = int_or(argv[2], errors.not_integer) if len(argv) == 3 else 10
        return [list(entry) for entry in list(node.gate.slowlog)[:count]]
    raise err("Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")


@command("latency", -2, "arl")
def cmd_latency(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    if sub == b"latest" and len(argv) == 2:
        return []
    if sub == b"doctor" and len(argv) == 2:
        return b"No latency spikes were observed (latency monitoring is not sampling events)."
    if sub == b"history" and len(argv) == 3:
        return []
    if sub == b"graph" and len(argv) == 3:
        raise err(f"No samples available for event '{text(argv[2])}'")
    if sub == b"reset":
        return 0
    raise errors.syntax()


@command("cluster", -2, "ar")
def cmd_cluster(node: NodeCore, client: Connection, argv: list[bytes]) -> Any:
    return admin.cluster_command(node, argv)
