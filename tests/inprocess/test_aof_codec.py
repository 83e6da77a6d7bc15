"""AOF records: codec round trips, the streaming parser on every prefix and
under corruption, and the replay rules (spec/persistence.md §2, §7, §9, §10)."""

from __future__ import annotations

import zlib

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque.core.effects import AofAppend
from disque.store.ids import new_job_id
from disque.core.replay import Replay
from disque.store.aof import (
    CLEANSHUTDOWN,
    DELJOB,
    LOADJOB,
    AofCorrupt,
    RecordReader,
    encode_clean_marker,
    encode_deljob,
    encode_loadjob,
    encode_record,
    parse_record,
    scan,
)
from disque.store.job import BCAST_QUEUED, BCAST_WILLQUEUE, DELIVERED, Job, State
from support import NODE_ID, START_MS, Session, all_jobs, make_core

NOW_S = START_MS // 1000
fuzz = settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])

node_ids = st.binary(min_size=20, max_size=20).map(bytes.hex)
job_ids = st.builds(new_job_id, node_ids, st.randoms(use_true_random=False), st.integers(1, 2**20), st.integers(0, 1))
u16 = st.integers(0, 0xFFFF)


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    return Job(
        draw(job_ids),
        draw(st.binary(min_size=1, max_size=40)),
        draw(st.binary(max_size=300)),
        state=draw(st.sampled_from([State.ACTIVE, State.QUEUED])),
        flags=draw(st.integers(0, 7)),
        repl=draw(st.integers(1, 65535)),
        etime=draw(st.integers(0, 2**33)),
        ctime=draw(st.integers(0, 2**63)),
        delay=draw(st.integers(0, 2**31)),
        retry=draw(st.integers(0, 2**31)),
        nacks=draw(u16),
        deliv=draw(u16),
        nodes_delivered=tuple(draw(st.lists(node_ids, max_size=5, unique=True))),
    )


FIELDS = ("id", "queue", "body", "state", "flags", "repl", "etime", "ctime", "delay", "retry", "nacks", "deliv", "nodes_delivered")


def fields(job: Job) -> tuple:
    return tuple(getattr(job, f) for f in FIELDS)


@st.composite
def records(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return encode_loadjob(draw(jobs()))
    return encode_deljob(draw(job_ids))


files = st.lists(records(), max_size=8)


# --------------------------------------------------------------------- codec


@fuzz
@given(jobs())
def test_loadjob_round_trip(job: Job) -> None:
    data = encode_loadjob(job)
    assert data.startswith(b"*3\r\n$7\r\nLOADJOB\r\n$")
    args, end = parse_record(data, 0)  # type: ignore[misc]
    assert end == len(data) and args[0] == LOADJOB and args[2] == b"%08x" % zlib.crc32(data[:-14])
    report = scan(data)
    assert report.status == "ok" and report.records == 1
    from disque.store.records import decode_storage

    assert fields(decode_storage(args[1])) == fields(job)


@fuzz
@given(job_ids)
def test_deljob_is_the_resp_command(job_id: bytes) -> None:
    data = encode_deljob(job_id)
    head = b"*3\r\n$6\r\nDELJOB\r\n$48\r\n%s\r\n" % job_id
    seal = b"%08x" % zlib.crc32(head)
    assert data == head + b"$8\r\n%s\r\n" % seal  # the RESP command, sealed with the CRC-32 of what comes before
    assert parse_record(data, 0) == ([DELJOB, job_id, seal], len(data))


@fuzz
@given(st.lists(st.binary(max_size=50), min_size=1, max_size=6))
def test_any_multibulk_round_trips(args: list[bytes]) -> None:
    data = encode_record(*args)
    sealed = [*args, data[-10:-2]]
    assert parse_record(data, 0) == (sealed, len(data))
    assert parse_record(b"xx" + data, 2, base=100) == (sealed, len(data) + 2)


@fuzz
@given(files, st.data())
def test_streaming_reader_under_any_split(recs: list[bytes], data: st.DataObject) -> None:
    blob = b"".join(recs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(blob)), max_size=6)))
    reader = RecordReader()
    got: list[tuple[int, list[bytes]]] = []
    last = 0
    for cut in [*cuts, len(blob)]:
        reader.feed(blob[last:cut])
        last = cut
        got.extend(reader)
    offsets = [0]
    for rec in recs:
        offsets.append(offsets[-1] + len(rec))
    assert [o for o, _ in got] == offsets[:-1]
    assert reader.offset == len(blob) and reader.pending == 0


