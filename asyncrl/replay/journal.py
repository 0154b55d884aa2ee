"""`Journal`: the hub's state plus its log. Every mutation is applied, then logged with its arguments.

One log record per mutation, ``[kind, *args]`` as msgpack (`asyncrl.replay.journal_format`); requests
that carry records (SubmitPrompts, SampleBatch) are logged as the network frame they arrived in, written
from the received buffer as it is (`log_record_parts`), so the hot path never re-encodes or
copies samples. `Journal.open(path)` replays the log through the same `HubState`
methods, which are deterministic in their arguments, so a restart rebuilds the same state. A mutation
that raised is not logged (it changed nothing).

Scores are logged by sample id only (the sample itself was logged when it arrived).

Compaction: the log is a chain of segments (`asyncrl.replay.segments`). At a `sync()` after which the
current segment holds more than ``max(compact_bytes, COMPACT_RATIO x last snapshot)`` bytes, the journal
starts segment k+1 and writes snapshot k+1 of the whole state, then deletes what the two newest valid
snapshots cover. A snapshot refers to the live samples of its last `REF_SEGMENTS` segments where they were
logged instead of copying them (`asyncrl.replay.segments`), so it costs little more than the state's
bookkeeping; each sample's place is noted as it is logged (`PackedSample.stored`) or replayed. Disk
therefore stays within about 2 snapshots + 2 + REF_SEGMENTS segments (bounded by the live state, not by the
run's length) and a resume loads one snapshot, reads the records it names and replays at most about two
segments. A snapshot that fails to write leaves a journal that still resumes exactly (the new segment
simply follows the old one); it is retried at the next threshold.

Threads: `Journal.open(path, background=False)` does all of this on the caller's thread, inside `sync()`
(tests, `bench.journal`). The hub opens it with ``background=True``: mutations, records and the snapshot's
image (`snapshot.state_image`: new containers around leaves that never change, ~5 ms for 3k groups) still
happen on the loop thread, between mutations (so a snapshot is one consistent state, no locking), while
writing, fsync, rotating segments, packing and writing snapshots and pruning run on the
`asyncrl.replay.flusher.Flusher` threads, in the same order as here. `sync()` then returns a ticket at once and the
caller waits for `durable() >= ticket` before it acknowledges anything logged (the hub holds replies):

    loop:    mutate + append ... sync() -> t ... [hold replies of t] ... durable() >= t -> send them
    thread:                      write, fsync ───────────────────────────► durable = t, wake the loop
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.flusher import Flusher
from asyncrl.replay.journal_format import decode_record, encode_record, log_record_parts
from asyncrl.replay.leases import LeaseEntry
from asyncrl.replay.log import LogCorrupt, LogWriter, iter_records_at
from asyncrl.replay.segments import Segments
from asyncrl.replay.snapshot import SnapshotInvalid, read_snapshot, state_image, write_snapshot
from asyncrl.replay.state import HubState, Outcome

log = logging.getLogger("asyncrl.replay")
COMPACT_BYTES = 16 << 20  # a segment is not rotated before it holds this much (resume replays about this)
COMPACT_RATIO = 2  # ... nor before it is this many times the last snapshot (snapshot writes <= 1/2 of logging)


class Journal:
    def __init__(self, state: HubState, writer: LogWriter | None, files: Segments | None = None,
                 segment: int = 0, compact_bytes: int = COMPACT_BYTES, snapshot_bytes: int = 0,
                 background: bool = False) -> None:
        """`background`: write on the `Flusher` threads (module doc); needs `writer` and `files`."""
        self.state = state
        self._writer = writer
        self.flusher = Flusher(writer, files, self._snapshot_written) if background and writer and files else None
        self.files = files
        self.segment = segment  # number of the segment `writer` appends to
        self.compact_bytes = compact_bytes
        self.snapshot_bytes = snapshot_bytes  # size of the newest snapshot (0: none yet)
        self.snapshots_written = 0

    @classmethod
    def open(cls, path: str | Path | None, fsync: str = "batch", compact_bytes: int = COMPACT_BYTES,
             background: bool = False) -> Journal:
        """Rebuild the state from the journal at `path` (newest valid snapshot, then the segments after it)
        and keep appending to its last segment. None: no log. Raises LogCorrupt when history is damaged.
        `background`: write and fsync on a writer thread (module doc)."""
        if path is None:
            return cls(HubState(), None)
        files = Segments(Path(path))
        state, base, snapshot_bytes = _newest_snapshot(files)
        last = _replay_segments(files, state, base)
        return cls(state, LogWriter(files.segment(last), fsync), files, last, compact_bytes, snapshot_bytes,
                   background)

    @property
    def writer(self) -> LogWriter | None:
        """The segment being appended to (the writer thread's, in background mode: read its counters only)."""
        return self.flusher.writer if self.flusher is not None else self._writer

    def _log(self, *record: Any) -> None:
        if self._writer is not None:
            self._append((encode_record(list(record)),))

    def _log_frame(self, kind: str, frame: bytes | memoryview, samples: list[wire.PackedSample] | None = None) -> None:
        """Log `frame` as it arrived; note where each of `samples` (decoded from it) now lies on disk."""
        if self._writer is None:
            return
        parts = log_record_parts(kind, frame)
        if samples:
            at = self.flusher.segment_bytes if self.flusher is not None else self._writer.bytes  # this record's offset
            _note_stored(samples, (self.segment, at, len(parts[0])))
        self._append(tuple(parts))

    def _append(self, parts: tuple[bytes | memoryview, ...]) -> None:
        if self.flusher is not None:
            self.flusher.append(parts)  # written by the writer thread after the next sync()
        else:
            self._writer.append(*parts)  # type: ignore[union-attr]

    def sync(self, durable: bool = True) -> int:
        """Make what was logged durable (per the fsync mode); compact once the segment has grown enough.
        Returns a ticket: everything logged so far is durable once `durable() >= ticket` (at once when not
        in background mode; in background mode the caller holds its acknowledgements until then).
        `durable=False` (background mode): nobody waits for this ticket; its records are written and made
        durable with the next ticket someone waits for (`Flusher.sync`)."""
        if self.flusher is not None:
            ticket = self.flusher.sync(durable)
            if not self.flusher.snapshot_pending and self.flusher.segment_bytes >= self._compact_at():
                self.segment += 1  # the image is taken here, between mutations: one consistent state
                self.flusher.rotate(self.segment, state_image(self.state, self.segment))
            return ticket
        if self._writer is None:
            return 0
        self._writer.sync()
        if self._writer.bytes >= self._compact_at():
            self.compact()
        return 0

    def durable(self) -> int:
        """The highest ticket of `sync()` whose records are durable."""
        return self.flusher.durable if self.flusher is not None else 0

    def _compact_at(self) -> int:
        return max(self.compact_bytes, COMPACT_RATIO * self.snapshot_bytes)

    def _snapshot_written(self, size: int) -> None:
        self.snapshot_bytes = size
        self.snapshots_written += 1

    def compact(self) -> None:
        """Start segment k+1, write snapshot k+1 of the current state, delete what it makes redundant
        (synchronously; in background mode `sync()` hands the same steps to the writer thread)."""
        assert self._writer is not None and self.files is not None and self.flusher is None
        self._writer.close()
        self.segment += 1
        self._writer = LogWriter(self.files.segment(self.segment), self._writer.fsync)
        try:
            size = write_snapshot(self.files.snapshot(self.segment), self.state, self.segment)
        except OSError as e:  # e.g. disk full: the new segment follows the old one, resume stays exact
            log.error("journal snapshot %d not written (%s); history kept, retried later", self.segment, e)
            return
        self._snapshot_written(size)
        self.files.prune(known_valid=self.segment)

    def wait_durable(self) -> None:
        """Block until everything logged so far is durable (background mode; otherwise it already is)."""
        if self.flusher is not None:
            self.flusher.wait()

    def close(self) -> None:
        if self.flusher is not None:
            self.flusher.close()
        elif self._writer is not None:
            self._writer.close()

    # -- logged mutations (same signatures as HubState, plus the raw frame where one exists)

    def submit(self, frame: bytes | memoryview, msg: R.SubmitPrompts) -> list[str]:
        ids = self.state.submit(msg.prompts, client=msg.watch, evaluate=msg.evaluate)
        self._log_frame("submit", frame)
        return ids

    def grant(self, generator: str, count: int, now: float, ttl_s: float) -> tuple[LeaseEntry, list[R.Prompt]] | None:
        got = self.state.grant(generator, count, now, ttl_s)
        if got is not None:
            self._log("grant", generator, count, now, ttl_s, got[0].lease_id)
        return got

    def add_samples(self, frame: bytes | memoryview, msg: R.SampleBatch) -> Outcome:
        out = self.state.add_samples(msg.lease_id, msg.samples)
        self._log_frame("samples", frame, msg.samples)
        return out

    def return_prompts(self, lease_id: str, prompt_ids: list[str]) -> int:
        n = self.state.return_prompts(lease_id, prompt_ids)
        if n:
            self._log("return", lease_id, prompt_ids)
        return n

    def fail_prompts(self, lease_id: str, prompt_ids: list[str]) -> int:
        n = self.state.fail_prompts(lease_id, prompt_ids)
        if n:
            self._log("fail", lease_id, prompt_ids)
        return n

    def expire(self, now: float) -> int:
        if not self.state.leases.overdue(now):
            return 0
        n = self.state.expire(now)
        self._log("expire", now)
        return n

    def score(self, results: list[R.ScoreResult]) -> Outcome:
        out = self.state.score(results)
        self._log("score", [_pack_score(r) for r in results])
        return out

    def prune_stale(self, min_version: int) -> int:
        n = self.state.prune_stale(min_version)
        if n:
            self._log("prune", min_version)
        return n

    def filter_uniform(self) -> int:
        n = self.state.filter_uniform()
        if n:
            self._log("filter")
        return n

    def form_batch(self, step: int, prompts_per_step: int) -> R.Batch:
        batch = self.state.form_batch(step, prompts_per_step)
        self._log("form", step, prompts_per_step)
        return batch

    def commit(self, step: int) -> int:
        n = self.state.commit(step)
        if n:
            self._log("commit", step)
        return n

    def set_version(self, version: int) -> None:
        self.state.set_version(version)
        self._log("version", version)


def _newest_snapshot(files: Segments) -> tuple[HubState, int, int]:
    """(state, first segment to replay, snapshot size) from the newest snapshot that loads; else empty."""
    bad: list[str] = []
    for k in reversed(files.snapshots()):
        path = files.snapshot(k)
        try:
            state, segment = read_snapshot(path, files)
        except SnapshotInvalid as e:  # set aside (kept, never deleted) so that pruning never counts on it
            aside = path.with_name(path.name + ".bad")
            path.rename(aside)
            log.warning("journal snapshot unusable, moved to %s; an older one is tried: %s", aside.name, e)
            bad.append(aside.name)
            continue
        return state, segment, path.stat().st_size
    segments = files.segments()
    if segments and segments[0] != 0:
        raise LogCorrupt(
            f"{files.dir}: journal segments start at {files.segment(segments[0]).name} and no snapshot covers the "
            f"history before it ({', '.join(bad) or 'no snapshot files'}); nothing was changed. Restore the "
            f"{files.base.name}* files from a backup, or move them aside to start the run afresh")
    return HubState(), 0, 0


def _replay_segments(files: Segments, state: HubState, base: int) -> int:
    """Apply segments base.. in order; all but the last must be whole. Returns the last segment's number."""
    present = [k for k in files.segments() if k >= base]
    last = max(present, default=base)
    missing = [k for k in range(base, last) if k not in present]
    if missing:
        raise LogCorrupt(f"{files.segment(missing[0])}: journal segment {missing[0]} is missing between the snapshot "
                         f"and segment {last}; nothing was changed. Restore it from a backup, or move the "
                         f"{files.base.name}* files aside to start the run afresh")
    for k in present:
        for at, payload in iter_records_at(files.segment(k), sealed=k != last):
            apply(state, decode_record(payload), (k, at, len(payload)))
    return last


def _note_stored(samples: list[wire.PackedSample], record: tuple[int, int, int]) -> None:
    """`record`: (segment, offset of the record, where the frame the samples were decoded from starts in
    its payload)."""
    segment, at, frame_at = record
    for ps in samples:
        if ps.offset >= 0:
            ps.stored = (segment, at, frame_at + ps.offset)


def _pack_score(r: R.ScoreResult) -> list[Any]:
    return [r.prompt_id, r.sample_index, r.reward, r.components, r.status.value, r.reason]


def _unpack_score(v: list[Any]) -> R.ScoreResult:
    pid, idx, reward, components, status, reason = v
    return R.ScoreResult(prompt_id=pid, sample_index=idx, reward=reward, components=components,
                       status=R.ScoreStatus(status), reason=reason)


def apply(state: HubState, record: list[Any], where: tuple[int, int, int] | None = None) -> None:
    """Re-apply one logged mutation to `state` (log replay). `where`: (segment, offset, payload length) of
    its log record, so that the samples it holds know where they lie on disk."""
    kind, *args = record
    if kind == "submit":
        msg = wire.decode(args[0])
        state.submit(msg.prompts, client=msg.watch, evaluate=msg.evaluate)
    elif kind == "grant":
        state.grant(*args)
    elif kind == "samples":
        msg = wire.decode_packed(args[0])
        if where is not None:  # the frame is the record's last value: it ends where the payload ends
            segment, at, length = where
            _note_stored(msg.samples, (segment, at, length - len(args[0])))
        state.add_samples(msg.lease_id, msg.samples)
    elif kind == "return":
        state.return_prompts(*args)
    elif kind == "fail":
        state.fail_prompts(*args)
    elif kind == "expire":
        state.expire(*args)
    elif kind == "score":
        state.score([_unpack_score(v) for v in args[0]])
    elif kind == "prune":
        state.prune_stale(*args)
    elif kind == "filter":
        state.filter_uniform()
    elif kind == "form":
        state.form_batch(*args)
    elif kind == "commit":
        state.commit(*args)
    elif kind == "version":
        state.set_version(*args)
    else:
        raise ValueError(f"unknown log record kind {kind!r}: the log was written by a newer asyncrl")
