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
_flash_ok: bool | None = None  # whether the build has the flash kernel (asked once)


# The kernel pair as torch custom ops with a registered backward: torch.compile traces through them (no graph
# break per layer), so Inductor fuses rotary and the [1, H, T, D] -> [T, H, D] layout change into the kernels
# that feed attention, and each compiled decoder layer is one graph forward and one backward.
def _forward(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, scale: float) -> tuple[Tensor, Tensor]:
    """Causal, no dropout -> (out [T, Hq, D], logsumexp [Hq, T] fp32). Also the op's fake: on fake tensors
    the aten call runs torch's own meta kernel, so the shapes come from one rule."""
    out, lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, True, False,
                                                           scale=scale)
    return out, lse


@torch.library.custom_op("asyncrl::flash_varlen_fwd", mutates_args=(), device_types="cuda")
def _flash_fwd(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, scale: float) -> tuple[Tensor, Tensor]:
    return _forward(q, k, v, cu, max_len, scale)


_flash_fwd.register_fake(_forward)


@torch.library.custom_op("asyncrl::flash_varlen_bwd", mutates_args=(), device_types="cuda")
def _flash_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu: Tensor, max_len: int,
               scale: float) -> tuple[Tensor, Tensor, Tensor]:
    no_rng = torch.empty((), dtype=torch.long)  # the philox seed/offset are read only with dropout
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        dout, q, k, v, out, lse, cu, cu, max_len, max_len, 0.0, True, no_rng, no_rng, scale=scale)
    return dq, dk, dv


@_flash_bwd.register_fake
def _(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu: Tensor, max_len: int,
      scale: float) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _flash_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, cu, max_len, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu)
    ctx.max_len, ctx.scale = max_len, scale


def _flash_backward(ctx: Any, dout: Tensor, _dlse: Tensor | None) -> tuple[Tensor | None, ...]:
    q, k, v, out, lse, cu = ctx.saved_tensors
    dq, dk, dv = _flash_bwd(dout.contiguous(), q, k, v, out, lse, cu, ctx.max_len, ctx.scale)
    return dq, dk, dv, None, None, None


_flash_fwd.register_autograd(_flash_backward, setup_context=_flash_setup)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_len: int, scale: float) -> Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D], cu_seqlens [s + 1] int32 -> [T, Hq, D]."""
    if not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and _has_flash()):
        return _per_sequence(q, k, v, cu_seqlens, scale)
    if not gqa_native(q.device):
        k, v = _expand_kv(k, v, q.shape[1])
    return _flash_fwd(q, k, v, cu_seqlens, max_len, scale)[0]


def gqa_native(device: torch.device) -> bool:
    """Whether the flash kernel takes fewer kv heads than query heads (probed once, eagerly: `resolve` calls
    it before any compiled forward, so traced code only reads the answer)."""
    global _gqa_native
    if _gqa_native is None:
        q = torch.zeros(4, 2, 64, device=device, dtype=torch.bfloat16)
        cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
        try:
            torch.ops.aten._flash_attention_forward(q, q[:, :1], q[:, :1], cu, cu, 4, 4, 0.0, True, False)
            _gqa_native = True
        except RuntimeError:
            _gqa_native = False
    return _gqa_native


def _expand_kv(k: Tensor, v: Tensor, q_heads: int) -> tuple[Tensor, Tensor]:
    """GQA without kernel support: repeat each kv head for its group of query heads. Heads are dim 1 in
    both layouts used here ([T, H, D] and [B, H, T, D])."""
    rep = q_heads // k.shape[1]
    if rep == 1:
        return k, v
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def _has_flash() -> bool:
    """Whether this torch build has the flash kernel (asked once; traced code reads the cached answer)."""
    global _flash_ok
    if _flash_ok is None:
        _flash_ok = hasattr(torch.ops.aten, "_flash_attention_forward") and torch.backends.cuda.is_flash_attention_available()
    return _flash_ok


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
    if name not in ("auto", "varlen"):
        return name
    if device.type == "cuda" and _has_flash():
        gqa_native(device)
    return register()


def cu_seqlens(lengths: list[int]) -> Tensor:
    """Per-sequence input lengths -> cumulative boundaries [s + 1] int32 (what the kernel reads)."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return out
