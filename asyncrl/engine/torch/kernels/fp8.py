"""Triton kernels of FP8 rollouts (asyncrl/engine/torch/model/fp8.py): a matmul's input quantized per row to e4m3
with one fp32 scale per row (max |row| / 448), alone or fused into the kernel that makes the input:

* `quantize_rows_fp8`: any bf16 input [n, k] (the attention output before o_proj);
* `add_rmsnorm_fp8`: residual add + RMSNorm, its normed row quantized instead of stored (the inputs of qkv and
  gate_up): the same roundings as `ops.add_rmsnorm` and then `quantize_rows_fp8`;
* `silu_mul_fp8`: silu(gate) * up, quantized (the input of down_proj), one program per row (the scale needs the
  whole row), the roundings of `ops.silu_mul`.

The fused forms save a kernel and a bf16 write and read of the activation per projection. Each returns
(x8 [n, k] float8_e4m3fn, scale [n, 1] fp32) with x ~ x8 * scale. GPU only (Hopper and later for the e4m3
conversion); `model/fp8.quantize_rows_reference` is the torch form and the tests' reference.
"""

from __future__ import annotations

import torch

from asyncrl.engine.torch.kernels.ops import HAS_TRITON, pdl

FP8_MAX = 448.0  # largest e4m3 value
SCALE_FLOOR = 1e-12  # an all-zero row's scale

if HAS_TRITON:
    import triton
    import triton.language as tl

    from asyncrl.engine.torch.kernels.ops import dependent_launch

    @triton.jit
    def _store_fp8_row(y, q_ptr, s_ptr, row, cols, mask, n_cols, scale_floor, fp8_max):
        """y [BLOCK] fp32 (0 where masked) -> q_ptr[row] = y / scale in e4m3, s_ptr[row] = scale."""
        scale = tl.maximum(tl.max(tl.abs(y), axis=0), scale_floor) / fp8_max
        q = tl.minimum(tl.maximum(y / scale, -fp8_max), fp8_max)
        tl.store(q_ptr + row * n_cols + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + row, scale)

    @triton.jit
    def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, n_cols, scale_floor, fp8_max, BLOCK: tl.constexpr,
                              PDL: tl.constexpr):
        dependent_launch(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        _store_fp8_row(x, q_ptr, s_ptr, row, cols, mask, n_cols, scale_floor, fp8_max)

    @triton.jit
    def _add_rmsnorm_fp8_kernel(x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr, stride_x, stride_r, n_cols, eps,
                                scale_floor, fp8_max, HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
                                PDL: tl.constexpr):
        dependent_launch(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        dt = x_ptr.dtype.element_ty  # the compute dtype (ops.add_rmsnorm rounds its norm to x's dtype)
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            rdt = res_out_ptr.dtype.element_ty
            r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
            x = (x + r).to(rdt).to(tl.float32)
            tl.store(res_out_ptr + row * n_cols + cols, x.to(rdt), mask=mask)
        var = tl.sum(x * x, axis=0) / n_cols
        h = (x * tl.rsqrt(var + eps)).to(dt).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (w * h).to(dt).to(tl.float32)
        _store_fp8_row(y, q_ptr, s_ptr, row, cols, mask, n_cols, scale_floor, fp8_max)

    @triton.jit
    def _silu_mul_fp8_kernel(x_ptr, q_ptr, s_ptr, stride_x, n_cols, scale_floor, fp8_max, BLOCK: tl.constexpr,
                             PDL: tl.constexpr):
        dependent_launch(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        dt = x_ptr.dtype.element_ty
        g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        y = (s * u).to(dt).to(tl.float32)
        _store_fp8_row(y, q_ptr, s_ptr, row, cols, mask, n_cols, scale_floor, fp8_max)


def _outputs(n: int, cols: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty((n, cols), dtype=torch.float8_e4m3fn, device=device),
            torch.empty((n, 1), dtype=torch.float32, device=device))


def _warps(cols: int) -> int:
    return 8 if cols > 4096 else 4


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, k] contiguous -> (x8 [n, k], scale [n, 1])."""
    n, cols = x.shape
    q, s = _outputs(n, cols, x.device)
    if n:
        _quantize_rows_kernel[(n,)](x, q, s, cols, SCALE_FLOOR, FP8_MAX, BLOCK=triton.next_power_of_2(cols),
                                    num_warps=_warps(cols), **pdl(x))
    return q, s


def add_rmsnorm_fp8(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                    eps: float) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """As `ops.add_rmsnorm`, with the norm quantized: x, residual [n, hidden] -> ((x8, scale), x + residual)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    n, cols = x.shape
    q, s = _outputs(n, cols, x.device)
    res_out = torch.empty_like(residual, memory_format=torch.contiguous_format) if residual is not None else x
    res = (residual if residual.stride(-1) == 1 else residual.contiguous()) if residual is not None else x
    if n:
        _add_rmsnorm_fp8_kernel[(n,)](x, res, weight, q, s, res_out, x.stride(0), res.stride(0), cols, eps,
                                      SCALE_FLOOR, FP8_MAX, HAS_RES=residual is not None,
                                      BLOCK=triton.next_power_of_2(cols), num_warps=4, **pdl(x))
    return (q, s), res_out


def silu_mul_fp8(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up [n, 2 * inter] -> silu(gate) * up quantized: (x8 [n, inter], scale [n, 1])."""
    gate_up = gate_up if gate_up.stride(-1) == 1 else gate_up.contiguous()
    n, cols = gate_up.shape[0], gate_up.shape[1] // 2
    q, s = _outputs(n, cols, gate_up.device)
    if n:
        _silu_mul_fp8_kernel[(n,)](gate_up, q, s, gate_up.stride(0), cols, SCALE_FLOOR, FP8_MAX,
                                   BLOCK=triton.next_power_of_2(cols), num_warps=_warps(cols), **pdl(gate_up))
    return q, s
