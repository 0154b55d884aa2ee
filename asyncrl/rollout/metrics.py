"""A batch's episode figures for the learner's metrics line (multi-turn runs only)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from asyncrl import records as R

ENV_PREFIX = "environment: "  # the reward worker's reason for a sample whose environment failed


def episode_metrics(groups: list[R.Group]) -> dict[str, Any]:
    """turns_mean, env_time_s (mean per episode), tool_calls (batch total), tool_errors (batch total of calls
    the tool answered with an error, where the environment reports them), episode_failed {reason: n}; {} when no
    sample of the batch came from an environment."""
    stats = [s.sample.rollout for g in groups for s in g.samples if s.sample.rollout]
    failed = Counter(_reason(s.reason) for g in groups for s in g.samples
                     if s.status == R.ScoreStatus.FAILED and s.reason.startswith(ENV_PREFIX))
    if not stats and not failed:
        return {}
    n = max(len(stats), 1)
    return {"turns_mean": sum(r.get("turns", 0.0) for r in stats) / n,
            "env_time_s": sum(r.get("env_time_s", 0.0) for r in stats) / n,
            "tool_calls": sum(r.get("tool_calls", 0.0) for r in stats),
            **({"tool_errors": sum(r.get("tool_errors", 0.0) for r in stats)}
               if any("tool_errors" in r for r in stats) else {}),
            "episode_failed": dict(sorted(failed.items()))}


def _reason(text: str) -> str:
    """"environment: timeout: step did not answer ..." -> "timeout"."""
    return text[len(ENV_PREFIX):].split(":", 1)[0].strip() or "unknown"
