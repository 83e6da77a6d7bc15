"""The bus codec per frame, for instruction counts: N encodes or decodes of
a REPLJOB (a 100-byte job, three delivery nodes) or a GOTJOB, in the
positional form of a link whose header was sent already.

    python bench/codec_frames.py KIND N

KIND is enc_repl, dec_repl, enc_got or dec_got.  As with
bench/instructions.py, the instructions of one frame are the difference
between two runs under `valgrind --tool=callgrind` with different N, divided
by the difference of N:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/codec_frames.py dec_repl 2000   # and 6000

An encode includes making its message (each is a new one, so the codec's
reuse of the body of a message sent to several peers does not apply).
"""

from __future__ import annotations

import random
import sys

from disque.cluster.codec import LinkCodec
from disque.cluster.messages import GotJob, Header, ReplJob
from disque.store.ids import new_job_id
from disque.store.job import Job, State
from disque.store.records import job_to_wire

NODES = ("a" * 40, "b" * 40, "c" * 40)


def main() -> None:
    kind, n = sys.argv[1], int(sys.argv[2])
    header = Header(NODES[0], 7711, 0)
    job_id = new_job_id(NODES[0], random.Random(1), 3600, 300)
    job = Job(job_id, b"q", b"x" * 100, State.QUEUED, 0, 3, 2_000_000_000, 1, 0, 300, 0, 0, NODES, 0, b"", b"")
    wire = job_to_wire(job, 1000)
    sender, receiver = LinkCodec(), LinkCodec()
    receiver.decode(sender.encode(header, GotJob(job_id)))  # the map form, which says "pv"
    sender.positional = True
    receiver.decode(sender.encode(header, GotJob(job_id)))  # the header, once
    repl = kind.endswith("repl")
    if kind.startswith("enc"):
        encode = sender.encode
        for msg in [ReplJob(wire) if repl else GotJob(job_id) for _ in range(n)]:
            encode(header, msg)
    else:
        body, decode = sender.encode(header, ReplJob(wire) if repl else GotJob(job_id)), receiver.decode
        for _ in range(n):
            decode(body)


if __name__ == "__main__":
    main()
