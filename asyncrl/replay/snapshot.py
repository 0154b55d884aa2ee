"""Snapshots of the replay hub's state: a whole `HubState` as one checksummed msgpack record on disk.

A snapshot holds the live state only (queue, leases, groups with their samples, scores and client flag,
delivered batches, counters including the client prompts' own, version), never the history that led to
it, so its size follows what is in flight, not how long the run has gone on. `Journal` writes one when it
starts a new log segment and loads the newest valid one on resume (see `asyncrl.replay.journal`).

File: one record in the log format of `asyncrl.replay.log` (``[length][crc32][payload]``), the payload
being `journal_format.encode_record` of a plain map. Prompts are kept as their wire frames (`wire.encode`),
samples as their Sample msgpack bytes (what `PackedSample.raw` holds), so nothing in a snapshot is pickled and
a restore rebuilds the same records the hub had. A sample logged in the `REF_SEGMENTS` segments before the
snapshot is not copied: its entry is ``[segment, record offset, offset in the payload, length]``, where the
journal logged it (`PackedSample.stored`), and a restore reads those bytes from that record, checksum
checked (format 2; format 1 copied every sample and still loads). Delivered batches are not stored as such: a batch is
rebuilt from its groups (their delivered samples, in index order), as `HubState.form_batch` made it.

Encoding has two phases so that the hub's loop only takes the first: `state_image` (plain data, new
containers around leaves that never change: the state of that moment) and `pack_image` (msgpack, group by
group, on any thread); `encode_state` is both at once. A group still as it was submitted (queued, never
leased: most of a queue fed far ahead) is packed once and kept packed (`GroupEntry.untouched_image`): the
image holds those bytes (`PackedGroup`) and `pack_image` writes them as they are.

Writing is atomic: a temp name, fsync, rename, fsync of the directory. A file whose checksum, framing
or content does not check out raises `SnapshotInvalid` on reading (the journal then falls back to the
previous snapshot).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack

from asyncrl import records as R
from asyncrl import wire
from asyncrl.durable import fsync_dir
from asyncrl.replay.counts import SampleCounts
from asyncrl.replay.groups import NEVER_STALE, GroupEntry, Phase
from asyncrl.replay.journal_format import decode_record, encode_record
from asyncrl.replay.leases import LeaseEntry
from asyncrl.replay.log import LogCorrupt, LogWriter, iter_sealed, read_record_at
from asyncrl.replay.segments import REF_SEGMENTS, Segments
from asyncrl.replay.state import HubState

FORMAT = 2
FORMATS = (1, 2)  # what `decode_state` reads
S = R.SampleState
_STATE_VALUES = {s: s.value for s in S}  # Enum.value is a Python-level property: ~1 us a read, per sample
_PHASE_VALUES = {p: p.value for p in Phase}
_SCORE_VALUES = {s: s.value for s in R.ScoreStatus}


class PackedGroup(bytes):
    """A group's snapshot entry, already packed (see the module doc)."""


class SnapshotInvalid(ValueError):
    """A snapshot file that cannot be loaded (bad checksum, truncated, wrong format)."""


# ------------------------------------------------------------------------------------- files


def write_snapshot(path: Path, state: HubState, segment: int) -> int:
    """Atomically write `state` (which covers every segment before `segment`) to `path`; returns its size."""
    return write_image(path, state_image(state, segment))


