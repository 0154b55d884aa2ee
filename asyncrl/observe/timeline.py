"""Busy intervals of a process, for the pipeline bench and its plots.

Each service appends ``{"name", "kind", "start", "end"}`` lines (wall-clock seconds) to
``RUN_DIR/timeline/<name>.jsonl``. Intervals of one kind closer than ``merge_gap_s`` are merged (a
generator records one interval per decode step), so the file stays small; a crash loses at most the
open interval.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class Timeline:
    def __init__(self, run_dir: str | Path | None, name: str, merge_gap_s: float = 0.005) -> None:
        self.name, self.merge_gap_s = name, merge_gap_s
        self._open: dict[str, list[float]] = {}  # kind -> [start, end] not yet written
        self._file = None
        if run_dir:
            folder = Path(run_dir) / "timeline"
            folder.mkdir(parents=True, exist_ok=True)
            self._file = open(folder / f"{name}.jsonl", "a", buffering=1)

    def record(self, kind: str, start: float, end: float) -> None:
        if self._file is None or end <= start:
            return
        current = self._open.get(kind)
        if current is not None and start - current[1] <= self.merge_gap_s:
            current[1] = end
            return
        if current is not None:
            self._write(kind, *current)
        self._open[kind] = [start, end]

    def _write(self, kind: str, start: float, end: float) -> None:
        assert self._file is not None
        self._file.write(json.dumps({"name": self.name, "kind": kind, "start": start, "end": end}) + "\n")

    @contextmanager
    def span(self, kind: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.record(kind, start, time.time())

    def close(self) -> None:
        if self._file is not None:
            for kind, (start, end) in self._open.items():
                self._write(kind, start, end)
            self._open.clear()
            self._file.close()
            self._file = None


def read_timelines(run_dir: str | Path) -> list[dict]:
    out = []
    for path in sorted((Path(run_dir) / "timeline").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line after a crash
    return out
