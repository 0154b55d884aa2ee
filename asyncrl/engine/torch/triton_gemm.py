"""Triton GEMMs for the decode step's projections: `linear` (x @ W.T + b), `silu_linear` (SwiGLU's
gate/up projection with its activation in the epilogue) and `linear_partials` (split over K, fp32 partial
sums left for the next kernel to fold, `triton_ops.add_rmsnorm_partials`).

Why: at decode, M (the batch) is a few hundred rows, so cuBLAS picks kernels that leave SMs idle or
split K and reduce in a second launch, and SwiGLU's activation is a kernel of its own between two GEMMs.
These kernels take the decode shapes (M <= a few hundred, K a multiple of the K tile) and fall back to
nothing: the caller (`DecodeGemms`) decides per shape whether they run, from a table of configurations
measured on the H200 (`bench.decode_gemms`).

Rounding is that of the Hugging Face eager code each one replaces: `linear` rounds acc + bias once to the
output dtype (cuBLAS's bias epilogue); `silu_linear` rounds gate and up to the output dtype first, then
silu(gate) and the product, as `triton_ops.silu_mul` does after a cuBLAS GEMM; `linear_partials` leaves fp32
partials whose in-order sum the consumer rounds once (what a split-K GEMM does in its own reduce). Only the
accumulation order inside the dot products differs from cuBLAS, and it depends on (N, K) and the
configuration alone, never on M or the other rows: a row's result is batch-invariant for a fixed config.

Grid: (M tiles, N tiles, K splits), M tiles fastest, so the programs that read one weight tile are launched
together (the second reads it from L2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.engine.torch.triton_ops import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl


@dataclass(frozen=True, slots=True)
class GemmConfig:
    """One launch configuration: tile sizes, warps, pipeline stages and K splits (split > 1 only for
    `linear_partials`)."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    split: int = 1

    @property
    def name(self) -> str:
        return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.warps}s{self.stages}x{self.split}"


if HAS_TRITON:

    @triton.jit
    def _dot_tiles(x_ptr, w_ptr, offs_m, offs_n, k_start, stride_xm, stride_wn, K_TILES: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """acc [BLOCK_M, BLOCK_N] fp32 = x[offs_m, K range] @ w[offs_n, K range].T over K_TILES tiles from k_start."""
        offs_k = k_start + tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K_TILES):
            a = tl.load(x_ptrs)  # [BLOCK_M, BLOCK_K]
            b = tl.load(w_ptrs)  # [BLOCK_N, BLOCK_K]
            acc = tl.dot(a, tl.trans(b), acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        return acc

    @triton.jit
    def _offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Rows and columns of this program's tile, wrapped into range for the loads (stores mask them)."""
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        return rows, cols, (rows % M).to(tl.int64), (cols % N).to(tl.int64)

    @triton.jit
    def _linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_om, K: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows, cols, offs_m, offs_n = _offsets(M, N, BLOCK_M, BLOCK_N)
        acc = _dot_tiles(x_ptr, w_ptr, offs_m, offs_n, 0, stride_xm, stride_wn, K // BLOCK_K,
                         BLOCK_M, BLOCK_N, BLOCK_K)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n).to(tl.float32)[None, :]
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_om, K: tl.constexpr,
                            HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr):
        """w: [2N, K], gate rows then up rows; out [M, N] = silu(x @ gate.T) * (x @ up.T)."""
        rows, cols, offs_m, offs_n = _offsets(M, N, BLOCK_M, BLOCK_N)
        dt = out_ptr.dtype.element_ty
        # gate and up walk K in one loop: x's tile is loaded once for both dot products
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        g_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
        u_ptrs = g_ptrs + N * stride_wn
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K // BLOCK_K):
            a = tl.load(x_ptrs)
            acc_g = tl.dot(a, tl.trans(tl.load(g_ptrs)), acc_g)
            acc_u = tl.dot(a, tl.trans(tl.load(u_ptrs)), acc_u)
            x_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        if HAS_BIAS:
            acc_g += tl.load(b_ptr + offs_n).to(tl.float32)[None, :]
            acc_u += tl.load(b_ptr + N + offs_n).to(tl.float32)[None, :]
        g = acc_g.to(dt).to(tl.float32)  # the gate_up GEMM's output rounding
        u = acc_u.to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # silu_mul's roundings
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :], (s * u).to(dt), mask=mask)

    @triton.jit
    def _partials_kernel(x_ptr, w_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_os, stride_om,
                         K_TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """out[s] (fp32) = x[:, K slice s] @ w[:, K slice s].T, K slice s = K_TILES tiles from s * K_TILES."""
        rows, cols, offs_m, offs_n = _offsets(M, N, BLOCK_M, BLOCK_N)
        split = tl.program_id(2)
        acc = _dot_tiles(x_ptr, w_ptr, offs_m, offs_n, split * K_TILES * BLOCK_K, stride_xm, stride_wn, K_TILES,
                         BLOCK_M, BLOCK_N, BLOCK_K)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        tl.store(out_ptr + split * stride_os + rows[:, None].to(tl.int64) * stride_om + cols[None, :], acc, mask=mask)


def fits(x: torch.Tensor, weight: torch.Tensor, cfg: GemmConfig) -> bool:
    """Whether the kernels take these operands with cfg: row-major bf16/fp16 tensors on one CUDA device (or the
    interpreter), K a multiple of the K tile (times the splits)."""
    from asyncrl.engine.torch.triton_ops import runs_on

    k = x.shape[-1]
    return (runs_on(x) and x.dim() == 2 and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
            and x.stride(1) == 1 and weight.stride(1) == 1 and weight.shape[1] == k
            and k % (cfg.block_k * cfg.split) == 0)


def _launch(kernel, cfg: GemmConfig, m: int, n: int, *args, splits: int = 1, **constexprs) -> None:
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), splits)
    kernel[grid](*args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.warps,
                 num_stages=cfg.stages, **constexprs)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemmConfig) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias [N]) -> [M, N] in x's dtype."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _launch(_linear_kernel, cfg, m, n, x, weight, bias if bias is not None else weight, out, m, n,
            x.stride(0), weight.stride(0), out.stride(0), K=k, HAS_BIAS=bias is not None)
    return out


def silu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemmConfig) -> torch.Tensor:
    """x [M, K], weight [2N, K] (gate rows, then up rows) -> silu(x @ gate.T) * (x @ up.T): [M, N]."""
    m, k = x.shape
    n = weight.shape[0] // 2
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _launch(_silu_linear_kernel, cfg, m, n, x, weight, bias if bias is not None else weight, out, m, n,
            x.stride(0), weight.stride(0), out.stride(0), K=k, HAS_BIAS=bias is not None)
    return out


def linear_partials(x: torch.Tensor, weight: torch.Tensor, cfg: GemmConfig) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T split over K -> fp32 partials [cfg.split, M, N]; their sum in split order,
    rounded once, is the product (`triton_ops.add_rmsnorm_partials` folds them)."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((cfg.split, m, n), dtype=torch.float32, device=x.device)
    _launch(_partials_kernel, cfg, m, n, x, weight, out, m, n, x.stride(0), weight.stride(0), out.stride(0),
            out.stride(1), K_TILES=k // (cfg.block_k * cfg.split), splits=cfg.split)
    return out
