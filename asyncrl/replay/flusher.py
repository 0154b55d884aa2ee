"""`Flusher`: the hub journal's writer thread. Appends, fsyncs and compaction's file work run here, so the
hub's loop never waits on the disk.

    hub loop (Journal, between mutations)            writer thread                    snapshot thread
    append(parts) ... one turn's records
    sync() ──(ticket t, records)──► jobs ──────────► write every queued job in order,
    rotate(k+1, state image) ─────► jobs             ONE fsync for all of them (group
                                                     commit); rotate = close segment k
                                                     (fsync), open k+1 ──────────────► pack the image group
    durable >= t ◄──────── wake() (pipe) ◄────────── durable = last ticket written       by group, write
    send the replies held for <= t                                                    snapshot k+1 (tmp,
                                                                                      fsync, rename, fsync
                                                                                      dir), prune

Who blocks on what: the loop never blocks (it puts jobs on a SimpleQueue); the writer thread sleeps on
that queue until a job arrives; the snapshot thread is started per snapshot and the loop
asks for the next rotation only after it has finished (`snapshot_pending`).

Durability rule: a ticket is durable once its records and every record handed over before them are written
and fsynced (per the fsync mode). The hub holds each reply until the ticket of its turn is durable, so a
reply never acknowledges (or reveals state built on) a record that could be lost. A turn whose replies all
go out at once (leases, work to score: the hub's `UNHELD`) hands its records over with `sync(durable=False)`:
they are written, and fsynced with the next records someone waits for, not on their own (an fsync costs
~0.1 ms of CPU; leases' own were a sixth of the hub's fsyncs in `bench.replay`). Records no reply reports
(a lease's expiry on a tick) wait for the next such fsync too: a crash before it re-derives them from what is
durable (a lease's deadline is in its grant). What a crash may lose:
records whose tickets were not yet durable, i.e. mutations no reply has reported; the peers that sent them
time out and retry against the restarted hub (as before, when a crash hit between the log write and the
replies). The file operations are those of the synchronous journal in the same order (segment k is closed
before k+1 exists, snapshot k+1 is written only after that), so a crash leaves a state the synchronous
journal could also leave: every case `tests/replay` crashes through.

An error on the writer thread (e.g. disk full on fsync) stops it; nothing after it becomes durable and the
loop raises the error at its next `sync()`, which ends the hub as a failed fsync on the loop did. A snapshot
that fails to write is logged and retried at the next threshold (the new segment follows the old one).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from asyncrl.replay.log import HEADER, LogWriter
from asyncrl.replay.segments import Segments
from asyncrl.replay.snapshot import write_image

log = logging.getLogger("asyncrl.replay")

Parts = tuple[bytes | memoryview, ...]  # one record's payload pieces (immutable buffers)


class Flusher:
    def __init__(self, writer: LogWriter, files: Segments, on_snapshot: Callable[[int], None]) -> None:
        """`on_snapshot(size)` is called from the snapshot thread once a snapshot is in place."""
        self.writer = writer  # owned by the writer thread from here on (the loop reads path/records/bytes)
        self.files = files
        self._on_snapshot = on_snapshot
        self._pending: list[Parts] = []  # loop side: records since the last sync()
        self.segment_bytes = writer.bytes  # loop side: bytes handed over for the current segment
        self.submitted = 0  # loop side: tickets handed out
        self.awaited = 0  # loop side: the newest ticket handed over as waited for (the writer fsyncs it)
        self.durable = 0  # written by the writer thread: every ticket <= this is on disk
        self.snapshot_pending = False
        self.error: BaseException | None = None
        self._jobs: queue.SimpleQueue[tuple[int, str, Any] | None] = queue.SimpleQueue()  # None: stop
        self._snapshot_thread: threading.Thread | None = None
        self.wake_fd, self._wake_w = os.pipe()  # the loop polls wake_fd; a byte arrives when `durable` moves
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_w, False)
        self.thread = threading.Thread(target=self._run, daemon=True, name="asyncrl-hub-journal")
        self.thread.start()

    # ------------------------------------------------------------------------------ loop side

    def append(self, parts: Parts) -> None:
        self._pending.append(parts)
        self.segment_bytes += HEADER.size + sum(len(p) for p in parts)

    def sync(self, durable: bool = True) -> int:
        """Hand the records appended since the last call to the writer thread; returns the ticket that covers
        everything appended so far. `durable`: the caller will wait for that ticket, so the writer fsyncs it
        (and, if nothing new was appended, an earlier ticket handed over with durable=False); False: written
        now, fsynced with the next records handed over durable. Raises the writer thread's error, if it
        stopped on one."""
        if self.error is not None:
            raise self.error
        if self._pending or (durable and self.awaited < self.submitted):
            self._put("records", (self._pending, durable))
            self._pending = []
        if durable:
            self.awaited = self.submitted
        return self.submitted

    def rotate(self, segment: int, snapshot: dict[str, Any]) -> None:
        """Close the current segment, start `segment`, then pack and write `snapshot` (a `state_image`) as
        snapshot `segment` on the snapshot thread."""
        self.sync(durable=False)  # closing the segment fsyncs it
        self.snapshot_pending = True
        self.segment_bytes = 0
        self._put("rotate", (segment, snapshot))

    def drain_wakes(self) -> None:
        try:
            os.read(self.wake_fd, 1 << 16)  # a pipe holds at most 64 KiB: one read empties it
        except BlockingIOError:
            pass

    def wait(self, timeout_s: float = 30.0) -> None:
        """Block until every ticket handed out is durable (or the writer thread failed); for shutdown."""
        target, deadline = self.sync(), time.monotonic() + timeout_s
        while self.durable < target and self.error is None and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)

    def close(self) -> None:
        """Write what is left, stop both threads, close the segment. After a writer error (already raised by
        `sync()`) nothing more is written. A second call does nothing: closing the wake pipe's descriptors twice
        would close whatever the process opened under those numbers since (another hub's ZeroMQ sockets)."""
        if self.wake_fd < 0:
            return
        if self.error is None:
            self.sync()
        self._jobs.put(None)
        self.thread.join()
        if self._snapshot_thread is not None:
            self._snapshot_thread.join()
        try:
            self.writer.close()
        except OSError as e:
            if self.error is None:
                raise
            log.error("journal segment not closed cleanly after the writer failed: %s", e)
        os.close(self.wake_fd)
        os.close(self._wake_w)
        self.wake_fd = self._wake_w = -1  # a late _wake writes to no descriptor (OSError, ignored)

    def _put(self, kind: str, payload: Any) -> None:
        self.submitted += 1
        self._jobs.put((self.submitted, kind, payload))

    # ------------------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        stop = False
        while not stop:
            jobs = [self._jobs.get()]  # sleeps until the loop hands over a turn; then takes every turn queued
            while not self._jobs.empty():
                jobs.append(self._jobs.get_nowait())
            stop = jobs[-1] is None
            jobs = [j for j in jobs if j is not None]
            if not jobs:
                return
            try:
                awaited = self._write(jobs)
                if awaited:
                    self.writer.sync()
            except BaseException as e:  # the loop raises it at its next sync(); nothing later becomes durable
                log.exception("journal writer thread failed")
                self.error = e
                self._wake()
                return
            if awaited:
                self.durable = jobs[-1][0]
                self._wake()

    def _write(self, jobs: list[tuple[int, str, Any]]) -> bool:
        """Write (and rotate) in order; whether a job is waited for (a rotation's closing fsync counts)."""
        awaited = False
        for _, kind, payload in jobs:
            if kind == "records":
                records, durable = payload
                for parts in records:
                    self.writer.append(*parts)
                awaited = awaited or durable
            else:
                self._rotate(*payload)
                awaited = True
        return awaited

    def _rotate(self, segment: int, snapshot: dict[str, Any]) -> None:
        self.writer.close()  # segment k is whole and synced before k+1 exists (as the synchronous journal)
        self.writer = LogWriter(self.files.segment(segment), self.writer.fsync)
        self._snapshot_thread = threading.Thread(target=self._write_snapshot, args=(segment, snapshot),
                                                 daemon=True, name="asyncrl-hub-snapshot")
        self._snapshot_thread.start()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):  # the pipe is full: the loop has wakes to read already
            pass

    # ------------------------------------------------------------------------------ snapshot thread

    def _write_snapshot(self, segment: int, snapshot: dict[str, Any]) -> None:
        try:
            size = write_image(self.files.snapshot(segment), snapshot)
            self._on_snapshot(size)
            self.files.prune(known_valid=segment)
        except OSError as e:  # e.g. disk full: the new segment follows the old one, resume stays exact
            log.error("journal snapshot %d not written or pruned (%s); history kept, retried later", segment, e)
        finally:
            self.snapshot_pending = False
