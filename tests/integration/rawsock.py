"""Raw-socket access to a node, for tests that care about exact reply bytes.

`Raw` sends requests (multibulk via `call`, or any bytes via `send`) and reads
back whole replies as the exact bytes the server wrote; `decode` turns one
RESP2 reply into Python values that keep the reply type (`Status` vs bytes vs
`Error`, nil bulk `None` vs nil array `NIL`).  The fixtures give a node shared
by a whole test module (spawning costs ~0.5 s) and per-test unique names.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from disque.testing.devcluster import NodeProcess, free_port

TIMEOUT = 5.0


def pack(*args: Any) -> bytes:
    """A multibulk request."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def reply_end(buf: bytes, pos: int = 0) -> int | None:
    """End offset of the reply starting at `pos`, or None if it is incomplete."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None
    kind, head, end = buf[pos : pos + 1], buf[pos + 1 : eol], eol + 2
    if kind in (b"+", b"-", b":", b"_", b",", b"#", b"("):
        return end
    if kind in (b"$", b"=", b"!"):
        n = int(head)
        return end if n < 0 else (end + n + 2 if len(buf) >= end + n + 2 else None)
    if kind in (b"*", b"~", b">", b"%", b"|"):
        n = int(head) * (2 if kind in (b"%", b"|") else 1)
        for _ in range(max(n, 0)):
            next_end = reply_end(buf, end)
            if next_end is None:
                return None
            end = next_end
        return end
    raise ValueError(f"not a RESP reply: {buf[pos:pos + 40]!r}")


class Status(str):
    """A decoded `+status` reply."""


class Error(str):
    """A decoded `-error` reply."""


class _Nil:
    def __repr__(self) -> str:
        return "NIL"


NIL = _Nil()  # the nil array `*-1`; the nil bulk `$-1` decodes to None


def decode(buf: bytes) -> Any:
    """One complete RESP2 reply as typed Python values."""
    value, end = _decode(buf, 0)
    assert end == len(buf), f"trailing bytes after the reply: {buf[end:]!r}"
    return value


def _decode(buf: bytes, pos: int) -> tuple[Any, int]:
    eol = buf.index(b"\r\n", pos)
    kind, head, end = buf[pos : pos + 1], buf[pos + 1 : eol], eol + 2
    if kind == b"+":
        return Status(head.decode()), end
    if kind == b"-":
        return Error(head.decode()), end
    if kind == b":":
        return int(head), end
    if kind == b"$":
        n = int(head)
        return (None, end) if n < 0 else (buf[end : end + n], end + n + 2)
    if kind == b"*":
        n = int(head)
        if n < 0:
            return NIL, end
        items = []
        for _ in range(n):
            item, end = _decode(buf, end)
            items.append(item)
        return items, end
    raise ValueError(f"not a RESP2 reply: {buf[pos:pos + 40]!r}")


class Raw:
    """One client connection that reads replies as raw bytes."""

    def __init__(self, node: NodeProcess | tuple[str, int], timeout: float = TIMEOUT) -> None:
        address = node if isinstance(node, tuple) else (node.host, node.port)
        self.sock = socket.create_connection(address, timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError(f"connection closed by the server (pending {self.buf!r})")
        return data

    def read_raw(self) -> bytes:
        """The exact bytes of the next reply."""
        while (end := reply_end(self.buf)) is None:
            self.buf += self._recv()
        raw, self.buf = self.buf[:end], self.buf[end:]
        return raw

    def read(self) -> Any:
        return decode(self.read_raw())

    def call_raw(self, *args: Any) -> bytes:
        self.send(pack(*args))
        return self.read_raw()

    def call(self, *args: Any) -> Any:
        return decode(self.call_raw(*args))

    def read_until_closed(self, timeout: float = TIMEOUT) -> bytes:
        """Everything the server still sends; fails if it keeps the connection open."""
        deadline = time.monotonic() + timeout
        data, self.buf = self.buf, b""
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                raise AssertionError(f"the server did not close the connection; got {data!r}") from None
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def silent_for(self, seconds: float) -> bool:
        """True when nothing arrives (and the connection stays open) for `seconds`."""
        self.sock.settimeout(seconds)
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(TIMEOUT)
        self.buf += chunk
        return False

    def close(self) -> None:
        self.sock.close()




def rss(pid: int) -> int:
    """The resident memory of a process, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def blocked_on(conn: Raw, queue: bytes) -> int:
    """Clients blocked on `queue` (0 while the queue does not exist yet)."""
    stat = conn.call("QSTAT", queue)
    return 0 if stat is NIL else as_dict(stat)[b"blocked"]


def as_dict(flat: list[Any]) -> dict[bytes, Any]:
    """A flat key/value array (SHOW, QSTAT, CONFIG GET) as a dict."""
    assert len(flat) % 2 == 0
    return dict(zip(flat[::2], flat[1::2]))


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node for a whole module; tests keep apart by using unique names."""
    port = free_port()
    node = NodeProcess(port, tmp_path_factory.mktemp("shared") / f"node-{port}").start()
    yield node
    assert node.stop() == 0


@pytest.fixture
def raw(shared_node: NodeProcess) -> Iterator[Callable[..., Raw]]:
    """`raw()` connects to the module's shared node, `raw(node)` to another."""
    conns: list[Raw] = []

    def connect(node: NodeProcess | tuple[str, int] | None = None, timeout: float = TIMEOUT) -> Raw:
        conn = Raw(node or shared_node, timeout)
        conns.append(conn)
        return conn

    yield connect
    for conn in conns:
        conn.close()


_names = itertools.count()


@pytest.fixture
def q() -> bytes:
    """A queue name no other test uses."""
    return b"q%d" % next(_names)
