"""Building blocks of the compact decoder: RMSNorm, rotary embedding, SwiGLU MLP.

Numerics follow the Hugging Face Llama/Qwen code (norm in fp32, cos/sin in fp32 then cast), so the
engine's logprobs match a Hugging Face forward of the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for the positions of one batch; `inv_freq` comes from the Hugging Face model so
    every static RoPE variant (default, linear, llama3, yarn) is reproduced exactly."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)  # [head_dim / 2]
        self.attention_scaling = attention_scaling

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [num_tokens, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [num_tokens, head_dim]
        cos = (emb.cos() * self.attention_scaling).to(dtype)
        sin = (emb.sin() * self.attention_scaling).to(dtype)
        return cos, sin


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim]; cos, sin: [num_tokens, head_dim]."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
