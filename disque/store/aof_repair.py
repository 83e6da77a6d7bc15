"""What `disque check-aof` finds in an append-only file, and the repaired bytes.

Theory of operation: the whole file is parsed with the loader's parser,
seals and record checks (aof.py), and judged as the loader judges it
(shell/aof_loader.py).  Problems are of two kinds.  A truncated tail (an
unfinished last record, a NUL-filled tail after power loss, damaged bytes
with no whole record after them) is what the server itself cuts off with
`aof-load-truncated yes`; `--fix` cuts it off in place.  Damage in the
middle (bad framing, a checksum that fails, an unknown command, an
undecodable LOADJOB) is what the server skips with `aof-load-damaged yes`
(or refuses to start on); `--fix` drops each damaged region up to the next
point where valid records resume, writes the result to a new file renamed
over FILE, and keeps the original as `FILE.bak`.  A CLEANSHUTDOWN marker is dropped from a repaired file, since
its queued states can no longer be trusted.

This module only looks at bytes (`analyze`, `repair`); reading, writing
and the report are `disque.cli.check_aof`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from disque.store.aof import (
    AOFFORMAT,
    SIGNATURES,
    CLEANSHUTDOWN,
    AofCorrupt,
    all_nul,
    check_record,
    parse_record,
    tail_is_corrupt,
    unseal,
)


@dataclass
class Damage:
    offset: int
    length: int
    reason: str
    truncated: bool = False  # an unfinished tail rather than corruption


@dataclass
class Analysis:
    size: int
    records: int = 0
    keep: list[tuple[int, int]] = field(default_factory=list)  # good (start, end) spans
    damage: list[Damage] = field(default_factory=list)
    marker: tuple[int, int] | None = None  # span of a trailing CLEANSHUTDOWN

    @property
    def ok_up_to(self) -> int:
        return self.damage[0].offset if self.damage else self.size


def _valid_at(data: bytes, pos: int) -> int | None:
    """End of a valid record starting at pos, else None."""
    try:
        parsed = parse_record(data, pos)
        if parsed is None:
            return None
        check_record(pos, unseal(data, pos, parsed[1], parsed[0], False))
    except AofCorrupt:
        return None
    return parsed[1]


def _resync(data: bytes, start: int) -> int | None:
    """The first offset after `start` where a valid record begins."""
    pos = start + 1
    while True:
        found = [i for i in (data.find(sig, pos) for sig in SIGNATURES) if i >= 0]
        if not found:
            return None
        at = min(found)
        if _valid_at(data, at) is not None:
            return at
        pos = at + 1


def analyze(data: bytes) -> Analysis:
    result = Analysis(len(data))
    n, pos = len(data), 0
    sealed = False  # past an AOFFORMAT record: every record has a checksum
    while pos < n:
        try:
            parsed = parse_record(data, pos)
            if parsed is None:
                tail = data[pos:]
                if all_nul(tail) or not tail_is_corrupt(tail):
                    result.damage.append(Damage(pos, n - pos, "unfinished last record", truncated=True))
                    break
                raise AofCorrupt(pos, "damaged record (complete records follow an unfinished one)")
            args, end = parsed
            args = unseal(data, pos, end, args, sealed)
            check_record(pos, args)
        except AofCorrupt as e:
            if all_nul(data[e.byte_offset :]):
                result.damage.append(Damage(pos, n - pos, "NUL bytes at the end of the file", truncated=True))
                break
            nxt = _resync(data, pos)
            stop = n if nxt is None else nxt
            # no whole record after it: the loader cuts it off as a torn tail
            result.damage.append(Damage(pos, stop - pos, f"{e.message} (byte {e.byte_offset})", truncated=nxt is None))
            if nxt is None:
                break
            pos = nxt
            continue
        result.records += 1
        result.keep.append((pos, end))
        result.marker = (pos, end) if args[0].upper() == CLEANSHUTDOWN else None
        sealed = sealed or args[0] == AOFFORMAT
        pos = end
    return result


def repair(data: bytes, analysis: Analysis) -> bytes:
    spans = analysis.keep
    if analysis.marker is not None and analysis.damage:
        spans = [s for s in spans if s != analysis.marker]
    return b"".join(data[a:b] for a, b in spans)
