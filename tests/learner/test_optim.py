"""clip_grad_norm gives torch's numbers (norm, clipped gradients) without going through DTensor ops."""

import pytest
import torch

from asyncrl.learner.optim import clip_grad_norm


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_clip_grad_norm_matches_torch(max_norm):
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(s)) for s in ((4, 3), (7,), (2, 2, 2))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, ref):
        a.grad = torch.randn_like(a)
        b.grad = a.grad.clone()
    ours.append(torch.nn.Parameter(torch.zeros(3)))  # no grad: skipped
    norm = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(ref, max_norm if max_norm > 0 else float("inf"))
    assert torch.equal(norm, expected)
    for a, b in zip(ours, ref):
        assert torch.equal(a.grad, b.grad)
    assert ours[-1].grad is None


def test_clip_grad_norm_without_gradients_is_zero():
    assert clip_grad_norm([torch.nn.Parameter(torch.ones(2))], 1.0).item() == 0.0


@pytest.mark.parametrize("max_norm", [0.0, 0.5])
def test_fused_optimizer_takes_the_clip_as_its_grad_scale(max_norm):
    """With a fused AdamW the coefficient rides in the optimizer's grad_scale (one pass fewer over the
    gradients): the update equals clip-then-step up to rounding, the reported norm is torch's."""
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(s)) for s in ((64, 3), (7,))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt, ref_opt = (torch.optim.AdamW(ps, lr=1e-2, fused=True) for ps in (ours, ref))
    for step in range(3):
        for a, b in zip(ours, ref):
            a.grad = torch.randn_like(a) * 3
            b.grad = a.grad.clone()
        norm = clip_grad_norm(ours, max_norm, opt)
        assert torch.equal(norm, torch.nn.utils.clip_grad_norm_(ref, max_norm if max_norm > 0 else float("inf")))
        assert (opt.grad_scale is None) == (max_norm == 0)
        opt.step()
        ref_opt.step()
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)
