"""nodes.conf on disk: locked for the life of the process, rewritten in place.

Shell side of spec/config.md §5: the file is opened (created if missing) and
locked with a non-blocking exclusive flock, so two nodes can never share it.
Saves pad the new content to the old size, write it with one write, then
truncate, so the file is never seen empty or half-written.
"""

from __future__ import annotations

import fcntl
import os


class NodesFileLocked(Exception):
    pass


class NodesFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise NodesFileLocked(
                f"Sorry, the cluster configuration file {path} is already used by a different Disque node. "
                "Please make sure that different nodes use different cluster configuration files."
            ) from None

    def read(self) -> str:
        os.lseek(self.fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self.fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def save(self, text: str, fsync: bool = False) -> None:
        content = text.encode()
        old_size = os.fstat(self.fd).st_size
        padded = content + b"\n" * max(0, old_size - len(content))
        os.lseek(self.fd, 0, os.SEEK_SET)
        view = memoryview(padded)
        while view:
            view = view[os.write(self.fd, view) :]
        os.ftruncate(self.fd, len(content))
        if fsync:
            os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
