"""Fused GPU sampling: one pass over each row's logits gives the sampled token and its logprob.

Computes what `asyncrl.engine.torch.sampler.sample` does without truncation (temperature, Gumbel-max with
the counter-based noise of `asyncrl.engine.torch.rng`, full-vocabulary logprob), but reads the bf16 logits
once instead of materialising [batch, vocab] fp32 logits, noise and log-softmax. The noise is
-log(-log u): on a GPU the outer log is the hardware's approximate one (`lg2.approx`, absolute error
~1e-7 on the noise), so a token can differ from the torch sampler's only where two noisy values tie within
that; the inner log stays exact, because u near 1 needs it (-log u is then ~1e-7 itself, and it makes the
largest noise). Each log was a ~30-instruction libdevice call per vocabulary entry.
It needs no host sync and no generator state, so it runs inside the decode CUDA graph.

A forced row (scoring: `forced[row] >= 0`) returns the forced token and its logprob, taken from the
same scaled logits and the same run_max / run_sum normaliser as a sampled token's; the sampled rows'
arithmetic is untouched, so a forced token scores bitwise as sampling it did.

Two launches (split over the vocabulary, like flash-decoding over a context). Program (row, split) walks its
contiguous run of 2048-wide blocks making three reductions per block: the noisy max with its first position
(one `tl.max(..., return_indices=True)`) and the max and exp-sum of the online log-softmax; it writes those
four numbers. One program per row then folds the row's partials: the earliest split holding the largest noisy
value gives the token (so ties go to the first index, like argmax), the maxes and rescaled sums give the
normaliser, and the chosen token's scaled logit is loaded once, the same load and division as in the loop,
so its value is bitwise the one the loop saw.

Why split: one program per row walked all ~75 blocks of a 152k vocabulary in series; at batch 256 that is 256
programs (two per SM), latency-bound at 0.21 ms of the 0.5B decode graph's 1.64 ms of kernels (H200,
bench.decode_kernels). The split count depends on the vocabulary only (`vocab_splits`), so a row's bits do not
depend on the batch (deterministic mode's batch invariance).
"""

from __future__ import annotations

import torch

from asyncrl.engine.torch import rng
from asyncrl.engine.torch.triton_ops import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def _mix32(x):
        x = x ^ (x >> 16)
        x = x * tl.full([], 0x7FEB352D, tl.uint32)
        x = x ^ (x >> 15)
        x = x * tl.full([], 0x846CA68B, tl.uint32)
        return x ^ (x >> 16)

    @triton.jit
    def _sample_partial_kernel(logits_ptr, stride_l, temp_ptr, seed_ptr, step_ptr, part_f_ptr, part_i_ptr, vocab,
                               blocks_per_split, GOLDEN: tl.constexpr, BLOCK_V: tl.constexpr,
                               APPROX_LOG: tl.constexpr):
        """Program (row, split): the split's blocks of the row -> its noisy max and first position, and the
        online log-softmax's (max, exp-sum), in part_f [rows, splits, 3] fp32 / part_i [rows, splits] int32."""
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        splits = tl.num_programs(1)
        temp = tl.load(temp_ptr + row)
        greedy = temp <= 0.0
        temp = tl.where(greedy, 1.0, temp)
        seed = tl.load(seed_ptr + row)
        step = tl.load(step_ptr + row)
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
        first = split * blocks_per_split * BLOCK_V
        last = tl.minimum(first + blocks_per_split * BLOCK_V, vocab)
        for start in range(first, last, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < vocab
            scaled = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32) / temp
            x = _mix32(_mix32(cols.to(tl.uint32) ^ k1) ^ k2)
            u = ((x >> 9).to(tl.float32) + 0.5) * (2.0**-23)
            e = -tl.log(u)  # exact: for u near 1 this is tiny and sets the largest noise
            if APPROX_LOG:  # a GPU: one MUFU op (the interpreter has no libdevice)
                noise = -libdevice.fast_logf(e)
            else:
                noise = -tl.log(e)
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
        at = row * splits + split
        tl.store(part_f_ptr + at * 3, best)
        tl.store(part_f_ptr + at * 3 + 1, run_max)
        tl.store(part_f_ptr + at * 3 + 2, run_sum)
        tl.store(part_i_ptr + at, best_idx)

    @triton.jit
    def _sample_combine_kernel(logits_ptr, stride_l, temp_ptr, forced_ptr, part_f_ptr, part_i_ptr, out_ptr, stride_o,
                               splits, SPLITS_P2: tl.constexpr):
        """Program row: the row's partials in split order -> token (the first position of the largest noisy
        value: splits are contiguous, so the earliest split wins a tie) and its logprob."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, SPLITS_P2)
        live = offs < splits
        at = row * splits + offs
        bests = tl.load(part_f_ptr + at * 3, mask=live, other=float("-inf"))
        maxes = tl.load(part_f_ptr + at * 3 + 1, mask=live, other=float("-inf"))
        sums = tl.load(part_f_ptr + at * 3 + 2, mask=live, other=0.0)
        idxs = tl.load(part_i_ptr + at, mask=live, other=0)
        _, winner = tl.max(bests, axis=0, return_indices=True, return_indices_tie_break_left=True)
        best_idx = tl.sum(tl.where(offs == winner, idxs, 0), axis=0)
        run_max = tl.max(maxes, axis=0)
        run_sum = tl.sum(sums * tl.exp(maxes - run_max), axis=0)  # a split of -inf logits adds 0 * 0
        temp = tl.load(temp_ptr + row)
        temp = tl.where(temp <= 0.0, 1.0, temp)
        forced = tl.load(forced_ptr + row)  # int64; -1: sample
        token = tl.where(forced >= 0, forced, best_idx.to(tl.int64))
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
    part_f = torch.empty((batch, splits, 3), dtype=torch.float32, device=logits.device)  # best, max, exp-sum
    part_i = torch.empty((batch, splits), dtype=torch.int32, device=logits.device)  # position of best
    _sample_partial_kernel[(batch, splits)](
        logits, logits.stride(0), temperatures, seeds, steps, part_f, part_i, vocab, per,
        GOLDEN=rng._GOLDEN, BLOCK_V=BLOCK_V, APPROX_LOG=logits.is_cuda, num_warps=8,
    )
    _sample_combine_kernel[(batch,)](
        logits, logits.stride(0), temperatures, forced, part_f, part_i, out, out.stride(0), splits,
        SPLITS_P2=triton.next_power_of_2(splits), num_warps=1,
    )
    return out[:, :batch]