def write_image(path: Path, image: dict[str, Any]) -> int:
    """Atomically write a `state_image` to `path`; returns its size. Reads no live state: any thread may call
    it (the hub's snapshot thread does), and it packs group by group so the loop runs in between."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    w = LogWriter(tmp, fsync="always")
    try:
        w.append(*pack_image(image))
    finally:
        w.close()
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path.stat().st_size


def read_snapshot(path: Path, files: Segments | None = None) -> tuple[HubState, int]:
    """(state, first segment to replay after it); SnapshotInvalid if the file does not check out, or a sample
    it refers to is not in `files` (the journal's segments) whole and checksummed."""
    try:
        records = list(iter_sealed(path))
    except (LogCorrupt, OSError) as e:
        raise SnapshotInvalid(str(e)) from None
    if len(records) != 1:
        raise SnapshotInvalid(f"{path}: holds {len(records)} records, a snapshot holds exactly one")
    try:
        return decode_state(records[0], files)
    except Exception as e:  # any malformed content: this snapshot is unusable, an older one may do
        raise SnapshotInvalid(f"{path}: {type(e).__name__}: {e}") from None


# ------------------------------------------------------------------------------------- encode


def encode_state(st: HubState, segment: int) -> bytes:
    return b"".join(pack_image(state_image(st, segment)))


def state_image(st: HubState, segment: int) -> dict[str, Any]:
    """The snapshot of `st` as plain data whose containers are all new and whose leaves never change (str, int,
    float, bool, None, bytes, views of received frames, score components): it stays the state of this moment
    while the hub goes on mutating `st`, so it may be packed later on another thread."""
    book = st.book
    return {
        "format": FORMAT,
        "segment": segment,
        "counts": _pack_counts(st.counts),
        "groups": [_pack_group(g, segment - REF_SEGMENTS) for g in st.groups.values()],
        "queue": list(st.queue),
        "eval_queue": list(st.eval_queue),
        "eval_counts": _pack_counts(st.eval_counts),
        "ready": list(st.ready),
        "leases": [st.leases.issued, [[e.lease_id, e.generator, e.expires_at, list(e.prompt_ids)]
                                      for e in st.leases.leases.values()]],
        "book": [book.last_formed, book.committed,
                 [[step, b.policy_version, b.dropped_stale, list(book.prompt_ids[step])]
                  for step, b in book.delivered.items()]],
        "version": st.version, "admitted": st.admitted, "events": dict(st.events),
        "pending_dropped": st.pending_dropped, "prompts_seq": st.prompts_seq,
    }


def pack_image(image: dict[str, Any]) -> list[bytes]:
    """Pieces whose concatenation is `encode_record(image)` (with each `PackedGroup` as its bytes), each group
    packed by its own call: msgpack holds the GIL for a whole call, so packing the state at once would stall the
    hub's loop for the whole snapshot."""
    packer = msgpack.Packer(use_bin_type=True)  # one per call: a Packer is not thread-safe
    out = [packer.pack_map_header(len(image))]
    for key, value in image.items():
        out.append(packer.pack(key))
        if key == "groups":
            out.append(packer.pack_array_header(len(value)))
            out.extend(g if type(g) is PackedGroup else packer.pack(g) for g in value)
        else:
            out.append(packer.pack(value))
    return out


def _pack_group(g: GroupEntry, oldest_ref: int) -> list[Any] | PackedGroup:
    if g.prompt_frame is None:  # every snapshot holds every live group: encode each prompt once, not per snapshot
        g.prompt_frame = wire.encode(g.prompt)
    n = len(g.samples)
    empty = g.samples.count(None) == n  # nothing generated yet (most groups of a queue fed ahead): no score either
    untouched = empty and _untouched(g, n)
    if untouched and g.untouched_image is not None:
        return g.untouched_image  # type: ignore[return-value]
    # samples as [where, min_version, finite], where = [segment, record, offset, length] of its bytes in a
    # segment >= oldest_ref, else raw (packed as bin, copied once by msgpack); scores as [reward, components,
    # status, reason]: built inline, this runs for every sample slot of every live group
    entry = [g.prompt_frame, _PHASE_VALUES[g.phase], g.lease_id, list(map(_STATE_VALUES.__getitem__, g.states)),
             list(g.min_versions), g.checked_min,
             [None] * n if empty else
             [None if s is None else
              [s.raw if s.stored is None or s.stored[0] < oldest_ref else [*s.stored, len(s.raw)],
               s.min_version, s.finite] for s in g.samples],
             [None] * n if empty else
             [None if sc is None else [sc.reward, sc.components, _SCORE_VALUES[sc.status], sc.reason]
              for sc in g.scored],
             g.client, g.evaluate]
    if untouched:
        g.untouched_image = PackedGroup(encode_record(entry))
        return g.untouched_image  # type: ignore[return-value]
    return entry


def _untouched(g: GroupEntry, n: int) -> bool:
    """`g` is as `GroupEntry.new` made it (its samples were checked to be all None), so its entry is too."""
    return (g.phase is Phase.QUEUED and not g.lease_id and g.states.count(S.QUEUED) == n
            and g.min_versions.count(NEVER_STALE) == n and g.checked_min == -NEVER_STALE)


def _pack_counts(c: SampleCounts) -> list[Any]:
    return [c.submitted, {s.value: n for s, n in c.by_state.items()}, dict(c.transitions), c.client_submitted,
            c.client_failed]


def _unpack_counts(c: SampleCounts, v: list[Any]) -> None:
    submitted, by_state, transitions, *client = v  # client counts: absent in older snapshots
    c.submitted = submitted
    c.client_submitted, c.client_failed = client or (0, 0)
    c.by_state = {s: by_state.get(s.value, 0) for s in S}  # a state newer than the snapshot: none yet
    c.transitions = Counter(transitions)


# ------------------------------------------------------------------------------------- decode


def decode_state(data: bytes, files: Segments | None = None) -> tuple[HubState, int]:
    """`files`: the journal's segments, where the samples the snapshot refers to are read (None: it may
    refer to none)."""
    d = decode_record(data)
    if type(d) is not dict or d.get("format") not in FORMATS:
        raise SnapshotInvalid(f"snapshot format {d.get('format') if type(d) is dict else None!r} is not one of "
                              f"{FORMATS}: written by a newer asyncrl?")
    stored = _StoredSamples(files)
    st = HubState()
    _unpack_counts(st.counts, d["counts"])
    if "eval_counts" in d:  # absent in snapshots older than evaluation prompts
        _unpack_counts(st.eval_counts, d["eval_counts"])
    for packed in d["groups"]:
        g = _unpack_group(packed, stored)
        st.groups[g.prompt.prompt_id] = g
    st.queue.extend(d["queue"])
    st.eval_queue.extend(d.get("eval_queue", []))
    st.ready = dict.fromkeys(d["ready"])
    _restore_leases(st, *d["leases"])
    _restore_book(st, *d["book"])
    st.version, st.admitted, st.events = d["version"], d["admitted"], Counter(d["events"])
    st.pending_dropped, st.prompts_seq = d["pending_dropped"], d["prompts_seq"]
    st._check()
    return st, d["segment"]


def _unpack_group(v: list[Any], stored: _StoredSamples) -> GroupEntry:
    prompt_frame, phase, lease_id, states, min_versions, checked_min, samples, scored, *flags = v
    prompt = wire.decode(prompt_frame)
    if type(prompt) is not R.Prompt:
        raise SnapshotInvalid(f"a group's prompt is a {type(prompt).__name__}")
    g = GroupEntry(prompt=prompt, phase=Phase(phase), lease_id=lease_id, states=[S(s) for s in states],
                   min_versions=list(min_versions), checked_min=checked_min, client=bool(flags and flags[0]),
                   evaluate=bool(len(flags) > 1 and flags[1]),
                   prompt_frame=bytes(prompt_frame))
    g.samples = [None if s is None else stored.sample(prompt.prompt_id, i, *s) for i, s in enumerate(samples)]
    g.scored = [None if sc is None else _unpack_scored(g.samples[i], sc) for i, sc in enumerate(scored)]
    if not len(g.states) == len(g.samples) == len(g.scored) == len(g.min_versions) == prompt.n:
        raise SnapshotInvalid(f"group {prompt.prompt_id!r} does not hold n={prompt.n} samples")
    return g


class _StoredSamples:
    """Reads the samples a snapshot refers to from the journal's segments, each record once."""

    def __init__(self, files: Segments | None) -> None:
        self.files = files
        self.records: dict[tuple[int, int], memoryview] = {}

    def sample(self, prompt_id: str, index: int, where: Any, min_version: int | None,
               finite: bool) -> wire.PackedSample:
        if type(where) is not list:  # the bytes themselves
            return wire.PackedSample(prompt_id, index, min_version, where, finite)
        segment, at, offset, length = where
        if self.files is None:
            raise SnapshotInvalid("it refers to samples in journal segments, and none were given to read them")
        record = self.records.get((segment, at))
        if record is None:
            record = self.records[(segment, at)] = memoryview(read_record_at(self.files.segment(segment), at))
        if not 0 <= offset <= offset + length <= len(record):
            raise SnapshotInvalid(f"sample {prompt_id}/{index} lies outside record {at} of segment {segment}")
        ps = wire.PackedSample(prompt_id, index, min_version, record[offset:offset + length], finite,
                               stored=(segment, at, offset))
        got = ps.unpack()  # the bytes are a valid Sample, and the one the snapshot names
        if (got.prompt_id, got.sample_index) != (prompt_id, index):
            raise SnapshotInvalid(f"sample {prompt_id}/{index}: segment {segment} holds {got.prompt_id}/"
                                  f"{got.sample_index} at the place the snapshot names")
        return ps


def _unpack_scored(sample: wire.PackedSample | None, v: list[Any]) -> R.ScoredSample:
    if sample is None:
        raise SnapshotInvalid("a score without its sample")
    reward, components, status, reason = v
    # The hub's ScoredSample holds the PackedSample that `wire.encode` splices in; the record's annotation is
    # the Sample the learner decodes (records cannot import wire), hence the ignore (HubState.score builds it so too).
    return R.ScoredSample(sample=sample, reward=reward, components=components, status=R.ScoreStatus(status),  # type: ignore[arg-type]
                          reason=reason)


def _restore_leases(st: HubState, issued: int, entries: list[list[Any]]) -> None:
    st.leases.issued = issued
    for lease_id, generator, expires_at, prompt_ids in entries:
        st.leases.leases[lease_id] = LeaseEntry(lease_id, generator, expires_at, dict.fromkeys(prompt_ids))


def _restore_book(st: HubState, last_formed: int, committed: int, delivered: list[list[Any]]) -> None:
    """Rebuild each delivered batch from its groups' delivered samples (as `form_batch` made it)."""
    book = st.book
    book.last_formed, book.committed = last_formed, committed
    for step, policy_version, dropped_stale, pids in delivered:
        groups = [R.Group(prompt=st.groups[pid].prompt, samples=_delivered(st.groups[pid])) for pid in pids]
        book.delivered[step] = R.Batch(step=step, policy_version=policy_version, groups=groups,
                                       dropped_stale=dropped_stale)
        book.prompt_ids[step] = list(pids)


def _delivered(g: GroupEntry) -> list[R.ScoredSample]:
    return [sc for sc, st in zip(g.scored, g.states) if st is S.DELIVERED and sc is not None]