# --------------------------------------------------------------------- prefixes


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(files.filter(bool))
def test_every_prefix_of_a_valid_file(recs: list[bytes]) -> None:
    """A prefix is a complete file at a record boundary, else a truncated
    tail after the last complete record: never 'corrupt'."""
    blob = b"".join(recs)
    boundaries = [0]
    for rec in recs:
        boundaries.append(boundaries[-1] + len(rec))
    for n in range(len(blob) + 1):
        report = scan(blob[:n])
        complete = max(b for b in boundaries if b <= n)
        assert report.ok_up_to == complete, n
        assert report.records == boundaries.index(complete), n
        assert report.status == ("ok" if n == complete else "truncated"), (n, report.error)


def test_every_prefix_of_a_fixed_file() -> None:
    rng = random.Random(7)
    recs = []
    for i in range(12):
        job = Job(new_job_id(NODE_ID, rng, 3600, i % 2), b"q%d" % i, bytes(range(i * 7 % 256)),
                  state=State.QUEUED, etime=NOW_S + 3600, retry=i % 2, nodes_delivered=(NODE_ID,))  # fmt: skip
        recs.append(encode_loadjob(job))
        if i % 3 == 0:
            recs.append(encode_deljob(job.id))
    recs.append(encode_clean_marker(START_MS))
    blob = b"".join(recs)
    full = scan(blob)
    assert full.status == "ok" and full.clean_marker == len(blob) - len(recs[-1])
    statuses = {scan(blob[:n]).status for n in range(len(blob))}
    assert statuses == {"ok", "truncated"}


def test_nul_filled_tail_counts_as_truncated() -> None:
    rec = encode_deljob(b"DI" + b"0" * 44 + b"SQ")
    assert scan(rec + b"\x00" * 300).status == "truncated"
    report = scan(rec + rec[:20] + b"\x00" * 100)
    assert report.status == "truncated" and report.ok_up_to == len(rec)


# --------------------------------------------------------------------- corruption


def sample_file(n: int = 10) -> tuple[bytes, list[int]]:
    rng = random.Random(3)
    recs = [
        encode_loadjob(Job(new_job_id(NODE_ID, rng, 3600, 1), b"q", b"body%d" % i, state=State.QUEUED,
                           etime=NOW_S + 3600, retry=5, nodes_delivered=(NODE_ID,)))
        for i in range(n)
    ]  # fmt: skip
    offsets = [0]
    for rec in recs:
        offsets.append(offsets[-1] + len(rec))
    return b"".join(recs), offsets


@pytest.mark.parametrize(
    "where, byte",
    [(0, b"#"), (1, b"x"), (4, b"?"), (8, b"\n"), (19, b"Z")],
    ids=["star", "count", "dollar", "name", "length"],
)
def test_corrupt_framing_in_the_middle_names_the_record(where: int, byte: bytes) -> None:
    blob, offsets = sample_file()
    at = offsets[4] + where
    bad = blob[:at] + byte + blob[at + 1 :]
    report = scan(bad)
    assert report.status == "corrupt"
    assert report.error is not None and report.error.offset == offsets[4]
    assert report.ok_up_to == offsets[4]
    assert str(offsets[4]) in str(report.error)


def test_inflated_length_is_corruption_not_truncation() -> None:
    """A length field damaged to run past EOF would look like a torn last
    record; complete records after it give it away."""
    blob, offsets = sample_file()
    header = b"*2\r\n$7\r\nLOADJOB\r\n$"
    at = offsets[7] + len(header)
    assert blob[at : at + 1] in (b"1", b"2")
    bad = blob[:at] + b"9" + blob[at + 1 :]  # e.g. $132 -> $932: past the end of the file
    report = scan(bad)
    assert report.status == "corrupt" and report.error is not None and report.error.offset == offsets[7]


def test_unknown_command_and_bad_payload_are_corrupt() -> None:
    blob, offsets = sample_file(3)
    report = scan(blob + encode_record(b"FLUSHALL", b"x") + blob)
    assert report.status == "corrupt" and "Unknown command 'FLUSHALL'" in report.error.message  # type: ignore[union-attr]
    assert report.error.offset == len(blob)  # type: ignore[union-attr]
    garbage = encode_record(LOADJOB, b"\x81\xa1v\x01")  # a map without the job fields
    report = scan(blob + garbage)
    assert report.status == "corrupt" and "corrupted LOADJOB data" in report.error.message  # type: ignore[union-attr]
    report = scan(encode_record(DELJOB, b"not-an-id"))
    assert report.status == "corrupt"


