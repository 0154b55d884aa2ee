"""Attention over the paged KV cache, the portable torch path (SDPA), and the metadata every path reads.
On GPU the model calls the Triton kernels instead, on the same cache layout: `kernels.ops.rotary_store` and
this module's `prefill_attention` at prefill, `kernels.attention.decode_attention` at decode (rotary and the new
token's KV store inside).

The portable path calls three functions per layer:

* `store_kv`: write the new tokens' K/V into their slots (slot = block_id * block_size + offset).
* `prefill_attention`: causal attention of each sequence's new tokens; in a batch where some sequence continues
  a prefix cached before (a prefix-cache hit), every sequence attends to its whole context read
  back from the cache, all in one padded, masked call (`AfterPrefix`).
* `decode_attention`: one query token per sequence against its cached context, gathered by block table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
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
    after_prefix: AfterPrefix | None = None  # prefill with a cache hit in the batch: every sequence padded to one call


@dataclass(kw_only=True, slots=True)
class AfterPrefix:
    """A prefill batch where some sequence continues a cached prefix, laid out for one padded attention call over
    the cache (every new token's KV is stored before attention, so each sequence's whole context is in the cache).
    b sequences, q_max = most new tokens, ctx_max = longest context (cached + new)."""

    q_rows: torch.Tensor  # [b, q_max] int64: packed row of each sequence's i-th new token (padding: its last one)
    k_slots: torch.Tensor  # [b, ctx_max] int64: cache slot of each context token (padding: slot 0, masked)
    mask: torch.Tensor  # [b, 1, q_max, ctx_max] bool: True = attend (causal within the context, none past it)
    valid: torch.Tensor  # [num_tokens] int64: flat index into [b * q_max] of each packed new token, in packed order


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
    if meta.after_prefix is None:
        return causal_attention(q, k, v, meta.seq_lens, scale)
    return attention_after_prefix(q, k_cache, v_cache, meta.after_prefix, scale)


def attention_after_prefix(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pad: AfterPrefix, scale: float
) -> torch.Tensor:
    """Every sequence of the batch in one masked call, its keys read back from the cache (one call per layer, not
    one per sequence: 128 continued episodes were 128 calls a layer). q: [num_tokens, num_heads, head_dim]
    -> [num_tokens, num_heads, head_dim]."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    b, q_max = pad.q_rows.shape
    qp = q[pad.q_rows]  # [b, q_max, heads, head_dim]
    kp = k_cache.view(-1, num_kv_heads, head_dim)[pad.k_slots]  # [b, ctx_max, kv_heads, head_dim]
    vp = v_cache.view(-1, num_kv_heads, head_dim)[pad.k_slots]
    out = F.scaled_dot_product_attention(
        qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), attn_mask=pad.mask, scale=scale, enable_gqa=True,
    )  # [b, heads, q_max, head_dim]
    return out.transpose(1, 2).reshape(b * q_max, *q.shape[1:])[pad.valid]


def after_prefix_layout(slots: list[np.ndarray], cached_lens: list[int], to: Callable[[np.ndarray], torch.Tensor]
                        ) -> AfterPrefix:
    """Host-side layout of `AfterPrefix` (numpy, no device sync): `slots[i]` ([context_i] int64) are the cache slots
    of sequence i's whole context, its first `cached_lens[i]` tokens cached, the rest its new tokens packed back to
    back in sequence order; `to` moves an int64 / bool array to the device."""
    new = np.asarray([len(s) - c for s, c in zip(slots, cached_lens, strict=True)], dtype=np.int64)  # [b]
    ctx = np.asarray([len(s) for s in slots], dtype=np.int64)  # [b]
    b, q_max, ctx_max = len(slots), int(new.max()), int(ctx.max())
    start = np.concatenate([[0], np.cumsum(new)[:-1]])  # [b] packed row of each sequence's first new token
    i = np.arange(q_max)
    q_rows = start[:, None] + np.minimum(i[None, :], new[:, None] - 1)  # [b, q_max]
    k_slots = np.zeros((b, ctx_max), dtype=np.int64)
    for row, s in enumerate(slots):
        k_slots[row, : len(s)] = s
    query_pos = (ctx - new)[:, None] + np.minimum(i[None, :], new[:, None] - 1)  # [b, q_max] position in its context
    mask = np.arange(ctx_max)[None, None, :] <= query_pos[:, :, None]  # [b, q_max, ctx_max]
    valid = (np.arange(b)[:, None] * q_max + i[None, :])[i[None, :] < new[:, None]]  # [num_tokens], row-major
    return AfterPrefix(q_rows=to(q_rows), k_slots=to(k_slots), mask=to(mask[:, None]), valid=to(valid))


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
