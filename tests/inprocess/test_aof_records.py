"""The AOF records a job's life writes (spec/persistence.md): LOADJOB when
it is made, DELJOB when it goes, nothing when the AOF is off."""

from __future__ import annotations

import pytest

from disque.core.effects import AofAppend
from disque.store.aof import encode_deljob

from jobenv import ODD_ID, duo, env


@pytest.mark.parametrize(
    "prepare, command, logged",
    [
        ((), "ACKJOB", True),
        ((), "FASTACK", True),
        ((), "DELJOB", True),
        (("GETJOB", "FROM", "q"), "DELJOB", True),
        (("DEQUEUE",), "DEQUEUE", False),
        ((), "WORKING", False),
    ],
)
def test_aof_records_follow_the_job(env, prepare, command, logged):
    env.core.aof.state = "on"
    job_id = env.add("q", "x")
    if prepare:
        env.s(*prepare, *([] if prepare[0] == "GETJOB" else [job_id]))
    env.s(command, job_id)
    records = [e.record for e in env.core.out.effects if isinstance(e, AofAppend)]
    assert len(records) == 1 + logged and records[1:] == ([encode_deljob(job_id)] if logged else [])
    assert records[0].startswith(b"*3\r\n$7\r\nLOADJOB\r\n") and job_id in records[0]


def test_no_aof_records_when_off(env):
    env.s("ACKJOB", env.add())
    assert not any(isinstance(e, AofAppend) for e in env.core.out.effects)


def test_expiry_is_logged_and_acked_jobs_are_not(duo):
    duo.core.aof.state = "on"
    job_id = duo.add("q", "x", "TTL", 2, "REPLICATE", 1)
    duo.wait(3_100)
    assert duo.show(job_id) is None
    assert [e.record for e in duo.core.out.effects if isinstance(e, AofAppend)][-1].startswith(b"*3\r\n$6\r\nDELJOB")
    duo.core.out.effects.clear()
    duo.s("ACKJOB", ODD_ID)
    assert not any(isinstance(e, AofAppend) for e in duo.core.out.effects)
