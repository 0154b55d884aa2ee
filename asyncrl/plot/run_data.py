"""One run's curves as columns, read from its directory: metrics.jsonl (one line per learner step), the eval
results (asyncrl.plot.evals) and a title from config.json.

A resumed run appends to metrics.jsonl from its checkpoint: a step seen twice keeps its last line, and
"time_s" (seconds since *this* learner started) is made cumulative over the restarts so wall time only grows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.plot.evals import json_lines, read_evals


class RunDataError(ValueError):
    """The directory holds nothing to plot; the message is the one line the command prints."""


@dataclass(kw_only=True, slots=True)
class Run:
    name: str  # the run folder's name: legend and title
    title: str  # name plus config basics (model, task, algorithm, batch)
    steps: list[dict[str, Any]]  # metrics lines, by step
    evals: list[dict[str, Any]]  # eval results, by step

    def column(self, key: str) -> list[float]:
        """One metric per step (NaN where a line lacks it or it is not a number)."""
        return [_number(m.get(key)) for m in self.steps]

    def has(self, key: str) -> bool:
        return any(math.isfinite(v) for v in self.column(key))

    def wall_s(self) -> list[float]:
        return _cumulative([_number(m.get("time_s")) for m in self.steps])

    def eval_column(self, key: str) -> list[float]:
        return [_number(e.get(key)) for e in self.evals]

    def eval_wall_s(self) -> list[float]:
        return _cumulative(self.eval_column("time_s"))


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise RunDataError(f"{path}: no such run directory")
    rows = json_lines(path / "metrics.jsonl")
    by_step = {int(m["step"]): m for m in rows if isinstance(m.get("step"), (int, float))}
    if not by_step:
        what = "no metrics.jsonl" if not (path / "metrics.jsonl").exists() else "metrics.jsonl has no step yet"
        raise RunDataError(f"{path}: {what}; nothing to plot")
    name = path.resolve().name
    return Run(name=name, title=_title(name, path / "config.json"), steps=[by_step[s] for s in sorted(by_step)],
               evals=read_evals(path))


def _title(name: str, config: Path) -> str:
    """'run-a: model Qwen2.5-0.5B, task gsm8k, grpo, 32x8 per step' (what config.json has of it)."""
    try:
        cfg = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError):
        return name
    model, task = cfg.get("model") or {}, cfg.get("task") or {}
    learner, batch = cfg.get("learner") or {}, cfg.get("batch") or {}
    parts = []
    if model.get("path"):
        parts.append(f"model {Path(str(model['path'])).name}")
    if task.get("name"):
        parts.append(f"task {task['name']}")
    if learner.get("algorithm"):
        parts.append(str(learner["algorithm"]))
    if batch.get("prompts_per_step") and batch.get("samples_per_prompt"):
        parts.append(f"{batch['prompts_per_step']}x{batch['samples_per_prompt']} per step")
    return f"{name}: {', '.join(parts)}" if parts else name


def _number(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _cumulative(times: list[float]) -> list[float]:
    """Seconds since a learner start -> seconds since the first start: each restart (time going back) continues
    from the last time seen before it."""
    out, offset, last = [], 0.0, 0.0
    for t in times:
        if math.isfinite(t) and t + offset < last:
            offset = last
        out.append(t + offset)
        if math.isfinite(t):
            last = t + offset
    return out
