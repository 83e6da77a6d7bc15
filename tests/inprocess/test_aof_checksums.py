"""Sealed AOF records (store/aof.py) and what the loader does with a file
that lies (shell/aof_loader.py): a checksum that fails, bytes that are no
record, a torn tail, a file of an older version without checksums."""

from __future__ import annotations

import logging
import zlib

import pytest

from disque.cli import check_aof
from disque.core.effects import AofAppend
from disque.shell import aof_loader
from disque.shell.aof_loader import AofLoader, AofLoadError
from disque.store import aof_repair
from disque.store.aof import (
    AOFFORMAT,
    LOADJOB,
    AofCorrupt,
    RecordReader,
    check_record,
    encode_record,
    format_marker,
    parse_record,
    unseal,
)
from support import Session, make_core


def unsealed(record: bytes) -> bytes:
    """The record as versions without checksums wrote it."""
    args = unseal(record, 0, len(record), parse_record(record, 0)[0], False)  # type: ignore[index]
    out = [b"*%d\r\n" % len(args)] + [b"$%d\r\n%s\r\n" % (len(a), a) for a in args]
    return b"".join(out)


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]


def journal(n: int, body: str = "hello-world-body") -> tuple[list[bytes], list[bytes]]:
    """The records a node writes for `n` new jobs (marker first), and their IDs."""
    core, _, _ = make_core()
    core.aof.state = "on"
    s = Session(core)
    ids = [bytes(s("ADDJOB", "q", f"{body}{i}", 0)) for i in range(n)]
    return [format_marker(), *(e.record for e in core.out.effects if isinstance(e, AofAppend))], ids


def read_all(data: bytes) -> list[list[bytes]]:
    reader = RecordReader()
    reader.feed(data)
    return [args for _, args in reader]


# --------------------------------------------------------------------- seals


def test_sealed_records_read_back_without_their_seal():
    recs, ids = journal(3)
    reader = RecordReader()
    reader.feed(b"".join(recs))
    got = [args for _, args in reader]
    assert got[0] == [AOFFORMAT, b"2"] and [a[0] for a in got[1:]] == [LOADJOB] * 3
    assert reader.sealed and reader.unsealed == 0 and all(job_id in args[1] for job_id, args in zip(ids, got[1:]))


def test_a_flipped_bit_anywhere_in_a_record_fails_its_checksum_and_reading_goes_on():
    recs, ids = journal(3)
    data = b"".join(recs)
    start = len(recs[0]) + len(recs[1])
    bad = flip(data, data.index(b"hello-world-body1"))  # hello-World-body1
    reader = RecordReader()
    reader.feed(bad)
    with pytest.raises(AofCorrupt) as failed:
        list(reader)
    e = failed.value
    assert (e.offset, e.end, e.message) == (start, start + len(recs[2]), "checksum mismatch")
    assert e.record is not None and e.record[0] == LOADJOB and b"Hello-world-body1" in e.record[1]
    assert [args[1] for _, args in reader][0].count(ids[2]) == 1  # the next record, whole


def test_a_seal_that_is_not_eight_hex_digits_is_a_failed_checksum():
    record = encode_record(b"DELJOB", b"x" * 10)
    widened = record[:-14] + b"$9\r\n" + record[-10:-2] + b"0\r\n"  # $9: the generic parse reads it
    assert parse_record(widened, 0) is not None
    with pytest.raises(AofCorrupt, match="checksum mismatch"):
        read_all(widened)


def test_records_of_an_older_version_load_until_a_format_marker_says_every_record_is_sealed():
    recs, _ = journal(2)
    old = unsealed(recs[1])
    reader = RecordReader()
    reader.feed(old + recs[2])
    assert len(list(reader)) == 2 and reader.unsealed == 1 and not reader.sealed
    with pytest.raises(AofCorrupt, match="record without a checksum"):
        read_all(recs[0] + old)
    with pytest.raises(AofCorrupt, match="unknown AOF format version"):
        check_record(0, [AOFFORMAT, b"3"])


def test_skip_finds_the_next_record_across_feeds():
    recs, _ = journal(2)
    reader = RecordReader()
    reader.feed(b"garbage")
    with pytest.raises(AofCorrupt):
        list(reader)
    reader.skip(final=False)  # no record in sight: the last bytes stay, a signature may straddle the next feed
    assert reader.offset == 1 and reader.pending == 6
    reader.feed(b"!" + recs[1])
    with pytest.raises(AofCorrupt):
        list(reader)
    reader.skip(final=False)
    assert reader.offset == len(b"garbage!") and [args[0] for _, args in reader] == [LOADJOB]
    reader.feed(b"tail")
    reader.skip(final=True)
    assert reader.pending == 0


