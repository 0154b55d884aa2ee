"""Append-only, checksummed record log on disk (the replay hub's write-ahead log).

File format: a sequence of records ``[length: u32 LE][crc32(payload): u32 LE][payload]``. The payload
is opaque here (`asyncrl.replay.journal` puts one msgpack record in each). A crash can leave a torn
tail: the LAST record cut short (a partial header or payload) or with a checksum that does not match.
Only that is dropped: `LogWriter` moves its bytes to ``<log>.torn-<offset>`` (kept, never deleted) and
truncates there before it appends. A bad record with whole records after it is corruption, not a torn
tail: reading raises `LogCorrupt` (one line: file, offset, what to do) and nothing is truncated.

A file that was closed cleanly (an older journal segment, a snapshot) cannot have a torn tail:
`iter_sealed` raises `LogCorrupt` for any bytes that are not whole, checksummed records.

Durability (`fsync`): "always" fsyncs after every record; "batch" buffers records and fsyncs on
`sync()` (in the hub, the journal's writer thread calls it once for all the loop turns queued since its
last one; the replies of those turns wait for it, see `asyncrl.replay.flusher`); "never" flushes on
`sync()` and leaves the rest to the OS.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("asyncrl.replay")
HEADER = struct.Struct("<II")  # payload length, crc32 of payload
MAX_RECORD_BYTES = 1 << 30


class LogCorrupt(ValueError):
    """A record in the middle of the log fails its checksum: the log is left as it is."""


def iter_records(path: str | Path) -> Iterator[bytes]:
    """Payloads of the valid prefix of the log, in order; stops silently at a torn tail."""
    for payload, _ in _scan(path):
        yield payload


def iter_records_at(path: str | Path, sealed: bool = False) -> Iterator[tuple[int, bytes]]:
    """(byte offset of the record, payload) for each record of `iter_records` (`sealed`: of `iter_sealed`)."""
    end = 0
    for payload, end in _scan(path):
        yield end - HEADER.size - len(payload), payload
    if sealed:
        _check_sealed(path, end)


def iter_sealed(path: str | Path) -> Iterator[bytes]:
    """Payloads of a log that was closed cleanly; anything but whole, valid records raises LogCorrupt
    (after the valid prefix was yielded). Nothing is truncated."""
    for _, payload in iter_records_at(path, sealed=True):
        yield payload


def read_record_at(path: str | Path, offset: int) -> bytes:
    """The payload of the record that starts at byte `offset` of the log at `path`, its checksum checked;
    LogCorrupt (naming the file and offset) when no whole, valid record starts there."""
    with open(path, "rb") as f:
        f.seek(offset)
        got = _read_record(f)
    if got is None or not got[1]:
        raise LogCorrupt(f"{path}: no whole record with a valid checksum at byte {offset}")
    return got[0]


def _check_sealed(path: str | Path, end: int) -> None:
    size = os.path.getsize(path)
    if end != size:
        raise LogCorrupt(
            f"{path}: the {size - end} bytes from byte {end} are not a whole checksummed record, yet this file "
            "was closed cleanly (it is damaged, not torn); it is left untouched. Restore it from a backup, or "
            "move the journal files aside to start the run afresh")


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
            got = _read_record(f)
            if got is None:
                return  # a torn tail (or a corrupted length: its bytes are kept aside, see LogWriter)
            payload, valid = got
            length = len(payload)
            if not valid:
                if f.read(1):  # whole records follow: this is not a torn tail
                    size = os.path.getsize(path)
                    raise LogCorrupt(
                        f"{path}: record at byte {end} ({length} bytes) fails its checksum and {size - end - HEADER.size - length} "
                        f"bytes follow it; the log is left untouched. Restore {Path(path).name} from a backup, or "
                        "move it aside to start the run afresh (resume cannot skip committed history)")
                return
            end += HEADER.size + length
            yield payload, end


def _read_record(f: BinaryIO) -> tuple[bytes, bool] | None:
    """The record at `f`'s position: (payload, whether its checksum matches), or None when no whole record
    is there (a partial header or payload, or a length past MAX_RECORD_BYTES)."""
    header = f.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    length, crc = HEADER.unpack(header)
    if length > MAX_RECORD_BYTES:
        return None
    payload = f.read(length)
    if len(payload) < length:
        return None
    return payload, zlib.crc32(payload) == crc


def _set_torn_tail_aside(path: Path, end: int) -> None:
    """Copy the bytes past the valid prefix (a torn tail) to `<path>.torn-<end>`, then truncate there."""
    size = path.stat().st_size if path.exists() else 0
    if size <= end:
        return
    with open(path, "rb") as f:
        f.seek(end)
        torn = f.read()
    aside = path.with_name(f"{path.name}.torn-{end}")
    aside.write_bytes(torn)
    log.warning("%s: dropped a torn tail of %d bytes at byte %d (kept in %s)", path, len(torn), end, aside)
    with open(path, "ab") as f:
        f.truncate(end)


class LogWriter:
    def __init__(self, path: str | Path, fsync: str = "batch") -> None:
        if fsync not in ("always", "batch", "never"):
            raise ValueError(f"fsync={fsync!r}: use 'always', 'batch' or 'never'")
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        end = valid_length(self.path)
        _set_torn_tail_aside(self.path, end)
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