def test_parse_record_error_offsets_are_absolute() -> None:
    with pytest.raises(AofCorrupt) as e:
        parse_record(b"....*2\r\n$x\r\n", 4, base=1000)
    assert e.value.offset == 1004 and e.value.byte_offset == 1009


# --------------------------------------------------------------------- replay


def stored(core, queue=b"q", body=b"b", *, state=State.QUEUED, retry=5, delay=0, ttl=3600, flags=BCAST_QUEUED,
           nodes=None, ctime=0) -> Job:  # fmt: skip
    job_id = new_job_id(core.membership.my_id, core.rng, ttl, retry)
    return Job(job_id, queue, body, state=state, flags=flags, etime=core.now // 1000 + ttl, retry=retry, delay=delay,
               ctime=ctime or core.lifecycle.new_ctime(), nodes_delivered=(core.membership.my_id,) if nodes is None else nodes)  # fmt: skip


def replay(core, blob: bytes, *, trust: bool = False) -> Replay:
    rep = Replay(core.lifecycle, core.groups, core.settle, core.read_clock, trust_queued=trust)
    reader = RecordReader()
    reader.feed(blob)
    for offset, args in reader:
        rep.apply(offset, args)
    assert reader.pending == 0
    rep.finish()
    return rep


def test_crash_replay_makes_every_job_active_with_retry_timer() -> None:
    src, _, _ = make_core()
    a = stored(src, retry=10, delay=2)
    b = stored(src, retry=0, flags=0)
    core, clock, _ = make_core(seed=2)
    rep = replay(core, encode_loadjob(a) + encode_loadjob(b))
    assert rep.loaded == 2 and not rep.trusted
    ja, jb = core.jobs.get(a.id), core.jobs.get(b.id)
    assert ja.state == jb.state == State.ACTIVE
    assert ja.flags & BCAST_WILLQUEUE and abs(ja.qtime - (clock.ms + 12_000)) <= 250
    assert jb.qtime == 0  # at-most-once: never re-queued after a crash
    assert not core.lifecycle.enqueue(jb)
    assert len(core.queues) == 0 or all(len(q) == 0 for q in core.queues.values())


def test_deljob_expiry_duplicates_and_unknown_nodes() -> None:
    src, _, _ = make_core()
    a, b, c = stored(src), stored(src, ttl=1), stored(src, nodes=(NODE_ID, "f" * 40))
    core, clock, _ = make_core(seed=2)
    clock.advance(5_000)
    core.read_clock()
    blob = encode_loadjob(a) + encode_loadjob(a) + encode_loadjob(b) + encode_loadjob(c) + encode_deljob(a.id)
    rep = replay(core, blob)
    assert rep.duplicates == 1 and rep.expired == 1 and rep.deleted == 1
    assert a.id not in core.jobs and b.id not in core.jobs
    assert core.jobs.get(c.id).nodes_delivered == (NODE_ID,)


def test_nack_delay_survives_a_restart() -> None:
    """NACK ... DELAY logs the job again with `not_before`: after a crash
    the job is not queued before the delay, though its RETRY is shorter,
    and the NACK is counted once (the requeue is not a redelivery); a file
    holding only the creation record gives the plain RETRY timer."""
    src, src_clock, _ = make_core()
    src.aof.state = "on"
    s = Session(src)
    job_id = bytes(s("ADDJOB", "q", "x", 0, "RETRY", 5))
    s("GETJOB", "FROM", "q")
    assert s("NACK", job_id, "DELAY", 600) == 1
    records = [e.record for e in src.out.effects if isinstance(e, AofAppend)]
    assert len(records) == 2
    for blob, due in ((records[0], 5_000), (b"".join(records), 600_000)):
        core, clock, _ = make_core(seed=2)
        clock.ms = src_clock.ms
        core.read_clock()
        rep = replay(core, blob)
        assert rep.loaded == 1 and rep.duplicates == (due > 5_000)
        job, t = core.jobs.get(job_id), Session(core)
        assert job.nacks == (due > 5_000)
        clock.advance(due - 600)
        core.tick()
        assert t("QLEN", "q") == 0
        clock.advance(1_500)
        core.tick()  # WILLQUEUE, then the requeue
        core.tick()
        nacked = due > 5_000
        job = core.jobs.get(job_id)  # (the same record: with read-behind forced on, a copy loaded back)
        assert t("QLEN", "q") == 1 and (job.nacks, job.deliv) == ((1, 0) if nacked else (0, 1))  # counted once


