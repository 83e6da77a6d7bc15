"""DEADLETTER REQUEUE (node.requeue_dead_letters): dead letters go back to
the queue they came from with fresh attempt counts, on a fake clock."""

from __future__ import annotations

import pytest

from disque.cluster import messages as m
from disque.core.figures import BODY_PREVIEW, client_figures, dead_letter_figures
from disque.core.types import BLOCKED, NIL_ARRAY
from invariants import check_core
from support import NODE_ID, Session, all_jobs, bus_sent, linked_core, make_core

PEER = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"


@pytest.fixture
def s() -> Session:
    core, _, _ = make_core()
    return Session(core)


def fail(s: Session, job_id: bytes, times: int) -> None:
    """A consumer that takes the job and NACKs it, `times` times."""
    for _ in range(times):
        assert s("GETJOB", "NOHANG", "FROM", s.core.jobs.get(job_id).queue)[0][1] == job_id
        assert s("NACK", job_id) == 1


def dead_letter(s: Session, queue: str = "q", body: str = "x", attempts: int = 2, *opts) -> bytes:
    """A job of `queue` that failed `attempts` times: the ID of its dead-lettered copy."""
    job_id = bytes(s("ADDJOB", queue, body, 0, "RETRY", 30, "MAXATTEMPTS", attempts, *opts))
    fail(s, job_id, attempts)
    assert s.core.jobs.get(job_id) is None
    (copy,) = [j for j in all_jobs(s.core) if j.origin == job_id]
    return copy.id


def test_a_dead_letter_goes_back_with_fresh_counts_and_can_die_again(s):
    copy_id = dead_letter(s, "orders", "o1", 3, "DEADLETTER", "failed")
    shown = dict(s("SHOW", copy_id))
    assert (shown[b"queue"], shown[b"dead-letter-from"], shown[b"nacks"]) == (b"failed", b"orders", 2)
    assert b"max-attempts" not in shown  # the origin's, kept for the requeue only
    assert s("DEADLETTER", "REQUEUE", "failed") == 1
    assert s("SHOW", copy_id) is None and s("QLEN", "failed") == 0
    [(queue, job_id, body)] = s("GETJOB", "NOHANG", "FROM", "orders")
    shown = dict(s("SHOW", job_id))
    assert (queue, body, shown[b"nacks"], shown[b"additional-deliveries"]) == (b"orders", b"o1", 0, 0)
    assert (shown[b"max-attempts"], shown[b"dead-letter"]) == (3, b"failed") and b"dead-letter-of" not in shown
    assert s("NACK", job_id) == 1
    fail(s, job_id, 2)  # three more attempts in all, then back to the dead letters
    assert s("QLEN", "failed") == 1 and s("QLEN", "orders") == 0
    check_core(s.core)


def test_count_takes_the_oldest_and_other_jobs_of_the_queue_stay(s):
    first, second, third = (dead_letter(s, "q", body) for body in ("a", "b", "c"))
    plain = bytes(s("ADDJOB", "q-dead", "not a dead letter", 0))
    assert s("DEADLETTER", "REQUEUE", "q-dead", "COUNT", 2) == 2
    assert [body for _, _, body in s("QPEEK", "q", 10)] == [b"a", b"b"]
    assert [job_id for _, job_id, _ in s("QPEEK", "q-dead", 10)] == [third, plain]
    assert s("DEADLETTER", "requeue", "q-dead", "count", 5) == 1  # the plain job stays where it is
    assert s("DEADLETTER", "REQUEUE", "q-dead") == 0 and s("QLEN", "q-dead") == 1
    assert s("DEADLETTER", "REQUEUE", "nosuchqueue") == 0
    assert first != second and s("QLEN", "q") == 3
    check_core(s.core)


def test_a_copy_made_without_its_queue_stays(s):
    copy_id = dead_letter(s)
    s.core.jobs.get(copy_id).rare.dead_letter = b""  # as an older version made it
    assert s("DEADLETTER", "REQUEUE", "q-dead") == 0 and s("QLEN", "q-dead") == 1
    assert b"dead-letter-from" not in dict(s("SHOW", copy_id))


def test_the_dead_letters_queued_here_only(s):
    """A copy taken by a consumer (active) is not requeued, and a dead letter is
    never dead-lettered again, whatever its counters."""
    copy_id = dead_letter(s, attempts=1)
    assert s("GETJOB", "NOHANG", "FROM", "q-dead")[0][1] == copy_id
    assert s("DEADLETTER", "REQUEUE", "q-dead") == 0
    for _ in range(3):
        assert s("NACK", copy_id) == 1
        assert s("GETJOB", "NOHANG", "FROM", "q-dead")[0][1] == copy_id
    assert s("GETJOB", "NOHANG", "FROM", "q-dead-dead") is NIL_ARRAY


