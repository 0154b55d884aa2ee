"""The decode GEMMs of `triton_gemm` against torch: linear with and without bias, the SwiGLU projection with its
activation in the epilogue, and the split-K partials folded by `add_rmsnorm_partials`; rows at the edges of a
tile (M not a multiple of the M tile), and a row's result independent of the batch around it.

"cpu" runs the kernels in the Triton interpreter (TRITON_INTERPRET=1 for the whole run), "cuda" compiled.
Exact matches are not expected against torch (another summation order): errors are held to a few ulps of
the output dtype (2**-8 relative: bf16's, which bounds fp16's too), against an fp32 reference from the same
inputs. The interpreter's tl.dot multiplies bf16 as raw bits, so fp16 stands in for bf16 on CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from asyncrl.engine.torch import triton_gemm as tg
from asyncrl.engine.torch import triton_ops

pytestmark = pytest.mark.filterwarnings(  # Triton < 3.7's interpreter under numpy 2.3
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

CFG = tg.GemmConfig(block_m=16, block_n=32, block_k=32, warps=4, stages=2)


@pytest.fixture
def device(triton_device):
    return triton_device


def _dtype(device: str) -> torch.dtype:
    return torch.float16 if device == "cpu" else torch.bfloat16


def _rand(*size, device, std=1.0, seed=0):
    g = torch.Generator().manual_seed(seed + sum(size))
    return (torch.randn(*size, generator=g) * std).to(_dtype(device)).to(device)


def _close(got: torch.Tensor, want: torch.Tensor, ulps: float = 2.0) -> None:
    """Within `ulps` bf16 roundings of the reference's scale (2**-8 relative each)."""
    scale = want.abs().max().item()
    assert (got.float() - want.float()).abs().max().item() <= ulps * 2**-8 * scale


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [1, 16, 37])
def test_linear_matches_torch(device, bias, m):
    x, w = _rand(m, 64, device=device), _rand(96, 64, device=device, std=0.1)
    b = _rand(96, device=device, std=0.5) if bias else None
    want = F.linear(x.float(), w.float(), b.float() if bias else None)
    got = tg.linear(x, w, b, CFG)
    assert got.shape == (m, 96) and got.dtype == _dtype(device)
    _close(got, want)


@pytest.mark.parametrize("m", [3, 16, 40])
def test_silu_linear_is_swiglu(device, m):
    x, w = _rand(m, 64, device=device), _rand(2 * 64, 64, device=device, std=0.2)
    gate_up = F.linear(x.float(), w.float()).to(_dtype(device)).float()  # the GEMM's output rounding
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = tg.silu_linear(x, w, None, CFG)
    assert got.shape == (m, 64)
    _close(got, want, ulps=4.0)


@pytest.mark.parametrize("split", [1, 2, 4])
def test_partials_fold_into_add_rmsnorm(device, split):
    m, k, n = 21, 128, 64
    x, w = _rand(m, k, device=device), _rand(n, k, device=device, std=0.1)
    residual, norm_w = _rand(m, n, device=device), _rand(n, device=device, std=0.1) + 1
    cfg = tg.GemmConfig(16, 32, 32, 4, 2, split)
    parts = tg.linear_partials(x, w, cfg)
    assert parts.shape == (split, m, n) and parts.dtype == torch.float32
    h = F.linear(x.float(), w.float())
    _close(parts.sum(0), h, ulps=0.05)  # fp32 partial sums: fp32 accuracy
    got_norm, got_res = triton_ops.add_rmsnorm_partials(parts, residual, norm_w, 1e-6, _dtype(device))
    want_norm, want_res = triton_ops.add_rmsnorm(parts.sum(0).to(_dtype(device)), residual, norm_w, 1e-6)
    _close(got_res, want_res, ulps=1.0)  # the folds' order differs from sum(0) only in fp32 bits
    _close(got_norm, want_norm, ulps=2.0)


def test_row_is_batch_invariant(device):
    """A row's bits do not depend on the rows around it or how many there are (deterministic mode's rule)."""
    x, w = _rand(40, 64, device=device), _rand(96, 64, device=device, std=0.1)
    full = tg.linear(x, w, None, CFG)
    for rows in (slice(0, 1), slice(5, 21), slice(17, 40)):
        assert torch.equal(tg.linear(x[rows].contiguous(), w, None, CFG), full[rows])
    assert torch.equal(tg.silu_linear(x[3:4].contiguous(), torch.cat([w, w]), None, CFG),
                       tg.silu_linear(x, torch.cat([w, w]), None, CFG)[3:4])


def test_fits_refuses_what_the_kernels_do_not_take(device):
    x, w = _rand(4, 64, device=device), _rand(32, 64, device=device)
    assert tg.fits(x, w, CFG)
    assert not tg.fits(x.float(), w.float(), CFG)  # fp32: cuBLAS
    assert not tg.fits(_rand(4, 48, device=device), _rand(32, 48, device=device), CFG)  # K not a multiple of 32
    assert not tg.fits(x, w, tg.GemmConfig(16, 32, 32, 4, 2, split=4))  # 64 / (32 * 4)
    assert not tg.fits(x.t(), w, CFG)
