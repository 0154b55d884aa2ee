"""The padded prefill path over the cache (`attention_after_prefix`): one call for a batch that mixes sequences
continuing a cached prefix with fresh ones equals attending each sequence alone over its whole context."""

import numpy as np
import torch
import torch.nn.functional as F

from asyncrl.engine.torch.paged_attention import (
    AttentionMetadata, after_prefix_layout, prefill_attention, store_kv,
)

BLOCKS, PAGE, KV_HEADS, HEADS, DIM = 16, 4, 2, 4, 8


def reference(q, k, v, new: int) -> torch.Tensor:
    """Sequence alone: q [new, heads, dim] are the last `new` of the context k, v [ctx, kv_heads, dim]."""
    ctx = k.shape[0]
    mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - new, ctx)[:, None]  # [new, ctx]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1)


def test_a_mixed_batch_in_one_call_equals_each_sequence_alone():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    k_cache = torch.zeros(BLOCKS, PAGE, KV_HEADS, DIM)
    v_cache = torch.zeros_like(k_cache)
    # (context length, cached tokens): a hit of two pages, a fresh prompt, a hit leaving one new token, a long hit
    shapes = [(11, 8), (6, 0), (5, 4), (13, 12)]
    free = list(rng.permutation(BLOCKS))
    contexts, new_q, new_rows, wants = [], [], [], []
    for ctx, cached in shapes:
        blocks = [free.pop() for _ in range(-(-ctx // PAGE))]
        slots = (np.asarray(blocks)[:, None] * PAGE + np.arange(PAGE)).reshape(-1)[:ctx].astype(np.int64)
        k, v = torch.randn(ctx, KV_HEADS, DIM), torch.randn(ctx, KV_HEADS, DIM)
        store_kv(k_cache, v_cache, k, v, torch.from_numpy(slots))  # cached tokens and the new ones (stored first)
        q = torch.randn(ctx - cached, HEADS, DIM)
        contexts.append(slots)
        new_q.append(q)
        wants.append(reference(q, k, v, ctx - cached))
        new_rows.append(slots[cached:])
    cached_lens = [c for _, c in shapes]
    meta = AttentionMetadata(is_prefill=True, slot_mapping=torch.from_numpy(np.concatenate(new_rows)),
                             seq_lens=[len(q) for q in new_q],
                             after_prefix=after_prefix_layout(contexts, cached_lens, torch.from_numpy))
    q = torch.cat(new_q)  # [num_tokens, heads, dim], packed in sequence order
    got = prefill_attention(q, None, None, meta, k_cache, v_cache, scale=DIM ** -0.5)
    assert got.shape == q.shape
    torch.testing.assert_close(got, torch.cat(wants), atol=1e-5, rtol=1e-5)
