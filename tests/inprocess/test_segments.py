"""Read-behind's body segments (shell/segments.py): the record format, what
a torn or damaged segment reads as, write failures, space reclaimed."""

from __future__ import annotations

import errno
import os

import pytest

from disque.shell import segments as seg
from disque.shell.segments import HEADER, Segments, decode_record, encode_record
from disque.store.spill import SpillCorrupt


def test_a_record_round_trips_and_checks_everything():
    record = encode_record(1234, b"payload")
    assert len(record) == HEADER.size + 7
    assert decode_record(record) == (1234, b"payload")
    with pytest.raises(SpillCorrupt, match="short"):
        decode_record(record[:10])
    with pytest.raises(SpillCorrupt, match="length"):
        decode_record(record + b"x")
    for i in range(4, len(record)):  # any damaged byte after the length: the checksum says so
        damaged = bytearray(record)
        damaged[i] ^= 0x40
        with pytest.raises(SpillCorrupt, match="checksum"):
            decode_record(bytes(damaged))


def test_every_prefix_of_a_segment_reads_whole_records_or_fails(tmp_path):
    store = Segments(str(tmp_path))
    payloads = [b"a" * n for n in (1, 50, 300, 7)]
    locs = [store.append(i, p) for i, p in enumerate(payloads)]
    store.flush()
    path = tmp_path / "0.seg"
    whole = path.read_bytes()
    assert len(whole) == sum(size for _, size in locs)
    for cut in range(len(whole) + 1):  # a torn write: the file ends anywhere
        path.write_bytes(whole[:cut])
        for i, (loc, size) in enumerate(locs):
            end = (loc & ((1 << 40) - 1)) + size
            if end <= cut:
                assert store.read(loc, size) == (i, payloads[i])
            else:
                with pytest.raises(SpillCorrupt):
                    store.read(loc, size)


def test_a_read_at_a_wrong_place_or_of_a_gone_segment_fails(tmp_path):
    store = Segments(str(tmp_path))
    (loc, size), (loc2, _) = store.append(1, b"one"), store.append(2, b"two")
    store.flush()
    with pytest.raises(SpillCorrupt):
        store.read(loc2, size + 1)  # past the end of the file
    with pytest.raises(SpillCorrupt):
        store.read(loc + 1, size)
    with pytest.raises(SpillCorrupt, match="gone"):
        store.read(7 << 40, size)


def test_a_new_store_starts_empty(tmp_path):
    (tmp_path / "3.seg").write_bytes(b"old")
    (tmp_path / "keep.txt").write_text("x")
    store = Segments(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["0.seg", "keep.txt"]
    assert store.figures() == {"segments": 1, "disk_bytes": 0, "dead_bytes": 0, "reads": 0, "read_bytes": 0, "written": 0}


def test_buffered_records_are_readable_and_written_when_large(tmp_path, monkeypatch):
    monkeypatch.setattr(seg, "WRITE_BYTES", 100)
    store = Segments(str(tmp_path))
    loc, size = store.append(5, b"x" * 10)
    assert (tmp_path / "0.seg").stat().st_size == 0
    assert store.read(loc, size) == (5, b"x" * 10)  # from the buffer
    loc2, size2 = store.append(6, b"y" * 100)  # the buffer passes 100 bytes: written
    assert (tmp_path / "0.seg").stat().st_size == size + size2
    assert store.read(loc2, size2) == (6, b"y" * 100)
    assert store.figures()["written"] == size + size2 and store.figures()["reads"] == 2


def test_a_failed_write_keeps_the_records_and_says_why(tmp_path, monkeypatch):
    store = Segments(str(tmp_path))
    loc, size = store.append(1, b"kept")
    real = os.pwrite
    calls = []

    def partial_then_full(fd, data, offset):
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, bytes(data[:5]), offset)  # a short write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", partial_then_full)
    store.flush()
    assert store.error == "No space left on device"
    assert store.read(loc, size) == (1, b"kept")  # half in the file, half still buffered
    loc2, size2 = store.append(2, b"more")
    monkeypatch.setattr(os, "pwrite", real)
    store.flush()
    assert store.error is None
    assert store.read(loc, size) == (1, b"kept") and store.read(loc2, size2) == (2, b"more")
    assert (tmp_path / "0.seg").stat().st_size == size + size2


def test_space_is_reclaimed_per_segment(tmp_path, monkeypatch):
    monkeypatch.setattr(seg, "SEGMENT_BYTES", 100)
    store = Segments(str(tmp_path))
    first = [store.append(i, b"z" * 30) for i in range(3)]  # 138 bytes: the next append rolls over
    second = store.append(9, b"w" * 30)
    assert store.segment_of(second[0]) == 1 and sorted(os.listdir(tmp_path)) == ["0.seg", "1.seg"]
    assert store.sparse() is None
    store.release(*first[0])
    assert store.sparse() is None  # a third dead
    store.release(*first[1])
    assert store.sparse() == 0  # two thirds dead: worth compacting
    store.hold()  # a rewrite is reading: the segment stays
    store.release(*first[2])
    assert "0.seg" in os.listdir(tmp_path)
    store.unhold()
    assert os.listdir(tmp_path) == ["1.seg"] and store.figures()["segments"] == 1
    store.release(*second)  # the current segment is never dropped
    assert os.listdir(tmp_path) == ["1.seg"] and store.sparse() is None


def test_a_segment_that_cannot_roll_over_keeps_growing(tmp_path, monkeypatch):
    monkeypatch.setattr(seg, "SEGMENT_BYTES", 10)
    store = Segments(str(tmp_path))
    store.append(1, b"a" * 20)
    monkeypatch.setattr(os, "pwrite", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    loc, size = store.append(2, b"b")  # the flush before a new segment failed: stay in this one
    assert store.segment_of(loc) == 0 and store.error == "I/O error"
    assert store.read(loc, size) == (2, b"b")
