"""Fused GPU sampling: each row's logits -> the sampled token and its logprob, inside the decode CUDA graph.

Computes what `asyncrl.engine.torch.sampler.sample` does without truncation (temperature, inverse-CDF sampling
with the row's counter-based uniform from `asyncrl.engine.torch.rng`, full-vocabulary logprob), but reads the
bf16 logits in place instead of materialising [batch, vocab] fp32 logits and log-softmax. No host sync and no
generator state.

Two launches (split over the vocabulary, like flash-decoding over a context):
1. Program (row, split) walks its contiguous run of 2048-wide blocks with two reductions per block: the max with
   its first position (one `tl.max(..., return_indices=True)`) and the exp-sum of the online log-softmax.
2. One program per row folds the partials into the normaliser (max, exp-sum), draws the row's uniform u, finds the
   split where the running mass crosses u * total, and rescans that split's blocks (at most five of 2048 at a
   152k vocabulary) with a cumulative sum to find the token. Greedy rows take the first position of the maximum
   (the earliest split wins a tie, like argmax). The token's scaled logit is loaded once, with the same load and
   division as the partials' loop, so its logprob uses the value the normaliser saw.

The token can differ from the torch sampler's only where u * total falls within rounding of a boundary between two
tokens' cumulative masses (the two sum in other orders): about one draw in 10^6 or fewer.

Why not Gumbel-max (argmax of logits + noise, the previous rule): it needs a hash and two logarithms for every
vocabulary entry, ~130 us of the 0.5B decode step at batch 256 (H200), ALU-bound; inverse CDF needs one exp per
entry, which the logprob's normaliser computes anyway, and one 32-bit hash per row.

A forced row (scoring: `forced[row] >= 0`) returns the forced token and its logprob, taken from the
same scaled logits and the same normaliser as a sampled token's; the sampled rows' arithmetic is untouched, so a
forced token scores bitwise as sampling it did.

Why split: one program per row walking all ~75 blocks of a 152k vocabulary in series made 256 programs at batch
256 (two per SM), latency-bound (H200, bench.decode_kernels). The split count depends on the vocabulary only (`vocab_splits`), so a row's bits do not
depend on the batch (deterministic mode's batch invariance).
"""

from __future__ import annotations

import torch

from asyncrl.engine.torch import rng
from asyncrl.engine.torch.kernels.ops import HAS_TRITON, pdl

if HAS_TRITON:
    import triton
    import triton.language as tl

    from asyncrl.engine.torch.kernels.ops import dependent_launch

    @triton.jit
    def _mix32(x):
        x = x ^ (x >> 16)
        x = x * tl.full([], 0x7FEB352D, tl.uint32)
        x = x ^ (x >> 15)
        x = x * tl.full([], 0x846CA68B, tl.uint32)
        return x ^ (x >> 16)

    @triton.jit
    def _sample_partial_kernel(logits_ptr, stride_l, temp_ptr, part_f_ptr, part_i_ptr, vocab, blocks_per_split,
                               BLOCK_V: tl.constexpr, PDL: tl.constexpr):
        """Program (row, split): the split's blocks of the row -> the online log-softmax's (max, exp-sum) of the
        scaled logits in part_f [rows, splits, 2] fp32 and the max's first position in part_i [rows, splits]."""
        dependent_launch(PDL)
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        splits = tl.num_programs(1)
        temp = tl.load(temp_ptr + row)
        temp = tl.where(temp <= 0.0, 1.0, temp)
        best_idx = tl.full([], 0, tl.int32)
        run_max = tl.full([], float("-inf"), tl.float32)
        run_sum = tl.full([], 0.0, tl.float32)
        base = logits_ptr + row * stride_l
        first = split * blocks_per_split * BLOCK_V
        last = tl.minimum(first + blocks_per_split * BLOCK_V, vocab)
        for start in range(first, last, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            scaled = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32) / temp
            # the block's max and its first position in one reduction (ties keep the earlier index, like argmax)
            block_max, block_pos = tl.max(scaled, axis=0, return_indices=True, return_indices_tie_break_left=True)
            best_idx = tl.where(block_max > run_max, start + block_pos, best_idx)
            new_max = tl.maximum(run_max, block_max)
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(scaled - new_max), axis=0)
            run_max = new_max
        at = row * splits + split
        tl.store(part_f_ptr + at * 2, run_max)
        tl.store(part_f_ptr + at * 2 + 1, run_sum)
        tl.store(part_i_ptr + at, best_idx)

    @triton.jit
    def _row_uniform(seed, step, GOLDEN: tl.constexpr):
        """`rng.row_uniform` of one row: (seed int64, step int64) -> fp32 in (0, 1)."""
        lo = (seed & 0xFFFFFFFF).to(tl.uint32)
        hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
        golden = tl.full([], GOLDEN, tl.uint32)
        k1 = _mix32(lo ^ _mix32(hi ^ _mix32((step & 0xFFFFFFFF).to(tl.uint32) ^ golden)))
        k2 = _mix32(k1 ^ golden)
        x = _mix32(_mix32(k1) ^ k2)  # column 0 of rng.uniform
        return ((x >> 9).to(tl.float32) + 0.5) * (2.0**-23)

    @triton.jit
    def _sample_combine_kernel(logits_ptr, stride_l, temp_ptr, seed_ptr, step_ptr, forced_ptr, part_f_ptr, part_i_ptr,
                               out_ptr, stride_o, vocab, splits, blocks_per_split, GOLDEN: tl.constexpr,
                               SPLITS_P2: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr):
        """Program row: the row's partials in split order -> the normaliser, then the token (`sampler.inverse_cdf`:
        the split where the running mass crosses u * total, then that split's blocks rescanned; greedy: the first
        position of the largest scaled logit) and its logprob."""
        dependent_launch(PDL)
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, SPLITS_P2)
        live = offs < splits
        at = row * splits + offs
        maxes = tl.load(part_f_ptr + at * 2, mask=live, other=float("-inf"))
        sums = tl.load(part_f_ptr + at * 2 + 1, mask=live, other=0.0)
        idxs = tl.load(part_i_ptr + at, mask=live, other=0)
        run_max, winner = tl.max(maxes, axis=0, return_indices=True, return_indices_tie_break_left=True)
        greedy_idx = tl.sum(tl.where(offs == winner, idxs, 0), axis=0)  # the earliest split wins a tie
        mass = tl.where(live, sums * tl.exp(maxes - run_max), 0.0)  # each split's exp-sum against the row's max
        run_sum = tl.sum(mass, axis=0)
        temp = tl.load(temp_ptr + row)
        greedy = temp <= 0.0
        temp = tl.where(greedy, 1.0, temp)
        # inverse CDF: the split holding the crossing, then its blocks
        target = _row_uniform(tl.load(seed_ptr + row), tl.load(step_ptr + row), GOLDEN) * run_sum
        below = live & (tl.cumsum(mass, axis=0) <= target)
        last_split = tl.max(tl.where(live & (mass > 0), offs, 0), axis=0)
        chosen = tl.minimum(tl.sum(below.to(tl.int32), axis=0), last_split)
        acc = tl.sum(tl.where(offs < chosen, mass, 0.0), axis=0)  # the mass before the chosen split
        first = chosen * blocks_per_split * BLOCK_V
        last = tl.minimum(first + blocks_per_split * BLOCK_V, vocab)
        base = logits_ptr + row * stride_l
        sampled = tl.full([], -1, tl.int32)
        last_pos = first
        for start in range(first, last, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            p = tl.exp(tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32) / temp - run_max)
            hit = (acc + tl.cumsum(p, axis=0) > target) & (p > 0)
            pos = tl.min(tl.where(hit, cols, vocab), axis=0)
            sampled = tl.where((sampled < 0) & (pos < vocab), pos, sampled)
            last_pos = tl.maximum(last_pos, tl.max(tl.where(p > 0, cols, -1), axis=0))
            acc += tl.sum(p, axis=0)
        sampled = tl.where(sampled < 0, last_pos, sampled)  # rounding left no crossing: the last possible token
        forced = tl.load(forced_ptr + row)  # int64; -1: sample
        token = tl.where(forced >= 0, forced, tl.where(greedy, greedy_idx, sampled).to(tl.int64))
        # the token's scaled logit: the same load and division as the partials kernel's
        picked = tl.load(logits_ptr + row * stride_l + token).to(tl.float32) / temp
        tl.store(out_ptr + row, token.to(tl.float64))
        logprob = picked - run_max - tl.log(run_sum)
        tl.store(out_ptr + stride_o + row, logprob.to(tl.float64))


