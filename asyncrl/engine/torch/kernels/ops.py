"""Triton kernels of the decoder on GPU: fused residual-add + RMSNorm, SiLU-and-multiply, rotary +
KV-cache store (prefill; at decode the attention kernels of `kernels.attention` rotate and store the step's own
token), and what every engine kernel shares: where they run (`enabled`) and how they launch (`pdl`).

Each kernel reproduces the rounding of the Hugging Face eager code it replaces (bf16 results of the
same fp32 math), so engine logprobs stay close to a learner's forward pass; they only save launches
and memory passes. `enabled(t)` says whether a tensor takes this path: CUDA tensors when Triton is
importable, or any tensor under TRITON_INTERPRET=1 (the interpreter runs them on CPU for tests).
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl

    from triton.language.extra.cuda import gdc_wait

    HAS_TRITON = True
except ImportError:  # CPU-only installs: the torch path is used
    HAS_TRITON = False

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def runs_on(t: torch.Tensor) -> bool:
    """Whether Triton kernels run on t's device (a GPU, or the interpreter under TRITON_INTERPRET=1)."""
    return HAS_TRITON and (t.is_cuda or _INTERPRET)


def enabled(t: torch.Tensor) -> bool:
    return runs_on(t) and t.dtype in (torch.bfloat16, torch.float16, torch.float32)


# Programmatic dependent launch (PDL, Hopper and later; compiled kernels only). A decode step is ~220 small kernels
# in one CUDA graph, and each launch waits for the previous kernel to drain before its blocks are scheduled. Our
# kernels are launched with the PDL attribute and begin with `griddepcontrol.wait`, which returns once the kernel
# before has completed and its writes are visible: the launch and block scheduling overlap the previous kernel's
# tail, the kernel's own memory work still starts after it (0.5B decode graph 1.70 -> 1.60 ms, H200; letting the
# next kernel launch before this one ends was slower: docs/engine-perf.md). Read at each launch, so a graph captures
# the setting in force (bench.generation --pdl 0,1 compares both in one process).
PDL = True
_pdl_devices: dict[int, bool] = {}


