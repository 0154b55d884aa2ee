"""Fused lm_head + per-token logprob with a hand-written backward, the learner's "linear-logprob" step.

    hidden [n, H] (final-norm states at the positions that predict response tokens), weight [V, H]
    -> logp [n] fp32 (with grad), entropy [n] fp32 (metric, no grad)

logp_i = log_softmax(softcap(h_i W^T) / T_i)[target_i]: SGLang's and our engine's sampling logprob
(full vocabulary, no top-p/top-k renormalisation; greedy requests use T = 1).

Why not autograd through `F.linear` + `log_softmax`: autograd keeps the fp32 [n, V] log-softmax and
builds its gradient through ~6 elementwise fp32 passes. Here the forward does one matmul and one fused
reduction (logprob_kernels.forward) and keeps only the logits in the compute dtype (bf16 on GPU); the
backward turns those saved logits into their gradient in place (one fused pass) and does two matmuls:

    d logits = g * (onehot - softmax) / T      [n, V], in place over the saved logits
    d hidden = d logits @ W                    [n, H]
    d W      = d logits^T @ hidden             [V, H]

When the micro-batch's logits would exceed KEEP_LOGITS_BYTES they are not kept: the forward and backward
walk `chunk` rows at a time and the backward recomputes each chunk's logits (one extra matmul per chunk).

fp32=True (ModelConfig.logits_fp32): the logits are the matmul's fp32 output (asyncrl/precision/fp32_logits.py), as the
engine's, and are kept in fp32; the backward reads them and writes d logits in the weight's dtype for the two
matmuls, which is what it writes without the option.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from asyncrl.precision.fp32_logits import fp32_logits
from asyncrl.learner import logprob_kernels as K

KEEP_LOGITS_BYTES = 16 << 30  # logits of one micro-batch kept between forward and backward (bf16: 56k x 152k)


class _LinearLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, inv_temp: Tensor, chunk: int,
                softcap: float | None, keep_bytes: int, fp32: bool) -> tuple[Tensor, Tensor]:
        n, v = hidden.shape[0], weight.shape[0]
        ctx.chunk, ctx.softcap, ctx.fp32 = chunk, softcap, fp32
        keep = n * v * (4 if fp32 else hidden.element_size()) <= keep_bytes
        if keep:
            logits = _logits(ctx, hidden, weight)  # [n, V]
            logp, entropy, lse = K.forward(logits, targets, inv_temp, softcap)
        else:
            logits = None
            parts = [K.forward(_logits(ctx, hidden[s:s + chunk], weight), targets[s:s + chunk], inv_temp[s:s + chunk],
                               softcap) for s in range(0, n, chunk)]
            logp, entropy, lse = (torch.cat(t) for t in zip(*parts)) if parts else (hidden.new_zeros(0, dtype=torch.float32),) * 3
        ctx.save_for_backward(hidden, weight, targets, inv_temp, lse)
        ctx.logits = logits
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor, _grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        hidden, weight, targets, inv_temp, lse = ctx.saved_tensors
        grad_logp = grad_logp.float()
        if ctx.logits is not None:
            logits, ctx.logits = ctx.logits, None
            dlogits = K.backward_(logits, targets, inv_temp, lse, grad_logp, ctx.softcap, _grad_out(logits, weight))
            del logits  # [n, V] fp32 with fp32=True: freed before the matmuls
            return dlogits @ weight, dlogits.t() @ hidden, None, None, None, None, None, None
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for s in range(0, hidden.shape[0], ctx.chunk):
            sl = slice(s, s + ctx.chunk)
            logits = _logits(ctx, hidden[sl], weight)
            d = K.backward_(logits, targets[sl], inv_temp[sl], lse[sl], grad_logp[sl], ctx.softcap,
                            _grad_out(logits, weight))
            grad_h[sl] = d @ weight
            grad_w += (d.t() @ hidden[sl]).float()
        return grad_h, grad_w.to(weight.dtype), None, None, None, None, None, None


def _logits(ctx: Any, hidden: Tensor, weight: Tensor) -> Tensor:
    """[n, H] -> [n, V]: in the weight's dtype, or fp32 (ctx.fp32)."""
    return fp32_logits(hidden, weight) if ctx.fp32 else hidden @ weight.t()


def _grad_out(logits: Tensor, weight: Tensor) -> Tensor | None:
    """Where the backward writes d logits: over the logits themselves (None) unless they are fp32 logits of a
    half weight, whose gradient is written in the weight's dtype."""
    return None if logits.dtype == weight.dtype else torch.empty(logits.shape, dtype=weight.dtype, device=logits.device)


def linear_logprob(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: Tensor, *, chunk: int = 4096,
                   softcap: float | None = None, keep_bytes: int = KEEP_LOGITS_BYTES,
                   fp32: bool = False) -> tuple[Tensor, Tensor]:
    """hidden [n, H], weight [V, H] (same dtype), targets [n] int64, temperature [n] -> (logp [n] fp32,
    entropy [n] fp32 without grad). fp32: logits in fp32 (module docstring)."""
    inv_temp = (1.0 / temperature.float()).contiguous()  # [n]
    logp, entropy = _LinearLogprob.apply(hidden.contiguous(), weight, targets.contiguous(), inv_temp, chunk,
                                         softcap, keep_bytes, fp32)
    return logp, entropy.detach()
