"""Self-attention layer of the compact decoder: projections (GQA, optional qkv bias and q/k norm),
rotary embedding, then the paged-cache attention of `asyncrl.engine.torch.paged_attention`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from asyncrl.engine.torch import kernels
from asyncrl.engine.torch.model.config import ArchConfig
from asyncrl.engine.torch.model.fp8 import Fp8Input, Fp8Linear
from asyncrl.engine.torch.model.low_rank import LowRank
from asyncrl.engine.torch.model.layers import (
    RMSNorm,
    RotaryEmbedding,
    apply_rotary,
    fuse_linears,
)
from asyncrl.engine.torch.paged_attention import (
    AttentionMetadata,
    decode_attention,
    prefill_attention,
    store_kv,
)


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
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by fuse()
        self.qkv_fp8: Fp8Linear | None = None  # fp8 images of qkv and o_proj (FP8 rollouts: fp8.py)
        self.o_fp8: Fp8Linear | None = None
        self.qkv_lora: LowRank | None = None  # LoRA adapters kept unmerged (low_rank.py)
        self.o_lora: LowRank | None = None

    def fuse(self) -> None:
        """One [q + k + v, hidden] projection; q_proj / k_proj / v_proj parameters become views of it."""
        if self.qkv is None:
            self.qkv = fuse_linears(self.q_proj, self.k_proj, self.v_proj)

    def project(self, x: torch.Tensor | Fp8Input) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [n, hidden] (or its fp8 form, when qkv_fp8 is set) -> q [n, heads, d], k, v [n, kv_heads, d] (views
        of one matmul when fused)."""
        n, d = x.shape[0], self.head_dim
        if self.qkv is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            sizes = [self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d]
            qkv = self.qkv_fp8(x) if self.qkv_fp8 is not None else F.linear(x, *self.qkv)  # [n, q + k + v]
            if self.qkv_lora is not None:
                qkv = self.qkv_lora(x, qkv)
            q, k, v = qkv.split(sizes, -1)
        return q.view(n, self.num_heads, d), k.view(n, self.num_kv_heads, d), v.view(n, self.num_kv_heads, d)

    def forward(
        self,
        x: torch.Tensor | Fp8Input,  # [num_tokens, hidden]
        rotary: RotaryEmbedding,
        positions: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.project(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if kernels.ops.enabled(q):
            cos, sin = rotary.tables(rotary.max_positions, q.dtype, q.device)
            if meta.is_prefill:
                q, k = kernels.ops.rotary_store(
                    q, k, v, positions, cos, sin, meta.slot_mapping, k_cache, v_cache, want_k=True
                )
                out = prefill_attention(q, k, v, meta, k_cache, v_cache, self.scale)
            else:  # the attention kernel rotates the step's own token and writes its KV
                new = kernels.attention.NewTokens(k, v, positions, cos, sin, meta.slot_mapping)
                out = kernels.attention.decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens,
                                                        self.scale, meta.single_pass, new)
        else:
            cos, sin = rotary(positions, q.dtype)  # [num_tokens, head_dim]
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
            if meta.is_prefill:
                out = prefill_attention(q, k, v, meta, k_cache, v_cache, self.scale)
            else:
                out = decode_attention(q, k_cache, v_cache, meta, self.scale)
        out = out.reshape(n, self.num_heads * self.head_dim)
        y = self.o_fp8(out) if self.o_fp8 is not None else self.o_proj(out)  # [n, hidden]
        return y if self.o_lora is None else self.o_lora(out, y)
