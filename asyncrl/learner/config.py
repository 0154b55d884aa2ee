"""Config of the learner (read by `asyncrl.learner`).

Batch units are defined once in `asyncrl.config.batch`; here only how one batch is trained. Values that
the batch itself carries are not knobs: the sampling temperature (per prompt, `Prompt.sampling`) and the
maximum response length (`sampling.max_new_tokens`, used by Dr.GRPO's constant normaliser and by the
overlong penalty) come from the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Algorithm = Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"]
LossAgg = Literal["auto", "token_mean", "seq_mean", "constant"]

# Loss aggregation each algorithm uses when `loss_agg="auto"`.
DEFAULT_LOSS_AGG: dict[str, str] = {
    "grpo": "seq_mean",
    "dr_grpo": "constant",
    "dapo": "token_mean",
    "rloo": "token_mean",
    "reinforce_pp": "token_mean",
    "ppo": "token_mean",
}


@dataclass(kw_only=True, slots=True)
class LearnerConfig:
    algorithm: Algorithm = "grpo"
    """Advantage estimator and loss family: grpo (group-normalised), dr_grpo (group mean, no std, constant
    normaliser), dapo (grpo + drop all-equal groups, token-level mean, use clip_eps_high > clip_eps_low),
    rloo (leave-one-out baseline), reinforce_pp (batch-normalised returns), ppo (value head + GAE)."""
    steps: int = 40
    """Learner steps in the run."""
    lr: float = 1e-5
    """Peak learning rate (AdamW)."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: constant, or cosine decay to `min_lr_ratio * lr` at `steps`."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule as a fraction of `lr`."""
    warmup_steps: int = 0
    """Linear warm-up steps (from lr / (warmup_steps + 1) up to lr)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Gradient clipping (global norm); 0 disables clipping (the norm is still reported)."""
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    """PPO ratio clip range [1 - low, 1 + high] (DAPO: high > low, e.g. 0.28)."""
    loss_agg: LossAgg = "auto"
    """How token losses become one number: token_mean (over all tokens of the batch), seq_mean (per
    sequence, then over sequences), constant (sum / (sequences x max_new_tokens)); auto: per algorithm."""
    kl_coef: float = 0.0
    """Weight of the KL to the frozen reference model (0: no reference model is loaded)."""
    kl_in_reward: bool = False
    """reinforce_pp / ppo: put the KL (k1) into the per-token reward instead of a k3 loss term."""
    off_policy: Literal["decoupled", "tis", "none"] = "decoupled"
    """Correction for samples made by an older policy. decoupled: clip around the proximal policy (the
    learner's weights before this step) and weight by pi_prox / pi_behav, dropping tokens whose weight
    exceeds `importance_cap`; tis: the same ratio, weight truncated to min(w, importance_cap); none: the
    behaviour logprobs are the PPO "old" policy and no proximal forward is run."""
    importance_cap: float = 2.0
    """Cap of the behaviour -> proximal importance weight (decoupled: drop above; tis: truncate)."""
    mini_batches: int = 1
    """Optimizer steps per learner step: the rank's groups are split into this many mini-batches, all
    clipped around the same proximal policy (one policy version per learner step)."""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty: the last this-many tokens before max_new_tokens get a linearly growing
    penalty (0: off)."""
    overlong_penalty: float = 1.0
    """Penalty at max_new_tokens (and beyond) when `overlong_buffer > 0`."""
    gamma: float = 1.0
    """Discount of per-token returns (reinforce_pp, ppo)."""
    gae_lambda: float = 0.95
    """GAE lambda (ppo)."""
    value_coef: float = 0.5
    """Weight of the value loss (ppo)."""
    value_clip: float = 0.2
    """Clip range of the value prediction around the old value (ppo)."""
    ranks: int = 1
    """Learner processes (FSDP2 ranks)."""
    devices: list[str] = field(default_factory=list)
    """Device per rank; default: cpu, or cuda:N when CUDA is present."""
    micro_batch_tokens: int = 4096
    """Tokens per forward/backward micro-batch (sequences are packed; a longer sequence goes alone)."""
    logprob_chunk_tokens: int = 1024
    """Response tokens per lm_head chunk: at most [chunk x vocab] fp32 logits exist at once."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flash_attention_3"] = "sdpa"
    """Hugging Face attention kernel; all of these honour packed position_ids (see logprobs.py)."""
    activation_checkpointing: bool = False
    """Recompute decoder layers in backward (less memory, ~30% more compute)."""
    checkpoint_every: int = 10
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 3
    """Complete checkpoints kept in the run directory (older ones are deleted); 0 keeps all."""
    weight_bucket_mb: int = 256
    """Bucket size of the weight push."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"learner.steps={self.steps}: must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"learner.lr={self.lr}: must be > 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"learner.min_lr_ratio={self.min_lr_ratio}: must be in [0, 1]")
        if self.warmup_steps < 0:
            raise ValueError(f"learner.warmup_steps={self.warmup_steps}: must be >= 0")
        if self.weight_decay < 0:
            raise ValueError(f"learner.weight_decay={self.weight_decay}: must be >= 0")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"learner.adam_betas={self.adam_betas}: give two values in [0, 1), e.g. [0.9, 0.999]")
        if self.adam_eps <= 0:
            raise ValueError(f"learner.adam_eps={self.adam_eps}: must be > 0")
        if self.max_grad_norm < 0:
            raise ValueError(f"learner.max_grad_norm={self.max_grad_norm}: must be >= 0 (0 disables clipping)")
        for name in ("clip_eps_low", "clip_eps_high"):
            v = getattr(self, name)
            if not 0.0 < v < 10.0:
                raise ValueError(f"learner.{name}={v}: must be in (0, 10); typical 0.2 (DAPO high: 0.28)")
        if self.clip_eps_low >= 1.0:
            raise ValueError(f"learner.clip_eps_low={self.clip_eps_low}: must be < 1 so that 1 - low stays positive")
        if self.kl_coef < 0:
            raise ValueError(f"learner.kl_coef={self.kl_coef}: must be >= 0 (0: no reference model)")
        if self.kl_in_reward and self.algorithm not in ("reinforce_pp", "ppo"):
            raise ValueError(
                f"learner.kl_in_reward=true needs a token-level algorithm (reinforce_pp or ppo), not "
                f"{self.algorithm!r}; use the KL loss term (kl_in_reward=false) instead"
            )
        if self.importance_cap < 1.0:
            raise ValueError(f"learner.importance_cap={self.importance_cap}: must be >= 1 (typical 2-5)")
        if self.mini_batches < 1:
            raise ValueError(f"learner.mini_batches={self.mini_batches}: must be >= 1")
        if self.overlong_buffer < 0 or self.overlong_penalty < 0:
            raise ValueError(
                f"learner.overlong_buffer={self.overlong_buffer}, overlong_penalty={self.overlong_penalty}: "
                "both must be >= 0"
            )
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(
                f"learner.gamma={self.gamma}, gae_lambda={self.gae_lambda}: both must be in [0, 1]"
            )
        if self.value_coef < 0 or self.value_clip <= 0:
            raise ValueError(
                f"learner.value_coef={self.value_coef} must be >= 0 and value_clip={self.value_clip} > 0"
            )
        if self.ranks < 1:
            raise ValueError(f"learner.ranks={self.ranks}: must be >= 1")
        if self.devices and len(self.devices) != self.ranks:
            raise ValueError(
                f"learner.devices has {len(self.devices)} entries but learner.ranks={self.ranks}: give one per rank"
            )
        if self.micro_batch_tokens < 16:
            raise ValueError(f"learner.micro_batch_tokens={self.micro_batch_tokens}: must be >= 16")
        if self.logprob_chunk_tokens < 1:
            raise ValueError(f"learner.logprob_chunk_tokens={self.logprob_chunk_tokens}: must be >= 1")
        if self.checkpoint_every < 1:
            raise ValueError(f"learner.checkpoint_every={self.checkpoint_every}: must be >= 1")
        if self.keep_checkpoints < 0:
            raise ValueError(f"learner.keep_checkpoints={self.keep_checkpoints}: must be >= 0 (0 keeps all)")
        if self.weight_bucket_mb < 1:
            raise ValueError(f"learner.weight_bucket_mb={self.weight_bucket_mb}: must be >= 1")

    @property
    def resolved_loss_agg(self) -> str:
        """The loss aggregation in effect (`loss_agg`, or the algorithm's default for "auto")."""
        return DEFAULT_LOSS_AGG[self.algorithm] if self.loss_agg == "auto" else self.loss_agg

    @property
    def needs_value_head(self) -> bool:
        return self.algorithm == "ppo"