BLOCK_V = 2048  # vocabulary entries per loop iteration of a program
MAX_SPLITS = 16  # programs per row; a function of the vocabulary alone, so a row's result never depends on the batch


def vocab_splits(vocab: int) -> tuple[int, int]:
    """-> (splits, blocks per split): the row's ceil(vocab / BLOCK_V) blocks in at most MAX_SPLITS contiguous runs,
    none empty (151,936 entries: 75 blocks in 15 splits of 5)."""
    blocks = -(-vocab // BLOCK_V)
    per = -(-blocks // MAX_SPLITS)
    return -(-blocks // per), per


def sample_fused(
    logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
    forced: torch.Tensor | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits: [batch, vocab] (any float dtype, last dim contiguous); temperatures [batch] fp32
    (0 = greedy); seeds, steps [batch] int64; forced [batch] int64 in [0, vocab) or -1 = sample (None:
    sample every row). -> [2, batch] float64: row 0 the tokens, row 1 their logprobs (one tensor, so
    the host reads both with a single copy). out: [2, >= batch] float64 with contiguous rows to write
    into (the result is then out[:, :batch]); a new tensor when None."""
    batch, vocab = logits.shape
    assert logits.stride(1) == 1
    if forced is None:
        forced = torch.full_like(steps, -1)
    if out is None:
        out = torch.empty((2, batch), dtype=torch.float64, device=logits.device)
    assert out.dtype == torch.float64 and out.shape[0] == 2 and out.shape[1] >= batch and out.stride(1) == 1
    splits, per = vocab_splits(vocab)
    part_f = torch.empty((batch, splits, 2), dtype=torch.float32, device=logits.device)  # max, exp-sum
    part_i = torch.empty((batch, splits), dtype=torch.int32, device=logits.device)  # position of the max
    _sample_partial_kernel[(batch, splits)](
        logits, logits.stride(0), temperatures, part_f, part_i, vocab, per, BLOCK_V=BLOCK_V, num_warps=8,
        **pdl(logits),
    )
    _sample_combine_kernel[(batch,)](
        logits, logits.stride(0), temperatures, seeds, steps, forced, part_f, part_i, out, out.stride(0), vocab,
        splits, per, GOLDEN=rng._GOLDEN, SPLITS_P2=triton.next_power_of_2(splits), BLOCK_V=BLOCK_V, num_warps=8,
        **pdl(logits),
    )
    return out[:, :batch]
