"""Fuzzing the command layer: arbitrary argument vectors (known command names
with plausible, hostile or random arguments, and random bytes) go through
`NodeCore.handle_command` from several connections while time passes.  Every
call must give a reply value that the RESP encoder accepts (an error reply is
fine, an internal error is not), and the core must stay consistent
(`invariants.check_core`) after every step.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from disque.protocols.resp.table import COMMANDS
from disque.core.effects import CloseClient, Reply
from disque.core.errors import DisqueError
from disque.core.types import BLOCKED, SILENT, Map, Status
from disque.protocols.resp.encoder import encode
from invariants import advance, check_core, quick_and_slow
from support import NODE_ID, Session, all_jobs, make_core

KEYWORDS = [
    b"FROM", b"NOHANG", b"COUNT", b"TIMEOUT", b"WITHCOUNTERS", b"RETRY", b"TTL", b"DELAY", b"MAXLEN",
    b"REPLICATE", b"ASYNC", b"in", b"out", b"all", b"none", b"state", b"bcast", b"BUSYLOOP", b"QUEUE",
    b"STATE", b"REPLY", b"MINLEN", b"IMPORTRATE", b"id", b"queued", b"active", b"acked", b"wait-repl",
    b"get", b"set", b"list", b"kill", b"reply", b"off", b"skip", b"on", b"setname", b"getname", b"len",
    b"reset", b"flushall", b"error", b"leaving", b"yes", b"no", b"info", b"nodes", b"myid", b"docs",
    b"jobs", b"default", b"maxmemory", b"maxmemory-policy", b"noeviction", b"hz", b"rewrite-aof",
    b"resetstat", b"forget", b"meet", b"127.0.0.1", b"sleep", b"structsize", b"latest", b"history",
    b"graph", b"doctor", b"addr", b"type", b"normal", b"skipme", b"setinfo", b"lib-name", b"pause",
    b"AFTER", b"ON-PARENT-FAIL", b"run", b"drop", b"fail", b"RESULT", b"WITHRESULTS", b"BATCH", b"new", b"close",
    b"show", b"ON-SUCCESS", b"ON-COMPLETE", b"KEY",
]  # fmt: skip
NUMBERS = [
    b"0", b"1", b"-1", b"2", b"3", b"10", b"100", b"1000", b"+5", b"", b" 1", b"1 ", b"1e3", b"0x10",
    b"9223372036854775807", b"9223372036854775808", b"-9223372036854775809", b"18446744073709551616",
    b"9" * 5000,
]  # fmt: skip
QUEUES = [b"q", b"q2", b""]
FAKE_IDS = [b"DI" + NODE_ID[:8].encode() + b"f" * 32 + b"05a1SQ", b"DI" + b"x" * 44 + b"SQ", b"DI" + b"0" * 44 + b"SQ"]
MAX_SESSIONS = 4


def replies_ok(value, proto: int) -> None:
    """A reply must be encodable, and status lines must not break the framing."""
    assert not (isinstance(value, DisqueError) and value.message.startswith("internal error")), value
    if value is BLOCKED or value is SILENT:
        return
    encode(value, proto)
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is Status:
            assert b"\r" not in item and b"\n" not in item, item
        elif type(item) is Map:
            stack.extend(v for pair in item for v in pair)
        elif type(item) in (list, tuple):
            stack.extend(item)


class CommandFuzz(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core, self.clock, self.host = make_core()
        self.sessions: list[Session] = [Session(self.core)]
        self.watcher = Session(self.core)  # MONITOR: every command is echoed to it
        assert self.watcher("MONITOR") == Status(b"OK")

    def job_ids(self) -> list[bytes]:
        return sorted(job.id for job in all_jobs(self.core))

    def argument(self, data) -> bytes:
        known = self.job_ids()
        return data.draw(
            st.one_of(
                st.sampled_from(KEYWORDS),
                st.sampled_from(NUMBERS),
                st.sampled_from(QUEUES + FAKE_IDS),
                st.sampled_from(known) if known else st.just(b"q"),
                st.binary(max_size=50),
                st.sampled_from(KEYWORDS).map(bytes.upper),
            )
        )

    def free_session(self, data) -> Session:
        """Any connection not waiting for a reply (or a new one)."""
        free = [s for s in self.sessions if s.client.waiter is None and not s.client.repl_jobs]
        index = data.draw(st.integers(0, len(free)))
        if index < len(free):
            return free[index]
        session = Session(self.core)
        self.sessions.append(session)
        return session

    def run(self, session: Session, argv: list[bytes]) -> None:
        reply = session(*argv)
        replies_ok(reply, session.client.proto)
        self.absorb_effects()

    def absorb_effects(self) -> None:
        """Check replies to other connections; close what the core closed."""
        core = self.core
        clients = {s.client.id: s for s in [*self.sessions, self.watcher]}
        for effect in core.out.effects:
            if isinstance(effect, Reply) and effect.client_id in clients:
                replies_ok(effect.value, clients[effect.client_id].client.proto)
        closed = {e.client_id for e in core.out.effects if isinstance(e, CloseClient)}
        core.out.effects.clear()
        for client_id in closed & set(clients):
            core.disconnect(client_id)
            if clients[client_id] is self.watcher:
                self.watcher = Session(core)
                self.watcher("MONITOR")
            else:
                self.sessions.remove(clients[client_id])
        if not self.sessions:
            self.sessions.append(Session(core))

    @rule(data=st.data(), name=st.sampled_from(sorted(COMMANDS)), case=st.sampled_from([bytes.lower, bytes.upper]))
    def known_command(self, data, name, case):
        args = [self.argument(data) for _ in range(data.draw(st.integers(0, 8)))]
        self.run(self.free_session(data), [case(name), *args])

    @rule(data=st.data(), argv=st.lists(st.binary(max_size=20), min_size=1, max_size=5))
    def random_bytes(self, data, argv):
        self.run(self.free_session(data), argv)

    @rule(
        data=st.data(),
        name=st.sampled_from([b"ADDJOB", b"GETJOB", b"ACKJOB", b"NACK", b"WORKING", b"QSCAN", b"JSCAN", b"PAUSE"]),
    )
    def job_command(self, data, name):
        """Mostly well-formed job traffic, so that jobs exist for the rest to hit."""
        q = data.draw(st.sampled_from(QUEUES[:2]))
        known = self.job_ids()
        ids = data.draw(st.lists(st.sampled_from(known), min_size=1, max_size=3)) if known else FAKE_IDS[:1]
        words = [b"RETRY", b"TTL", b"DELAY", b"MAXLEN", b"0", b"1", b"2", b"5", b"KEY", b"k", b"DEBOUNCE", b"DEDUP", b"1500"]
        opts = data.draw(st.lists(st.sampled_from(words), max_size=6))
        argv = {
            b"ADDJOB": [q, b"body", b"0", *opts],
            b"GETJOB": [b"NOHANG", b"COUNT", b"2", b"FROM", q],
            b"QSCAN": [b"COUNT", b"1", *opts[:2]],
            b"JSCAN": [b"STATE", b"queued", *opts[:2]],
            b"PAUSE": [q, data.draw(st.sampled_from([b"in", b"out", b"all", b"none"]))],
        }.get(name, ids)
        self.run(self.free_session(data), [name, *argv])

    @rule(ms=st.sampled_from([1, 100, 1000, 5000, 60_000]))
    def wait(self, ms):
        advance(self.core, self.clock, ms)
        self.absorb_effects()

    @precondition(lambda self: len(self.sessions) > MAX_SESSIONS)
    @rule()
    def disconnect(self):
        session = self.sessions.pop(0)
        self.core.disconnect(session.client.id)

    @invariant()
    def consistent(self):
        check_core(self.core)


TestCommandFuzz, TestCommandFuzzLong = quick_and_slow(CommandFuzz, quick=(100, 30), slow=(1000, 60))
