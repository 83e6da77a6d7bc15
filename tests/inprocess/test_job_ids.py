"""Job IDs (store/ids.py, spec/commands.md §2.2): the TTL field and its
parity, validation, the mixed node IDs, and a collision refused."""

from __future__ import annotations

import random

import pytest

from disque.store import ids

from jobenv import env
from support import NODE_ID


def test_ttl_field_of_ids_is_minutes_and_parity_records_retry():
    cases = [  # spec/commands.md §2.2
        (86400, 1, b"05a1"), (86400, 0, b"05a0"), (59, 1, b"0001"), (59, 0, b"0000"),
        (180, 0, b"0002"), (120, 0, b"0002"), (300_000_000, 1, b"ffff"), (300_000_000, 0, b"fffe"),
    ]  # fmt: skip
    rng = random.Random(3)
    for ttl, retry, field in cases:
        job_id = ids.new_job_id(NODE_ID, rng, ttl, retry)
        assert job_id[42:46] == field and ids.ttl_minutes(job_id) == int(field, 16)
        assert ids.valid_id(job_id) and job_id[:10] == b"DI" + NODE_ID[:8].encode()
        assert ids.node_prefix(job_id) == NODE_ID[:8]
        assert all(c in b"0123456789abcdef" for c in job_id[10:46])


@pytest.mark.parametrize(
    "job_id, valid, minutes",
    [
        (b"DI" + b"x" * 40 + b"05A1SQ", True, 0x5A1),  # case-insensitive
        (b"DI" + b"x" * 40 + b"0g1zSQ", True, 0x010),  # a non-hex digit counts as 0
        (b"DI" + b"x" * 44 + b"SQ", True, 0),
        (b"DJ" + b"x" * 44 + b"SQ", False, 0),
        (b"DI" + b"x" * 44 + b"SX", False, 0),
        (b"DI" + b"x" * 43 + b"SQ", False, 0),
    ],
)
def test_id_validation_and_ttl_field(job_id, valid, minutes):
    assert ids.valid_id(job_id) is valid
    if valid:
        assert ids.ttl_minutes(job_id) == minutes


def test_mixed_node_ids_follow_the_spec_formula():
    job_id = b"DI" + bytes(range(0x41, 0x41 + 44)) + b"SQ"
    expected = bytes(ord(c) ^ job_id[10 + i % 32] for i, c in enumerate(NODE_ID))
    assert ids.mixed(NODE_ID, job_id) == expected


def test_id_collision_is_refused(env):
    state = env.core.rng.getstate()
    job_id = env.add("q", "x")
    env.core.rng.setstate(state)
    reply = env.s("ADDJOB", "q", "y", 0)
    assert reply.message == "Internal error creating the job, check server logs"
    assert env.show(job_id)["body"] == b"x"
