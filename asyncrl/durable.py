"""Durable writes to the local filesystem, one implementation for every writer (run files, checkpoints,
the hub's journal and snapshots): data is on disk when these return, and a rename is made durable by
syncing its folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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
