"""A one-shot timer as a file descriptor (Linux timerfd), for the client
loop's epoll set.

Theory of operation: trio has no timer that is not a cancellation: a
`sleep` or `move_on_after` that expires raises `Cancelled` into the task
and catches it through its scopes, which for an idle node was a fifth of
its CPU (docs/performance.md, "Scale").  A timerfd is a file descriptor
that becomes readable when it expires, so the node's deadlines wake the
client loop (tcp.py) like any socket, in the same wake-up as the frames and
requests that arrive with them, with no task of their own.

Python has `os.timerfd_create` only from 3.13: the two calls are made
through ctypes.  `arm(ms)` (re)sets the expiry relative to now; `fired()`
consumes an expiry and tells whether there was one (a stale readiness after
a re-arm has none).
"""

from __future__ import annotations

import ctypes
import os

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_create = _libc.timerfd_create
_create.argtypes = (ctypes.c_int, ctypes.c_int)
_settime = _libc.timerfd_settime
_settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p)


class Timer:
    __slots__ = ("fd", "_spec")

    def __init__(self) -> None:
        fd = _create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create: " + os.strerror(ctypes.get_errno()))
        self.fd: int = fd
        self._spec = _Itimerspec()

    def arm(self, ms: int) -> None:
        """Expire `ms` milliseconds from now (at once, on the next wake-up, if 0 or less)."""
        ns = max(ms, 0) * 1_000_000 or 1  # an expiry of 0 would disarm it
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(ns, 1_000_000_000)
        if _settime(self.fd, 0, ctypes.byref(self._spec), None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime: " + os.strerror(ctypes.get_errno()))

    def fired(self) -> bool:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        os.close(self.fd)
