"""Config of the learner (read by `asyncrl.learner`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(kw_only=True, slots=True)
class LearnerConfig:
    algorithm: Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"] = "grpo"
    """Advantage estimator and loss family."""
    steps: int = 40
    """Learner steps in the run."""
    lr: float = 1e-5
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 0
    """Linear warm-up steps, then constant."""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    """Gradient clipping (global norm)."""
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    """PPO ratio clip range [1 - low, 1 + high] (DAPO: high > low)."""
    kl_coef: float = 0.0
    """Weight of the KL term to the frozen reference model (0: no reference model)."""
    off_policy: Literal["decoupled", "tis", "none"] = "decoupled"
    """Correction for samples made by an older policy: decoupled PPO, truncated importance weights, or none."""
    tis_cap: float = 2.0
    """Cap of the truncated importance weight."""
    ranks: int = 1
    """Learner processes (FSDP2 ranks)."""
    devices: list[str] = field(default_factory=list)
    """Device per rank; default: cpu, or cuda:N when CUDA is present."""
    micro_batch_tokens: int = 4096
    """Tokens per forward/backward micro-batch (sequences are packed)."""
    checkpoint_every: int = 10
    """Checkpoint every this many steps (and at the end)."""
    weight_bucket_mb: int = 256
    """Bucket size of the weight push."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"learner.steps={self.steps}: must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"learner.lr={self.lr}: must be > 0")
        if self.ranks < 1:
            raise ValueError(f"learner.ranks={self.ranks}: must be >= 1")
