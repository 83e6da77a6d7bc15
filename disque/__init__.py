"""Disque: a multi-master distributed job queue, wire-compatible with antirez's Disque."""

__version__ = "0.2.0"

from disque import compiled as _compiled  # noqa: E402

_compiled.choose()  # the compiled core, or its sources when it is stale or DISQUE_PURE is set
