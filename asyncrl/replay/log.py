"""Append-only, checksummed record log on disk (the replay hub's write-ahead log).

File format: a sequence of records ``[length: u32 LE][crc32(payload): u32 LE][payload]``. The payload
is opaque here (`asyncrl.replay.journal` puts one msgpack record in each). A crash can leave a torn
tail (a partial header, a partial payload, or a payload whose checksum does not match); reading stops
at the first bad record, and `LogWriter` truncates the file there before it appends, so later records
are never hidden behind garbage.

Durability (`fsync`): "always" fsyncs after every record; "batch" buffers records and fsyncs on
`sync()` (the hub calls it once per event-loop turn, before it sends the replies of that turn);
"never" flushes on `sync()` and leaves the rest to the OS.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

HEADER = struct.Struct("<II")  # payload length, crc32 of payload
MAX_RECORD_BYTES = 1 << 30


def iter_records(path: str | Path) -> Iterator[bytes]:
    """Payloads of the valid prefix of the log, in order; stops silently at a torn tail."""
    for payload, _ in _scan(path):
        yield payload


def valid_length(path: str | Path) -> int:
    """Byte length of the valid prefix (where the next record must be written)."""
    end = 0
    for _, end in _scan(path):
        pass
    return end


def _scan(path: str | Path) -> Iterator[tuple[bytes, int]]:
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        end = 0
        while True:
            header = f.read(HEADER.size)
            if len(header) < HEADER.size:
                return
            length, crc = HEADER.unpack(header)
            if length > MAX_RECORD_BYTES:
                return
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                return
            end += HEADER.size + length
            yield payload, end


class LogWriter:
    def __init__(self, path: str | Path, fsync: str = "batch") -> None:
        if fsync not in ("always", "batch", "never"):
            raise ValueError(f"fsync={fsync!r}: use 'always', 'batch' or 'never'")
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        end = valid_length(self.path)
        with open(self.path, "ab") as f:  # drop a torn tail left by a crash
            f.truncate(end)
        self._file = open(self.path, "ab", buffering=1 << 20)
        self._dirty = False
        self.records = 0
        self.bytes = end

    def append(self, *parts: bytes | memoryview) -> None:
        """One record whose payload is the concatenation of `parts` (written as they are, not joined)."""
        length, crc = 0, 0
        for p in parts:
            length += len(p)
            crc = zlib.crc32(p, crc)
        if length > MAX_RECORD_BYTES:
            raise ValueError(f"log record of {length} bytes > {MAX_RECORD_BYTES}")
        self._file.write(HEADER.pack(length, crc))
        for p in parts:
            self._file.write(p)
        self.records += 1
        self.bytes += HEADER.size + length
        self._dirty = True
        if self.fsync == "always":
            self.sync()

    def sync(self) -> None:
        if not self._dirty:
            return
        self._file.flush()
        if self.fsync != "never":
            os.fsync(self._file.fileno())
        self._dirty = False

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()
