"""One rank in bf16: the unsharded compute-dtype copy FSDP2 made at the first forward is kept for the run and
refreshed after each optimizer step (fsdp.ComputeCopy). The numbers must be those of FSDP's own per-step unshard,
bit for bit, also across a checkpoint (a state-dict call reshards and frees the copy)."""

import pytest
import torch
import torch.distributed as dist
from learner_helpers import make_batch, params_snapshot

from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer

CFG = {"algorithm": "grpo", "lr": 1e-2, "micro_batch_tokens": 24, "off_policy": "decoupled"}
METRICS = ("loss", "pg_loss", "grad_norm", "entropy", "is_weight_mean")


DEVICES = ["cpu", pytest.param("cuda:0", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


def _run(tiny_model, tmp_path, device: str, reshard_each_step: bool) -> tuple[list[dict], dict]:
    trainer = Trainer(LearnerConfig(**CFG), str(tiny_model), device=device, dtype="bfloat16")
    out = []
    for step in range(4):
        out.append(trainer.train_step(make_batch(seed=10 + step, groups=3, n=4)))
        if reshard_each_step:
            trainer.policy.reshard()  # FSDP's own path: the next forward casts the masters afresh
        if step == 1:
            trainer.step = step + 1
            trainer.save_checkpoint(tmp_path / ("a" if reshard_each_step else "b"))
    params = params_snapshot(trainer)
    dist.destroy_process_group()
    return out, params


def test_kept_copy_matches_fsdp_unshard_bitwise(tiny_model, tmp_path):
    """On CPU, where the step itself is deterministic (on GPU flash attention's backward is not)."""
    kept, p_kept = _run(tiny_model, tmp_path, "cpu", reshard_each_step=False)
    ref, p_ref = _run(tiny_model, tmp_path, "cpu", reshard_each_step=True)
    for a, b in zip(kept, ref):
        for k in METRICS:
            assert a[k] == b[k], k
    for k in p_ref:
        torch.testing.assert_close(p_kept[k], p_ref[k], atol=0, rtol=0, msg=k)


@pytest.mark.parametrize("device", DEVICES)
def test_refresh_brings_the_copy_to_the_masters(tiny_model, device):
    trainer = Trainer(LearnerConfig(**CFG), str(tiny_model), device=device, dtype="bfloat16")
    for seed in (3, 4):
        trainer.train_step(make_batch(seed=seed, groups=3, n=4))
    assert trainer.compute_copy.enabled
    masters = trainer.compute_copy.masters
    current = dict(trainer.policy.named_parameters())
    assert not any(hasattr(p, "device_mesh") for p in current.values()), "the copy was freed after the step"
    for name, p in current.items():
        assert p.dtype == torch.bfloat16
        torch.testing.assert_close(p.detach(), masters[name].to(torch.bfloat16), atol=0, rtol=0, msg=name)
    dist.destroy_process_group()
