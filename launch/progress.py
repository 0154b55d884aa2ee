"""Live progress in the terminal: learner step, elapsed, steps/s, ETA, reward, tokens/s, staleness, the
training-inference logprob mismatch, queues, the latest held-out eval.

Reads the last line of RUN_DIR/metrics.jsonl, the last of RUN_DIR/eval.jsonl (else the last "eval" a
metrics line carried) and the hub's counters; plain log lines when the
output is not a terminal (CI, nohup): one per learner step, or every 30 s while none comes.
Steps/s counts the steps seen since the launcher started (a resumed run starts counting at its
checkpoint); the ETA is the steps left at that rate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from asyncrl.plot.evals import last_eval
from asyncrl.run.rundir import last_metrics
from launch.report import duration


class StepRate:
    """Steps per second since the first step this launcher saw (its time stamp is when it was first seen)."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None

    def observe(self, step: int, now: float) -> float | None:
        if self.first is None or step < self.first[0]:
            self.first = (step, now)
        s0, t0 = self.first
        return (step - s0) / (now - t0) if step > s0 and now > t0 else None


def progress_row(m: dict[str, Any], hub: dict[str, Any], total: int, elapsed_s: float,
                 rate: float | None, latest_eval: dict[str, Any] | None = None) -> dict[str, str]:
    """The fields of one progress line; "-" where nothing is known yet (never "nan")."""
    step = int(m.get("step", 0))
    eta = duration((total - step) / rate) if rate else "-"
    return {
        "step": f"{step}/{total}",
        "elapsed": duration(elapsed_s),
        "steps/s": f"{rate:.3f}" if rate else "-",
        "eta": eta if step < total else "0s",
        "reward": f"{m['reward_mean']:.3f}" if "reward_mean" in m else "-",
        "tokens/s": f"{m.get('tokens_per_s', 0.0):.0f}",
        "staleness": f"{m.get('staleness_mean', 0.0):.2f} (max {m.get('staleness_max', 0)})",
        "logp mismatch": _mismatch(m),
        "version": str(hub.get("policy_version", m.get("policy_version", 0))),
        "queues": " ".join(f"{k}={v}" for k, v in (hub.get("states") or {}).items() if v),
        "eval": _eval(latest_eval),
        **({"episodes": _episodes(m)} if "turns_mean" in m else {}),
    }


def _episodes(m: dict[str, Any]) -> str:
    """'turns 1.8, env 0.12 s, tools 40, failed timeout=2': multi-turn runs only."""
    failed = " ".join(f"{k}={v}" for k, v in (m.get("episode_failed") or {}).items())
    return (f"turns {m['turns_mean']:.2f}, env {m.get('env_time_s', 0.0):.2f} s, tools {m.get('tool_calls', 0):.0f}"
            + (f", failed {failed}" if failed else ""))


def _eval(e: dict[str, Any] | None) -> str:
    """'pass@1 0.31 @ step 40': greedy accuracy on the held-out prompts of the weights of that step."""
    if not e or not isinstance(e.get("pass@1"), (int, float)):
        return "-"
    return f"pass@1 {e['pass@1']:.2f} @ step {e.get('step', '?')}"


def _mismatch(m: dict[str, Any]) -> str:
    """|learner's proximal - generator's behaviour| logprob per token, mean (p99): what makes "on-policy"
    training off-policy; near 0 when the engine and the learner compute the same numbers."""
    if "behav_prox_logp_absdiff" not in m:
        return "-"
    return f"{m['behav_prox_logp_absdiff']:.1e} (p99 {m.get('behav_prox_logp_absdiff_p99', 0.0):.1e})"


class Progress:
    def __init__(self, run_dir: Path, total_steps: int, enabled: bool = True) -> None:
        self.run_dir, self.total = run_dir, total_steps
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=2) if enabled and sys.stderr.isatty() else None
        self.started = time.monotonic()
        self.rate = StepRate()
        self._last_print = self.started
        self._last_step = -1
        self.latest_eval: dict[str, Any] | None = None

    def __enter__(self) -> "Progress":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, hub: dict[str, Any]) -> None:
        m, now = last_metrics(self.run_dir), time.monotonic()
        step = int(m.get("step", 0))
        self.latest_eval = last_eval(self.run_dir) or m.get("eval") or self.latest_eval
        row = progress_row(m, hub, self.total, now - self.started, self.rate.observe(step, now) if m else None,
                           self.latest_eval)
        if self.live is not None:
            self.live.update(self._table(row))
        elif (m and step != self._last_step) or now - self._last_print > 30:
            self._last_step, self._last_print = step, now
            print(" | ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr, flush=True)

    @staticmethod
    def _table(row: dict[str, str]) -> Table:
        table = Table(title="asyncrl", expand=False)
        for key in row:
            table.add_column(key)
        table.add_row(*row.values())
        return table
