"""`generator.rollout`: which environment plays the episodes, and the limits every episode keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True, slots=True)
class RolloutConfig:
    environment: str = ""
    """"module:Name" of an environment class (asyncrl.rollout.environment.Environment), built once per
    episode with `options` as keyword arguments; "" = one model turn per sample and no environment."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment class."""
    max_turns: int = 4
    """Model turns per episode at most; the episode ends (finish_reason length) after the last."""
    max_total_tokens: int = 0
    """Response tokens per episode at most (model and environment tokens together); 0 = max_turns x the
    prompt's max_new_tokens. Each turn may sample up to max_new_tokens of what is left."""
    step_timeout_s: float = 30.0
    """An environment call (reset or step) that takes longer fails its episode with reason "timeout"."""
    max_episodes: int = 0
    """Episodes a generator holds at once (leased, decoding or waiting on their environment); 0 = its
    max_running. More than max_running keeps the engine's rows busy while some episodes wait on slow tools
    (the extra ones queue in the engine; none holds KV while it waits)."""
    env_threads: int = 16
    """Threads for environments whose reset/step are plain (non-async) functions."""

    def __post_init__(self) -> None:
        if self.environment and ":" not in self.environment:
            raise ValueError(f"generator.rollout.environment={self.environment!r}: give it as 'module:ClassName'")
        if self.max_turns < 1:
            raise ValueError(f"generator.rollout.max_turns={self.max_turns}: must be >= 1")
        if self.max_total_tokens < 0:
            raise ValueError(f"generator.rollout.max_total_tokens={self.max_total_tokens}: must be >= 0 (0: auto)")
        if self.step_timeout_s <= 0:
            raise ValueError(f"generator.rollout.step_timeout_s={self.step_timeout_s}: must be > 0")
        if self.max_episodes < 0:
            raise ValueError(f"generator.rollout.max_episodes={self.max_episodes}: must be >= 0 (0: max_running)")
        if self.env_threads < 1:
            raise ValueError(f"generator.rollout.env_threads={self.env_threads}: must be >= 1")

    @property
    def multi_turn(self) -> bool:
        return bool(self.environment)
