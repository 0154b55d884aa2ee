"""Building blocks of the compact decoder: RMSNorm, rotary embedding, SwiGLU MLP.

Numerics follow the Hugging Face Llama/Qwen code (norm in fp32, cos/sin in fp32 then cast), so the
engine's logprobs match a Hugging Face forward of the same weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from asyncrl.engine.torch import kernels
from asyncrl.engine.torch.kernels import fp8 as fp8_kernels
from asyncrl.engine.torch.model.fp8 import Fp8Input, fused_inputs
from asyncrl.engine.torch.model.low_rank import LowRank


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim] in the weight's dtype
        """Hugging Face's roundings (normalise in fp32, round to the compute dtype, scale); an fp32 residual
        stream (`add_forward`'s stream_fp32) is rounded to the weight's dtype, the compute dtype, the same way."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(self.weight.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None, stream_fp32: bool = False,
                    quantize: bool = False) -> tuple[torch.Tensor | Fp8Input, torch.Tensor]:
        """-> (norm(x + residual), x + residual); residual None means x is the stream itself, kept in x's
        dtype or, with stream_fp32, as fp32 (then every later `residual + x` is fp32: the residual stream is
        rounded once per layer less). One fused kernel on GPU; the same roundings as `residual + x` then
        `forward`. quantize (FP8 rollouts, only where the kernel runs): the norm comes back as an `Fp8Input`."""
        if residual is None and stream_fp32:
            residual, x = x.float(), torch.zeros_like(x)
        if kernels.ops.enabled(x) and x.dim() == 2 and self.weight.dtype == x.dtype:
            if quantize:
                (x8, scale), stream = fp8_kernels.add_rmsnorm_fp8(x, residual, self.weight, self.eps)
                return Fp8Input(x8, scale), stream
            return kernels.ops.add_rmsnorm(x, residual, self.weight, self.eps)
        h = x if residual is None else residual + x
        return self.forward(h), h


class RotaryEmbedding(nn.Module):
    """cos/sin tables for the positions of one batch; `inv_freq` comes from the Hugging Face model so
    every static RoPE variant (default, linear, llama3, yarn) is reproduced exactly."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0, max_positions: int = 4096) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)  # [head_dim / 2]
        self.attention_scaling = attention_scaling

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [num_tokens, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [num_tokens, head_dim]
        cos = (emb.cos() * self.attention_scaling).to(dtype)
        sin = (emb.sin() * self.attention_scaling).to(dtype)
        return cos, sin

    def tables(self, max_positions: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [max_positions, head_dim] for every position (what `forward` gives row by row),
        built once per dtype and device; the fused rotary kernel gathers from them."""
        key = (max_positions, dtype, device)
        if getattr(self, "_tables_key", None) != key:
            positions = torch.arange(max_positions, device=device)
            self._tables = self.forward(positions, dtype)
            self._tables_key = key
        return self._tables


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[head_dim / 2] fp32, on the CPU even inside a meta-device context (meta arithmetic goes through torch's
    Python reference ops, whose first use imports torch._dynamo: ~1 s of a start-up)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim]; cos, sin: [num_tokens, head_dim]."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). After `fuse()`, gate_proj / up_proj weights are views
    into one [2 * inter, hidden] matrix (one matmul); loading by their Hugging Face names still
    writes that matrix in place."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

        self.gate_up: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.gate_up_fp8: Callable[[torch.Tensor], torch.Tensor] | None = None  # fp8 images (FP8 rollouts: fp8.py)
        self.down_fp8: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.gate_up_lora: LowRank | None = None  # LoRA adapters kept unmerged (low_rank.py)
        self.down_lora: LowRank | None = None

    def fuse(self) -> None:
        if self.gate_up is None:
            self.gate_up = fuse_linears(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor | Fp8Input) -> torch.Tensor:  # [num_tokens, hidden]
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate_up = self.gate_up_fp8(x) if self.gate_up_fp8 is not None else F.linear(x, *self.gate_up)  # [n, 2 * inter]
        if self.gate_up_lora is not None:
            gate_up = self.gate_up_lora(x, gate_up)
        if fused_inputs(gate_up, self.down_fp8):
            return self.down_fp8(Fp8Input(*fp8_kernels.silu_mul_fp8(gate_up)))
        if kernels.ops.enabled(gate_up) and gate_up.dim() == 2:
            h = kernels.ops.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            h = F.silu(gate) * up  # [n, inter]
        y = self.down_fp8(h) if self.down_fp8 is not None else self.down_proj(h)  # [n, hidden]
        return y if self.down_lora is None else self.down_lora(h, y)


def fuse_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the linears' weights (and biases) along the output dim into one tensor and make
    each module's parameters views of it, so in-place loads by name update the fused tensor. Weights that already
    lie back to back in one storage (a shared base image: asyncrl/weights/base_image.py) are viewed, not copied.
    -> (weight [sum out, in], bias or None)."""
    weight = _adjacent([lin.weight.detach() for lin in linears])
    if weight is None:
        weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = linears[0].bias is not None
    bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if has_bias:
            lin.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


def _adjacent(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The row-contiguous `parts` as one [sum rows, cols] view where each starts where the one before ends in one
    storage; else None."""
    first = parts[0]
    if not all(p.is_contiguous() and p.dtype == first.dtype and p.shape[1:] == first.shape[1:] for p in parts):
        return None
    at = first.data_ptr()
    for p in parts:
        if p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or p.data_ptr() != at:
            return None
        at += p.numel() * p.element_size()
    return first.as_strided((sum(p.shape[0] for p in parts), *first.shape[1:]), first.stride())