def test_check_aof_drops_a_record_whose_checksum_fails(tmp_path, capsys):
    recs, _ = journal(3)
    data = b"".join(recs)
    start = len(recs[0]) + len(recs[1])
    bad = flip(data, data.index(b"hello-world-body1"))
    analysis = aof_repair.analyze(bad)
    [damage] = analysis.damage
    assert (damage.offset, damage.length, damage.truncated) == (start, len(recs[2]), False)
    assert aof_repair.repair(bad, analysis) == b"".join(recs[:2] + recs[3:])
    assert not aof_repair.analyze(recs[0] + unsealed(recs[1])).keep[1:]  # sealed file, record without a seal
    path = tmp_path / "disque.aof"
    path.write_bytes(bad)
    assert check_aof.main([str(path)]) == 1
    assert f"AOF is corrupt at offset {start}: checksum mismatch" in capsys.readouterr().out


# --------------------------------------------------------------------- loading


def load(tmp_path, data: bytes, **settings):
    path = tmp_path / "disque.aof"
    path.write_bytes(data)
    core, _, _ = make_core(appendonly=True, **settings)
    for _ in AofLoader(core, core.config).steps(str(path)):
        pass
    return core, path


def ids_of(core) -> set[bytes]:
    return {job.id for job in core.jobs.values()}


def test_bit_rot_in_the_middle_is_never_delivered_logged_and_counted(tmp_path, caplog):
    recs, ids = journal(3)
    data = b"".join(recs)
    caplog.set_level(logging.WARNING)
    core, path = load(tmp_path, flip(data, data.index(b"hello-world-body1")))
    assert ids_of(core) == {ids[0], ids[2]} and path.stat().st_size == len(data)  # skipped, not cut
    core.aof.state = "on"  # (INFO shows them with the AOF on)
    fields = dict(core.aof.info_fields(False))
    assert (fields["aof_damaged_records"], fields["aof_dropped_jobs"], fields["aof_damaged_bytes"]) == (1, 1, len(recs[2]))
    assert f"Job {ids[1].decode()} of queue q dropped" in caplog.text and core.aof.rewrite_scheduled


def test_bit_rot_in_the_middle_can_refuse_the_start_naming_the_file_and_offset(tmp_path):
    recs, _ = journal(3)
    data = b"".join(recs)
    start = len(recs[0]) + len(recs[1])
    with pytest.raises(AofLoadError, match=f"disque.aof: checksum mismatch at offset {start}"):
        load(tmp_path, flip(data, data.index(b"hello-world-body1")), aof_load_damaged=False)


def test_a_damaged_last_record_is_a_torn_tail_cut_off(tmp_path, caplog):
    recs, ids = journal(3)
    data = b"".join(recs)
    caplog.set_level(logging.WARNING)
    core, path = load(tmp_path, flip(data, data.index(b"hello-world-body2")))
    assert ids_of(core) == set(ids[:2]) and path.stat().st_size == len(data) - len(recs[3])
    assert f"dropping {len(recs[3])} bytes" in caplog.text and f"Job {ids[2].decode()} of queue q dropped" in caplog.text
    with pytest.raises(AofLoadError, match="Unexpected end of file"):
        load(tmp_path, data[:-5], aof_load_truncated=False)


def test_bytes_that_are_no_record_are_skipped_to_the_next_one_even_across_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(aof_loader, "READ_CHUNK", 64)  # the damage and the records straddle reads
    recs, ids = journal(4)
    inflated = recs[2].replace(b"$", b"$9", 2)[:40] + recs[2][40:]  # a length that runs into the next record
    data = recs[0] + recs[1] + b"\x00garbage\xff" * 20 + inflated + recs[3] + recs[4]
    core, _ = load(tmp_path, data)
    assert ids_of(core) == {ids[0], ids[2], ids[3]} and core.aof.damaged_records == 1
    assert core.aof.dropped_jobs == 0  # no ID could be read from what was skipped


def test_an_old_file_without_checksums_loads_and_is_to_be_rewritten(tmp_path):
    recs, ids = journal(2)
    core, _ = load(tmp_path, b"".join(unsealed(r) for r in recs[1:]))
    assert ids_of(core) == set(ids) and core.aof.rewrite_scheduled and core.aof.damaged_records == 0
    sealed, _ = load(tmp_path, b"".join(recs))
    assert not sealed.aof.rewrite_scheduled


def test_a_damaged_record_that_a_later_one_brings_back_is_not_a_dropped_job(tmp_path):
    recs, ids = journal(2)
    data = recs[0] + flip(recs[1], recs[1].index(b"hello")) + recs[2] + recs[1]  # logged again (a NACK would)
    core, _ = load(tmp_path, data)
    assert ids_of(core) == set(ids) and core.aof.damaged_records == 1 and core.aof.dropped_jobs == 0


def test_a_seal_is_cheap_to_check():
    recs, _ = journal(1)
    record = recs[1]
    assert zlib.crc32(record[:-14]) == int(record[-10:-2], 16)
