"""Triton kernel of the LoRA merge on a GPU: out = W + scale * B @ A in one pass over W.

`adapter_merge.merge_into` in torch writes B @ A as an fp32 temporary the size of W, reads it back with W and
rounds the sum into `out`: per element 2 bytes of W read, 4 of the product written and read, 2 of `out` written
(12 bytes; 20 when the scale is no power of two), and its fp32 GEMM runs on the CUDA cores. For the 6.5 B
targeted weights of a 7B model that is ~80 GB of traffic and ~830 GFLOP of fp32 work at every adapter push, while
the engine is paused. This kernel computes each [BLOCK_M, BLOCK_N] tile of B @ A in registers (fp32 inputs on the
tensor cores in three TF32 passes, "tf32x3", whose error is that of fp32 to within a few ulps), adds the tile of W
and stores the rounded sum: 4 bytes per element (W read, `out` written).

    out [M, N] (W's dtype, or fp32)  =  W [M, N]  +  scale * (B [M, R] @ A [R, N])     (sum in fp32, one rounding)

It is not bit for bit torch's `merge_into` (the partial sums of B @ A run in another order and with another
split of fp32), so every merge on a GPU goes through it, the engine's (adapter pushes) and the learner's merged
stream (`asyncrl.learner.lora.merge_weight`) alike: both sides keep giving the same bits on one kind of device.
On a CPU (and where Triton is missing) the torch form stays.
"""

from __future__ import annotations

import torch

from asyncrl.engine.torch.kernels.ops import HAS_TRITON, runs_on

BLOCK_M, BLOCK_N = 64, 128
MAX_BLOCK_R = 64  # rank chunk a program multiplies at once (r = 64, the 7B recipe's rank: one chunk)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _merge_kernel(w_ptr, a_ptr, b_ptr, out_ptr, scale, M, N, R, stride_w, stride_a, stride_b, stride_out,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                      R_CHUNKS: tl.constexpr, PRECISION: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] of M
        cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] of N
        in_rows, in_cols = rows[:, None] < M, cols[None, :] < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for chunk in tl.static_range(R_CHUNKS):  # ceil(R / BLOCK_R): one for r <= 64
            ranks = chunk * BLOCK_R + tl.arange(0, BLOCK_R)
            b = tl.load(b_ptr + rows[:, None] * stride_b + ranks[None, :], mask=in_rows & (ranks[None, :] < R),
                        other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_R]
            a = tl.load(a_ptr + ranks[:, None] * stride_a + cols[None, :], mask=(ranks[:, None] < R) & in_cols,
                        other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_N]
            acc += tl.dot(b, a, input_precision=PRECISION)
        mask = in_rows & in_cols
        w = tl.load(w_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = w + acc * scale
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernel merges these: Triton present and every tensor where its kernels run (a GPU, or the
    interpreter under TRITON_INTERPRET=1)."""
    return HAS_TRITON and all(runs_on(t) for t in tensors)


def merge_into(out: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
               scale: float) -> None:
    """out [M, N] = weight [M, N] + scale * lora_b [M, R] @ lora_a [R, N], summed in fp32, rounded once to out's
    dtype. `out` may be `weight` itself. Rows must be contiguous (stride 1 along the last dimension)."""
    m, n = weight.shape
    r = lora_a.shape[0]
    if lora_a.shape != (r, n) or lora_b.shape != (m, r) or out.shape != (m, n):
        raise ValueError(f"lora merge: W {tuple(weight.shape)}, A {tuple(lora_a.shape)}, B {tuple(lora_b.shape)}, "
                         f"out {tuple(out.shape)}: want A [r, {n}], B [{m}, r], out [{m}, {n}]")
    if any(t.stride(-1) != 1 for t in (out, weight, lora_a, lora_b)):
        raise ValueError("lora merge: every operand's rows must be contiguous")
    block_r = max(16, min(MAX_BLOCK_R, triton.next_power_of_2(r)))
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    precision = "tf32x3" if out.is_cuda else "ieee"  # the interpreter computes in fp32 anyway
    _merge_kernel[grid](weight, lora_a, lora_b, out, float(scale), m, n, r, weight.stride(0), lora_a.stride(0),
                        lora_b.stride(0), out.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_R=block_r,
                        R_CHUNKS=triton.cdiv(r, block_r), PRECISION=precision)
