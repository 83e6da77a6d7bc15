"""What every command passes, whatever its front end: the gate.

Theory of operation: a front end parses a request, finds its command and
checks its arity, then hands it to `Gate.execute` (through
`NodeCore.execute`), which applies the checks of spec/commands.md §1.3 in
order: AUTH when a password is set; memory (at level 2 it evicts first,
and refuses commands flagged `m` when nothing can go); a failing disk (the
AOF's or read-behind's: MISCONF for what adds data and PING, not for
consumers, so GETJOB and ACKJOB drain the backlog that filled it); LOADING
while the AOF replays.  Then it feeds MONITOR, runs the handler (a
`DisqueError` becomes the reply; any other exception is logged and costs
this one request, not the node), and counts: calls, time, the latency
histogram, the slow log.

Passwords: `check_password` counts guesses per source address across
connections and ports (core/auth_throttle.py) and the answer of a wrong
one waits (`Blocking.answer_late`), so that guessing costs time.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from disque.core import errors
from disque.core.auth_throttle import REFUSED, AuthThrottle
from disque.core.errors import DisqueError
from disque.core.settings import Settings
from disque.core.types import Clock, Command, Connection, Stats, Status

if TYPE_CHECKING:
    from disque.core.blocking import Blocking
    from disque.core.lifecycle import Lifecycle
    from disque.core.memory import Memory
    from disque.core.outbox import Outbox
    from disque.store.jobs import Spill

log = logging.getLogger("disque")

OK = Status(b"OK")
AUTH_LOG_EVERY_MS = 10_000  # at most one log line about failed AUTHs per period
# Command latency histogram (Stats.calls): bucket i counts the calls that took
# 2**(i-1) µs or more and less than 2**i µs (bucket 0: under 1 µs); the last
# bucket also takes every longer call.
LATENCY_BUCKETS: Final = 22

_ESCAPES = {b"\\": b"\\\\", b'"': b'\\"', b"\n": b"\\n", b"\r": b"\\r", b"\t": b"\\t", b"\a": b"\\a", b"\b": b"\\b"}
_UNPRINTABLE = re.compile(rb'[^\x20\x21\x23-\x5b\x5d-\x7e]')


def monitor_repr(arg: bytes) -> bytes:
    """An argument as MONITOR shows it (upstream sdscatrepr): quoted, with
    escapes for quotes, backslashes and control bytes, so that no CR or LF
    can break the status line."""
    return b'"%s"' % _UNPRINTABLE.sub(lambda m: _ESCAPES.get(m[0]) or b"\\x%02x" % m[0][0], arg)


class Gate:
    def __init__(
        self, config: Any, clock: Clock, stats: Stats, life: Lifecycle, out: Outbox, memory: Memory, waits: Blocking,
        spill: Spill,
    ) -> None:  # fmt: skip
        self.config = config
        self.settings: Settings = config.settings  # what every command reads, typed
        self.clock = clock
        self.stats = stats
        self.life = life  # the time of the step
        self.out = out
        self.memory = memory
        self.waits = waits
        self.spill = spill
        self.loading = False  # the AOF replays: commands without the `l` flag answer -LOADING
        self.aof_error: str | None = None  # strerror of the last failed AOF write (MISCONF)
        self.monitors: dict[int, Connection] = {}
        self.slowlog: deque[tuple[int, int, int, list[bytes]]] = deque()
        self.slowlog_id = 0
        self.auth_throttle = AuthThrottle()  # wrong passwords by source address
        self._auth_logged = -AUTH_LOG_EVERY_MS  # when a failed AUTH was last logged

    def execute(self, node: Any, client: Connection, cmd: Command, argv: list[bytes]) -> Any:
        """The checks, then `cmd.handler(node, client, argv)`, with
        statistics, MONITOR and the slow log."""
        settings = self.settings
        if settings.requirepass and not client.authenticated:
            if cmd.name != "auth" and not (cmd.name == "hello" and len(argv) > 1):
                return errors.noauth()
        flags = cmd.flags
        limit = settings.maxmemory
        memory = self.memory
        if limit and memory.used > limit // 100 * 95 and not memory.evict() and "m" in flags:
            return errors.oom()
        if "m" in flags or cmd.name == "ping":
            if self.aof_error is not None:
                return errors.misconf(self.aof_error)
            if (disk := self.spill.error()) is not None:
                return errors.misconf(disk, "reading or writing the read-behind segments")
        if self.loading and "l" not in flags:
            return errors.loading()
        client.last_cmd = cmd.name
        stats = self.stats
        stats.commands += 1
        if self.monitors:
            self.feed_monitors(client, argv)
        try:
            reply = cmd.handler(node, client, argv)
        except DisqueError as e:
            reply = e.detach()
        except Exception:  # a bug must cost one reply, not the node and every job in it
            log.exception("Error executing %r", [a[:64] for a in argv[:8]])
            reply = errors.err(f"internal error executing '{cmd.name}', check the server logs")
        elapsed = self.clock.since_us()  # from `handle_command`'s reading of the clock
        calls = stats.calls.get(cmd.name)
        if calls is None:
            calls = stats.calls[cmd.name] = [0] * (2 + LATENCY_BUCKETS)
        calls[0] += 1
        calls[1] += elapsed
        calls[2 + min(elapsed.bit_length(), LATENCY_BUCKETS - 1)] += 1
        slower = settings.slowlog_log_slower_than
        if elapsed >= slower >= 0:  # as Redis: 0 logs every command
            self.slowlog_add(argv, elapsed)
        if client.reply_mode:
            return client.silence(reply)
        return reply

    # ------------------------------------------------------------ AUTH

    def authenticate(self, client: Connection, password: bytes | None, failure: DisqueError, success: Any = OK) -> Any:
        """AUTH (`password` None: a user other than `default`): None when it
        is right and may be answered at once; else `failure` raised, or
        BLOCKED when the answer (`failure`, or `success`) must wait
        (`check_password`)."""
        delay = self.check_password(client, password)
        if client.authenticated and not delay:
            return None
        return self.waits.answer_late(client, delay, success if client.authenticated else failure)

    def check_password(self, client: Connection, password: bytes | None) -> int:
        """Check a password a client sent (setting `client.authenticated`);
        the ms its answer must wait, so that guessing costs time
        (core/auth_throttle.py: counted per source address, across
        connections and ports).  Raises when the address has too many
        attempts waiting already (the password is not looked at then).
        Failures are counted in INFO and logged, rate-limited."""
        required = self.config.requirepass
        assert required
        ok = password is not None and len(password) <= 512 and password == required.encode()
        now = self.life.now
        delay = self.auth_throttle.attempt(client.addr, now, ok)
        if delay == REFUSED:
            client.authenticated = False
            raise errors.auth_refused()
        client.authenticated = ok
        if not ok:
            self.stats.auth_failures += 1
            if now - self._auth_logged >= AUTH_LOG_EVERY_MS:
                self._auth_logged = now
                log.warning("Failed AUTH from %s (%d failures since start)", client.addr, self.stats.auth_failures)
        return delay

    # ------------------------------------------------------------ MONITOR and the slow log

    def feed_monitors(self, client: Connection, argv: list[bytes]) -> None:
        now_us = self.clock.wall_us()
        args = b" ".join(monitor_repr(a) for a in argv)
        line = Status(b"%d.%06d [%s] %s" % (now_us // 1_000_000, now_us % 1_000_000, client.addr.encode(), args))
        for monitor in self.monitors.values():
            if monitor is not client:
                self.out.reply_to(monitor, line)

    def slowlog_add(self, argv: list[bytes], elapsed_us: int) -> None:
        self.slowlog_id += 1
        self.slowlog.appendleft((self.slowlog_id, self.life.now // 1000, elapsed_us, argv[:32]))
        while len(self.slowlog) > self.config.slowlog_max_len:
            self.slowlog.pop()
