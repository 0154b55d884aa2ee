"""Attention over the paged KV cache, the portable torch path (SDPA), and the metadata every path reads.
On GPU the model calls the Triton kernels instead, on the same cache layout: `kernels.ops.rotary_store` and
this module's `prefill_attention` at prefill, `kernels.attention.decode_attention` at decode (rotary and the new
token's KV store inside).

The portable path calls three functions per layer:

* `store_kv`: write the new tokens' K/V into their slots (slot = block_id * block_size + offset).
* `prefill_attention`: causal attention of each sequence's new tokens; a sequence that continues a prefix
  cached before (a prefix-cache hit, `cached_lens`) attends to that prefix's KV too, read back from the cache.
* `decode_attention`: one query token per sequence against its cached context, gathered by block table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(kw_only=True, slots=True)
class AttentionMetadata:
    is_prefill: bool
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token
    seq_lens: list[int]  # prefill: new tokens per sequence (they are packed back to back)
    block_tables: torch.Tensor | None = None  # decode: [batch, max_blocks] int64, padded with 0
    context_lens: torch.Tensor | None = None  # decode: [batch] int64, cached tokens incl. the new one
    single_pass: bool = False  # decode: one pass over each context, never split (`kernels.attention.decode_attention`)
    cached_lens: list[int] | None = None  # prefill: tokens of each sequence already in the cache; None: none
    context_slots: torch.Tensor | None = None  # prefill: [sum of cached + new tokens] slots of every token of the
    # sequences with cached_lens > 0, in order (their cached tokens, then their new ones)


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim];
    k, v: [num_tokens, num_kv_heads, head_dim]."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, k_cache: torch.Tensor,
    v_cache: torch.Tensor, scale: float,
) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim], the new tokens, already
    stored in the caches ([num_blocks, block_size, num_kv_heads, head_dim]) -> [num_tokens, num_heads, head_dim]."""
    if meta.cached_lens is None:
        return causal_attention(q, k, v, meta.seq_lens, scale)
    outs, start = [], 0
    for qs, ks, vs, cached in zip(q.split(meta.seq_lens), k.split(meta.seq_lens), v.split(meta.seq_lens),
                                  meta.cached_lens, strict=True):
        if not cached:
            outs.append(causal_attention(qs, ks, vs, [len(qs)], scale))
            continue
        slots = meta.context_slots[start : start + cached + len(qs)]
        start += len(slots)
        outs.append(attention_after_prefix(qs, k_cache, v_cache, slots, scale))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def attention_after_prefix(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [new, num_heads, head_dim], the last `new` tokens of one sequence whose every token's KV is in the cache at
    `slots` ([context] int64) -> [new, num_heads, head_dim]: each query attends to the keys up to its own."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k = k_cache.view(-1, num_kv_heads, head_dim)[slots]  # [context, kv_heads, head_dim]
    v = v_cache.view(-1, num_kv_heads, head_dim)[slots]
    positions = torch.arange(len(slots), device=q.device)
    mask = positions[None, :] <= positions[len(slots) - len(q):, None]  # [new, context], True = attend
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask,
        scale=scale, enable_gqa=True,
    )  # [1, heads, new, head_dim]
    return out[0].transpose(0, 1)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float
) -> torch.Tensor:
    """Causal attention within each of the packed sequences: q: [num_tokens, num_heads, head_dim];
    k, v: [num_tokens, num_kv_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
    if len(set(seq_lens)) == 1:  # equal lengths: one batched call
        b, n = len(seq_lens), seq_lens[0]
        out = F.scaled_dot_product_attention(
            *(t.view(b, n, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v)),
            is_causal=True, scale=scale, enable_gqa=True,
        )  # [b, heads, len, head_dim]
        return out.transpose(1, 2).reshape(q.shape)
    outs = []
    for qs, ks, vs in zip(q.split(seq_lens), k.split(seq_lens), v.split(seq_lens), strict=True):
        out = F.scaled_dot_product_attention(
            qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None],  # [1, heads, len, head_dim]
            is_causal=True, scale=scale, enable_gqa=True,
        )
        outs.append(out[0].transpose(0, 1))  # [len, num_heads, head_dim]
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """q: [batch, num_heads, head_dim] -> [batch, num_heads, head_dim]."""
    assert meta.block_tables is not None and meta.context_lens is not None
    return decode_attention_torch(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale)


def decode_attention_torch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """The portable path (and the tests' reference for the Triton kernels): gathers every column of
    the block tables and masks past each context. q: [batch, num_heads, head_dim];
    block_tables: [batch, max_blocks]; context_lens: [batch] -> [batch, num_heads, head_dim]."""
    batch, max_blocks = block_tables.shape
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    ctx = max_blocks * block_size
    # [batch, num_kv_heads, ctx, head_dim]
    k = k_cache[block_tables].view(batch, ctx, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache[block_tables].view(batch, ctx, num_kv_heads, head_dim).transpose(1, 2)
    positions = torch.arange(ctx, device=q.device)
    mask = positions[None, :] < context_lens[:, None]  # [batch, ctx], True = attend
    out = F.scaled_dot_product_attention(
        q[:, :, None, :], k, v, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True
    )  # [batch, num_heads, 1, head_dim]
    return out[:, :, 0, :]
