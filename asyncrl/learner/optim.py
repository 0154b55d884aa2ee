"""AdamW, the learning-rate schedule (linear warm-up, then constant or cosine) and gradient clipping."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from asyncrl.learner import fsdp
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.loss_scale import LossScale


def build_optimizer(params: Iterable[nn.Parameter], cfg: LearnerConfig) -> torch.optim.AdamW:
    """AdamW over the trained fp32 master parameters (with LoRA: the adapters, plus a value head; the frozen
    base has requires_grad False and gets no state); the fused (one kernel per step) implementation on CUDA."""
    trainable = [p for p in params if p.requires_grad]
    fused = bool(trainable) and all(p.is_cuda for p in trainable)
    return torch.optim.AdamW(
        trainable, lr=cfg.resolved_lr, betas=(cfg.adam_betas[0], cfg.adam_betas[1]), eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay, fused=fused or None,
    )


def lr_factor(step: int, cfg: LearnerConfig) -> float:
    """Multiplier of cfg.resolved_lr for the update after `step` completed scheduler steps (0-based)."""
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


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float,
                   optimizer: torch.optim.Optimizer | None = None,
                   loss_scale: LossScale | None = None) -> torch.Tensor:
    """Clip to max_norm (0: no clipping) and return the global pre-clip L2 norm as a 0-d device tensor (read
    with the step's other metrics: reading it here would stall the host until the backward drains).

    The same numbers as `torch.nn.utils.clip_grad_norm_` (norms per tensor, the norm of those, coefficient
    max_norm / (norm + 1e-6) capped at 1), computed on the local shards of FSDP2's DTensor gradients: every
    DTensor op re-plans its sharding on the host, and the step's optimizer phase was host-bound on that.
    FSDP2 shards each gradient on dim 0 without overlap, so the squared local norms sum to the global one
    over the ranks.

    With a fused `optimizer` (AdamW on GPU) the coefficient is not applied here: the optimizer gets
    1 / coefficient as its `grad_scale`, the hook through which AMP's GradScaler unscales gradients, and divides
    every gradient by it inside its one kernel. That saves a read and a write of all fp32 gradients (~1 ms a
    step for 0.5B on an H200); the update differs from multiply-then-step by float rounding only.

    With an enabled `loss_scale` (fp16) the gradients are S times the true ones: the returned norm and the clip
    are the unscaled ones, the division by S joins the coefficient (the fused optimizer's grad_scale, or the
    one multiply), and an overflow (non-finite norm) sets `loss_scale.found_inf`, which the fused optimizer
    reads to skip its update (`step` skips the others')."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    local = [fsdp.local_tensor(g) for g in grads]
    norms = torch._foreach_norm(local, 2.0)  # 0-d each
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), 2.0)
    mesh = getattr(grads[0], "device_mesh", None)
    if mesh is not None and mesh.size() > 1:
        squared = total.square()
        torch.distributed.all_reduce(squared, group=mesh.get_group())
        total = squared.sqrt()
    scaled = loss_scale is not None and loss_scale.enabled
    if scaled:
        total = loss_scale.unscale_norm(total)
    fused = optimizer is not None and _is_fused(optimizer)
    if fused:
        optimizer.grad_scale = None  # no stale scale from an earlier step
        optimizer.found_inf = loss_scale.found_inf if scaled else None
    if max_norm > 0 or scaled:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0) if max_norm > 0 else torch.ones_like(total)
        if scaled:
            coef = coef / loss_scale.scale  # [0-d] undo S in the same pass
        if fused:
            optimizer.grad_scale = 1.0 / coef  # read by the next step(): fused AdamW divides the gradients by it
        else:
            torch._foreach_mul_(local, coef.to(local[0].dtype))
    return total.detach()


def step(optimizer: torch.optim.Optimizer, loss_scale: LossScale) -> None:
    """The optimizer step after `clip_grad_norm`, skipped when the fp16 gradients overflowed; then the loss
    scale's update. A fused optimizer skips on the device (its found_inf); another needs the host to know."""
    overflowed = loss_scale.enabled and not _is_fused(optimizer) and bool(loss_scale.found_inf.item())
    if not overflowed:
        optimizer.step()
    loss_scale.update()


def _is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return all(group.get("fused") for group in optimizer.param_groups)
