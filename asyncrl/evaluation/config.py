"""Config of the held-out evaluation (read by `asyncrl.evaluation`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    every: int = 0
    """Evaluate every this many learner steps, and also before the first step and after the last (0 = off)."""
    prompts: int = 100
    """Held-out prompts per evaluation: made by the task (asyncrl.task.heldout), never trained on (the training
    source skips them) and de-duplicated against the training problems by their text."""
    k: int = 0
    """Samples per prompt at the training temperature for mean@k (their mean score) and pass@k (the share of prompts
    one of them solves), beside greedy pass@1 (0 = greedy only)."""
    max_new_tokens: int = 0
    """Response cap of evaluation samples (0 = task.max_new_tokens)."""
    timeout_s: float = 600.0
    """An evaluation whose samples have not all come back by then is reported with the missing ones counted
    wrong (and their number in `missing`)."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"eval.every={self.every}: must be >= 0 (0 = no evaluation)")
        if self.every and self.prompts < 1:
            raise ValueError(f"eval.prompts={self.prompts}: must be >= 1 when eval.every > 0")
        if self.k < 0:
            raise ValueError(f"eval.k={self.k}: must be >= 0 (0 = greedy pass@1 only)")
        if self.max_new_tokens < 0:
            raise ValueError(f"eval.max_new_tokens={self.max_new_tokens}: must be >= 0 (0 = task.max_new_tokens)")
        if not self.timeout_s > 0:
            raise ValueError(f"eval.timeout_s={self.timeout_s}: must be > 0")

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def heldout_count(self) -> int:
        """Prompts the training source must leave out (0 when evaluation is off)."""
        return self.prompts if self.enabled else 0
