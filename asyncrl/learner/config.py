"""Config of the learner (read by `asyncrl.learner`).

Batch units are defined once in `asyncrl.replay.config.BatchConfig`; here only how one batch is trained. Values that
the batch itself carries are not knobs: the sampling temperature (per prompt, `Prompt.sampling`) and the
maximum response length (`sampling.max_new_tokens`, used by Dr.GRPO's constant normaliser and by the
overlong penalty) come from the records. What an algorithm is, and so what each `"auto"` setting resolves
to, is its recipe in `asyncrl.learner.algorithms`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from asyncrl.learner import config_checks
from asyncrl.learner.algorithms import Algorithm, Recipe, recipe

LossAgg = Literal["auto", "token_mean", "seq_mean", "constant"]
GroupFilter = Literal["auto", "off", "accuracy", "shaped"]
RatioLevel = Literal["auto", "token", "sequence"]
LoraPush = Literal["auto", "adapter", "merged"]

# learner.lora_targets' default: every attention and MLP projection of Llama/Qwen-style decoders.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# learner.lora_trainable's default: every RMSNorm / LayerNorm gain (docs/lora.md: why).
DEFAULT_LORA_TRAINABLE = ("norm",)
# learner.lora_lr's auto value, in units of learner.lr (docs/lora.md: the embedded default's sweep).
LORA_LR_FACTOR = 10.0


@dataclass(kw_only=True, slots=True)
class CorrectionConfig:
    level: Literal["token", "sequence", "geometric"] = "token"
    """What the behaviour -> proximal importance weight w = pi_prox / pi_behav is taken over, counting the
    policy's tokens only (loss mask 1). token: per token, w_t; sequence: the product over the sample,
    exp(sum_t log w_t), shared by its tokens; geometric: the per-token geometric mean, exp(mean_t log w_t),
    shared by its tokens. How the weight is bounded is `learner.off_policy` (decoupled: masked, tis:
    truncated) at `learner.importance_cap`. Formulas: docs/algorithms.md."""
    low: float = 0.0
    """Masked IS (`off_policy = "decoupled"`): a token (at sequence or geometric level, a whole sample) whose
    weight is below this is dropped too, as one above importance_cap is; 0: no lower bound. Must be in
    [0, 1) and 0 with tis (truncation bounds from above only)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < 1.0:
            raise ValueError(f"learner.correction.low={self.low}: must be in [0, 1) (0: no lower bound; typical 0.5)")


class RolloutCorrection(NamedTuple):
    off_policy: str
    importance_cap: float
    level: str


# The correction a rollout precision calls for, by the generator's weight dtype. bf16 rollouts: the learner's
# defaults (decoupled, masked above 2, per token). FP8 rollouts: token-level TIS with C = 2 (truncated IS is how
# FlashRL corrects 8-bit rollouts): truncation keeps a gradient on every token, where masking drops each past C.
ROLLOUT_CORRECTION = {"bf16": RolloutCorrection("decoupled", 2.0, "token"),
                      "fp8": RolloutCorrection("tis", 2.0, "token")}


def rollout_correction_default(weights_dtype: str) -> RolloutCorrection:
    """The row of `ROLLOUT_CORRECTION` for a generator.weights_dtype ("model" rollouts are the bf16 row). The run
    config resolves `learner.off_policy = "auto"` through it; a learner config alone resolves "auto" as "model"."""
    weights_dtype = "bf16" if weights_dtype == "model" else weights_dtype
    if weights_dtype not in ROLLOUT_CORRECTION:
        raise ValueError(f"weights_dtype={weights_dtype!r}: known rollout precisions are {sorted(ROLLOUT_CORRECTION)}")
    return ROLLOUT_CORRECTION[weights_dtype]


