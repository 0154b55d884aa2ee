"""Variable-length attention over packed micro-batches: each sequence attends only to itself, so the cost
is sum(len_i^2) rather than pack^2.

Packing puts a micro-batch's sequences end to end in one row ([1, T] input ids, positions restarting at 0).
With HF's `sdpa` that row gets a dense block-diagonal [T, T] mask: exact, but every kernel then does the
work of one T-long sequence (for 256 sequences of 264 tokens in a 16k pack, ~60x the needed attention
FLOPs) and cuDNN/efficient-attention kernels with a mask are slow. `attn_implementation = "varlen"`
instead runs FlashAttention's variable-length kernel (`aten._flash_attention_forward/_backward`, shipped
with every CUDA build of torch >= 2.2) on the cumulative sequence boundaries of the pack:

    q [T, Hq, D], k/v [T, Hkv, D], cu_seqlens [s + 1] int32 -> out [T, Hq, D]

It is registered with transformers' `AttentionInterface` under the name "asyncrl_varlen" (plus a mask
function that builds no mask), and reads the boundaries from the `cu_seq_lens_q` / `max_length_q` keyword
arguments that HF decoders pass through to attention (`PolicyModel.forward` supplies them). On CPU (and
on a CUDA build without the flash kernel) the same boundaries drive a loop of causal SDPA calls, one per
sequence: still sum(len^2), with no [T, T] mask.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

NAME = "asyncrl_varlen"
_gqa_native: bool | None = None  # whether the flash kernel takes fewer kv heads (probed once)


class _VarlenFlash(torch.autograd.Function):
    """Causal varlen FlashAttention with its own backward (no dropout)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, scale: float) -> Tensor:
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.max_len, ctx.scale = max_len, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu, cu, ctx.max_len, ctx.max_len, 0.0, True, rng, unused,
            scale=ctx.scale)
        return dq, dk, dv, None, None, None


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_len: int, scale: float) -> Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D], cu_seqlens [s + 1] int32 -> [T, Hq, D]."""
    global _gqa_native
    if not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and _has_flash()):
        return _per_sequence(q, k, v, cu_seqlens, scale)
    rep = q.shape[1] // k.shape[1]
    if rep > 1 and _gqa_native is not False:
        try:
            out = _VarlenFlash.apply(q, k, v, cu_seqlens, max_len, scale)
            _gqa_native = True
            return out
        except RuntimeError:
            if _gqa_native:  # worked before: a real error
                raise
            _gqa_native = False
    k, v = _expand_kv(k, v, q.shape[1])
    return _VarlenFlash.apply(q, k, v, cu_seqlens, max_len, scale)


def _expand_kv(k: Tensor, v: Tensor, q_heads: int) -> tuple[Tensor, Tensor]:
    """GQA without kernel support: repeat each kv head for its group of query heads. Heads are dim 1 in
    both layouts used here ([T, H, D] and [B, H, T, D])."""
    rep = q_heads // k.shape[1]
    if rep == 1:
        return k, v
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def _has_flash() -> bool:
    return hasattr(torch.ops.aten, "_flash_attention_forward") and torch.backends.cuda.is_flash_attention_available()


def _per_sequence(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: float) -> Tensor:
    """The same function as a loop of causal SDPA calls, one per sequence (CPU and fallback)."""
    k, v = _expand_kv(k, v, q.shape[1])
    bounds = cu_seqlens.tolist()
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        qi, ki, vi = (t[a:b].transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        outs.append(torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale)
                    .transpose(0, 1))
    return torch.cat(outs) if outs else q.new_zeros(q.shape)


@torch.compiler.disable  # compiled decoder layers break here: the kernel call and its probe stay eager
def _hf_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                  **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query [1, Hq, T, D], key/value [1, Hkv, T, D]
    -> ([1, T, Hq, D], None)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:  # a plain call (no pack boundaries): each row is one causal sequence
        return _plain_causal(query, key, value, attention_mask, scaling), None
    if query.shape[0] != 1 or dropout:
        raise ValueError("varlen attention takes one packed row and no dropout")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D] (views of the projections)
    out = varlen_attention(q.contiguous(), k.contiguous(), v.contiguous(), cu, int(kwargs["max_length_q"]), scale)
    return out[None], None


def _plain_causal(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, scale: float | None) -> Tensor:
    """[B, Hq, T, D], [B, Hkv, T, D] -> [B, T, Hq, D], causal, or under a given 4-D mask."""
    key, value = _expand_kv(key, value, query.shape[1])
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=mask is None, scale=scale)
    return out.transpose(1, 2)


def _mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """No mask for packed rows (the boundaries carry the structure); a plain call with a padding mask gets
    HF's SDPA mask, which `_plain_causal` honours."""
    if kwargs.get("attention_mask") is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register() -> str:
    """Make "asyncrl_varlen" a valid `attn_implementation` for `from_pretrained`. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, _hf_attention)
    AttentionMaskInterface.register(NAME, _mask)
    return NAME


def resolve(name: str, device: torch.device) -> str:
    """LearnerConfig.attn_implementation -> the HF name ("auto" = "varlen")."""
    return register() if name in ("auto", "varlen") else name


def cu_seqlens(lengths: list[int]) -> Tensor:
    """Per-sequence input lengths -> cumulative boundaries [s + 1] int32 (what the kernel reads)."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return out
