"""Config of the prompt source (the task the run trains on)."""

from __future__ import annotations

from dataclasses import dataclass

_OPS = "+-"


@dataclass(kw_only=True, slots=True)
class TaskConfig:
    name: str = "arithmetic"
    """"arithmetic" (the embedded synthetic task) or "jsonl" (prompts from `path`)."""
    path: str = ""
    """JSONL prompt file for name = "jsonl": one {"text" | "token_ids", "target", "n"?, "metadata"?} per line."""
    max_new_tokens: int = 8
    """Response length cap (arithmetic answers take at most digits + 2 tokens with the sign and EOS)."""
    temperature: float = 1.0
    """Sampling temperature of rollouts."""
    seed: int = 0
    """Seed of the prompt generator (and of the JSONL shuffle)."""
    digits: int = 2
    """Arithmetic: operands have 1 .. `digits` digits (the difficulty dial)."""
    ops: str = "+-"
    """Arithmetic: operators to draw from, a subset of "+-"."""
    shuffle: bool = True
    """JSONL: shuffle the lines every pass (seeded by `seed`); false keeps file order."""
    repeat: bool = True
    """JSONL: cycle through the file forever; false stops after one pass."""

    def __post_init__(self) -> None:
        if self.name not in ("arithmetic", "jsonl"):
            raise ValueError(f'task.name={self.name!r}: allowed values are "arithmetic", "jsonl"')
        if self.name == "jsonl" and not self.path:
            raise ValueError('task.name = "jsonl" needs task.path: a JSONL file of prompts')
        if self.max_new_tokens < 1:
            raise ValueError(f"task.max_new_tokens={self.max_new_tokens}: must be >= 1")
        if not self.temperature >= 0.0:
            raise ValueError(f"task.temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if not 1 <= self.digits <= 9:
            raise ValueError(f"task.digits={self.digits}: must be in 1..9 (operand length in digits)")
        if not self.ops or any(op not in _OPS for op in self.ops):
            raise ValueError(f'task.ops={self.ops!r}: give a non-empty subset of "{_OPS}"')