@dataclass(kw_only=True, slots=True)
class LearnerConfig:
    algorithm: Algorithm = "grpo"
    """Advantage estimator and loss family, one recipe each in asyncrl/learner/algorithms.py: grpo
    (group-normalised), dr_grpo (group mean, no std, constant normaliser), dapo (the DAPO paper's recipe:
    grpo advantages, clip-higher 0.28, token-level mean, groups of equal accuracy dropped, soft overlong
    penalty; each part overridable by its own setting), rloo (leave-one-out baseline, sequence-level ratio as
    in the RLOO paper), reinforce_pp (batch-normalised returns), ppo (value head + GAE). Formulas:
    docs/algorithms.md."""
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
    """PPO ratio clip range [1 - low, 1 + high]; auto: the recipe's (dapo: 0.28, clip-higher), else = clip_eps_low."""
    dual_clip: float = 3.0
    """Dual-clip constant c (verl's clip_ratio_c): for negative advantages the token loss is capped at
    -c * A, so a ratio far above 1 cannot blow up the loss. Must be > 1; 0 disables."""
    ratio_level: RatioLevel = "auto"
    """Importance ratio of the clipped surrogate. token: r_t = exp(logp_t - old_t) per token (PPO, GRPO);
    sequence: rho = exp(sum_t (logp_t - old_t)) per sample, shared by its tokens (RLOO paper, TRL);
    auto: the recipe's (sequence for rloo, token otherwise)."""
    loss_agg: LossAgg = "auto"
    """How token losses become one number: token_mean (over all tokens of the batch), seq_mean (per
    sequence, then over sequences), constant (sum / (sequences x max_new_tokens)); auto: seq_mean for a
    sequence-level ratio (one loss per sample), otherwise the recipe's (grpo seq_mean, dr_grpo constant, others
    token_mean)."""
    filter_groups: GroupFilter = "auto"
    """DAPO dynamic sampling: drop groups whose samples all score the same (zero advantage). accuracy:
    compare the raw rewards (before overlong shaping; DAPO paper, verl's default); shaped: compare the
    rewards after shaping; off: keep every group; auto: the recipe's (accuracy for dapo, off otherwise). What
    dropped groups do to the batch: `filter_refill`."""
    filter_refill: bool | Literal["auto"] = "auto"
    """With the accuracy filter: true = the hub drops groups without signal as it forms batches, so their
    prompts' places go back to generation and every batch holds batch.prompts_per_step groups with signal
    (the DAPO paper's dynamic sampling; costs generation); false = the learner drops them and trains on a
    smaller batch. auto: the recipe's (true for dapo) with the accuracy filter. Needs filter_groups accuracy (the
    hub sees raw rewards only)."""
    kl_coef: float = 0.0
    """Weight of the KL to the frozen reference model (0: no reference model is loaded). With LoRA (lora_rank > 0)
    no second model is loaded either: the reference is the policy's own frozen base, its adapters switched off and
    its `lora_trainable` tensors at their values from the model path (docs/lora.md)."""
    kl_clamp: float = 10.0
    """The k3 KL term is clamped to [-kl_clamp, kl_clamp] per token (verl: 10); 0 disables."""
    kl_in_reward: bool = False
    """reinforce_pp / ppo: put the KL (k1) into the per-token reward instead of a k3 loss term."""
    off_policy: Literal["auto", "decoupled", "tis", "none"] = "auto"
    """Correction for samples made by an older policy or another precision. auto: the rollouts' precision picks
    (`ROLLOUT_CORRECTION`: "decoupled" for model-dtype rollouts, "tis" for generator.weights_dtype = "fp8").
    decoupled: clip around the proximal policy (the
    learner's weights before this step) and weight by w = pi_prox / pi_behav, dropping tokens whose weight
    exceeds `importance_cap` (masked IS; also below `correction.low`); tis: the same ratio, weight truncated
    to min(w, importance_cap); none: the behaviour logprobs are the PPO "old" policy and no proximal forward
    is run. Over what w is taken (token, sequence, geometric mean): `correction.level`."""
    importance_cap: float = 2.0
    """Cap of the behaviour -> proximal importance weight (decoupled: drop above; tis: truncate)."""
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    """The rollout-correction suite beyond the per-token weight: its level and the mask's lower bound."""
    mini_batches: int = 1
    """Optimizer steps per learner step: the rank's groups are split into this many mini-batches, all
    clipped around the same proximal policy (one policy version per learner step)."""
    overlong_buffer: int | Literal["auto"] = "auto"
    """DAPO soft overlong penalty: the last this-many tokens before max_new_tokens get a linearly growing
    penalty (0: off); auto: the recipe's share of max_new_tokens (dapo: the paper's last fifth, 4,096 of
    20,480), else 0."""
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
    dtype, and only low-rank adapters A [r, in], B [out, r] beside each `lora_targets` linear (and the
    `lora_trainable` base tensors) are trained, checkpointed and optimised; generators get the adapters or the merged weights (`lora_push`, docs/lora.md)."""
    lora_alpha: float = 16.0
    """LoRA scale numerator: the adapter's output is multiplied by lora_alpha / lora_rank."""
    lora_targets: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    """Linear layers that get adapters, by the last part of their module name (every attention and MLP
    projection of Llama/Qwen-style decoders by default). A name the model lacks is an error at start."""
    lora_trainable: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TRAINABLE))
    """Base parameters trained beside the adapters (full tensors, fp32 masters, in the optimizer, the adapter
    checkpoint, every adapter push and the export), by module-name suffix: "norm" matches input_layernorm,
    post_attention_layernorm and model.norm; "embed_tokens" the embedding (and a head tied to it). [] trains the
    adapters alone. A name that matches no module of the model is an error before any process starts.
    Default ["norm"]: the logits are the frozen (tied) embedding times model.norm's gain times an RMS-normalised
    hidden state, so adapters on the projections can turn the hidden state but not scale the logits, and RL at
    temperature 1 gains mostly by sharpening the distribution (lowering the entropy). On the embedded default
    (CPU, 200 steps, r 8) adapters alone end at a training reward of 0.47-0.49 whatever lora_lr, full fine-tuning
    at 0.56-0.62, and adapters plus the norms' gains (640 parameters there, KBs in a push) match or pass full
    fine-tuning (docs/lora.md, "Measured")."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input in training (0: none; then the one-mini-batch step's proximal
    logprobs are exactly the training forward's)."""
    lora_push: LoraPush = "auto"
    """What each version's weight push carries with LoRA: "adapter": A and B only (MBs), applied by the torch
    engine from its pristine copy of the base; "merged": the whole merged model W + scale * B @ A (any engine);
    "auto": adapter with generator.engine = "torch"; with SGLang, what its server serves, and merged whenever
    `lora_trainable` is non-empty (its LoRA serving cannot take trained norms; "adapter" is then an error)."""
    lora_lr: float = 0.0
    """Peak learning rate with LoRA (replaces `lr` when lora_rank > 0); 0: auto = 10 x lr, since LoRA's best
    rate sits near ten times full fine-tuning's (measured on the embedded default: docs/lora.md)."""

    def __post_init__(self) -> None:
        for check in config_checks.ALL:
            check(self)
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
        if self.lora_push not in ("auto", "adapter", "merged"):
            raise ValueError(f"learner.lora_push={self.lora_push!r}: must be 'auto', 'adapter' or 'merged'")
        if len(set(self.lora_targets)) != len(self.lora_targets):
            raise ValueError(f"learner.lora_targets={self.lora_targets}: a name is listed twice; list each once")
        if not all(isinstance(t, str) and t and "." not in t for t in self.lora_trainable):
            raise ValueError(f"learner.lora_trainable={self.lora_trainable}: give module name suffixes without dots, "
                             "e.g. ['norm'] or ['norm', 'embed_tokens'] ([]: the adapters alone)")
        if len(set(self.lora_trainable)) != len(self.lora_trainable):
            raise ValueError(f"learner.lora_trainable={self.lora_trainable}: a name is listed twice; list each once")

    @property
    def recipe(self) -> Recipe:
        """The algorithm's recipe (asyncrl/learner/algorithms.py): what every "auto" below resolves to."""
        return recipe(self.algorithm)

    @property
    def resolved_lr(self) -> float:
        """Peak learning rate in effect: `lr`, or with LoRA `lora_lr` (auto: LORA_LR_FACTOR x lr)."""
        if not self.lora_rank:
            return self.lr
        return self.lora_lr or LORA_LR_FACTOR * self.lr

    @property
    def resolved_loss_agg(self) -> str:
        """The loss aggregation in effect (`loss_agg`, or its "auto" default: seq_mean for a sequence-level
        ratio, else the recipe's)."""
        if self.loss_agg != "auto":
            return self.loss_agg
        return "seq_mean" if self.resolved_ratio_level == "sequence" else self.recipe.loss_agg

    @property
    def resolved_clip_eps_high(self) -> float:
        """Upper clip epsilon in effect: `clip_eps_high`, or the recipe's (symmetric: clip_eps_low)."""
        if self.clip_eps_high != "auto":
            return self.clip_eps_high
        return self.clip_eps_low if self.recipe.clip_eps_high is None else self.recipe.clip_eps_high

    @property
    def resolved_host_threads(self) -> int:
        """torch CPU threads for a learner that trains on a GPU: `host_threads`, or min(4, cores)."""
        return self.host_threads or min(4, os.cpu_count() or 1)

    @property
    def resolved_filter_groups(self) -> str:
        """Group filter in effect: off, accuracy or shaped."""
        return self.recipe.group_filter if self.filter_groups == "auto" else self.filter_groups

    @property
    def resolved_filter_refill(self) -> bool:
        """Whether the hub drops groups without signal before forming batches (refill)."""
        if self.filter_refill != "auto":
            return self.filter_refill
        return self.recipe.filter_refill and self.resolved_filter_groups == "accuracy"

    @property
    def resolved_off_policy(self) -> str:
        """off_policy with "auto" resolved for model-dtype rollouts (the run config sets fp8 runs' itself)."""
        return rollout_correction_default("model").off_policy if self.off_policy == "auto" else self.off_policy

    @property
    def resolved_ratio_level(self) -> str:
        """Importance-ratio level in effect: token or sequence."""
        return self.recipe.ratio_level if self.ratio_level == "auto" else self.ratio_level

    def overlong_buffer_for(self, max_new_tokens: int) -> int:
        """Overlong buffer in tokens for a sample generated with `max_new_tokens` (0: no shaping)."""
        if self.overlong_buffer != "auto":
            return self.overlong_buffer
        return self.recipe.overlong_buffer(max_new_tokens)

