"""fp16 dynamic loss scaling (learner/loss_scale.py): the update sees the true gradients, an overflow skips
the update and halves the scale, clean steps grow it, and the state survives a checkpoint."""

import pytest
import torch
import torch.distributed as dist
from learner_helpers import make_batch, params_snapshot

from asyncrl.learner import optim
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.loss_scale import LossScale
from asyncrl.learner.trainer import Trainer

CFG = {"algorithm": "grpo", "lr": 1e-2, "micro_batch_tokens": 24}


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s)) for s in ((64, 3), (7,))]


def test_disabled_scale_changes_nothing():
    ls = LossScale(torch.device("cpu"), enabled=False, init=1024.0)
    loss = torch.tensor(3.0)
    assert ls.scaled(loss) is loss
    assert ls.unscale_norm(torch.tensor(5.0)).item() == 5.0
    ls.update()
    assert ls.scale.item() == 1.0 and ls.skipped.item() == 0.0


def test_overflow_halves_and_clean_window_doubles():
    ls = LossScale(torch.device("cpu"), enabled=True, init=1024.0, growth_interval=3)
    ls.unscale_norm(torch.tensor(float("inf")))
    ls.update()
    assert ls.scale.item() == 512.0 and ls.skipped.item() == 1.0
    ls.unscale_norm(torch.tensor(float("nan")))
    ls.update()
    assert ls.scale.item() == 256.0 and ls.skipped.item() == 2.0
    for expected in (256.0, 256.0, 512.0, 512.0):
        ls.unscale_norm(torch.tensor(1.0))
        ls.update()
        assert ls.scale.item() == expected
    state = ls.state_dict()
    fresh = LossScale(torch.device("cpu"), enabled=True, init=8.0, growth_interval=3)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state == {"scale": 512.0, "clean_steps": 1, "skipped": 2.0}


def test_a_scale_below_one_is_a_clear_error():
    """Overflow at every scale means the fp16 forward itself overflows: say so instead of halving S to 0."""
    ls = LossScale(torch.device("cpu"), enabled=True, init=1.0)
    ls.check(1.0)
    ls.unscale_norm(torch.tensor(2.0))
    ls.check(0.5)  # a small scale by itself is no error (loss_scale_init may be < 1)
    ls.unscale_norm(torch.tensor(float("inf")))
    ls.update()
    with pytest.raises(FloatingPointError, match='model.dtype = "bfloat16"'):
        ls.check(ls.scale.item())
    LossScale(torch.device("cpu"), enabled=False).check(0.0)  # bf16 / fp32: nothing to check


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("max_norm", [0.0, 0.5])
def test_scaled_gradients_give_the_unscaled_update(fused, max_norm):
    """Gradients S times the true ones: the reported norm is the true one and the clip-and-step equals the
    unscaled clip-and-step (fused: through grad_scale; otherwise one multiply)."""
    ours, ref = _params(), _params()
    opt = torch.optim.AdamW(ours, lr=1e-2, fused=fused)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, fused=fused)
    ls = LossScale(torch.device("cpu"), enabled=True, init=4096.0)
    for _ in range(3):
        for a, b in zip(ours, ref):
            b.grad = torch.randn_like(b) * 3
            a.grad = b.grad * ls.scale
        norm = optim.clip_grad_norm(ours, max_norm, opt, ls)
        expected = torch.nn.utils.clip_grad_norm_(ref, max_norm if max_norm > 0 else float("inf"))
        torch.testing.assert_close(norm, expected, rtol=1e-6, atol=0)
        optim.step(opt, ls)
        ref_opt.step()
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)
    assert ls.skipped.item() == 0.0


@pytest.mark.parametrize("fused", [True, False])
def test_overflow_skips_the_update(fused):
    ours = _params()
    opt = torch.optim.AdamW(ours, lr=1e-2, fused=fused)
    ls = LossScale(torch.device("cpu"), enabled=True, init=4096.0)
    for p in ours:
        p.grad = torch.ones_like(p)
    optim.clip_grad_norm(ours, 1.0, opt, ls)
    optim.step(opt, ls)  # one clean step: moments exist
    before = [p.detach().clone() for p in ours]
    moments = [opt.state[p]["exp_avg"].clone() for p in ours]
    steps = [opt.state[p]["step"].clone() for p in ours]
    for p in ours:
        p.grad = torch.ones_like(p)
    ours[0].grad[0, 0] = float("inf")
    norm = optim.clip_grad_norm(ours, 1.0, opt, ls)
    optim.step(opt, ls)
    assert not torch.isfinite(norm)
    assert ls.skipped.item() == 1.0 and ls.scale.item() == 2048.0
    for p, b, m, s in zip(ours, before, moments, steps):
        assert torch.equal(p.detach(), b)
        assert torch.equal(opt.state[p]["exp_avg"], m)
        assert torch.equal(opt.state[p]["step"], s)


