"""The diff of a background AOF rewrite (shell/aof_rewrite.py `Rewrite`): the
records appended while the rewrite runs, kept in memory up to a bound and
in a file of their own past it, written whole to the new AOF."""

from __future__ import annotations

import errno
import os

import pytest

from disque.shell import aof_rewrite
from disque.shell.aof_rewrite import Rewrite


def test_a_large_diff_goes_to_a_file_and_comes_back_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(aof_rewrite, "DIFF_IN_MEMORY", 100)
    rw = Rewrite(str(tmp_path / "new.aof"))
    records = [b"record %03d;" % i * 3 for i in range(50)]
    for record in records:
        rw.add(record)
    assert os.path.exists(tmp_path / "new.aof.diff") and rw.held < 100 and rw.buf_len == sum(map(len, records))
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    assert rw.write_diff(fd) == rw.buf_len
    os.close(fd)
    assert (tmp_path / "out").read_bytes() == b"".join(records)
    rw.discard()
    assert not os.path.exists(tmp_path / "new.aof.diff")
    rw.discard()  # twice: nothing left to do


def test_a_diff_that_cannot_be_written_fails_the_rewrite(tmp_path, monkeypatch):
    monkeypatch.setattr(aof_rewrite, "DIFF_IN_MEMORY", 10)
    rw = Rewrite(str(tmp_path / "missing-dir" / "new.aof"))
    rw.add(b"x" * 20)  # the diff file cannot be created: kept in memory, the rewrite will fail
    rw.add(b"y" * 20)
    assert rw.diff_error and rw.held == 40
    with pytest.raises(OSError) as failed:
        rw.write_diff(0)
    assert failed.value.errno == errno.EIO
