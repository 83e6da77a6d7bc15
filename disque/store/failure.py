"""A job's last failure: why its last delivery failed, as the consumer said.

Theory of operation: a consumer that NACKs a job may say why (NACK ...
ERROR, docs/commands.md): the exception's type and message, a traceback,
and the host and process that ran it.  The node keeps the last such
`Failure` with the job (store/job.py), sends it wherever the job's state
travels (REPLJOB and YOURJOBS, the QUEUED of a NACK) and writes it to the
AOF; a job moved to its dead-letter queue takes it along, so a dead letter
says why it died.

Sizes are bounded by one rule, `LIMITS`, checked here and only here
(`problem`): the command refuses an over-long field with an error that
names it, and a record or frame that breaks it fails to decode as any
malformed field does.  `at` is the node's clock (unix ms) when the failure
was recorded.  `NO_FAILURE` (the empty tuple) stands for none: what a job,
a record or a frame without one holds.
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Failure(NamedTuple):
    type: bytes  # the exception's type, as the consumer names it ("ValueError")
    message: bytes
    traceback: bytes = b""
    host: bytes = b""  # the consumer's host name
    pid: int = 0  # its process ID (0: not said)
    at: int = 0  # unix ms when a node recorded it


NO_FAILURE: Final[tuple[()]] = ()

# The rule: the most bytes each text field may have.  The client cuts its
# fields to fit, keeping the innermost frames of a traceback
# (disque/client/protocol.py, failure_args).
LIMITS: Final = {"type": 256, "message": 4096, "traceback": 16384, "host": 255}
MAX_PID: Final = 2**32 - 1


def problem(failure: Failure) -> str | None:
    """What breaks the rule in `failure`, or None when it keeps it."""
    for name, limit in LIMITS.items():
        if len(getattr(failure, name)) > limit:
            return f"{name} longer than {limit} bytes (the failure size limits)"
    if not failure.type:
        return "type must not be empty"
    if not 0 <= failure.pid <= MAX_PID:
        return f"pid must be between 0 and {MAX_PID}"
    return None