def pdl(t: torch.Tensor) -> dict:
    """Launch options of a kernel whose first operand is t: the PDL constexpr and Triton's launch flag."""
    if not PDL or not t.is_cuda:
        return {"PDL": False}
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if index not in _pdl_devices:
        _pdl_devices[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return {"PDL": True, "launch_pdl": True} if _pdl_devices[index] else {"PDL": False}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


if HAS_TRITON:

    @triton.jit
    def dependent_launch(PDL: tl.constexpr):
        """A kernel's first statement under `pdl`: wait for the kernel before it. Nothing without PDL (the
        interpreter, CPUs, GPUs before Hopper)."""
        if PDL:
            gdc_wait()

    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_r, n_cols, eps,
                            HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        dependent_launch(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        dt = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            rdt = res_out_ptr.dtype.element_ty  # the stream's dtype: the compute dtype, or fp32
            r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
            x = (x + r).to(rdt).to(tl.float32)  # the residual stream is rounded like torch's add
            tl.store(res_out_ptr + row * n_cols + cols, x.to(rdt), mask=mask)
        var = tl.sum(x * x, axis=0) / n_cols
        h = (x * tl.rsqrt(var + eps)).to(dt).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n_cols + cols, (w * h).to(dt), mask=mask)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, stride_x, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
        dependent_launch(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        dt = out_ptr.dtype.element_ty
        g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(out_ptr + row * n_cols + cols, (s * u).to(dt), mask=mask)

    @triton.jit
    def rotate_heads(x_ptr, row_off, stride_h, heads, offs_d, hmask, cos, sin, sign, HALF: tl.constexpr,
                     D: tl.constexpr):
        dt = x_ptr.dtype.element_ty
        ptrs = x_ptr + row_off + heads[:, None] * stride_h
        x = tl.load(ptrs + offs_d[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)
        partner = tl.load(ptrs + ((offs_d + HALF) % D)[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)
        a = (x * cos[None, :]).to(dt).to(tl.float32)  # q * cos and rotate_half(q) * sin round separately
        b = (partner * sign[None, :] * sin[None, :]).to(dt).to(tl.float32)
        return (a + b).to(dt)

    @triton.jit
    def _rotary_store_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache, v_cache,
                             q_out, k_out, stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh,
                             H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                             WRITE_K: tl.constexpr, PDL: tl.constexpr):
        dependent_launch(PDL)
        n = tl.program_id(0).to(tl.int64)
        HALF: tl.constexpr = D // 2
        offs_d = tl.arange(0, D)
        offs_h = tl.arange(0, BLOCK_H)
        pos = tl.load(pos_ptr + n)
        cos = tl.load(cos_ptr + pos * D + offs_d).to(tl.float32)
        sin = tl.load(sin_ptr + pos * D + offs_d).to(tl.float32)
        sign = tl.where(offs_d < HALF, -1.0, 1.0)
        qmask = offs_h < H
        q = rotate_heads(q_ptr, n * stride_qn, stride_qh, offs_h, offs_d, qmask, cos, sin, sign, HALF, D)
        tl.store(q_out + n * H * D + offs_h[:, None] * D + offs_d[None, :], q, mask=qmask[:, None])
        kmask = offs_h < KV
        k = rotate_heads(k_ptr, n * stride_kn, stride_kh, offs_h, offs_d, kmask, cos, sin, sign, HALF, D)
        v = tl.load(v_ptr + n * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :], mask=kmask[:, None])
        slot = tl.load(slot_ptr + n)
        dst = slot * KV * D + offs_h[:, None] * D + offs_d[None, :]
        tl.store(k_cache + dst, k, mask=kmask[:, None])
        tl.store(v_cache + dst, v, mask=kmask[:, None])
        if WRITE_K:
            tl.store(k_out + n * KV * D + offs_h[:, None] * D + offs_d[None, :], k, mask=kmask[:, None])

def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [n, hidden] -> (rmsnorm(x + residual) * weight, x + residual). The sum keeps the residual's
    dtype (the compute dtype, or fp32 for an fp32 stream, torch's type promotion); the norm is in x's."""
    x = _rows(x)
    n, cols = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(residual, memory_format=torch.contiguous_format) if residual is not None else x
    res = _rows(residual) if residual is not None else x
    _add_rmsnorm_kernel[(n,)](
        x, res, weight, out, res_out, x.stride(0), res.stride(0), cols, eps,
        HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(cols), num_warps=4, **pdl(x),
    )
    return out, res_out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [n, 2 * inter] -> silu(gate) * up: [n, inter]."""
    gate_up = _rows(gate_up)
    n, cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((n, cols), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(n, triton.cdiv(cols, block))](gate_up, out, gate_up.stride(0), cols, BLOCK=block, num_warps=4,
                                                    **pdl(gate_up))
    return out


def rotary_store(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, want_k: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q: [n, heads, d], k, v: [n, kv_heads, d] (rows may be strided views of one qkv output);
    cos, sin: [max_positions, d] tables. Rotates q and k, writes k and v to their cache slots.
    -> (rotated q [n, heads, d], rotated k [n, kv_heads, d] when want_k)."""
    n, heads, d = q.shape
    kv = k.shape[1]
    assert q.stride(2) == k.stride(2) == v.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    q_out = torch.empty((n, heads, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((n, kv, d), dtype=k.dtype, device=k.device) if want_k else q_out
    _rotary_store_kernel[(n,)](
        q, k, v, positions, cos, sin, slot_mapping, k_cache, v_cache, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        H=heads, KV=kv, D=d, BLOCK_H=triton.next_power_of_2(max(heads, 2)), WRITE_K=want_k, num_warps=4, **pdl(q),
    )
    return q_out, (k_out if want_k else None)
