"""Config of the reward service (read by `asyncrl.reward`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

KINDS = ("exact_match", "regex", "math", "task", "python", "http", "classifier", "reasoning_gym", "environment")
# Options each kind cannot do without; the rest have defaults (see the kind's class in asyncrl.reward).
_REQUIRED_OPTIONS = {"regex": ("pattern",), "python": ("function",), "http": ("url",), "classifier": ("model",)}


@dataclass(kw_only=True, slots=True)
class RewardComponentConfig:
    kind: str
    """exact_match | regex | math | task | python | http | classifier | reasoning_gym | environment (the
    multi-turn environment's own episode reward; what each trusts: docs/rewards.md)"""
    weight: float = 1.0
    """Weight of this component in the total reward."""
    name: str = ""
    """Name reported per component (default: kind)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Kind-specific options. math, reasoning_gym: answer, where the final answer is read ("auto": the last
    \\boxed{}, else the last marker such as "answer: X" or "#### X", else the last number; "boxed",
    "marked", "last_number"; see asyncrl.reward.answer). exact_match: answer (unset: the whole response).
    reasoning_gym: cpu_heavy (run in the process pool). regex: pattern, full_match (false: search
    anywhere). python: function ("pkg.module:fn"), cpu_heavy (run in the process pool). http: url, timeout_s (per attempt; default
    the reward timeout), retries (2), backoff_s (0.2, doubled per retry), headers. classifier: model (a
    sequence-classification folder), batch_size (16), device ("cpu"), max_length (1024), label, dtype."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"reward component kind={self.kind!r}: allowed kinds are {list(KINDS)}")
        if not math.isfinite(self.weight):
            raise ValueError(f"reward component {self.kind!r}: weight={self.weight} must be a finite number")
        missing = [k for k in _REQUIRED_OPTIONS.get(self.kind, ()) if k not in self.options]
        if missing:
            raise ValueError(f"reward component kind={self.kind!r} needs options.{missing[0]} (set it in its options table)")
        if not self.name:
            self.name = self.kind


@dataclass(kw_only=True, slots=True)
class RewardConfig:
    components: list[RewardComponentConfig] = field(default_factory=lambda: [RewardComponentConfig(kind="task")])
    """Reward functions; the total is the weighted sum."""
    workers: int = 1
    """Reward worker processes."""
    timeout_s: float = 10.0
    """A function that has not answered by then marks the sample failed."""
    process_pool: int = 1
    """Processes for CPU-heavy functions (math, python with cpu_heavy) per worker (0: run in a thread)."""
    max_inflight: int = 64
    """Samples one worker scores concurrently (its credit towards the hub)."""
    heartbeat_s: float = 2.0
    """Seconds between a worker's heartbeats (with its stats) to the hub."""

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError("reward.components is empty: give at least one reward function")
        names = [c.name for c in self.components]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"reward.components: two components are named {dup!r}; give each a distinct name")
        if self.workers < 1:
            raise ValueError(f"reward.workers={self.workers}: must be >= 1")
        if not self.timeout_s > 0:
            raise ValueError(f"reward.timeout_s={self.timeout_s}: must be > 0")
        if self.process_pool < 0:
            raise ValueError(f"reward.process_pool={self.process_pool}: must be >= 0 (0 runs CPU-heavy functions in a thread)")
        if self.max_inflight < 1:
            raise ValueError(f"reward.max_inflight={self.max_inflight}: must be >= 1")
        if not self.heartbeat_s > 0:
            raise ValueError(f"reward.heartbeat_s={self.heartbeat_s}: must be > 0")
