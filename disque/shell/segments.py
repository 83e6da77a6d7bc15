"""Body segments: the files read-behind keeps spilled job records in.

Theory of operation: read-behind (core/read_behind.py) moves whole job
records out of memory; this module is where they go.  Records are appended
to numbered segment files (`<n>.seg`, a new one past `SEGMENT_BYTES`) in a
directory of their own, and read back by location, `segment << 40 |
offset`.  A record is a 16-byte header, `<payload length u32><crc32 u32>
<qtime u64>`, then the payload (the job's AOF storage form); the CRC covers
the qtime and the payload, so a torn write, a record read at a wrong
location or a damaged sector is an error (`SpillCorrupt`), never a wrong job.

Appends go to a buffer written out when it passes `WRITE_BYTES` or at the
node's cron (`flush`), so spilling a job costs no system call; a read of a
record still in the buffer is served from it.  If writing fails (disk full,
I/O error) the records stay buffered, nothing is lost, `error` says why and
the core stops spilling and answers `-MISCONF` to writes until a later
flush succeeds.

The segments are a cache, not a second journal: the AOF stays the durable
copy of every job, so nothing is fsynced and the directory is emptied when
the node starts.  Space is reclaimed per segment: `release` counts a
record's bytes dead, a segment whose records are all dead is deleted (not
the one being written, and not while an AOF rewrite reads them: `hold`),
and `sparse()` names a segment more than half dead for the core to compact.

Reads and appends are synchronous (positional reads of a local file,
usually from the page cache), called by the core like the clock.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Any

from disque.store.spill import SpillCorrupt

SEGMENT_BYTES = 64 << 20
WRITE_BYTES = 1 << 20
HEADER = struct.Struct("<IIQ")
_OFFSET_BITS = 40
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


def encode_record(qtime: int, payload: bytes) -> bytes:
    tail = struct.pack("<Q", qtime) + payload
    return struct.pack("<II", len(payload), zlib.crc32(tail)) + tail


def decode_record(data: bytes) -> tuple[int, bytes]:
    """(qtime, payload) of one whole record; SpillCorrupt if it is not one."""
    if len(data) < HEADER.size:
        raise SpillCorrupt("short record")
    length, crc, qtime = HEADER.unpack_from(data)
    if length != len(data) - HEADER.size:
        raise SpillCorrupt("record length mismatch")
    if zlib.crc32(memoryview(data)[8:]) != crc:
        raise SpillCorrupt("record checksum mismatch")
    return qtime, bytes(memoryview(data)[HEADER.size :])


class Segments:
    def __init__(self, directory: str) -> None:
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):  # a cache of the AOF: a new process starts empty
            if name.endswith(".seg"):
                os.unlink(os.path.join(directory, name))
        self._fds: dict[int, int] = {}
        self._size: dict[int, int] = {}  # bytes appended to each segment (written or buffered)
        self._dead: dict[int, int] = {}
        self._current = -1
        self._buf = bytearray()
        self._buf_start = 0  # offset in the current segment where the buffer begins
        self._held = 0
        self._doomed: set[int] = set()
        self.error: str | None = None
        self.reads = self.read_bytes = self.written = 0
        self._new_segment()

    # -- the core's interface ---------------------------------------------

    def append(self, qtime: int, payload: bytes) -> tuple[int, int]:
        """Store a record; returns (location, size)."""
        record = encode_record(qtime, payload)
        seg = self._current
        if self._size[seg] >= SEGMENT_BYTES:
            self.flush()
            if self.error is None:
                self._new_segment()
                seg = self._current
        offset = self._size[seg]
        self._buf += record
        self._size[seg] = offset + len(record)
        if len(self._buf) >= WRITE_BYTES:
            self.flush()
        return seg << _OFFSET_BITS | offset, len(record)

    def read(self, loc: int, size: int) -> tuple[int, bytes]:
        """(qtime, payload) of the record at `loc`; OSError or SpillCorrupt."""
        seg, offset = loc >> _OFFSET_BITS, loc & _OFFSET_MASK
        self.reads += 1
        self.read_bytes += size
        fd = self._fds.get(seg)
        if fd is None:
            raise SpillCorrupt(f"segment {seg} is gone")
        if seg == self._current and offset + size > self._buf_start:  # (partly) still buffered
            written = os.pread(fd, self._buf_start - offset, offset) if offset < self._buf_start else b""
            start = max(0, offset - self._buf_start)
            data = written + bytes(self._buf[start : start + size - len(written)])
        else:
            data = os.pread(fd, size, offset)
        if len(data) != size:
            raise SpillCorrupt("short record")
        return decode_record(data)

    def release(self, loc: int, size: int) -> None:
        """The record at `loc` is no longer needed."""
        seg = loc >> _OFFSET_BITS
        dead = self._dead[seg] = self._dead[seg] + size
        if dead >= self._size[seg] and seg != self._current:
            if self._held:
                self._doomed.add(seg)
            else:
                self._drop(seg)

    def flush(self) -> None:
        """Write the buffered records out; on failure keep them (see above)."""
        buf = self._buf
        if not buf:
            return
        fd = self._fds[self._current]
        done = 0
        try:
            while done < len(buf):
                done += os.pwrite(fd, buf[done:] if done else buf, self._buf_start + done)
        except OSError as e:
            self.error = e.strerror or str(e)
        del buf[:done]
        self._buf_start += done
        self.written += done
        if not buf:
            self.error = None

    def sparse(self) -> int | None:
        """A segment (not the current one) more than half dead, if any."""
        for seg, size in self._size.items():
            if seg != self._current and self._dead[seg] * 2 > size:
                return seg
        return None

    @staticmethod
    def segment_of(loc: int) -> int:
        return loc >> _OFFSET_BITS

    def hold(self) -> None:
        """An AOF rewrite reads records from another thread: keep every
        segment until `unhold`."""
        self.flush()
        self._held += 1

    def unhold(self) -> None:
        self._held -= 1
        if not self._held:
            for seg in sorted(self._doomed):
                self._drop(seg)
            self._doomed.clear()

    def figures(self) -> dict[str, Any]:
        return {
            "segments": len(self._fds),
            "disk_bytes": sum(self._size.values()),
            "dead_bytes": sum(self._dead.values()),
            "reads": self.reads,
            "read_bytes": self.read_bytes,
            "written": self.written,
        }

    # -- files --------------------------------------------------------------

    def _path(self, seg: int) -> str:
        return os.path.join(self.dir, f"{seg}.seg")

    def _new_segment(self) -> None:
        seg = self._current = max(self._fds, default=self._current) + 1
        self._fds[seg] = os.open(self._path(seg), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._size[seg] = self._dead[seg] = 0
        self._buf_start = 0

    def _drop(self, seg: int) -> None:
        fd = self._fds.pop(seg, None)
        if fd is None:
            return
        os.close(fd)
        del self._size[seg], self._dead[seg]
        try:
            os.unlink(self._path(seg))
        except OSError:
            pass
