"""`Segments`: the files of one hub journal on disk, by number, and which of them may be deleted.

For a journal at ``RUN_DIR/replay.log``:

    replay.log                 segment 0 (a run that never compacted has only this file)
    replay.log.000007          segment 7: the records logged after snapshot 7 was taken
    replay.log.000007.snap     snapshot 7: the state after every record of segments 0..6
    replay.log.000007.torn-N   a torn tail set aside by LogWriter (kept, never deleted here)

Resume = newest valid snapshot k, then segments k, k+1, ... in order. Segment k exists before snapshot
k is written (the journal rotates first), so a crash anywhere leaves a state that resumes exactly.

A snapshot k does not copy the live samples logged in the REF_SEGMENTS segments before it (k-1, k-2): it
names the record that holds each one (`PackedSample.stored`), and a resume reads them from there (checksum
checked). Older live samples are copied into it, so what a snapshot needs stays within those segments.

Deletion rule (`prune`): with the two newest snapshots that pass their checksum, a (newest) and b
(previous), delete snapshots numbered below b and segments numbered below b - REF_SEGMENTS. Snapshot b
plus the segments it refers to and those from b on still rebuild the state if a turns out bad; nothing
not covered by a valid snapshot is ever deleted.
"""

from __future__ import annotations

import logging
import re
from itertools import islice
from pathlib import Path

from asyncrl.replay.log import LogCorrupt, iter_sealed
from asyncrl.durable import fsync_dir

log = logging.getLogger("asyncrl.replay")
REF_SEGMENTS = 2  # a snapshot may refer to samples in this many segments before it (module doc)


class Segments:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.dir = base.parent
        name = re.escape(base.name)
        self._segment_re = re.compile(rf"^{name}\.(\d{{6,}})$")
        self._snapshot_re = re.compile(rf"^{name}\.(\d{{6,}})\.snap$")

    def segment(self, k: int) -> Path:
        return self.base if k == 0 else self.dir / f"{self.base.name}.{k:06d}"

    def snapshot(self, k: int) -> Path:
        return self.dir / f"{self.base.name}.{k:06d}.snap"

    def segments(self) -> list[int]:
        """Numbers of the segment files present, ascending."""
        found = self._numbers(self._segment_re)
        return ([0] if self.base.exists() else []) + found

    def snapshots(self) -> list[int]:
        """Numbers of the snapshot files present, ascending."""
        return self._numbers(self._snapshot_re)

    def _numbers(self, pattern: re.Pattern[str]) -> list[int]:
        if not self.dir.exists():
            return []
        return sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := pattern.match(p.name)))

    def bytes_on_disk(self) -> int:
        """Segments and snapshots together (what the journal costs in disk)."""
        return sum(self.segment(k).stat().st_size for k in self.segments()) + \
            sum(self.snapshot(k).stat().st_size for k in self.snapshots())

    def checks_out(self, k: int) -> bool:
        """Snapshot k is whole and passes its checksum (its content is checked when it is loaded)."""
        try:
            return sum(1 for _ in iter_sealed(self.snapshot(k))) == 1
        except (LogCorrupt, OSError):
            return False

    def prune(self, known_valid: int | None = None) -> list[Path]:
        """Delete what the two newest valid snapshots make unnecessary (see module doc); returns it.
        `known_valid`: a snapshot this process has just written whole and fsynced (not read back)."""
        valid = list(islice((k for k in reversed(self.snapshots()) if k == known_valid or self.checks_out(k)), 2))
        if len(valid) < 2:
            return []
        keep_from = valid[1]
        doomed = [self.segment(k) for k in self.segments() if k < keep_from - REF_SEGMENTS]
        doomed += [self.snapshot(k) for k in self.snapshots() if k < keep_from]
        for p in doomed:
            p.unlink(missing_ok=True)
        if doomed:
            fsync_dir(self.dir)
            log.info("journal compacted: deleted %d files before snapshot %d", len(doomed), keep_from)
        return doomed
