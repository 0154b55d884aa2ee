"""Validation of `LearnerConfig`: one short function per group of settings, run in order by its
`__post_init__` (LoRA's checks stay its method `_check_lora`). Each raises a ValueError that names the
setting, the rule and the fix. `Checked` is the config as these functions see it (any object with its
fields): this module never imports config.py, which imports it."""

from __future__ import annotations

from typing import Any

from asyncrl.learner.algorithms import recipe, token_level_algorithms

Checked = Any  # a LearnerConfig


def _check_algorithm(c: Checked) -> None:
    try:
        recipe(c.algorithm)
    except ValueError as e:
        raise ValueError(f"learner.algorithm: {e}") from None


def _check_schedule(c: Checked) -> None:
    if c.steps < 1:
        raise ValueError(f"learner.steps={c.steps}: must be >= 1")
    if c.lr <= 0:
        raise ValueError(f"learner.lr={c.lr}: must be > 0")
    if c.time_limit_s < 0:
        raise ValueError(f"learner.time_limit_s={c.time_limit_s}: must be >= 0 (0: no time limit)")
    if not 0.0 <= c.min_lr_ratio <= 1.0:
        raise ValueError(f"learner.min_lr_ratio={c.min_lr_ratio}: must be in [0, 1]")
    if c.warmup_steps < 0:
        raise ValueError(f"learner.warmup_steps={c.warmup_steps}: must be >= 0")


def _check_optimizer(c: Checked) -> None:
    if c.weight_decay < 0:
        raise ValueError(f"learner.weight_decay={c.weight_decay}: must be >= 0")
    if len(c.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in c.adam_betas):
        raise ValueError(f"learner.adam_betas={c.adam_betas}: give two values in [0, 1), e.g. [0.9, 0.999]")
    if c.adam_eps <= 0:
        raise ValueError(f"learner.adam_eps={c.adam_eps}: must be > 0")
    if c.loss_scale_init <= 0 or c.loss_scale_init == float("inf"):
        raise ValueError(f"learner.loss_scale_init={c.loss_scale_init}: must be a positive finite number "
                         "(typical 65536)")
    if c.loss_scale_growth_interval < 1:
        raise ValueError(f"learner.loss_scale_growth_interval={c.loss_scale_growth_interval}: must be >= 1 "
                         "(typical 200)")
    if c.max_grad_norm < 0:
        raise ValueError(f"learner.max_grad_norm={c.max_grad_norm}: must be >= 0 (0 disables clipping)")


def _check_surrogate(c: Checked) -> None:
    for name in ("clip_eps_low", "clip_eps_high"):
        v = getattr(c, name)
        if v != "auto" and not 0.0 < v < 10.0:
            raise ValueError(f"learner.{name}={v}: must be in (0, 10); typical 0.2 (DAPO high: 0.28)")
    if c.dual_clip != 0.0 and c.dual_clip <= 1.0:
        raise ValueError(f"learner.dual_clip={c.dual_clip}: must be > 1 (verl's default 3) or 0 to disable")
    if c.clip_eps_low >= 1.0:
        raise ValueError(f"learner.clip_eps_low={c.clip_eps_low}: must be < 1 so that 1 - low stays positive")


def _check_kl(c: Checked) -> None:
    if c.kl_clamp < 0:
        raise ValueError(f"learner.kl_clamp={c.kl_clamp}: must be >= 0 (verl: 10; 0 disables)")
    if c.kl_coef < 0:
        raise ValueError(f"learner.kl_coef={c.kl_coef}: must be >= 0 (0: no reference model)")
    if c.kl_in_reward and not c.recipe.token_level:
        raise ValueError(
            f"learner.kl_in_reward=true needs a token-level algorithm ({' or '.join(token_level_algorithms())}), "
            f"not {c.algorithm!r}; use the KL loss term (kl_in_reward=false) instead"
        )


def _check_off_policy(c: Checked) -> None:
    if c.importance_cap < 1.0:
        raise ValueError(f"learner.importance_cap={c.importance_cap}: must be >= 1 (typical 2-5)")
    if c.mini_batches < 1:
        raise ValueError(f"learner.mini_batches={c.mini_batches}: must be >= 1")
    if c.correction.low > 0.0 and c.resolved_off_policy != "decoupled":
        raise ValueError(f"learner.correction.low={c.correction.low} bounds the masked weight of off_policy = "
                         f"\"decoupled\", not {c.off_policy!r} (tis truncates from above only); set it to 0")
    if c.correction.level != "token" and c.off_policy == "none":
        raise ValueError(f"learner.correction.level={c.correction.level!r} weights nothing with off_policy = "
                         "\"none\" (no proximal policy); set off_policy = \"decoupled\" or \"tis\", or "
                         "level = \"token\"")


def _check_shaping(c: Checked) -> None:
    if (c.overlong_buffer != "auto" and c.overlong_buffer < 0) or c.overlong_penalty < 0:
        raise ValueError(
            f"learner.overlong_buffer={c.overlong_buffer}, overlong_penalty={c.overlong_penalty}: "
            "both must be >= 0 (overlong_buffer may also be \"auto\")"
        )
    if c.filter_refill is True and c.resolved_filter_groups != "accuracy":
        raise ValueError(
            f"learner.filter_refill=true needs learner.filter_groups = \"accuracy\" (now resolved to "
            f"{c.resolved_filter_groups!r}): the hub compares raw rewards only; set filter_groups = "
            "\"accuracy\" or filter_refill = false"
        )


def _check_returns(c: Checked) -> None:
    if not 0.0 <= c.gamma <= 1.0 or not 0.0 <= c.gae_lambda <= 1.0:
        raise ValueError(f"learner.gamma={c.gamma}, gae_lambda={c.gae_lambda}: both must be in [0, 1]")
    if c.value_coef < 0 or c.value_clip <= 0:
        raise ValueError(f"learner.value_coef={c.value_coef} must be >= 0 and value_clip={c.value_clip} > 0")


def _check_compute(c: Checked) -> None:
    if c.ranks < 1:
        raise ValueError(f"learner.ranks={c.ranks}: must be >= 1")
    if c.devices and len(c.devices) != c.ranks:
        raise ValueError(f"learner.devices has {len(c.devices)} entries but learner.ranks={c.ranks}: give one per rank")
    if c.micro_batch_tokens < 16:
        raise ValueError(f"learner.micro_batch_tokens={c.micro_batch_tokens}: must be >= 16")
    if c.host_threads < 0:
        raise ValueError(f"learner.host_threads={c.host_threads}: must be >= 0 (0: auto, min(4, cores))")
    if c.logprob_chunk_tokens < 1:
        raise ValueError(f"learner.logprob_chunk_tokens={c.logprob_chunk_tokens}: must be >= 1")


def _check_checkpoints(c: Checked) -> None:
    if c.checkpoint_every < 1:
        raise ValueError(f"learner.checkpoint_every={c.checkpoint_every}: must be >= 1")
    if c.keep_checkpoints < 0:
        raise ValueError(f"learner.keep_checkpoints={c.keep_checkpoints}: must be >= 0 (0 keeps all)")
    if c.weight_bucket_mb < 1:
        raise ValueError(f"learner.weight_bucket_mb={c.weight_bucket_mb}: must be >= 1")


ALL = (_check_algorithm, _check_schedule, _check_optimizer, _check_surrogate, _check_kl, _check_off_policy,
       _check_shaping, _check_returns, _check_compute, _check_checkpoints)
