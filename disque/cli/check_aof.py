"""`disque check-aof [--fix] FILE`: report and repair an append-only file.

`disque.store.aof_repair` finds the damage and computes the repaired bytes;
this module reads the file, prints the report, and writes the repair:
truncated in place, or a new file renamed over FILE with the original kept
as `FILE.bak`.

Exit status: 0 when the file is valid or was repaired, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from disque.store.aof_repair import analyze, repair

USAGE = "Usage: disque check-aof [--fix] <file.aof>"


def _write_replacing(path: str, content: bytes) -> None:
    tmp = f"{path}.fixing-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def run(path: str, fix: bool, out: TextIO) -> int:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        print(f"Cannot open file {path}: {e.strerror}", file=out)
        return 1
    result = analyze(data)
    diff = result.size - result.ok_up_to
    print(f"AOF analyzed: size={result.size}, ok_up_to={result.ok_up_to}, diff={diff}", file=out)
    print(f"{result.records} valid records", file=out)
    if not result.damage:
        print("AOF is valid", file=out)
        return 0
    for d in result.damage:
        kind = "truncated" if d.truncated else "corrupt"
        print(f"AOF is {kind} at offset {d.offset}: {d.reason} ({d.length} bytes)", file=out)
    if not fix:
        print(f"This will shrink the AOF from {result.size} bytes to {len(repair(data, result))} bytes.", file=out)
        print("Run again with --fix to repair it (make a backup first).", file=out)
        return 1
    corrupt = [d for d in result.damage if not d.truncated]
    try:
        if not corrupt:
            cut = result.damage[0].offset
            if result.marker is not None:  # something was appended after it
                cut = result.marker[0]
                print("The clean-shutdown marker was removed: queued states will not be trusted", file=out)
            with open(path, "r+b") as f:
                f.truncate(cut)
                f.flush()
                os.fsync(f.fileno())
            print(f"Successfully truncated AOF to {cut} bytes", file=out)
            return 0
        backup = path + ".bak"
        with open(backup, "wb") as f:
            f.write(data)
        fixed = repair(data, result)
        _write_replacing(path, fixed)
    except OSError as e:
        print(f"Failed to repair {path}: {e.strerror}", file=out)
        return 1
    dropped = sum(d.length for d in result.damage)
    print(f"Dropped {dropped} bytes in {len(result.damage)} damaged region(s); original kept as {backup}", file=out)
    if result.marker is not None and result.marker in result.keep:
        print("The clean-shutdown marker was removed: queued states will not be trusted", file=out)
    print(f"Successfully repaired AOF: {len(fixed)} bytes", file=out)
    return 0


def main(argv: list[str]) -> int:
    args = list(argv)
    fix = False
    if args and args[0] == "--fix":
        fix = True
        args = args[1:]
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 1
    return run(args[0], fix, sys.stdout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
