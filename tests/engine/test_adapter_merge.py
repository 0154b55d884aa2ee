"""`merge_into`, the engine's in-place merge: the same bits as `W.copy_(merge(W0, A, B, scale))` (the function the
learner's merged push uses), for every weight dtype and for scales that are and are not powers of two."""

import pytest
import torch

from asyncrl.engine.torch.adapter_merge import _power_of_two, merge, merge_into


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
