"""AOF edge cases: framing errors of the generic parser, record checks,
unfinished tails with record signatures inside them, the replay rules for
stale and at-most-once queued jobs (spec/persistence.md §7), and `check-aof` on
the files a real crash or a damaged disk leaves: resynchronisation, NUL
tails, a clean-shutdown marker followed by a torn record, a failed repair
and the script entry point."""

from __future__ import annotations

import random
import runpy
import sys

import pytest

from disque.store.ids import new_job_id
from disque.cli import check_aof
from disque.store import aof_repair
from disque.core.replay import Replay
from disque.store.aof import (
    CLEANSHUTDOWN,
    DELJOB,
    AofCorrupt,
    RecordReader,
    check_record,
    encode_clean_marker,
    encode_deljob,
    encode_loadjob,
    encode_record,
    parse_record,
    scan,
    tail_is_corrupt,
)
from disque.store.job import BCAST_QUEUED, DELIVERED, Job, State
from support import NODE_ID, START_MS, Session, make_core

NOW_S = START_MS // 1000
JOB_ID = b"DI" + b"0" * 44 + b"SQ"


def records(n: int) -> list[bytes]:
    rng = random.Random(5)
    return [
        encode_loadjob(Job(new_job_id(NODE_ID, rng, 3600, 1), b"q", b"body%d" % i, state=State.QUEUED,
                           etime=NOW_S + 3600, retry=5, nodes_delivered=(NODE_ID,)))
        for i in range(n)
    ]  # fmt: skip


def corrupt_at(data: bytes, offset: int) -> AofCorrupt:
    with pytest.raises(AofCorrupt) as e:
        parse_record(data, offset)
    return e.value


# --------------------------------------------------------------------- parser


@pytest.mark.parametrize(
    "data, byte, message",
    [
        (b"*65\r\n", 1, "argument count out of range"),  # more than MAX_ARGS arguments
        (b"*0\r\n", 1, "empty record"),
        (b"*1\r\n$3\r\nabcX", 11, "argument not followed by CRLF"),  # short, but already wrong
        (b"*1\r\n$3\r\nabcXY", 11, "argument not followed by CRLF"),
        (b"*1\r\n$3\r\nabc\rY", 11, "argument not followed by CRLF"),
    ],
    ids=["too-many-args", "empty", "short-bad-crlf", "bad-crlf", "cr-without-lf"],
)
def test_generic_parser_rejects_bad_framing(data: bytes, byte: int, message: str) -> None:
    error = corrupt_at(b"...." + data, 4)
    assert error.message == message and error.offset == 4 and error.byte_offset == 4 + byte
    report = scan(encode_deljob(JOB_ID) + data + encode_deljob(JOB_ID))
    assert report.status == "corrupt" and report.ok_up_to == len(encode_deljob(JOB_ID))


def test_argument_that_may_still_end_in_crlf_is_incomplete() -> None:
    assert parse_record(b"*1\r\n$3\r\nabc", 0) is None
    assert parse_record(b"*1\r\n$3\r\nabc\r", 0) is None
    assert parse_record(b"*1\r\n$3\r\nabc\r\n", 0) == ([b"abc"], 13)


def test_reader_keeps_file_offsets_across_feeds() -> None:
    """Records come out with their file offsets whatever the chunking; the
    consumed part of the buffer is dropped on the next feed."""
    recs = records(3)
    data = b"".join(recs)
    cut = len(recs[0]) + 10  # inside the second record
    reader = RecordReader()
    reader.feed(data[:cut])
    assert [offset for offset, _ in reader] == [0]
    assert (reader.offset, reader.pending, reader.tail()) == (len(recs[0]), 10, data[len(recs[0]) : cut])
    reader.feed(data[cut:])
    assert [(offset, args[0]) for offset, args in reader] == [(len(recs[0]), b"LOADJOB"), (len(data) - len(recs[2]), b"LOADJOB")]
    assert (reader.offset, reader.pending, reader.tail()) == (len(data), 0, b"")
    reader.feed(recs[0][:5])
    assert list(reader) == [] and reader.offset == len(data) and reader.pending == 5


def test_signature_inside_an_unfinished_tail_must_parse_to_count() -> None:
    """A record signature inside a torn last record that does not start a
    complete, well-framed record is just bytes of the torn write; one that
    does means the length field in front of it was damaged."""
    good = encode_deljob(JOB_ID)
    torn = b"*2\r\n$6\r\nDELJOB\r\n$200\r\n"  # length runs past the end of the file
    fake = b"*2\r\n$6\r\nDELJOB\r\n$Z\r\n"  # a signature with a bad length after it
    assert tail_is_corrupt(torn + fake) is False
    assert tail_is_corrupt(torn + good[:-4]) is False  # a torn record inside the torn record
    report = scan(good + torn + fake)
    assert report.status == "truncated" and report.ok_up_to == len(good) and report.error is None
    assert tail_is_corrupt(torn + fake + good) is True
    report = scan(good + torn + fake + good)
    assert report.status == "corrupt" and report.error is not None and report.error.offset == len(good)


