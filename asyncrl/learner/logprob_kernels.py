"""The two elementwise halves of the fused lm_head -> logprob step (linear_logprob.py), on [n, V] logits.

    forward:  z = softcap(logits) / T  ->  lse = logsumexp(z), logp = z[target] - lse,
              entropy = lse - sum(softmax(z) * z)                                   (one read of the logits)
    backward: d logits = g * (onehot(target) - exp(z - lse)) / T  [* softcap']        (one read, one write,
              in place over the saved logits, or into a half buffer when they are fp32 logits)

On CUDA without softcapping these are two Triton kernels that read the bf16 logits once each and never
materialise fp32 [n, V] tensors (the plain-torch version makes ~6 fp32 passes over them). Everywhere else
(CPU, softcapped models such as Gemma 2) the torch version runs; both compute in fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs
    triton = None


def forward(logits: Tensor, targets: Tensor, inv_temp: Tensor, softcap: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """logits [n, V], targets [n] int64, inv_temp [n] fp32 -> (logp, entropy, lse), each [n] fp32."""
    if _use_triton(logits, softcap):
        return _triton_forward(logits, targets, inv_temp)
    return torch_forward(logits, targets, inv_temp, softcap)


def torch_forward(logits: Tensor, targets: Tensor, inv_temp: Tensor, softcap: float | None) -> tuple[Tensor, Tensor, Tensor]:
    z = _scaled(logits, inv_temp, softcap)  # [n, V] fp32
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, entropy, lse


def backward_(logits: Tensor, targets: Tensor, inv_temp: Tensor, lse: Tensor, grad: Tensor,
              softcap: float | None, out: Tensor | None = None) -> Tensor:
    """Writes d(sum_i grad_i * logp_i)/d logits [n, V] into `out` (same shape, contiguous, any float dtype;
    default: over `logits` itself, in place) and returns it."""
    out = logits if out is None else out
    if _use_triton(logits, softcap) and out.is_contiguous():
        return _triton_backward_(logits, targets, inv_temp, lse, grad, out)
    return torch_backward_(logits, targets, inv_temp, lse, grad, softcap, out)


def torch_backward_(logits: Tensor, targets: Tensor, inv_temp: Tensor, lse: Tensor, grad: Tensor,
                    softcap: float | None, out: Tensor | None = None) -> Tensor:
    z = _scaled(logits, inv_temp, softcap)
    dz = -torch.exp(z - lse[:, None]) * grad[:, None]  # [n, V]
    dz.scatter_add_(-1, targets[:, None], grad[:, None].to(dz.dtype))
    dz = dz * inv_temp[:, None]
    if softcap:
        t = torch.tanh(logits.float() / softcap)
        dz = dz * (1.0 - t * t)
    out = logits if out is None else out
    out.copy_(dz)
    return out


def _scaled(logits: Tensor, inv_temp: Tensor, softcap: float | None) -> Tensor:
    z = logits.float()
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    return z * inv_temp[:, None]


def _use_triton(logits: Tensor, softcap: float | None) -> bool:
    return triton is not None and logits.is_cuda and not softcap and logits.is_contiguous()


if triton is not None:

    @triton.jit
    def _forward_kernel(logits_ptr, targets_ptr, inv_temp_ptr, logp_ptr, ent_ptr, lse_ptr, V,
                        BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * V
        inv_t = tl.load(inv_temp_ptr + row)
        m = -float("inf")
        s = 0.0  # sum exp(z - m)
        w = 0.0  # sum exp(z - m) * z
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(base + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * inv_t
            m_new = tl.maximum(m, tl.max(z, 0))
            scale = tl.exp(m - m_new)
            e = tl.exp(z - m_new)
            s = s * scale + tl.sum(e, 0)
            w = w * scale + tl.sum(tl.where(cols < V, e * z, 0.0), 0)
            m = m_new
        lse = m + tl.log(s)
        target = tl.load(targets_ptr + row)
        zt = tl.load(base + target).to(tl.float32) * inv_t
        tl.store(logp_ptr + row, zt - lse)
        tl.store(ent_ptr + row, lse - w / s)
        tl.store(lse_ptr + row, lse)

    @triton.jit
    def _backward_kernel(logits_ptr, targets_ptr, inv_temp_ptr, lse_ptr, grad_ptr, out_ptr, V, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ptr = logits_ptr + row * V + cols
        inv_t = tl.load(inv_temp_ptr + row)
        lse = tl.load(lse_ptr + row)
        g = tl.load(grad_ptr + row)
        target = tl.load(targets_ptr + row)
        z = tl.load(ptr, mask=cols < V, other=0.0).to(tl.float32) * inv_t
        d = (tl.where(cols == target, 1.0, 0.0) - tl.exp(z - lse)) * (g * inv_t)
        tl.store(out_ptr + row * V + cols, d.to(out_ptr.dtype.element_ty), mask=cols < V)


# Tile and warps of both kernels, from a sweep on the H200 (fab375b, 32,768 x 151,936 bf16 logits): forward
# 3.33 ms at 2048 / 4 warps against 3.63 ms at 4096 / 8 (~3 TB/s read); backward 5.11 against 5.21 ms.
_BLOCK, _WARPS = 2048, 4


def _triton_forward(logits: Tensor, targets: Tensor, inv_temp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    n, v = logits.shape
    logp, ent, lse = (torch.empty(n, device=logits.device, dtype=torch.float32) for _ in range(3))
    if n:
        _forward_kernel[(n,)](logits, targets, inv_temp.float().contiguous(), logp, ent, lse, v, BLOCK=_BLOCK,
                              num_warps=_WARPS)
    return logp, ent, lse


def _triton_backward_(logits: Tensor, targets: Tensor, inv_temp: Tensor, lse: Tensor, grad: Tensor,
                      out: Tensor) -> Tensor:
    n, v = logits.shape
    if n:
        _backward_kernel[(n, triton.cdiv(v, _BLOCK))](
            logits, targets, inv_temp.float().contiguous(), lse.contiguous(), grad.float().contiguous(), out, v,
            BLOCK=_BLOCK, num_warps=_WARPS)
    return out
