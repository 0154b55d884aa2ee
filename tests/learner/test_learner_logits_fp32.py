"""model.logits_fp32 in the learner: the fused lm_head + logprob takes the lm_head's fp32 output (the engine's
logits) and gives the gradients in the weight's dtype; kept and chunked logits agree; the trainer runs it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from learner_helpers import make_batch

from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.linear_logprob import linear_logprob
from asyncrl.learner.trainer import Trainer


def _case(device: str = "cpu", dtype: torch.dtype = torch.bfloat16):
    torch.manual_seed(0)
    n, hdim, vocab = 9, 16, 40
    hidden = (torch.randn(n, hdim, device=device) * 6).to(dtype)  # logits of ~25, a trained model's size
    weight = torch.randn(vocab, hdim, device=device).to(dtype)
    targets = torch.randint(0, vocab, (n,), device=device)
    temp = torch.tensor([1.0, 0.7, 1.3] * 3, device=device)
    grad = torch.linspace(-1, 1, n, device=device)
    return hidden, weight, targets, temp, grad


def _run(hidden, weight, targets, temp, grad, **kw):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, entropy = linear_logprob(h, w, targets, temp, **kw)
    (logp * grad).sum().backward()
    return logp.detach(), entropy, h.grad, w.grad


def _exact(hidden, weight, targets, temp, grad):
    """fp64 autograd from the half operands' exact products."""
    h, w = hidden.double().requires_grad_(), weight.double().requires_grad_()
    lp = torch.log_softmax((h @ w.t()) / temp.double()[:, None], -1)
    logp = lp.gather(-1, targets[:, None]).squeeze(-1)
    (logp * grad.double()).sum().backward()
    return logp.detach(), h.grad, w.grad


def test_values_are_those_of_the_fp32_logits_and_closer_to_exact():
    case = _case()
    logp, entropy, gh, gw = _run(*case, fp32=True, chunk=4)
    hidden, weight, targets, temp, _ = case
    z = (hidden.float() @ weight.float().t()) / temp[:, None]
    torch.testing.assert_close(logp, torch.log_softmax(z, -1).gather(-1, targets[:, None]).squeeze(-1),
                               atol=1e-5, rtol=0)
    assert gh.dtype == gw.dtype == torch.bfloat16
    exact, exact_gh, exact_gw = _exact(*case)
    rounded = _run(*case, fp32=False, chunk=4)[0]
    err_fp32 = (logp.double() - exact).abs().max()
    err_rounded = (rounded.double() - exact).abs().max()
    assert err_fp32 < 1e-4 < err_rounded  # bf16 logits of ~25 have a step of 0.125
    torch.testing.assert_close(gh.double(), exact_gh, atol=0.05, rtol=0.02)  # bf16 gradients
    torch.testing.assert_close(gw.double(), exact_gw, atol=0.05, rtol=0.02)


def test_kept_and_chunked_logits_agree():
    case = _case()
    kept = _run(*case, fp32=True, chunk=4)
    chunked = _run(*case, fp32=True, chunk=4, keep_bytes=0)  # logits recomputed in the backward
    for a, b in zip(kept[:2], chunked[:2]):  # values: the same rows through the same kernels
        assert torch.equal(a, b)
    for a, b in zip(kept[2:], chunked[2:]):  # gradients: the chunked weight gradient is summed in fp32
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernels_take_fp32_logits_and_write_half_gradients(monkeypatch):
    from asyncrl.learner import logprob_kernels

    case = _case("cuda")
    triton = _run(*case, fp32=True)
    monkeypatch.setattr(logprob_kernels, "_use_triton", lambda logits, softcap: False)
    plain = _run(*case, fp32=True)
    torch.testing.assert_close(triton[0], plain[0], atol=1e-5, rtol=0)
    for a, b in zip(triton[2:], plain[2:]):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=1e-2)


def test_trainer_trains_with_fp32_logits(tiny_model):
    cfg = LearnerConfig(algorithm="grpo", lr=1e-2, micro_batch_tokens=24)
    metrics = {}
    for flag in (False, True):
        trainer = Trainer(cfg, str(tiny_model), device="cpu", dtype="bfloat16", logits_fp32=flag)
        assert trainer.policy.logits_fp32 is flag
        metrics[flag] = trainer.train_step(make_batch(seed=3, groups=3, n=4))
        dist.destroy_process_group()
    for m in metrics.values():
        assert m["grad_norm"] > 0 and m["loss"] == m["loss"]
    assert metrics[True]["entropy"] != metrics[False]["entropy"]  # the forward differs: the option reached it