# --------------------------------------------------------------------- record checks


def test_record_with_wrong_arity_is_corrupt() -> None:
    with pytest.raises(AofCorrupt, match="wrong number of arguments for DELJOB"):
        check_record(7, [b"deljob", JOB_ID, b"extra"])
    report = scan(encode_deljob(JOB_ID) + encode_record(DELJOB, JOB_ID, JOB_ID))
    assert report.status == "corrupt" and report.records == 1
    assert report.error is not None and report.error.message == "wrong number of arguments for DELJOB"


def test_clean_marker_with_a_non_numeric_time_is_corrupt() -> None:
    bad = encode_record(CLEANSHUTDOWN, b"soon")
    report = scan(encode_deljob(JOB_ID) + bad)
    assert report.status == "corrupt" and report.clean_marker is None
    assert report.error is not None and report.error.message == "corrupted CLEANSHUTDOWN data"
    core, _, _ = make_core()
    with pytest.raises(AofCorrupt, match="corrupted CLEANSHUTDOWN data"):
        Replay(core.lifecycle, core.groups, core.settle, core.read_clock).apply(0, [CLEANSHUTDOWN, b"soon"])


# --------------------------------------------------------------------- replay


def queued_job(core, body: bytes, *, retry: int = 5, flags: int = BCAST_QUEUED) -> Job:
    return Job(new_job_id(NODE_ID, core.rng, 3600, retry), b"q", body, state=State.QUEUED, flags=flags,
               etime=core.now // 1000 + 3600, retry=retry, ctime=core.lifecycle.new_ctime(), nodes_delivered=(NODE_ID,))  # fmt: skip


def replay(core, blob: bytes) -> tuple[Replay, int]:
    rep = Replay(core.lifecycle, core.groups, core.settle, core.read_clock)
    reader = RecordReader()
    reader.feed(blob)
    for offset, args in reader:
        rep.apply(offset, args)
    assert reader.pending == 0
    return rep, rep.finish()


def test_job_deleted_and_loaded_again_is_queued_once() -> None:
    """LOADJOB, DELJOB, LOADJOB of the same queued job before a clean
    marker: only the record that is registered at the end is queued."""
    src, _, _ = make_core()
    job = queued_job(src, b"again")
    core, _, _ = make_core(seed=2)
    blob = encode_loadjob(job) + encode_deljob(job.id) + encode_loadjob(job) + encode_clean_marker(START_MS)
    rep, queued = replay(core, blob)
    assert queued == 1 and (rep.loaded, rep.deleted) == (2, 1)
    s = Session(core)
    assert s("QLEN", "q") == 1 and dict(s("QSTAT", "q"))[b"jobs-in"] == 1
    assert s("GETJOB", "NOHANG", "FROM", "q") == [[b"q", job.id, b"again"]]


def test_delivered_retry0_job_stored_queued_is_not_queued_again() -> None:
    """At-most-once survives a trusted file: a RETRY 0 job that was already
    handed out comes back active, never queued."""
    src, _, _ = make_core()
    once = queued_job(src, b"once", retry=0, flags=BCAST_QUEUED | DELIVERED)
    fresh = queued_job(src, b"fresh", retry=0)
    core, _, _ = make_core(seed=2)
    _, queued = replay(core, encode_loadjob(once) + encode_loadjob(fresh) + encode_clean_marker(START_MS))
    assert queued == 1
    assert core.jobs.get(once.id).state == State.ACTIVE and core.jobs.get(fresh.id).state == State.QUEUED
    s = Session(core)
    assert s("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q") == [[b"q", fresh.id, b"fresh"]]


# --------------------------------------------------------------------- check-aof


def test_analyze_resync_skips_invalid_candidates_to_the_end(tmp_path, capsys) -> None:
    """After a bad record the checker looks for the next valid one.  A
    signature followed by an undecodable record, or by a torn one, is no
    place to resume: with nothing valid after it the damage runs to the end,
    a torn tail the loader cuts off and so does the fix."""
    good = records(3)
    head = b"".join(good)
    bad_id = encode_record(DELJOB, b"not-a-job-id")
    bad_again = encode_record(DELJOB, b"still-not-an-id")  # a signature, invalid record
    torn = good[0][:-7]  # a signature, unfinished record
    data = head + bad_id + bad_again + torn
    analysis = aof_repair.analyze(data)
    assert analysis.records == 3 and analysis.keep[-1] == (len(head) - len(good[2]), len(head))
    [damage] = analysis.damage
    assert (damage.offset, damage.length, damage.truncated) == (len(head), len(data) - len(head), True)
    assert damage.reason.startswith("corrupted DELJOB data: invalid job ID")

    path = tmp_path / "appendonly.aof"
    path.write_bytes(data)
    assert check_aof.main(["--fix", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"AOF is truncated at offset {len(head)}" in out and "clean-shutdown marker" not in out
    assert f"Successfully truncated AOF to {len(head)} bytes" in out
    assert path.read_bytes() == head and not (tmp_path / "appendonly.aof.bak").exists()


def test_analyze_inflated_length_drops_only_that_record() -> None:
    """An unfinished record with complete records after it is damage, not a
    torn tail: the checker resumes at the next record."""
    good = records(4)
    header = b"*3\r\n$7\r\nLOADJOB\r\n$"
    assert good[2].startswith(header)
    inflated = header + b"9" + good[2][len(header) + 1 :]  # $1xx -> $9xx: runs past the end
    data = good[0] + good[1] + inflated + good[3]
    analysis = aof_repair.analyze(data)
    start = len(good[0]) + len(good[1])
    [damage] = analysis.damage
    assert (damage.offset, damage.length, damage.truncated) == (start, len(inflated), False)
    assert damage.reason.startswith("damaged record (complete records follow an unfinished one)")
    assert analysis.records == 3 and analysis.ok_up_to == start
    assert aof_repair.repair(data, analysis) == good[0] + good[1] + good[3]


@pytest.mark.parametrize("torn", [b"", b"*2\r\n$6\r\nDEL"], ids=["nul-only", "torn-then-nul"])
def test_nul_tail_is_a_truncation_the_fix_cuts(tmp_path, capsys, torn: bytes) -> None:
    head = b"".join(records(2))
    data = head + torn + b"\x00" * 64
    analysis = aof_repair.analyze(data)
    [damage] = analysis.damage
    assert damage.truncated and damage.offset == len(head) and damage.length == len(data) - len(head)
    assert damage.reason == "NUL bytes at the end of the file"
    path = tmp_path / "appendonly.aof"
    path.write_bytes(data)
    assert check_aof.main([str(path)]) == 1
    assert f"AOF is truncated at offset {len(head)}: NUL bytes" in capsys.readouterr().out
    assert check_aof.main(["--fix", str(path)]) == 0
    assert path.read_bytes() == head
    assert f"Successfully truncated AOF to {len(head)} bytes" in capsys.readouterr().out


def test_fix_of_a_torn_record_after_the_clean_marker_drops_the_marker(tmp_path, capsys) -> None:
    """Something was appended after a clean shutdown and torn: the marker no
    longer ends the file, so the truncation cuts it off as well."""
    good = records(3)
    head = b"".join(good)
    data = head + encode_clean_marker(START_MS) + good[0][:25]
    analysis = aof_repair.analyze(data)
    assert analysis.marker == (len(head), len(head) + len(encode_clean_marker(START_MS)))
    assert [d.truncated for d in analysis.damage] == [True]
    path = tmp_path / "appendonly.aof"
    path.write_bytes(data)
    assert check_aof.main(["--fix", str(path)]) == 0
    out = capsys.readouterr().out
    assert "The clean-shutdown marker was removed: queued states will not be trusted" in out
    assert f"Successfully truncated AOF to {len(head)} bytes" in out
    assert path.read_bytes() == head and scan(head).clean_marker is None


def test_failed_repair_reports_and_leaves_the_file(tmp_path, capsys) -> None:
    good = records(2)
    data = good[0] + b"#garbage#" + good[1]
    path = tmp_path / "appendonly.aof"
    path.write_bytes(data)
    (tmp_path / "appendonly.aof.bak").mkdir()  # the backup cannot be written
    assert check_aof.main(["--fix", str(path)]) == 1
    assert f"Failed to repair {path}: Is a directory" in capsys.readouterr().out
    assert path.read_bytes() == data


def test_script_entry_point_exits_with_the_verdict(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "appendonly.aof"
    path.write_bytes(b"".join(records(2)))
    monkeypatch.setattr(sys, "argv", ["check-aof", str(path)])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(check_aof.__file__, run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "2 valid records" in out and "AOF is valid" in out
    path.write_bytes(b"".join(records(2))[:-3])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(check_aof.__file__, run_name="__main__")
    assert done.value.code == 1 and "AOF is truncated" in capsys.readouterr().out
