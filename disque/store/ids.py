"""48-character job IDs (spec/commands.md §2).

Theory of operation: an ID is `DI` + the first 8 characters of the creating
node's ID + 32 random lowercase hex characters + the TTL in minutes as 4 hex
digits + `SQ`.  The random part comes from the `random.Random` the caller
injects, so simulations are reproducible; the fixed parts are formatted once
per node ID and TTL field.  The parity of the TTL field records
the delivery guarantee: odd = at-least-once (RETRY > 0), even = at-most-once.
A recurring job's tick has an ID made from the schedule and the tick
instead (`tick_job_id`).  IDs are bytes everywhere in the core: they arrive as bytes from clients and
leave as bytes in replies.
"""

from __future__ import annotations

from binascii import hexlify
from hashlib import blake2b
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # annotations only: the caller passes its rng
    import random

ID_LEN = 48

# The fixed parts, formatted once: `DI` + node prefix by node ID, TTL field + `SQ` by TTL field
_PREFIXES: Final[dict[str, bytes]] = {}
_SUFFIXES: Final[dict[int, bytes]] = {}


def _suffix(ttl: int, at_least_once: bool) -> bytes:
    minutes = min(ttl // 60, 65535)
    minutes = minutes | 1 if at_least_once else minutes & ~1
    suffix = _SUFFIXES.get(minutes)
    if suffix is None:
        suffix = _SUFFIXES[minutes] = b"%04xSQ" % minutes
    return suffix


def new_job_id(node_id: str, rng: random.Random, ttl: int, retry: int) -> bytes:
    prefix = _PREFIXES.get(node_id)
    if prefix is None:
        prefix = _PREFIXES[node_id] = b"DI" + node_id[:8].encode()
    return prefix + hexlify(rng.getrandbits(128).to_bytes(16, "big")) + _suffix(ttl, retry > 0)


def tick_job_id(schedule: bytes, tick: int, ttl: int, retry: int) -> bytes:
    """The job of tick `tick` (ms) of a schedule (core/schedules.py): made from
    (schedule, tick) alone, so every node that fires the tick makes the same
    ID; the node part is the schedule's, not a node's."""
    digest = blake2b(b"%s\0%d" % (schedule, tick), digest_size=20).digest()
    return b"DI" + hexlify(digest[16:]) + hexlify(digest[:16]) + _suffix(ttl, retry != 0)  # (retry -1: ADDJOB's default, > 0)


def valid_id(job_id: bytes) -> bool:
    return len(job_id) == ID_LEN and job_id[:2] == b"DI" and job_id[46:] == b"SQ"


def ttl_minutes(job_id: bytes) -> int:
    """TTL field of an ID; a non-hex digit counts as 0, as upstream does."""
    value = 0
    for ch in job_id[42:46].lower():
        digit = ch - 48 if 48 <= ch <= 57 else ch - 87 if 97 <= ch <= 102 else 0
        value = value * 16 + digit
    return value


def mixed(node_id: str, job_id: bytes) -> bytes:
    """Per-job mixing of a node ID used to break ties between nodes (§2.5)."""
    return bytes(b ^ job_id[10 + (i % 32)] for i, b in enumerate(node_id.encode()[:40]))


def node_prefix(job_id: bytes) -> str:
    return job_id[2:10].decode("ascii", "replace")
