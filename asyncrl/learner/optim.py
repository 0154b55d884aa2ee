"""AdamW, the learning-rate schedule (linear warm-up, then constant or cosine) and gradient clipping."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from asyncrl.learner.config import LearnerConfig


def build_optimizer(params: Iterable[nn.Parameter], cfg: LearnerConfig) -> torch.optim.AdamW:
    """AdamW over the fp32 master parameters; the fused (one kernel per step) implementation on CUDA."""
    trainable = [p for p in params if p.requires_grad]
    fused = bool(trainable) and all(p.is_cuda for p in trainable)
    return torch.optim.AdamW(
        trainable, lr=cfg.lr, betas=(cfg.adam_betas[0], cfg.adam_betas[1]), eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay, fused=fused or None,
    )


def lr_factor(step: int, cfg: LearnerConfig) -> float:
    """Multiplier of cfg.lr for the update after `step` completed scheduler steps (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.lr_schedule == "constant":
        return 1.0
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(opt: torch.optim.Optimizer, cfg: LearnerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per learner step (not per mini-batch)."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, cfg))


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip to max_norm (0: no clipping) and return the global pre-clip norm (DTensor-aware) as a 0-d device
    tensor: reading it here would stall the host until the backward drains, and the GPU would then wait
    for the optimizer's launches."""
    norm = torch.nn.utils.clip_grad_norm_(
        [p for p in params if p.grad is not None], max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.detach()
