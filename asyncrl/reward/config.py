"""Config of the reward service (read by `asyncrl.reward`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True, slots=True)
class RewardComponentConfig:
    kind: str
    """exact_match | regex | math | task | python | http"""
    weight: float = 1.0
    """Weight of this component in the total reward."""
    name: str = ""
    """Name reported per component (default: kind)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Kind-specific options (pattern, function path, url, ...)."""


@dataclass(kw_only=True, slots=True)
class RewardConfig:
    components: list[RewardComponentConfig] = field(default_factory=lambda: [RewardComponentConfig(kind="task")])
    """Reward functions; the total is the weighted sum."""
    workers: int = 1
    """Reward worker processes."""
    timeout_s: float = 10.0
    """A function that has not answered by then marks the sample failed."""
    process_pool: int = 1
    """Processes for CPU-heavy functions (0: run in a thread)."""

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError("reward.components is empty: give at least one reward function")
        if self.workers < 1:
            raise ValueError(f"reward.workers={self.workers}: must be >= 1")
        if self.timeout_s <= 0:
            raise ValueError(f"reward.timeout_s={self.timeout_s}: must be > 0")
