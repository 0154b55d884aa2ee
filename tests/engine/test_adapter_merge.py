"""`merge_into`, the engine's in-place merge: the same bits as `W.copy_(merge(W0, A, B, scale))` (the function the
learner's merged push uses), for every weight dtype and for scales that are and are not powers of two; on a GPU
through the fused kernel (kernels/lora_merge.py), checked against an fp64 reference."""

import pytest
import torch

from asyncrl.engine.torch.adapter_merge import _power_of_two, merge, merge_into
from asyncrl.engine.torch.kernels import lora_merge


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [2.0, 0.25, 1.0, 16 / 12, 0.3, 3.0])
def test_merge_into_gives_the_bits_of_merge_then_copy(dtype, scale):
    g = torch.Generator().manual_seed(int(scale * 1000))
    w0 = (torch.randn(96, 80, generator=g) * 0.05).to(dtype)
    a = torch.randn(8, 80, generator=g) / 80 ** 0.5
    b = torch.randn(96, 8, generator=g) * 0.1
    want = torch.empty_like(w0).copy_(merge(w0, a, b, scale))
    got = torch.full_like(w0, float("nan"))
    merge_into(got, w0, a, b, scale)
    assert torch.equal(got, want)


def test_merge_into_writes_through_a_view_of_a_fused_weight():
    """The engine's q/k/v and gate/up weights are row blocks of one fused tensor: the merge lands in place."""
    fused = torch.zeros(12, 6)
    w0, a, b = torch.randn(4, 6), torch.randn(2, 6), torch.randn(4, 2)
    merge_into(fused[4:8], w0, a, b, 0.5)
    assert torch.equal(fused[4:8], merge(w0, a, b, 0.5)) and not fused[:4].any() and not fused[8:].any()


def test_power_of_two():
    assert [_power_of_two(x) for x in (1.0, 2.0, 0.25, 1024.0)] == [True] * 4
    assert [_power_of_two(x) for x in (3.0, 0.3, 16 / 12, 0.0, -2.0)] == [False] * 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not lora_merge.HAS_TRITON, reason="needs CUDA and Triton")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("m", "n", "r", "scale"), [(96, 80, 8, 2.0), (300, 517, 64, 0.25), (130, 260, 80, 0.3),
                                                  (3584, 512, 64, 16 / 64)])
def test_gpu_kernel_merges_as_fp32_does_and_both_entry_points_agree(dtype, m, n, r, scale):
    """The kernel's fp32 sum is fp32's to a few ulps (tf32x3), rounded once: at most one ulp of `dtype` from the
    fp64 sum rounded, and `merge` (the learner's, fp32) then a cast gives merge_into's bits (the engine's)."""
    g = torch.Generator().manual_seed(m + n + r)
    w0 = (torch.randn(m, n, generator=g) * 0.05).to(dtype).cuda()
    a = (torch.randn(r, n, generator=g) / n ** 0.5).cuda()
    b = (torch.randn(m, r, generator=g) * 0.1).cuda()
    assert lora_merge.usable(w0, a, b)
    exact = w0.double() + scale * (b.double() @ a.double())
    summed = merge(w0, a, b, scale)  # fp32
    assert summed.dtype == torch.float32
    torch.testing.assert_close(summed.double(), exact, rtol=2e-6, atol=1e-7)
    got = torch.full_like(w0, float("nan"))
    merge_into(got, w0, a, b, scale)
    assert torch.equal(got, summed.to(dtype))
    # within one ulp of the exact sum, plus the fp32 sum's own error where W and the product nearly cancel
    floor = 1e-6 * (w0.double().abs() + scale * (b.double().abs() @ a.double().abs()))
    assert ((got.double() - exact).abs() <= torch.finfo(dtype).eps * exact.abs() + floor).all()
    if dtype != torch.float32:  # nearly always the fp64 sum rounded (fp32 itself keeps its sum's last bits)
        assert (got == exact.to(dtype)).double().mean() > 0.99
    fused = torch.zeros(3 * m, n, dtype=dtype, device="cuda")  # a row block of a fused weight, in place
    merge_into(fused[m:2 * m], w0, a, b, scale)
    assert torch.equal(fused[m:2 * m], got) and not fused[:m].any() and not fused[2 * m:].any()
    in_place = w0.clone()
    merge_into(in_place, in_place, a, b, scale)
    assert torch.equal(in_place, got)
