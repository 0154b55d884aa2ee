"""Held-out eval results of a run directory, read by the plot, the progress line and the final summary.

Each result is one dict {"step", "pass@1", "mean@k" and "pass@k" (optional), "k", "prompts", "time_s", "response_tokens",
"versions", "check"}. RUN_DIR/eval.jsonl (one line per eval) is the source of truth; without it, the results
merged into metrics.jsonl step lines under "eval" are used. A step evaluated twice (a resumed run) keeps its
last result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_evals(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every eval result of the run, by step ([] when there is none)."""
    run_dir = Path(run_dir)
    rows = json_lines(run_dir / "eval.jsonl")
    if not rows:
        rows = [m["eval"] for m in json_lines(run_dir / "metrics.jsonl") if isinstance(m.get("eval"), dict)]
    by_step = {int(r["step"]): r for r in rows if "step" in r and "pass@1" in r}
    return [by_step[s] for s in sorted(by_step)]


def last_eval(run_dir: str | Path) -> dict[str, Any] | None:
    """The last line of eval.jsonl, read from the file's tail (cheap enough for a progress line); None without."""
    try:
        with open(Path(run_dir) / "eval.jsonl", "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").strip().splitlines()
        row = json.loads(lines[-1]) if lines else None
    except (OSError, json.JSONDecodeError):
        return None
    return row if isinstance(row, dict) and "pass@1" in row else None


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file; a torn last line (a writer mid-line) and a missing file read as none."""
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
