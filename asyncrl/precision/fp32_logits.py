"""Logits in fp32 from a half-precision lm_head (`ModelConfig.logits_fp32`), the same function for the engine
and the learner.

    hidden [n, H] (bf16 / fp16), weight [V, H] (same dtype) -> hidden @ weight.T [n, V] fp32

The products are accumulated in fp32 (as any half GEMM does) and the result is kept in fp32 instead of being
rounded to the half dtype. Why it matters: a trained model's logits reach 20-40, where a bf16 logit has a
step of 0.125-0.25 (fp16: 0.016-0.031). Two implementations whose final hidden states differ by a hair round
a logit to neighbouring steps, and the logprob moves by up to a step; an fp32 logit moves by the hair only.

On CUDA this is one cuBLAS GEMM with an fp32 output (`torch.mm(..., out_dtype=torch.float32)`, where the
installed torch has it); elsewhere the operands are cast to fp32 first, which gives the same exact products of
the half values. fp32 models compute fp32 logits anyway.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


def fp32_logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """hidden [n, H], weight [V, H] of one dtype -> [n, V] fp32 (fp64 for fp64 inputs)."""
    if hidden.dtype != weight.dtype:
        raise TypeError(f"fp32_logits: hidden is {hidden.dtype}, weight is {weight.dtype}; cast one to the other")
    if hidden.dtype not in (torch.bfloat16, torch.float16):  # fp32 (or fp64) logits anyway
        return hidden @ weight.t()
    if hidden.is_cuda and out_dtype_supported():
        return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
    return hidden.float() @ weight.float().t()


@functools.cache
def out_dtype_supported() -> bool:
    """Whether this torch's CUDA mm takes out_dtype=float32 for half inputs (asked once, outside any CUDA graph
    capture: call it before capturing)."""
    try:
        a = torch.ones(16, 16, device="cuda", dtype=torch.bfloat16)
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError, NotImplementedError):
        return False