def test_clean_marker_trusts_queued_states_in_order() -> None:
    src, _, _ = make_core()
    s = Session(src)
    ids = [bytes(s("ADDJOB", "q", f"b{i}", 0)) for i in range(5)]
    once = bytes(s("ADDJOB", "q", "once", 0, "RETRY", 0))
    s("GETJOB", "FROM", "q")  # ids[0] is now active (delivered)
    blob = b"".join(encode_loadjob(job) for job in all_jobs(src)) + encode_clean_marker(START_MS)
    core, _, _ = make_core(seed=2)
    rep = replay(core, blob)
    assert rep.clean_marker is not None
    t = Session(core)
    assert t("QLEN", "q") == 5
    assert [entry[1] for entry in t("QPEEK", "q", 10)] == [*ids[1:], once]
    assert core.jobs.get(ids[0]).state == State.ACTIVE
    j = core.jobs.get(once)
    assert j.state == State.QUEUED and j.qtime == 0  # queued exactly once
    assert t("GETJOB", "FROM", "q", "COUNT", 10)


def test_marker_not_last_is_not_trusted() -> None:
    src, _, _ = make_core()
    job = stored(src)
    blob = encode_loadjob(job) + encode_clean_marker(START_MS) + encode_deljob(b"DI" + b"0" * 44 + b"SQ")
    core, _, _ = make_core(seed=2)
    rep = replay(core, blob)
    assert rep.clean_marker is None and core.jobs.get(job.id).state == State.ACTIVE


def test_enqueue_jobs_once_trusts_without_marker() -> None:
    src, _, _ = make_core()
    job = stored(src, flags=BCAST_QUEUED | DELIVERED, retry=3)
    job.flags &= ~DELIVERED
    core, _, _ = make_core(seed=2)
    replay(core, encode_loadjob(job), trust=True)
    assert core.jobs.get(job.id).state == State.QUEUED


def test_marker_record_shape() -> None:
    head = b"*3\r\n$13\r\nCLEANSHUTDOWN\r\n$4\r\n1234\r\n"
    assert encode_clean_marker(1234) == head + b"$8\r\n%08x\r\n" % zlib.crc32(head)
    assert parse_record(encode_clean_marker(1), 0)[0][0] == CLEANSHUTDOWN  # type: ignore[index]


# --------------------------------------------------------------------- check-aof


def test_check_aof_reports_and_truncates(tmp_path, capsys) -> None:
    from disque.cli import check_aof

    blob, offsets = sample_file(5)
    path = tmp_path / "disque.aof"
    path.write_bytes(blob + blob[:30])
    assert check_aof.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert f"ok_up_to={len(blob)}" in out and f"truncated at offset {len(blob)}" in out
    assert path.stat().st_size == len(blob) + 30  # untouched without --fix
    assert check_aof.main(["--fix", str(path)]) == 0
    assert path.read_bytes() == blob
    assert check_aof.main([str(path)]) == 0
    assert "AOF is valid" in capsys.readouterr().out


def test_check_aof_fix_drops_only_the_damaged_record(tmp_path, capsys) -> None:
    from disque.cli import check_aof

    blob, offsets = sample_file(6)
    bad = blob[: offsets[2] + 9] + b"#" + blob[offsets[2] + 10 :] + encode_clean_marker(START_MS)
    path = tmp_path / "disque.aof"
    path.write_bytes(bad)
    assert check_aof.main([str(path)]) == 1
    assert f"corrupt at offset {offsets[2]}" in capsys.readouterr().out
    assert check_aof.main(["--fix", str(path)]) == 0
    fixed = path.read_bytes()
    assert fixed == blob[: offsets[2]] + blob[offsets[3] :]  # record 2 and the marker are gone
    assert (tmp_path / "disque.aof.bak").read_bytes() == bad
    assert scan(fixed).status == "ok"


def test_check_aof_usage(capsys) -> None:
    from disque.cli import check_aof

    assert check_aof.main([]) == 1
    assert check_aof.main(["--fix"]) == 1
    assert check_aof.main(["/nonexistent/x.aof"]) == 1


def test_info_fields_by_state() -> None:
    from disque.store.aof import AofStatus

    status = AofStatus()
    names = [name for name, _ in status.info_fields(False)]
    assert names[:3] == ["loading", "aof_enabled", "aof_state"] and "aof_current_size" not in names
    status.state = "on"
    status.loading_total_bytes, status.loading_loaded_bytes, status.loading_elapsed = 1000, 250, 1.0
    fields = dict(status.info_fields(True))
    assert fields["aof_enabled"] == 1 and fields["aof_current_size"] == 0
    assert fields["loading_loaded_perc"] == "25.00" and fields["loading_eta_seconds"] == 3
