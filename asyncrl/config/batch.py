"""Batch units, defined once: prompts per step x samples per prompt = samples per step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class BatchConfig:
    prompts_per_step: int = 8
    """Prompts (groups) in one learner step."""
    samples_per_prompt: int = 8
    """Completions per prompt (the GRPO group size, `n`)."""

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1:
            raise ValueError(f"batch.prompts_per_step={self.prompts_per_step}: must be >= 1")
        if self.samples_per_prompt < 1:
            raise ValueError(f"batch.samples_per_prompt={self.samples_per_prompt}: must be >= 1")

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt
