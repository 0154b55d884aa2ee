"""Durable writes to the local filesystem, one implementation for every writer (run files, checkpoints,
the hub's journal and snapshots): data is on disk when these return, and a rename is made durable by
syncing its folder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

PACE_BYTES = 64 << 20


def write_synced(path: Path, data: bytes) -> None:
    """Write `data` to `path` and fsync it (no rename: callers that need atomicity write a temporary name)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Temporary name, fsync, rename, fsync of the folder: a reader sees the old file or the new one."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as indented JSON, written atomically (write_atomic)."""
    write_atomic(path, json.dumps(data, indent=2).encode())


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename the complete folder `tmp` to `final` (an old `final` moved aside first, then removed) and fsync
    the parent. A crash leaves `final` whole (old or new), or `tmp` and `.old-<final>` for the caller to judge."""
    old = final.with_name(f".old-{final.name}")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


class PacedFile:
    """A file for one large write (a checkpoint) whose data reaches the disk as it is written: fdatasync after
    every `pace_bytes`, then fsync at `close`. Left to the page cache, gigabytes would be flushed by the final
    fsync at once, and on ext4 every other process's fsync meanwhile queues behind that flush: on the H200 host
    the hub's per-turn journal fsync stalled the whole two-GPU pipeline ~1 s, twice per background checkpoint
    (bench.pipeline timeline, 7c25179). Paced, another fsync waits for at most one chunk. Supports what
    `torch.save` needs of a file object (write, flush, tell). `on_write(n)` is called with every write's byte
    count (a progress counter), on the writing thread."""

    def __init__(self, path: Path, pace_bytes: int = PACE_BYTES, on_write: Callable[[int], None] | None = None) -> None:
        self._f: BinaryIO = open(path, "wb")
        self.pace_bytes = pace_bytes
        self.on_write = on_write
        self._unsynced = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = self._f.write(data)
        if self.on_write is not None:
            self.on_write(n)
        self._unsynced += n
        if self._unsynced >= self.pace_bytes:
            self._f.flush()
            os.fdatasync(self._f.fileno())
            self._unsynced = 0
        return n

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        """Flush and fsync (data and metadata), then close."""
        if self._f.closed:
            return
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
        finally:
            self._f.close()

    def __enter__(self) -> PacedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
