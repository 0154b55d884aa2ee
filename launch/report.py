"""The human summary printed at the end of a run, before the launcher's JSON line.

    run finished in 2m31s: step 20/20, reward 0.12 -> 0.45 (mean of a step's samples)
    eval pass@1 0.19 -> 0.63 at step 20, mean@8 0.12 -> 0.50 (from step 0, 64 prompts)
    samples: 1280 trained of 1600 submitted, 0 failed, 0 lost
    model: runs/20261130-191250/export (Hugging Face folder)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.plot.evals import read_evals


def duration(seconds: float) -> str:
    """73 -> '1m13s', 3723 -> '1h02m03s'."""
    s = int(round(max(seconds, 0.0)))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def step_rewards(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first and last lines of RUN_DIR/metrics.jsonl ({} when there is none)."""
    try:
        lines = [x for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        return (json.loads(lines[0]), json.loads(lines[-1])) if lines else ({}, {})
    except (OSError, json.JSONDecodeError):
        return {}, {}


def eval_line(first: dict[str, Any], last: dict[str, Any]) -> str:
    """First and last held-out eval: 'eval pass@1 0.19 -> 0.63 at step 200, mean@8 0.12 -> 0.50 (from step 0,
    64 prompts)'; one eval: 'eval pass@1 0.19 at step 0 (64 prompts)'."""
    def change(key: str) -> str:
        a, b = first.get(key), last.get(key)
        return f"{b:.2f}" if first is last or a is None else f"{a:.2f} -> {b:.2f}"

    text = f"eval pass@1 {change('pass@1')} at step {last['step']}"
    if last.get("mean@k") is not None:
        text += f", mean@{last.get('k', 'k')} {change('mean@k')}"
    origin = [] if first is last else [f"from step {first['step']}"]
    if last.get("prompts"):
        origin.append(f"{last['prompts']} prompts")
    return text + (f" ({', '.join(origin)})" if origin else "")


def final_report(run_dir: Path, accounting: dict[str, Any], elapsed_s: float, total_steps: int, outcome: str) -> str:
    first, last = step_rewards(run_dir)
    lines = [f"run {outcome} in {duration(elapsed_s)}: step {last.get('step', 0)}/{total_steps}"
             + (f", reward {first['reward_mean']:.3f} -> {last['reward_mean']:.3f} (mean per step)"
                if "reward_mean" in first and "reward_mean" in last else ", no step finished")]
    evals = read_evals(run_dir)
    if evals:
        lines.append(eval_line(evals[0], evals[-1]))
    if "submitted" in accounting:
        lines.append(f"samples: {accounting.get('trained', 0)} trained of {accounting['submitted']} submitted, "
                     f"{accounting.get('failed', 0)} failed, {accounting.get('dropped_stale', 0)} dropped stale, "
                     + (f"{accounting['filtered']} filtered (groups without signal, refill), "
                        if accounting.get("filtered") else "")
                     + f"{accounting.get('lost', 0)} lost")
        if accounting.get("client_submitted"):  # client prompts: their failures are not the run's (hub accounting)
            lines.append(f"client prompts: {accounting['client_submitted']} submitted, "
                         f"{accounting.get('client_failed', 0)} failed")
    else:
        lines.append(f"samples: unknown ({accounting.get('error', 'no accounting')})")
    export = run_dir / "export"
    lines.append(f"model: {export} (Hugging Face folder)" if export.is_dir() else f"model: not exported (no {export})")
    lines.append(f"run directory: {run_dir} (metrics.jsonl, logs/, summary.json)")
    return "\n".join(lines)