@pytest.mark.parametrize(
    "argv, error",
    [
        (("DEADLETTER", "LIST", "q"), "Syntax error, try DEADLETTER REQUEUE <queue> [COUNT <n>]"),
        (("DEADLETTER", "REQUEUE", "q", "COUNT"), "Syntax error, try DEADLETTER REQUEUE <queue> [COUNT <n>]"),
        (("DEADLETTER", "REQUEUE", "q", "LIMIT", "1"), "Syntax error, try DEADLETTER REQUEUE <queue> [COUNT <n>]"),
        (("DEADLETTER", "REQUEUE", "q", "COUNT", "0"), "COUNT must be a number greater than zero"),
        (("DEADLETTER", "REQUEUE", "q", "COUNT", "x"), "value is not an integer or out of range"),
        (("DEADLETTER", "REQUEUE"), "wrong number of arguments for 'deadletter' command"),
    ],
)
def test_bad_arguments_get_an_error(s, argv, error):
    reply = s(*argv)
    assert error in reply.message


def test_a_dead_letter_on_a_disk_that_fails_to_read_stays_for_another_call(monkeypatch):
    """With read-behind the newest dead letters are on disk: loaded for the
    requeue, or left in place while they cannot be."""
    core, clock, _ = make_core(read_behind="force", read_behind_prefetch=2)
    s = Session(core)
    for body in "abc":
        dead_letter(s, body=body)
    assert core.read_behind.counts()[0] == 1  # the newest one is on disk
    monkeypatch.setattr(core.jobs, "spilled", Unloadable(core.read_behind))
    assert s("DEADLETTER", "REQUEUE", "q-dead") == 2
    monkeypatch.undo()
    assert s("QLEN", "q-dead") == 1 and s("DEADLETTER", "REQUEUE", "q-dead") == 1
    assert sorted(body for _, _, body in s("QPEEK", "q", 10)) == [b"a", b"b", b"c"]
    check_core(core)


class Unloadable:
    """Read-behind as the job store sees it, when no job on disk can be loaded."""

    def __init__(self, spilled) -> None:
        self.spilled = spilled

    def load_id(self, job_id: bytes) -> None:
        return None

    def __getattr__(self, name: str):
        return getattr(self.spilled, name)


def test_the_requeue_deletes_the_copy_everywhere_and_replicates_the_new_job():
    conf = f"{NODE_ID} 127.0.0.1:7711 myself 0 0 connected\n{PEER} 127.0.0.1:7712 noflags 0 0 connected\n"
    core, _, _ = linked_core(conf, (PEER,))
    s = Session(core)
    s("ADDJOB", "q", "x", 0, "RETRY", 10, "REPLICATE", 2, "ASYNC", "MAXATTEMPTS", 1)
    (repl,) = bus_sent(core)
    job_id = repl.job["id"]
    s("GETJOB", "FROM", "q")
    bus_sent(core)
    assert s("NACK", job_id) == 1
    _, copy = bus_sent(core)
    assert copy.job["dead_letter"] == b"q" and copy.job["max_attempts"] == 1  # replicas know where it came from
    core.handle_bus(m.Header(PEER, 7712, 0), m.GotJob(copy.job["id"]), key=core.membership.nodes[PEER].key)
    assert s("DEADLETTER", "REQUEUE", "q-dead") == 1
    deljob, again = bus_sent(core)
    assert deljob == m.DelJob(copy.job["id"], acked=False)
    assert isinstance(again, m.ReplJob) and again.noreply and again.job["queue"] == b"q" and again.job["body"] == b"x"
    assert (again.job["nacks"], again.job["deliv"], again.job["origin"], again.job["dead_letter"]) == (0, 0, b"", b"q-dead")


def test_the_figures_list_dead_letter_queues_and_clients(s):
    """What the dashboard shows: the dead-letter queues with their oldest
    jobs, and the clients, blocked ones first, then named ones."""
    for body in ("first", "second", "x" * 500):
        dead_letter(s, "orders", body, 1, "DEADLETTER", "failed")
    s("ADDJOB", "orders", "fine", 0)
    shown = dead_letter_figures(s.core, max_queues=5, sample=2)
    assert [(q["name"], q["len"]) for q in shown] == [("failed", 3)]
    assert [(j["from"], j["body"], j["nacks"]) for j in shown[0]["jobs"]] == [("orders", "first", 0), ("orders", "second", 0)]
    dead_letter(s, "other", "o", 1)
    assert len(dead_letter_figures(s.core, max_queues=1, sample=1)) == 1 and len(dead_letter_figures(s.core, 5, 1)) == 2
    (failed,) = [q for q in dead_letter_figures(s.core, max_queues=5, sample=5) if q["name"] == "failed"]
    assert len(failed["jobs"][2]["body"]) == BODY_PREVIEW
    named, blocked = Session(s.core), Session(s.core)
    named("CLIENT", "SETNAME", "worker-1")
    assert blocked("GETJOB", "TIMEOUT", 1000, "FROM", "empty", "idle") is BLOCKED
    clients = client_figures(s.core, 3)
    assert [c["id"] for c in clients] == [blocked.client.id, named.client.id, s.client.id]
    assert clients[0]["queues"] == ["empty", "idle"] and clients[0]["cmd"] == "getjob" and clients[1]["name"] == "worker-1"
    assert clients[2]["queues"] == [] and len(client_figures(s.core, 1)) == 1
