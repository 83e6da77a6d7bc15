"""The append-only file without I/O: INFO status, record codec, parser, replay.

Theory of operation (spec/persistence.md): the AOF is a concatenation of RESP
multibulk records, each *sealed*: its last argument is the CRC-32 (zlib's,
8 lowercase hex digits) of every byte of the record before that argument,
so a bit flipped anywhere in a record (bit rot, a copy gone wrong) is seen
when it is read, and a record is never delivered altered.  A file written
since checksums exist starts with `AOFFORMAT 2`; from that record on, a
record without its checksum is damaged.  Files of older versions (no
marker, no checksums) still load, and the rewrite that follows their load
seals them (shell/aof_loader.py).  Two are written while the node runs, `LOADJOB <storage
form>` ("this node now holds the job") and `DELJOB <id>` ("no longer").  A
third one, `CLEANSHUTDOWN <unix ms>`, is written only as the last record of
the snapshot a controlled shutdown (SHUTDOWN, SIGTERM) leaves behind: it
tells the next start that the `queued` states in the file were taken while
no client could fetch a job, so they can be trusted.  The loader strips the
marker once it has used it, so a later crash never trusts them again.
Whether a record is sealed shows in its argument count: each name has a
fixed arity (`ARITY`), and a sealed record has one argument more.

`RecordReader` is a streaming parser.  It yields complete records with their
offsets (and checks and strips their seals) and stops at an incomplete one;
bytes that can never become a valid record raise `AofCorrupt` with the
offset of the record and of the bad byte (`skip` then looks for the next
record), a record whose framing is whole but whose checksum fails raises it
once the reader is past it (`AofCorrupt.end`).
What is left at end of input is a truncated tail (power loss in the middle
of a write) unless `tail_is_corrupt` sees complete records after it, which
means a damaged length field rather than a short file.  A tail of NUL bytes
(a file extended but never written) also counts as truncated.

Applying the records to a node is core/replay.py's (`Replay`); `scan` runs
the parser and the record checks over a whole byte string, for `disque
check-aof` and tests.

The shell (`disque/shell/aof_*.py`) owns files, fsync and rewrites; `AofStatus` is what
it reports through INFO.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from zlib import crc32

from disque.store.records import DecodeError, decode_storage, encode_storage
from disque.store.results import problem as result_problem
from disque.store.ids import valid_id
from disque.store.job import Job

LOADJOB = b"LOADJOB"
DELJOB = b"DELJOB"
CLEANSHUTDOWN = b"CLEANSHUTDOWN"
GROUPSET = b"GROUPSET"  # GROUPSET <event job ID> <group> <deadline ms, 0 = done>: a consumer group's progress
SCHEDULE = b"SCHEDULE"  # SCHEDULE <schedule storage form>: a recurring job's definition (store/schedule.py)
SCHEDTICK = b"SCHEDTICK"  # SCHEDTICK <name> <tick ms> <node ID>: the latest tick of a schedule known fired
KEYHOLD = b"KEYHOLD"  # KEYHOLD <key hold storage form>: a key's DEDUP hold at its home (store/keyed.py)
QLIMITS = b"QLIMITS"  # QLIMITS <limits storage form>: a queue's cluster-wide limits (store/limits.py)
BATCH = b"BATCH"  # BATCH <batch record>: a batch as this node knew it (store/batch.py)
RESULT = b"RESULT"  # RESULT <job ID> <until ms> <bytes>: an acknowledged job's result (store/results.py)
AOFFORMAT = b"AOFFORMAT"  # AOFFORMAT <version>: the first record of a file whose records are all sealed
FORMAT_VERSION = b"2"
RECORD_NAMES = (LOADJOB, DELJOB, CLEANSHUTDOWN, GROUPSET, SCHEDULE, SCHEDTICK, KEYHOLD, QLIMITS, RESULT, BATCH, AOFFORMAT)
ARITY = {GROUPSET: 4, SCHEDTICK: 4, RESULT: 4}  # arguments of a record, with its name and without its seal (the others: 2)
SEAL = 14  # bytes of the seal: $8 CRLF, 8 hex digits, CRLF

MAX_ARGS = 64  # a record with more arguments is garbage
MAX_LINE = 21  # digits of a count or a length, plus the sign

# --------------------------------------------------------------------- status


@dataclass(slots=True)
class AofStatus:
    state: str = "off"  # off | on | wait-rewrite
    rewrite_in_progress: bool = False
    rewrite_scheduled: bool = False
    last_rewrite_time_sec: int = -1
    current_rewrite_time_sec: int = -1
    last_bgrewrite_ok: bool = True
    last_write_ok: bool = True
    current_size: int = 0
    base_size: int = 0
    buffer_length: int = 0
    rewrite_buffer_length: int = 0
    pending_bio_fsync: int = 0
    delayed_fsync: int = 0
    fsynced_size: int = 0  # the file's size at its last fsync: what a power cut keeps
    # what loading the file cost: damaged records skipped, the jobs they held
    damaged_records: int = 0
    damaged_bytes: int = 0
    dropped_jobs: int = 0
    # progress of a load (INFO only shows it while loading)
    loading_start_time: int = 0
    loading_total_bytes: int = 0
    loading_loaded_bytes: int = 0
    loading_elapsed: float = 0.0

    def info_fields(self, loading: bool) -> list[tuple[str, Any]]:
        fields: list[tuple[str, Any]] = [
            ("loading", int(loading)),
            ("aof_enabled", int(self.state != "off")),
            ("aof_state", self.state),
            ("aof_rewrite_in_progress", int(self.rewrite_in_progress)),
            ("aof_rewrite_scheduled", int(self.rewrite_scheduled)),
            ("aof_last_rewrite_time_sec", self.last_rewrite_time_sec),
            ("aof_current_rewrite_time_sec", self.current_rewrite_time_sec),
            ("aof_last_bgrewrite_status", "ok" if self.last_bgrewrite_ok else "err"),
            ("aof_last_write_status", "ok" if self.last_write_ok else "err"),
        ]
        if self.state != "off":
            fields += [
                ("aof_current_size", self.current_size),
                ("aof_base_size", self.base_size),
                ("aof_pending_rewrite", int(self.rewrite_scheduled)),
                ("aof_buffer_length", self.buffer_length),
                ("aof_rewrite_buffer_length", self.rewrite_buffer_length),
                ("aof_pending_bio_fsync", self.pending_bio_fsync),
                ("aof_delayed_fsync", self.delayed_fsync),
                ("aof_fsynced_size", self.fsynced_size),
                ("aof_damaged_records", self.damaged_records),
                ("aof_damaged_bytes", self.damaged_bytes),
                ("aof_dropped_jobs", self.dropped_jobs),
            ]
        if loading:
            total, done = self.loading_total_bytes, self.loading_loaded_bytes
            perc = done * 100 / total if total else 0.0
            eta = int(self.loading_elapsed * (total - done) / done) if done else 1
            fields += [
                ("loading_start_time", self.loading_start_time),
                ("loading_total_bytes", total),
                ("loading_loaded_bytes", done),
                ("loading_loaded_perc", f"{perc:.2f}"),
                ("loading_eta_seconds", eta),
            ]
        return fields


# --------------------------------------------------------------------- codec


def _sealed(head: bytes) -> bytes:
    """The record `head` (whose count includes the seal) with its seal."""
    return b"".join((head, b"$8\r\n%08x\r\n" % crc32(head)))


def encode_record(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % (len(args) + 1)]
    for arg in args:
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return _sealed(b"".join(out))


def encode_loadjob(job: Job) -> bytes:
    return loadjob_record(encode_storage(job))


def loadjob_record(payload: bytes) -> bytes:
    """The LOADJOB of a job's storage form."""
    return _sealed(b"*3\r\n$7\r\nLOADJOB\r\n$%d\r\n%s\r\n" % (len(payload), payload))


