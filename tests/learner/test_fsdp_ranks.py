"""FSDP2 over 2 CPU ranks (gloo) matches one process on the same batch; its checkpoints round-trip."""

import pytest
import torch
import torch.multiprocessing as mp
from learner_helpers import fsdp_worker, make_batch, params_snapshot

from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer

# adam_eps = 1 makes the first AdamW update ~ lr * grad, so parameters compare gradients, not grad signs
CFG = {"algorithm": "grpo", "lr": 1e-2, "adam_eps": 1.0, "micro_batch_tokens": 24, "off_policy": "decoupled"}
METRICS = ("loss", "pg_loss", "grad_norm", "entropy", "clip_frac", "adv_mean", "adv_std", "is_weight_mean",
           "trained_tokens", "reward_mean")


@pytest.mark.timeout(240)
def test_two_ranks_match_one(tiny_model, tmp_path):
    store = f"file://{tmp_path / 'pg-store'}"
    mp.spawn(fsdp_worker, args=(2, store, str(tiny_model), str(tmp_path), CFG), nprocs=2, join=True)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)

    single = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    m1 = single.train_step(make_batch(seed=5, groups=3, n=4))
    for k in METRICS:
        assert got["m1"][k] == pytest.approx(m1[k], rel=1e-5, abs=1e-6), k
    ref = params_snapshot(single)
    assert got["params"].keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got["params"][k], ref[k], atol=1e-6, rtol=1e-5, msg=k)

    # the sharded checkpoint resumed on 2 ranks repeats step 2 exactly
    assert got["extra"] == {"hub_step": 1}
    for k in METRICS:
        assert got["m2b"][k] == pytest.approx(got["m2"][k], rel=1e-6, abs=1e-7), k

    # ...and loads into a single process (gathered to rank 0: any world size)
    other = Trainer(LearnerConfig(**CFG), str(tiny_model), device="cpu")
    other.load_checkpoint(got["ckpt"])
    for k, v in params_snapshot(other).items():
        torch.testing.assert_close(v, got["params"][k], atol=0, rtol=0, msg=k)


def test_bf16_mixed_precision_keeps_temperature_fp32(tiny_model, monkeypatch):
    """Under FSDP2 bf16 compute (here a one-rank gloo group on CPU) the per-token temperature reaches the
    lm_head logprob in fp32: cast to bf16, T = 0.8 would become 0.80078 and every logprob would shift."""
    from asyncrl.learner import model as policy_model

    seen = []
    head = policy_model.head_logprobs

    def spy(hidden, weight, targets, temperature, *rest):
        seen.append((hidden.dtype, temperature.dtype))
        return head(hidden, weight, targets, temperature, *rest)

    monkeypatch.setattr(policy_model, "head_logprobs", spy)
    trainer = Trainer(LearnerConfig(), str(tiny_model), device="cpu", dtype="bfloat16")
    trainer.train_step(make_batch(seed=1, temperature=0.8))
    assert seen and set(seen) == {(torch.bfloat16, torch.float32)}
