"""Self-attention layer of the compact decoder: projections (GQA, optional qkv bias and q/k norm),
rotary embedding, then the paged-cache attention of `asyncrl.engine.paged_attention`."""

from __future__ import annotations

import torch
from torch import nn

from asyncrl.engine.model.config import ArchConfig
from asyncrl.engine.model.layers import RMSNorm, apply_rotary
from asyncrl.engine.paged_attention import AttentionMetadata, decode_attention, prefill_attention, store_kv


class Attention(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        cos: torch.Tensor,  # [num_tokens, head_dim]
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)  # [num_tokens, num_heads, head_dim]
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)  # [num_tokens, num_kv_heads, head_dim]
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        if meta.is_prefill:
            out = prefill_attention(q, k, v, meta.seq_lens, self.scale)
        else:
            out = decode_attention(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))
