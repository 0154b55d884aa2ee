"""Config of the learner (read by `asyncrl.learner`).

Batch units are defined once in `asyncrl.config.batch`; here only how one batch is trained. Values that
the batch itself carries are not knobs: the sampling temperature (per prompt, `Prompt.sampling`) and the
maximum response length (`sampling.max_new_tokens`, used by Dr.GRPO's constant normaliser and by the
overlong penalty) come from the records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

Algorithm = Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"]
LossAgg = Literal["auto", "token_mean", "seq_mean", "constant"]
GroupFilter = Literal["auto", "off", "accuracy", "shaped"]
RatioLevel = Literal["auto", "token", "sequence"]

# Loss aggregation each algorithm uses when `loss_agg="auto"`.
DEFAULT_LOSS_AGG: dict[str, str] = {
    "grpo": "seq_mean",
    "dr_grpo": "constant",
    "dapo": "token_mean",
    "rloo": "token_mean",
    "reinforce_pp": "token_mean",
    "ppo": "token_mean",
}
# The DAPO paper's recipe (Yu et al. 2025, sec. 3 and 4.1): clip-higher 0.28 and a soft overlong buffer of
# 4,096 of 20,480 generated tokens, i.e. the last fifth of max_new_tokens.
DAPO_CLIP_EPS_HIGH = 0.28
DAPO_OVERLONG_BUFFER, DAPO_MAX_NEW_TOKENS = 4096, 20480
# learner.lora_targets' default: every attention and MLP projection of Llama/Qwen-style decoders.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# learner.lora_lr's auto value, in units of learner.lr (docs/lora.md: the embedded default's sweep).
LORA_LR_FACTOR = 10.0
# A group whose rewards spread by no more than this has no signal (the group filter; the hub's refill uses the same).
SIGNAL_SPREAD = 1e-8


@dataclass(kw_only=True, slots=True)
class LearnerConfig:
    algorithm: Algorithm = "grpo"
    """Advantage estimator and loss family: grpo (group-normalised), dr_grpo (group mean, no std, constant
    normaliser), dapo (the DAPO paper's recipe: grpo advantages, clip-higher 0.28, token-level mean,
    groups of equal accuracy dropped, soft overlong penalty; each part overridable by its own setting),
    rloo (leave-one-out baseline, sequence-level ratio as in the RLOO paper), reinforce_pp
    (batch-normalised returns), ppo (value head + GAE). Formulas: docs/algorithms.md."""
    steps: int = 40
    """Learner steps in the run."""
    time_limit_s: float = 0.0
    """Wall-time budget of training, in seconds from the learner's start (0: none). The first step to finish
    past it becomes the run's last: checkpointed, evaluated (waited for) and exported like step `steps`.
    For "the best you get in 10 minutes"; `steps` stays the upper bound (and sets the cosine schedule)."""
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
    loss_scale_init: float = 65536.0
    """fp16 only (`model.dtype = "float16"`): the first dynamic loss scale (learner/loss_scale.py). It halves on
    every step whose gradients overflow (that step's update is skipped) and doubles after
    `loss_scale_growth_interval` clean steps."""
    loss_scale_growth_interval: int = 200
    """fp16 only: clean optimizer steps in a row before the loss scale doubles."""
    clip_eps_low: float = 0.2
    clip_eps_high: float | Literal["auto"] = "auto"
    """PPO ratio clip range [1 - low, 1 + high]; auto: 0.28 for dapo (clip-higher), else = clip_eps_low."""
    dual_clip: float = 3.0
    """Dual-clip constant c (verl's clip_ratio_c): for negative advantages the token loss is capped at
    -c * A, so a ratio far above 1 cannot blow up the loss. Must be > 1; 0 disables."""
    ratio_level: RatioLevel = "auto"
    """Importance ratio of the clipped surrogate. token: r_t = exp(logp_t - old_t) per token (PPO, GRPO);
    sequence: rho = exp(sum_t (logp_t - old_t)) per sample, shared by its tokens (RLOO paper, TRL);
    auto: sequence for rloo, token otherwise."""
    loss_agg: LossAgg = "auto"
    """How token losses become one number: token_mean (over all tokens of the batch), seq_mean (per
    sequence, then over sequences), constant (sum / (sequences x max_new_tokens)); auto: seq_mean for a
    sequence-level ratio (one loss per sample), otherwise per algorithm (DEFAULT_LOSS_AGG)."""
    filter_groups: GroupFilter = "auto"
    """DAPO dynamic sampling: drop groups whose samples all score the same (zero advantage). accuracy:
    compare the raw rewards (before overlong shaping; DAPO paper, verl's default); shaped: compare the
    rewards after shaping; off: keep every group; auto: accuracy for dapo, off otherwise. What dropped groups
    do to the batch: `filter_refill`."""
    filter_refill: bool | Literal["auto"] = "auto"
    """With the accuracy filter: true = the hub drops groups without signal as it forms batches, so their
    prompts' places go back to generation and every batch holds batch.prompts_per_step groups with signal
    (the DAPO paper's dynamic sampling; costs generation); false = the learner drops them and trains on a
    smaller batch. auto: true for dapo with the accuracy filter. Needs filter_groups accuracy (the hub sees
    raw rewards only)."""
    kl_coef: float = 0.0
    """Weight of the KL to the frozen reference model (0: no reference model is loaded)."""
    kl_clamp: float = 10.0
    """The k3 KL term is clamped to [-kl_clamp, kl_clamp] per token (verl: 10); 0 disables."""
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
    overlong_buffer: int | Literal["auto"] = "auto"
    """DAPO soft overlong penalty: the last this-many tokens before max_new_tokens get a linearly growing
    penalty (0: off); auto: the paper's last fifth of max_new_tokens (4,096 of 20,480) for dapo, else 0."""
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
    logprob_chunk_tokens: int = 4096
    """Rows per lm_head chunk when a micro-batch's logits are too large to keep between forward and backward
    (linear_logprob.KEEP_LOGITS_BYTES); smaller micro-batches run the lm_head in one matmul."""
    attn_implementation: Literal["auto", "varlen", "sdpa", "eager", "flash_attention_2", "flash_attention_3"] = "auto"
    """Attention kernel: varlen (each packed sequence attends to itself alone: FlashAttention on CUDA, a
    per-sequence SDPA loop on CPU; see attention.py) or a Hugging Face one (sdpa / eager build a dense
    block-diagonal mask over the whole pack); auto: varlen."""
    compile: bool = False
    """torch.compile each decoder layer (fuses norms, rotary and the gated MLP; attention stays eager). The
    first steps compile (tens of seconds); pays off on GPU."""
    host_threads: int = 0
    """torch's CPU threads (intra-op) in a learner process that trains on a GPU; 0: auto = min(4, cores). The
    host work of a GPU step is small tensor ops (packing, loss weights) between GPU steps; on a 16-core H200
    host a pool of 16 OpenMP threads made them 10-100x slower there (the staging concatenations: ~33 ms a step
    instead of ~0.4 ms), all while the GPU waited. A CPU learner keeps torch's default (its compute is on the host)."""
    activation_checkpointing: bool = False
    """Recompute decoder layers in backward (less memory, ~30% more compute)."""
    checkpoint_every: int = 10
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 3
    """Complete checkpoints kept in the run directory (older ones are deleted); 0 keeps all."""
    weight_bucket_mb: int = 256
    """Bucket size of the weight push."""
    lora_rank: int = 0
    """LoRA rank r (0: off, full fine-tuning). With r > 0 the base weights are frozen and held in the compute
    dtype, and only low-rank adapters A [r, in], B [out, r] beside each `lora_targets` linear are trained,
    checkpointed and optimised; generators get the merged weights W + scale * B @ A (docs/lora.md)."""
    lora_alpha: float = 16.0
    """LoRA scale numerator: the adapter's output is multiplied by lora_alpha / lora_rank."""
    lora_targets: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    """Linear layers that get adapters, by the last part of their module name (every attention and MLP
    projection of Llama/Qwen-style decoders by default). A name the model lacks is an error at start."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input in training (0: none; then the one-mini-batch step's proximal
    logprobs are exactly the training forward's)."""
    lora_lr: float = 0.0
    """Peak learning rate with LoRA (replaces `lr` when lora_rank > 0); 0: auto = 10 x lr, since LoRA's best
    rate sits near ten times full fine-tuning's (measured on the embedded default: docs/lora.md)."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"learner.steps={self.steps}: must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"learner.lr={self.lr}: must be > 0")
        if self.time_limit_s < 0:
            raise ValueError(f"learner.time_limit_s={self.time_limit_s}: must be >= 0 (0: no time limit)")
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
        if self.loss_scale_init <= 0 or self.loss_scale_init == float("inf"):
            raise ValueError(f"learner.loss_scale_init={self.loss_scale_init}: must be a positive finite number "
                             "(typical 65536)")
        if self.loss_scale_growth_interval < 1:
            raise ValueError(f"learner.loss_scale_growth_interval={self.loss_scale_growth_interval}: must be >= 1 "
                             "(typical 200)")
        if self.max_grad_norm < 0:
            raise ValueError(f"learner.max_grad_norm={self.max_grad_norm}: must be >= 0 (0 disables clipping)")
        for name in ("clip_eps_low", "clip_eps_high"):
            v = getattr(self, name)
            if v != "auto" and not 0.0 < v < 10.0:
                raise ValueError(f"learner.{name}={v}: must be in (0, 10); typical 0.2 (DAPO high: 0.28)")
        if self.dual_clip != 0.0 and self.dual_clip <= 1.0:
            raise ValueError(f"learner.dual_clip={self.dual_clip}: must be > 1 (verl's default 3) or 0 to disable")
        if self.kl_clamp < 0:
            raise ValueError(f"learner.kl_clamp={self.kl_clamp}: must be >= 0 (verl: 10; 0 disables)")
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
        if (self.overlong_buffer != "auto" and self.overlong_buffer < 0) or self.overlong_penalty < 0:
            raise ValueError(
                f"learner.overlong_buffer={self.overlong_buffer}, overlong_penalty={self.overlong_penalty}: "
                "both must be >= 0 (overlong_buffer may also be \"auto\")"
            )
        if self.filter_refill is True and self.resolved_filter_groups != "accuracy":
            raise ValueError(
                f"learner.filter_refill=true needs learner.filter_groups = \"accuracy\" (now resolved to "
                f"{self.resolved_filter_groups!r}): the hub compares raw rewards only; set filter_groups = "
                "\"accuracy\" or filter_refill = false"
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
        if self.host_threads < 0:
            raise ValueError(f"learner.host_threads={self.host_threads}: must be >= 0 (0: auto, min(4, cores))")
        if self.logprob_chunk_tokens < 1:
            raise ValueError(f"learner.logprob_chunk_tokens={self.logprob_chunk_tokens}: must be >= 1")
        if self.checkpoint_every < 1:
            raise ValueError(f"learner.checkpoint_every={self.checkpoint_every}: must be >= 1")
        if self.keep_checkpoints < 0:
            raise ValueError(f"learner.keep_checkpoints={self.keep_checkpoints}: must be >= 0 (0 keeps all)")
        if self.weight_bucket_mb < 1:
            raise ValueError(f"learner.weight_bucket_mb={self.weight_bucket_mb}: must be >= 1")
        self._check_lora()

    def _check_lora(self) -> None:
        if self.lora_rank < 0:
            raise ValueError(f"learner.lora_rank={self.lora_rank}: must be >= 0 (0: full fine-tuning; typical 8-64)")
        if self.lora_alpha <= 0:
            raise ValueError(f"learner.lora_alpha={self.lora_alpha}: must be > 0 (the scale is lora_alpha / lora_rank)")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"learner.lora_dropout={self.lora_dropout}: must be in [0, 1) (0: none)")
        if not self.lora_targets or not all(isinstance(t, str) and t and "." not in t for t in self.lora_targets):
            raise ValueError(f"learner.lora_targets={self.lora_targets}: give linear layer names without dots, e.g. "
                             f"{list(DEFAULT_LORA_TARGETS)}")
        if self.lora_lr < 0:
            raise ValueError(f"learner.lora_lr={self.lora_lr}: must be >= 0 (0: auto, {LORA_LR_FACTOR:g} x learner.lr)")
        if len(set(self.lora_targets)) != len(self.lora_targets):
            raise ValueError(f"learner.lora_targets={self.lora_targets}: a name is listed twice; list each once")

    @property
    def resolved_lr(self) -> float:
        """Peak learning rate in effect: `lr`, or with LoRA `lora_lr` (auto: LORA_LR_FACTOR x lr)."""
        if not self.lora_rank:
            return self.lr
        return self.lora_lr or LORA_LR_FACTOR * self.lr

    @property
    def resolved_loss_agg(self) -> str:
        """The loss aggregation in effect (`loss_agg`, or its "auto" default: seq_mean for a sequence-level
        ratio, else the algorithm's)."""
        if self.loss_agg != "auto":
            return self.loss_agg
        return "seq_mean" if self.resolved_ratio_level == "sequence" else DEFAULT_LOSS_AGG[self.algorithm]

    @property
    def resolved_clip_eps_high(self) -> float:
        """Upper clip epsilon in effect: `clip_eps_high`, or 0.28 for dapo / clip_eps_low otherwise."""
        if self.clip_eps_high != "auto":
            return self.clip_eps_high
        return DAPO_CLIP_EPS_HIGH if self.algorithm == "dapo" else self.clip_eps_low

    @property
    def resolved_host_threads(self) -> int:
        """torch CPU threads for a learner that trains on a GPU: `host_threads`, or min(4, cores)."""
        return self.host_threads or min(4, os.cpu_count() or 1)

    @property
    def resolved_filter_groups(self) -> str:
        """Group filter in effect: off, accuracy or shaped."""
        if self.filter_groups != "auto":
            return self.filter_groups
        return "accuracy" if self.algorithm == "dapo" else "off"

    @property
    def resolved_filter_refill(self) -> bool:
        """Whether the hub drops groups without signal before forming batches (refill)."""
        if self.filter_refill != "auto":
            return self.filter_refill
        return self.algorithm == "dapo" and self.resolved_filter_groups == "accuracy"

    @property
    def resolved_ratio_level(self) -> str:
        """Importance-ratio level in effect: token or sequence."""
        if self.ratio_level != "auto":
            return self.ratio_level
        return "sequence" if self.algorithm == "rloo" else "token"

    def overlong_buffer_for(self, max_new_tokens: int) -> int:
        """Overlong buffer in tokens for a sample generated with `max_new_tokens` (0: no shaping)."""
        if self.overlong_buffer != "auto":
            return self.overlong_buffer
        return max_new_tokens * DAPO_OVERLONG_BUFFER // DAPO_MAX_NEW_TOKENS if self.algorithm == "dapo" else 0

    @property
    def needs_value_head(self) -> bool:
        return self.algorithm == "ppo"