def encode_deljob(job_id: bytes) -> bytes:
    return _sealed(b"*3\r\n$6\r\nDELJOB\r\n$%d\r\n%s\r\n" % (len(job_id), job_id))


def format_marker() -> bytes:
    return encode_record(AOFFORMAT, FORMAT_VERSION)


def encode_clean_marker(now_ms: int) -> bytes:
    return encode_record(CLEANSHUTDOWN, b"%d" % now_ms)


# --------------------------------------------------------------------- parser


class AofCorrupt(Exception):
    """Bytes that are not (a prefix of) a valid record, or a bad record."""

    def __init__(
        self, offset: int, message: str, byte_offset: int | None = None, *,
        end: int | None = None, record: list[bytes] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(offset, message)
        self.offset = offset  # start of the bad record
        self.byte_offset = offset if byte_offset is None else byte_offset  # first bad byte
        self.message = message
        self.end = end  # its end when its framing is whole (a checksum that fails): reading goes on there
        self.record = record  # its arguments then (what it held can be logged)

    def __str__(self) -> str:
        return f"{self.message} (record at offset {self.offset}, byte {self.byte_offset})"


_DIGITS = frozenset(b"0123456789")


def _partial_number_ok(buf: bytes, start: int) -> bool:
    """Could buf[start:] (which has no CRLF) still become `<digits>\\r\\n`?"""
    rest = buf[start:]
    if len(rest) > MAX_LINE:
        return False
    if rest.endswith(b"\r"):
        rest = rest[:-1]
    return all(c in _DIGITS for c in rest)


def _first_non_digit(buf: bytes, pos: int) -> int:
    end = len(buf)
    while pos < end and buf[pos] in _DIGITS:
        pos += 1
    if pos + 1 < end and buf[pos] == 0x0D:  # '\r' not followed by '\n'
        pos += 1
    return pos


class _Incomplete(Exception):
    """The buffer ends inside a number (raised fresh each time: a shared
    instance would keep, in its traceback, every buffer it was raised over)."""


def _number(buf: bytes, pos: int, limit: int, what: str, record: int, base: int) -> tuple[int, int]:
    """Parse `<digits>\\r\\n` at pos; returns (value, position after CRLF)."""
    eol = buf.find(b"\r\n", pos, pos + MAX_LINE + 2)
    if eol < 0:
        if _partial_number_ok(buf, pos):
            raise _Incomplete()
        raise AofCorrupt(record, f"bad {what}", base + _first_non_digit(buf, pos))
    text = buf[pos:eol]
    if not text.isdigit():  # bytes.isdigit: ASCII digits only
        raise AofCorrupt(record, f"bad {what}", base + _first_non_digit(buf, pos))
    value = int(text)
    if value > limit:
        raise AofCorrupt(record, f"{what} out of range", base + pos)
    return value, eol + 2


_FAST = tuple(
    (b"*%d\r\n$%d\r\n%s\r\n$" % (count, len(name), name), name, count == 3)
    for name in (LOADJOB, DELJOB)
    for count in (3, 2)
)


def parse_record(buf: bytes, pos: int, base: int = 0) -> tuple[list[bytes], int] | None:
    """The record starting at buf[pos]: (arguments, end position), or None
    when buf ends before it does.  Raises AofCorrupt (offsets are absolute:
    `base` is the file offset of buf[0])."""
    for prefix, name, sealed in _FAST:  # the records we write: skip the generic parse
        if buf.startswith(prefix, pos):
            start = pos + len(prefix)
            eol = buf.find(b"\r\n", start, start + MAX_LINE)
            if eol > start:
                text = buf[start:eol]
                if text.isdigit():
                    begin = eol + 2
                    end = begin + int(text)
                    if buf[end : end + 2] == b"\r\n":
                        if not sealed:
                            return [name, buf[begin:end]], end + 2
                        if buf[end + 2 : end + 6] == b"$8\r\n" and buf[end + 14 : end + 16] == b"\r\n":
                            return [name, buf[begin:end], buf[end + 6 : end + 14]], end + 16
            break  # anything unusual: the generic path reports it precisely
    n = len(buf)
    if pos >= n:
        return None
    record = base + pos
    if buf[pos] != 0x2A:  # '*'
        raise AofCorrupt(record, "expected '*' at the start of a record")
    try:
        count, p = _number(buf, pos + 1, MAX_ARGS, "argument count", record, base)
        if count == 0:
            raise AofCorrupt(record, "empty record", base + pos + 1)
        args: list[bytes] = []
        for _ in range(count):
            if p >= n:
                return None
            if buf[p] != 0x24:  # '$'
                raise AofCorrupt(record, "expected '$' before an argument", base + p)
            length, start = _number(buf, p + 1, 1 << 40, "argument length", record, base)
            end = start + length
            if end + 2 > n:
                # what we have must still match the CRLF that ends the argument
                if n > end and buf[end] != 0x0D or n > end + 1 and buf[end + 1] != 0x0A:
                    raise AofCorrupt(record, "argument not followed by CRLF", base + end)
                return None
            if buf[end] != 0x0D or buf[end + 1] != 0x0A:
                raise AofCorrupt(record, "argument not followed by CRLF", base + end)
            args.append(buf[start:end])
            p = end + 2
    except _Incomplete:
        return None
    return args, p


def unseal(buf: bytes, pos: int, end: int, args: list[bytes], strict: bool) -> list[bytes]:
    """The arguments of the record buf[pos:end] without its seal, once the
    seal is checked; `strict`: a record must have one.  Raises AofCorrupt."""
    if len(args) != ARITY.get(args[0].upper(), 2) + 1:
        if strict:
            raise AofCorrupt(pos, "record without a checksum", end=end, record=args)
        return args  # a record of an older version (or of the wrong arity: check_record says so)
    if buf[end - SEAL : end - SEAL + 4] != b"$8\r\n" or b"%08x" % crc32(memoryview(buf)[pos : end - SEAL]) != args[-1]:
        raise AofCorrupt(pos, "checksum mismatch", end=end, record=args[:-1])
    return args[:-1]


class RecordReader:
    """Streaming parser: `feed` bytes, iterate complete records.

    Iteration yields `(offset, args)` (unsealed) and stops at the first
    incomplete record; `offset` is then the end of the last complete
    record and `pending` the number of bytes after it.  `sealed` turns on
    at an AOFFORMAT record: every record after it must carry a checksum;
    `unsealed` counts the records read without one."""

    __slots__ = ("_buf", "_pos", "_base", "sealed", "unsealed")

    def __init__(self, base: int = 0) -> None:
        self._buf = b""
        self._pos = 0
        self._base = base  # file offset of _buf[0]
        self.sealed = False
        self.unsealed = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            self._buf = self._buf[self._pos :] + data
            self._base += self._pos
            self._pos = 0
        else:
            self._buf = self._buf + data if self._buf else data

    @property
    def offset(self) -> int:
        return self._base + self._pos

    @property
    def pending(self) -> int:
        return len(self._buf) - self._pos

    def tail(self) -> bytes:
        return self._buf[self._pos :]

    def __iter__(self) -> Iterator[tuple[int, list[bytes]]]:
        buf, base = self._buf, self._base
        while True:
            pos = self._pos
            parsed = parse_record(buf, pos, base)
            if parsed is None:
                return
            args, self._pos = parsed
            n = len(args)
            try:
                args = unseal(buf, pos, self._pos, args, self.sealed)
            except AofCorrupt as e:
                e.offset = e.byte_offset = base + pos
                e.end = base + self._pos
                raise
            if len(args) == n:
                self.unsealed += 1
            elif args[0] == AOFFORMAT:
                self.sealed = True
            yield base + pos, args

    def skip(self, final: bool) -> None:
        """Past damaged bytes: on to the next place a record may start (a
        signature), or to the end of what was fed (`final`: no more will
        come; else the last bytes stay, a signature may straddle the feed)."""
        buf, start = self._buf, self._pos + 1
        found = [i for i in (buf.find(sig, start) for sig in SIGNATURES) if i >= 0]
        if found:
            self._pos = min(found)
        else:
            self._pos = len(buf) if final else max(start, len(buf) - LONGEST_SIGNATURE + 1)


SIGNATURES = tuple(
    b"*%d\r\n$%d\r\n%s\r\n" % (count, len(name), name)
    for name in RECORD_NAMES
    for count in (ARITY.get(name, 2), ARITY.get(name, 2) + 1)
)  # how every record starts, sealed or not
LONGEST_SIGNATURE = max(map(len, SIGNATURES))


def tail_is_corrupt(tail: bytes) -> bool:
    """An unfinished last record is a truncation unless complete records
    follow inside it: then a length field was damaged, and treating the
    rest of the file as a torn write would silently drop good records."""
    start = 1
    while True:
        found = [i for i in (tail.find(sig, start) for sig in SIGNATURES) if i >= 0]
        if not found:
            return False
        at = min(found)
        try:
            if parse_record(tail, at) is not None:
                return True
        except AofCorrupt:
            pass
        start = at + 1


def all_nul(data: bytes | memoryview) -> bool:
    return not bytes(data).strip(b"\x00")


def check_record(offset: int, args: list[bytes], decode: bool = True) -> Job | None:
    """Validate a record's name, arity and payload; returns the decoded job
    of a LOADJOB (when `decode`).  Raises AofCorrupt."""
    name = args[0].upper()
    if name not in RECORD_NAMES:
        shown = args[0][:64].decode("utf-8", "backslashreplace")
        raise AofCorrupt(offset, f"Unknown command '{shown}' reading the append only file")
    if len(args) != ARITY.get(name, 2):
        raise AofCorrupt(offset, f"wrong number of arguments for {name.decode()}")
    if name == LOADJOB and decode:
        try:
            return decode_storage(args[1])
        except DecodeError as e:
            raise AofCorrupt(offset, f"corrupted LOADJOB data: {e}") from None
    if name == DELJOB and not valid_id(args[1]):
        raise AofCorrupt(offset, "corrupted DELJOB data: invalid job ID")
    if name == CLEANSHUTDOWN and not args[1].isdigit():
        raise AofCorrupt(offset, "corrupted CLEANSHUTDOWN data")
    if name == AOFFORMAT and args[1] != FORMAT_VERSION:
        raise AofCorrupt(offset, "unknown AOF format version")
    if name == GROUPSET and not (valid_id(args[1]) and args[3].isdigit() and len(args[3]) < 20):
        raise AofCorrupt(offset, "corrupted GROUPSET data")
    if name == SCHEDTICK and not (args[2].isdigit() and len(args[2]) < 20):
        raise AofCorrupt(offset, "corrupted SCHEDTICK data")
    if name == RESULT and not (valid_id(args[1]) and args[2].isdigit() and len(args[2]) < 20 and result_problem(args[3]) is None):
        raise AofCorrupt(offset, "corrupted RESULT data")
    return None  # (a SCHEDULE, KEYHOLD, QLIMITS or BATCH record is checked when replayed, and a bad one skipped alone)


@dataclass(slots=True)
class ScanReport:
    """What `scan` found in a whole file."""

    size: int
    status: str = "ok"  # ok | truncated | corrupt
    ok_up_to: int = 0  # end of the last good record before the problem
    records: int = 0
    error: AofCorrupt | None = None
    clean_marker: int | None = None  # offset of a trailing CLEANSHUTDOWN
    counts: dict[bytes, int] = field(default_factory=dict)


def scan(data: bytes, decode: bool = True) -> ScanReport:
    """Parse and check a whole file's bytes."""
    report = ScanReport(len(data))
    reader = RecordReader()
    reader.feed(data)
    try:
        for offset, args in reader:
            check_record(offset, args, decode)
            report.records += 1
            name = args[0].upper()
            report.counts[name] = report.counts.get(name, 0) + 1
            report.clean_marker = offset if name == CLEANSHUTDOWN else None
            report.ok_up_to = reader.offset
    except AofCorrupt as e:
        if all_nul(data[e.byte_offset :]):
            report.status = "truncated"
        else:
            report.status, report.error = "corrupt", e
        return report
    report.ok_up_to = reader.offset
    if reader.pending:
        tail = reader.tail()
        if not all_nul(tail) and tail_is_corrupt(tail):
            report.status = "corrupt"
            report.error = AofCorrupt(reader.offset, "damaged record: complete records follow an unfinished one")
        else:
            report.status = "truncated"
    return report


# --------------------------------------------------------------------- replay
