"""Config of the prompt source (the task the run trains on)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class TaskConfig:
    name: str = "arithmetic"
    """"arithmetic" (the embedded synthetic task) or "jsonl" (prompts from `path`)."""
    path: str = ""
    """JSONL prompt file for name = "jsonl": one {"text" | "token_ids", "target", ...} per line."""
    max_new_tokens: int = 12
    """Response length cap."""
    temperature: float = 1.0
    """Sampling temperature of rollouts."""
    seed: int = 0
    """Seed of the prompt generator."""

    def __post_init__(self) -> None:
        if self.name not in ("arithmetic", "jsonl"):
            raise ValueError(f'task.name={self.name!r}: allowed values are "arithmetic", "jsonl"')
        if self.name == "jsonl" and not self.path:
            raise ValueError('task.name = "jsonl" needs task.path: a JSONL file of prompts')
