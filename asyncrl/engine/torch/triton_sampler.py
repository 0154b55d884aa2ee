"""Fused GPU sampling: one pass over each row's logits gives the sampled token and its logprob.

Computes exactly what `asyncrl.engine.torch.sampler.sample` does without truncation (temperature,
Gumbel-max with the counter-based noise of `asyncrl.engine.torch.rng`, full-vocabulary logprob), but reads
the bf16 logits once instead of materialising [batch, vocab] fp32 logits, noise and log-softmax.
It needs no host sync and no generator state, so it runs inside the decode CUDA graph.

A forced row (scoring: `forced[row] >= 0`) returns the forced token and its logprob, taken from the
same scaled logits and the same run_max / run_sum normaliser as a sampled token's; the sampled rows'
arithmetic is untouched, so a forced token scores bitwise as sampling it did.

Per block of the vocabulary the loop makes three reductions: the noisy max with its first position (one
`tl.max(..., return_indices=True)`), and the max and exp-sum of the online log-softmax. The chosen token's
scaled logit is loaded once after the loop, the same load and division as in the loop, so its value is
bitwise the one the loop saw. (The loop used to find that value, and a forced token's, with three more masked
reductions per block.)
"""

from __future__ import annotations

import torch

from asyncrl.engine.torch import rng
from asyncrl.engine.torch.triton_ops import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _mix32(x):
        x = x ^ (x >> 16)
        x = x * tl.full([], 0x7FEB352D, tl.uint32)
        x = x ^ (x >> 15)
        x = x * tl.full([], 0x846CA68B, tl.uint32)
        return x ^ (x >> 16)

    @triton.jit
    def _sample_kernel(logits_ptr, stride_l, temp_ptr, seed_ptr, step_ptr, forced_ptr, out_ptr, vocab,
                       GOLDEN: tl.constexpr, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        temp = tl.load(temp_ptr + row)
        greedy = temp <= 0.0
        temp = tl.where(greedy, 1.0, temp)
        seed = tl.load(seed_ptr + row)
        step = tl.load(step_ptr + row)
        forced = tl.load(forced_ptr + row)  # int64; -1: sample
        lo = (seed & 0xFFFFFFFF).to(tl.uint32)
        hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
        golden = tl.full([], GOLDEN, tl.uint32)
        k1 = _mix32(lo ^ _mix32(hi ^ _mix32((step & 0xFFFFFFFF).to(tl.uint32) ^ golden)))
        k2 = _mix32(k1 ^ golden)
        best = tl.full([], float("-inf"), tl.float32)
        best_idx = tl.full([], 0, tl.int32)
        run_max = tl.full([], float("-inf"), tl.float32)
        run_sum = tl.full([], 0.0, tl.float32)
        base = logits_ptr + row * stride_l
        for start in range(0, vocab, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < vocab
            scaled = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32) / temp
            x = _mix32(_mix32(cols.to(tl.uint32) ^ k1) ^ k2)
            u = ((x >> 9).to(tl.float32) + 0.5) * (2.0**-23)
            noise = -tl.log(-tl.log(u))
            val = tl.where(greedy, scaled, scaled + noise)
            val = tl.where(mask, val, float("-inf"))
            # the block's max and its first position in one reduction (ties keep the earlier index, like argmax)
            chunk_best, chunk_pos = tl.max(val, axis=0, return_indices=True, return_indices_tie_break_left=True)
            better = chunk_best > best
            best_idx = tl.where(better, start + chunk_pos, best_idx)
            best = tl.where(better, chunk_best, best)
            new_max = tl.maximum(run_max, tl.max(scaled, axis=0))
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(scaled - new_max), axis=0)
            run_max = new_max
        is_forced = forced >= 0
        token = tl.where(is_forced, forced, best_idx.to(tl.int64))
        # the token's scaled logit, read once after the loop: the same load and division as inside it
        picked = tl.load(base + token).to(tl.float32) / temp
        tl.store(out_ptr + row, token.to(tl.float64))
        logprob = picked - run_max - tl.log(run_sum)
        tl.store(out_ptr + tl.num_programs(0) + row, logprob.to(tl.float64))


def sample_fused(
    logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
    forced: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits: [batch, vocab] (any float dtype, last dim contiguous); temperatures [batch] fp32
    (0 = greedy); seeds, steps [batch] int64; forced [batch] int64 in [0, vocab) or -1 = sample (None:
    sample every row). -> [2, batch] float64: row 0 the tokens, row 1 their logprobs (one tensor, so
    the host reads both with a single copy)."""
    batch, vocab = logits.shape
    assert logits.stride(1) == 1
    if forced is None:
        forced = torch.full_like(steps, -1)
    out = torch.empty((2, batch), dtype=torch.float64, device=logits.device)
    _sample_kernel[(batch,)](
        logits, logits.stride(0), temperatures, seeds, steps, forced, out, vocab,
        GOLDEN=rng._GOLDEN, BLOCK_V=2048, num_warps=8,
    )
    return out
