"""A token-major attention forward for packed micro-batches under "asyncrl_varlen".

Hugging Face's attention forward works in the head-major layout the dense kernels want:

    q_proj(x) [1, T, Hq*D] -> view [1, T, Hq, D] -> transpose [1, Hq, T, D] -> rotary (rotate_half: cat, neg)
    -> attention function: transpose back [T, Hq, D] + .contiguous() -> flash varlen -> [T, Hq, D] -> o_proj

The varlen kernel reads [T, H, D], so the round trip through [1, H, T, D] is pure overhead. Worse, under
FSDP `compile(dynamic=True)` turns every int the forward reads from a module (`self.head_dim`) into a
symbolic size: the views get a symbolic head count and head size, and the rotary kernels Inductor fuses
with the transposes compute each index with divisions by runtime values. On an H200 (0.5B Qwen2 shape,
22.5k tokens a micro-batch) they took 154 us per layer forward and 249 us backward, ~8x their bytes.

`lean_forward` keeps everything token-major: the projections are viewed as [T, H, D] (no copy) with the
head size as a constant (see `_forward_with`), rotary broadcasts cos/sin [T, 1, D] over the heads, and the
kernel's output [T, Hq, D] is already o_proj's input. Those rotary kernels then take 21 us forward and
27 us backward; the rotary-fused kernels of a step went from 37.0 to 5.6 ms and the whole bench.learner
step from 0.499 to 0.476 s (same shape, 32k micro-batches, compiled, 2026-11-30).

Same parameters, same names, same math (it calls the module's own q_proj/k_proj/v_proj/o_proj and
q_norm/k_norm): only the forward of each attention module instance changes. Anything else (a plain call
without pack boundaries, a KV cache, a sliding window, attention dropout in training, partial rotary) runs
the module's original forward. Only classes whose forward was checked against this one are patched
(`tests/learner/test_lean_attention.py`): the projections' names alone do not pin the math down (Olmo2
normalises q over all heads, Cohere rotates interleaved pairs, Mistral reads its sliding window from the
config).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from asyncrl.learner import attention
from asyncrl.learner.merged_linear import mergeable, merged_linear

# Attention classes with HF's Llama-family forward: q/k/v/o projections, optional per-head q_norm/k_norm
# right after the view, full-width rotate_half rotary, a per-module `sliding_window` (or none).
SUPPORTED = frozenset({"LlamaAttention", "Qwen2Attention", "Qwen3Attention"})
_NEEDED = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling", "config")


def install(hf: nn.Module) -> int:
    """Swap the forward of every supported attention module of `hf` for `lean_forward` (in place; no
    parameter is added, renamed or moved). Idempotent. Returns how many modules run it."""
    count = 0
    for module in hf.modules():
        if type(module).__name__ in SUPPORTED and all(hasattr(module, a) for a in _NEEDED):
            module.forward = types.MethodType(_forward_with(int(module.head_dim)), module)
            count += 1
    return count


def _forward_with(head_dim: int) -> Callable[..., tuple[Tensor, None]]:
    """`lean_forward` with the head size as a default argument. Under FSDP, `compile(dynamic=True)` makes
    every int it reads from a module (and from closure cells) a symbolic size, so HF's forward views the
    projections with a symbolic head_dim and Inductor's rotary kernel divides each index by runtime values
    (that, more than the layout, is the 8x above); a function's defaults stay constants."""
    def forward(self: nn.Module, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor] | None = None,
                attention_mask: Tensor | None = None, _head_dim: int = head_dim, **kwargs: Any) -> tuple[Tensor, None]:
        return lean_forward(self, hidden_states, position_embeddings, attention_mask, _head_dim, **kwargs)
    return forward


def lean_forward(self: nn.Module, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor] | None,
                 attention_mask: Tensor | None, head_dim: int, **kwargs: Any) -> tuple[Tensor, None]:
    """hidden_states [1, T, hidden], position_embeddings (cos, sin) [1, T, D] -> ([1, T, hidden], None), as
    HF's attention forward returns (output, attention weights)."""
    if not _packed(self, hidden_states, position_embeddings, head_dim, kwargs):
        return type(self).forward(self, hidden_states, position_embeddings=position_embeddings,
                                  attention_mask=attention_mask, **kwargs)
    x = hidden_states[0]  # [T, hidden]
    t = x.shape[0]
    q, k, v = _qkv(self, x, head_dim)  # [T, Hq, D], [T, Hkv, D], [T, Hkv, D]
    if getattr(self, "q_norm", None) is not None:  # Qwen3: RMSNorm over D, per head, before rotary
        q, k = self.q_norm(q), self.k_norm(k)
    cos, sin = (e[0].unsqueeze(1) for e in position_embeddings)  # [T, 1, D]
    q, k = rotary(q, cos, sin), rotary(k, cos, sin)
    out = attention.varlen_attention(q, k, v, kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"]),
                                     self.scaling)  # [T, Hq, D]
    return self.o_proj(out.reshape(1, t, -1)), None


def _qkv(self: nn.Module, x: Tensor, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """x [T, hidden] -> q [T, Hq, D], k and v [T, Hkv, D]: views of one merged projection (merged_linear.py)
    when the three are plain Linears, else of three. The head counts follow from `head_dim` and the sizes
    (T * H * D elements each), so no module int becomes a symbolic size."""
    t = x.shape[0]
    projections = (self.q_proj, self.k_proj, self.v_proj)
    if not mergeable(*projections):
        return tuple(p(x).view(t, -1, head_dim) for p in projections)
    hq = self.q_proj.weight.shape[0] // head_dim
    hkv = self.k_proj.weight.shape[0] // head_dim
    qkv = merged_linear(x, projections).view(t, hq + 2 * hkv, head_dim)  # [T, Hq + 2 Hkv, D]
    return qkv.split((hq, hkv, hkv), dim=1)


def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T, H, D], cos/sin [T, 1, D] -> x * cos + rotate_half(x) * sin, HF's formula in the token-major
    layout. Compiled on an H200 (0.5B shape, 22.5k tokens, static head sizes) it runs at the bandwidth of
    its bytes: 21 us forward for q; writing it per half (cat of x1*c1 - x2*s1 and x2*c2 + x1*s2) took 28."""
    x1, x2 = x.chunk(2, dim=-1)  # [T, H, D/2] each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _packed(module: nn.Module, hidden: Tensor, position_embeddings: tuple[Tensor, Tensor] | None, head_dim: int,
            kwargs: dict[str, Any]) -> bool:
    """Whether this call is one the lean forward computes exactly as the original one would."""
    return (kwargs.get("cu_seq_lens_q") is not None
            and module.config._attn_implementation == attention.NAME
            and hidden.dim() == 3 and hidden.shape[0] == 1
            and position_embeddings is not None and position_embeddings[0].shape[-1] == head_dim
            and kwargs.get("cache") is None and kwargs.get("past_key_values") is None  # 5.24 / 5.17 name
            and getattr(module, "sliding_window", None) is None
            and not (module.training and getattr(module, "attention_dropout", 0.0)))
