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