def _trainer(tiny_model, **cfg) -> Trainer:
    return Trainer(LearnerConfig(**CFG, **cfg), str(tiny_model), device="cpu", dtype="float16")


def _step_gradients(tiny_model, dtype: str, init: float) -> tuple[dict, torch.Tensor]:
    """One unclipped step -> (metrics, the master gradients it applied, flattened; unscaled on CPU's path)."""
    trainer = Trainer(LearnerConfig(**CFG, max_grad_norm=0.0, loss_scale_init=init), str(tiny_model), device="cpu",
                      dtype=dtype)
    m = trainer.train_step(make_batch(seed=3, groups=3, n=4))
    grads = torch.cat([getattr(p.grad, "full_tensor", lambda g=p.grad: g)().flatten() for p in trainer._trainable()])
    if dist.is_initialized():
        dist.destroy_process_group()
    return m, grads


def test_fp16_gradients_are_the_fp32_ones_unscaled(tiny_model):
    """fp16 at S = 2^12 applies the fp32 gradients to 1e-3 (so S was divided out again) and reports their norm;
    a scale of 2^-10, standing for a loss 1000x smaller, underflows: proof that S acts on the fp16 backward."""
    m32, g32 = _step_gradients(tiny_model, "float32", 1.0)
    m16, g16 = _step_gradients(tiny_model, "float16", 4096.0)
    _, g_small = _step_gradients(tiny_model, "float16", 2.0**-10)
    assert m16["loss_scale"] == 4096.0 and m16["skipped_updates"] == 0.0 and "loss_scale" not in m32
    assert m16["grad_norm"] == pytest.approx(m32["grad_norm"], rel=1e-3)
    assert ((g16 - g32).norm() / g32.norm()).item() < 2e-3
    assert ((g_small - g32).norm() / g32.norm()).item() > 5e-2


def test_fp16_loss_scale_survives_a_checkpoint(tiny_model, tmp_path):
    trainer = _trainer(tiny_model, loss_scale_init=4096.0, loss_scale_growth_interval=1)
    m = trainer.train_step(make_batch(seed=3, groups=3, n=4))
    assert m["loss_scale"] == 8192.0  # one clean step with a window of one: doubled
    trainer.step = 1
    trainer.save_checkpoint(tmp_path)
    dist.destroy_process_group()
    fresh = _trainer(tiny_model, loss_scale_init=8.0)
    extra = fresh.load_checkpoint(tmp_path / "checkpoints" / "step-00000001")
    assert "learner_loss_scale" not in extra  # the caller's extra dict comes back as it gave it
    assert fresh.loss_scale.scale.item() == 8192.0
    dist.destroy_process_group()


def test_fp16_overflow_skips_the_step_and_backs_off(tiny_model):
    trainer = _trainer(tiny_model, loss_scale_init=2.0**100)  # fp16 gradients overflow for certain
    before = params_snapshot(trainer)
    m = trainer.train_step(make_batch(seed=3, groups=3, n=4))
    after = params_snapshot(trainer)
    assert m["skipped_updates"] == 1.0 and m["loss_scale"] == 2.0**99
    assert m["grad_norm"] == 0.0  # the skipped update's inf is not reported as the step's norm
    for k in before:
        assert torch.equal(after[k], before[k]), k
    dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp16_on_gpu_fused_step_matches_fp32_and_skips_overflow(tiny_model):
    """CUDA: the fused AdamW takes S through grad_scale and the overflow through found_inf, no host sync."""
    norms = {}
    for dtype in ("float32", "float16"):
        trainer = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cuda:0", dtype=dtype)
        norms[dtype] = trainer.train_step(make_batch(seed=3, groups=3, n=4))["grad_norm"]
        if dist.is_initialized():
            dist.destroy_process_group()
    assert norms["float16"] == pytest.approx(norms["float32"], rel=1e-2)
    trainer = Trainer(LearnerConfig(**CFG, loss_scale_init=2.0**100), str(tiny_model), device="cuda:0",
                      dtype="float16")
    assert all(g.get("fused") for g in trainer.optimizer.param_groups)
    before = params_snapshot(trainer)
    m = trainer.train_step(make_batch(seed=3, groups=3, n=4))
    assert m["skipped_updates"] == 1.0 and m["loss_scale"] == 2.0**99
    after = params_snapshot(trainer)
    for k in before:
        assert torch.equal(after[k], before[k]), k
    m = trainer.train_step(make_batch(seed=4, groups=3, n=4))  # 2^99 still overflows: skipped again
    assert m["skipped_updates"] == 2.0
    dist.destroy_process_group()
