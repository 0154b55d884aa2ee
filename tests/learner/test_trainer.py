"""Trainer.train_step on a tiny Qwen2: every parameter moves, the surrogate falls, every algorithm runs."""

import itertools
import math

import pytest
import torch
from learner_helpers import make_batch, params_snapshot

from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer


def test_step_changes_every_parameter_and_lowers_loss(tiny_model):
    cfg = LearnerConfig(algorithm="grpo", lr=1e-3, off_policy="none", micro_batch_tokens=32)
    trainer = Trainer(cfg, str(tiny_model), device="cpu")
    batch = make_batch(seed=0, groups=3, n=4)
    before = params_snapshot(trainer)
    losses = [trainer.train_step(batch)["loss"] for _ in range(4)]
    after = params_snapshot(trainer)
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, f"parameters not updated: {unchanged}"
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert trainer.version == 4


def test_metrics_keys_and_staleness(tiny_model):
    trainer = Trainer(LearnerConfig(algorithm="grpo", lr=1e-4, micro_batch_tokens=32), str(tiny_model), device="cpu")
    trainer.version = 5
    m = trainer.train_step(make_batch(seed=1, groups=2, n=4, versions=3))
    for key in ("loss", "pg_loss", "reward_mean", "adv_mean", "adv_std", "adv_min", "adv_max", "clip_frac", "entropy",
                "grad_norm", "lr", "is_weight_mean", "is_weight_max", "is_dropped_frac", "staleness_mean",
                "staleness_max", "tokens", "trained_tokens", "policy_version"):
        assert key in m and math.isfinite(m[key]), key
    assert m["staleness_mean"] == 2.0 and m["staleness_max"] == 2.0
    assert m["tokens"] == m["trained_tokens"] > 0
    assert m["policy_version"] == 6.0


ALGOS = [
    {"algorithm": "dr_grpo"},
    {"algorithm": "dapo", "clip_eps_high": 0.28},
    {"algorithm": "rloo", "off_policy": "tis", "overlong_buffer": 2},
    {"algorithm": "reinforce_pp", "kl_coef": 0.05, "kl_in_reward": True},
    {"algorithm": "ppo", "kl_coef": 0.05, "mini_batches": 2, "lr_schedule": "cosine", "warmup_steps": 1},
]


@pytest.mark.parametrize("kw", ALGOS, ids=[a["algorithm"] for a in ALGOS])
def test_algorithms_run(tiny_model, kw):
    trainer = Trainer(LearnerConfig(lr=1e-3, micro_batch_tokens=32, **kw), str(tiny_model), device="cpu")
    m1 = trainer.train_step(make_batch(seed=2, groups=3, n=4))
    m2 = trainer.train_step(make_batch(seed=2, groups=3, n=4, step=2))
    for m in (m1, m2):
        assert all(math.isfinite(v) for v in m.values()), m
    if kw.get("kl_coef"):
        assert m2["kl"] > 0  # the policy moved away from the reference
    if kw["algorithm"] == "ppo":
        assert "value_loss" in m1 and m1["optimizer_steps"] == 2.0
    if kw["algorithm"] == "dapo":
        assert m1["groups_kept"] == 2.0


@pytest.mark.parametrize("off_policy", ["decoupled", "tis"])
def test_proximal_from_update_equals_separate_pass(tiny_model, monkeypatch, off_policy):
    """With one mini-batch the proximal logprobs are the update forward's own (no separate no-grad pass):
    the step must equal the one with the pass, in parameters and metrics."""
    cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=32, off_policy=off_policy, importance_cap=1.05)
    results = []
    for skip in (True, False):
        monkeypatch.setattr(Trainer, "_prox_from_update", lambda self, prep, skip=skip: skip)
        trainer = Trainer(cfg, str(tiny_model), seed=0)
        metrics = trainer.train_step(make_batch(seed=4, behav_noise=0.2))
        results.append((params_snapshot(trainer), metrics))
    (p_skip, m_skip), (p_pass, m_pass) = results
    for name in p_pass:
        torch.testing.assert_close(p_skip[name], p_pass[name], atol=0, rtol=0)
    for key in ("loss", "is_weight_mean", "is_dropped_frac", "behav_prox_logp_absdiff", "clip_frac"):
        assert m_skip[key] == pytest.approx(m_pass[key], abs=1e-7), key
    assert m_pass["behav_prox_logp_absdiff"] > 0.05 and m_pass["is_weight_max"] > 1.0  # the weights matter


def test_one_rank_bf16_kl_reference_is_held_once_in_bf16(tiny_model):
    """One FSDP2 rank (gloo, bf16 compute): the frozen KL reference is plain bf16 tensors, not an fp32 shard beside
    FSDP2's kept compute copy; its logprobs are the policy's at step 1 (both the bf16 cast of the same weights)."""
    trainer = Trainer(LearnerConfig(algorithm="grpo", kl_coef=0.1, micro_batch_tokens=32), str(tiny_model),
                      device="cpu", dtype="bfloat16")
    assert trainer.dist.sharded and trainer.ref is not None
    assert {p.dtype for p in trainer.ref.parameters()} == {torch.bfloat16}
    assert not any(hasattr(p, "device_mesh") for p in trainer.ref.parameters())
    first = trainer.train_step(make_batch(seed=1, step=1))
    assert first["kl"] == 0.0 and trainer.train_step(make_batch(seed=2, step=2))["kl"] > 0
