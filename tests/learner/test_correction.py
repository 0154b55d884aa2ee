"""The rollout-correction suite: golden numbers, computed by hand from docs/algorithms.md's formulas, for every
weight (token / sequence / geometric, truncated / masked) and for the mismatch metrics; the settings' checks."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from learner_helpers import VOCAB, make_batch

from asyncrl import records
from asyncrl.config.loader import from_dict
from asyncrl.config.run import RunConfig
from asyncrl.learner import losses
from asyncrl.learner.config import CorrectionConfig, LearnerConfig, rollout_correction_default
from asyncrl.learner.step_stats import StepStats
from asyncrl.learner.trainer import Trainer

# Three packed samples of 2, 1 and 3 tokens; d = log pi_prox - log pi_behav per token. Token 4 is an
# environment token (mask 0) with a wild ratio (e^5): it must count nowhere.
SEQ_LENS = torch.tensor([2, 1, 3])
D = torch.tensor([0.3, 0.2, -0.3, 0.1, 5.0, 0.2])
MASK = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])
E = math.exp
SEQ = [E(0.5), E(-0.3), E(0.3)]  # exp(sum of d over each sample's policy tokens): 1.648721, 0.740818, 1.349859
GEO = [E(0.25), E(-0.3), E(0.15)]  # exp(mean of d over them): 1.284025, 0.740818, 1.161834


def close(a, b, tol=1e-6):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


def weights(mode, cap, level, low=0.0):
    return losses.importance_weights(D, torch.zeros(6), mode, cap, low=low, level=level, seq_lens=SEQ_LENS,
                                     mask=MASK)


def test_token_truncated_is():
    w, dropped = weights("tis", 1.3, "token")
    close(w, [1.3, E(0.2), E(-0.3), E(0.1), 1.3, E(0.2)])
    assert not dropped.any()


def test_token_masked_is_drops_tokens_outside_the_band():
    w, dropped = weights("decoupled", 1.5, "token", low=0.8)
    close(w, [E(0.3), E(0.2), 0.0, E(0.1), 0.0, E(0.2)])  # e^-0.3 = 0.74 < 0.8; the environment token's e^5 > 1.5
    assert dropped.tolist() == [False, False, True, False, True, False]


def test_sequence_truncated_is_uses_the_product_over_policy_tokens():
    w, dropped = weights("tis", 1.5, "sequence")
    close(w, [1.5, 1.5, SEQ[1], SEQ[2], SEQ[2], SEQ[2]])  # sample 2: e^(0.1 + 0.2), not e^5.3
    assert not dropped.any()


def test_sequence_masked_is_drops_whole_samples():
    w, dropped = weights("decoupled", 1.5, "sequence", low=0.8)
    close(w, [0.0, 0.0, 0.0, SEQ[2], SEQ[2], SEQ[2]])  # 1.65 > 1.5 and 0.74 < 0.8 dropped; 1.35 kept
    assert dropped.tolist() == [True, True, True, False, False, False]


def test_geometric_mean_ratio_truncated_and_masked():
    w, _ = weights("tis", 1.2, "geometric")
    close(w, [1.2, 1.2, GEO[1], GEO[2], GEO[2], GEO[2]])
    w, dropped = weights("decoupled", 1.2, "geometric", low=0.8)
    close(w, [0.0, 0.0, 0.0, GEO[2], GEO[2], GEO[2]])
    assert dropped.tolist() == [True, True, True, False, False, False]


def test_decoupled_without_a_low_bound_is_the_former_drop_above_the_cap():
    w, dropped = weights("decoupled", 1.3, "token")
    close(w, [0.0, E(0.2), E(-0.3), E(0.1), 0.0, E(0.2)])
    assert dropped.tolist() == [True, False, False, False, True, False]


def test_an_unknown_level_names_the_setting():
    with pytest.raises(ValueError, match="correction.level"):
        weights("tis", 2.0, "vtrace")


def test_mismatch_metrics_golden():
    """r = [2, 0.5, 1, 4] on trained tokens (+ an environment token, r = e^3, that must not count):
    k1 = mean(-log r) = -ln2 / 2; k3 = mean(r - 1 - log r) = (3.5 - 2 ln2) / 4; chi2 = mean(r^2) - 1 =
    21.25 / 4 - 1 = 4.3125; quantiles of sorted [0.5, 1, 2, 4] (linear, position q * 3): p01 0.515, p50 1.5,
    p99 3.94; masked: 1 of 4 trained tokens."""
    ln2 = math.log(2.0)
    d = torch.tensor([ln2, -ln2, 0.0, 2 * ln2, 3.0])
    mb = SimpleNamespace(mask=torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0]), advantages=torch.zeros(5),
                         is_weights=torch.ones(5), is_dropped=torch.tensor([False, False, False, True, True]),
                         old_logp=d - 2.0, behav_logp=torch.full((5,), -2.0))
    stats = StepStats(torch.device("cpu"))
    stats.add_tokens(mb, entropy=torch.zeros(5), clipped=torch.zeros(5, dtype=torch.bool))
    m = stats.reduce(1)
    assert m["behav_prox_kl_k1"] == pytest.approx(-ln2 / 2, abs=1e-6)
    assert m["behav_prox_kl_k3"] == pytest.approx((3.5 - 2 * ln2) / 4, abs=1e-6)
    assert m["behav_prox_chi2"] == pytest.approx(4.3125, abs=1e-5)
    assert m["behav_prox_ratio_p01"] == pytest.approx(0.515, abs=1e-5)
    assert m["behav_prox_ratio_p50"] == pytest.approx(1.5, abs=1e-5)
    assert m["behav_prox_ratio_p99"] == pytest.approx(3.94, abs=1e-5)
    assert m["is_dropped_frac"] == 0.25
    assert m["behav_prox_logp_absdiff"] == pytest.approx(ln2, abs=1e-6)


@pytest.mark.parametrize("kw", [
    {"off_policy": "tis", "correction": CorrectionConfig(level="sequence")},
    {"off_policy": "tis", "correction": CorrectionConfig(level="geometric")},
    {"off_policy": "decoupled", "importance_cap": 1.05, "correction": CorrectionConfig(level="token", low=0.95)},
    {"off_policy": "decoupled", "importance_cap": 2.0, "correction": CorrectionConfig(level="sequence", low=0.5)},
    {"off_policy": "decoupled", "importance_cap": 1.05, "correction": CorrectionConfig(level="geometric", low=0.95)},
], ids=["seq-tis", "geo-tis", "token-mask", "seq-mask", "geo-mask"])
def test_trainer_steps_with_each_correction(tiny_model, kw):
    cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=32, **kw)
    m = Trainer(cfg, str(tiny_model), device="cpu", seed=0).train_step(make_batch(seed=4, behav_noise=0.2))
    assert all(math.isfinite(v) for v in m.values()), m
    assert m["behav_prox_kl_k3"] > 0  # each token's r - 1 - log r >= 0 (chi2's sample estimate may be < 0)
    assert m["behav_prox_ratio_p01"] < m["behav_prox_ratio_p50"] < m["behav_prox_ratio_p99"]
    if kw["off_policy"] == "tis":
        assert m["is_weight_max"] <= cfg.importance_cap and m["is_dropped_frac"] == 0
    else:
        assert 0 < m["is_dropped_frac"] < 1  # the band drops some of the noisy tokens (or samples), not all


def _group(responses: list[tuple[list[int], list[int]]]) -> records.Batch:
    """One prompt; sample i: response ids with its loss_mask, reward i % 2, behaviour logprob 0.0 on
    environment tokens (as a rollout records them) and -log(VOCAB) on the policy's."""
    prompt = records.Prompt(prompt_id="p", n=len(responses), token_ids=np.array([3, 1, 4], np.int32),
                            sampling=records.SamplingParams(max_new_tokens=32))
    samples = [records.ScoredSample(sample=records.Sample(
        prompt_id="p", sample_index=i, prompt_token_ids=prompt.token_ids, response_token_ids=np.array(ids, np.int32),
        logprobs=np.where(np.array(m) == 1, -np.log(VOCAB), 0.0).astype(np.float32),
        versions=np.zeros(len(ids), np.int32), finish_reason=records.FinishReason.STOP,
        loss_mask=np.array(m, np.int32)), reward=float(i % 2)) for i, (ids, m) in enumerate(responses)]
    return records.Batch(step=1, policy_version=0, groups=[records.Group(prompt=prompt, samples=samples)])


def _grads(tiny_model, cfg: LearnerConfig, batch: records.Batch) -> dict[str, torch.Tensor]:
    trainer = Trainer(cfg, str(tiny_model), device="cpu", seed=0)
    trainer.train_step(batch)
    return {n: p.grad.detach().clone() for n, p in trainer.masters if p.grad is not None}


@pytest.mark.parametrize("off_policy, level", [("tis", "sequence"), ("tis", "geometric"),
                                               ("decoupled", "sequence")])
def test_environment_tokens_never_enter_a_sample_weight(tiny_model, off_policy, level):
    """A model turn followed by environment tokens (whose behaviour logprob 0 against a proximal ~ -3.5 would pull
    the sample's weight to ~e^-10) trains exactly like that model turn alone."""
    cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=64, off_policy=off_policy, importance_cap=2.0,
                        correction=CorrectionConfig(level=level, low=0.5 if off_policy == "decoupled" else 0.0))
    other = ([7, 8, 9, 10], [1, 1, 1, 1])
    masked = _grads(tiny_model, cfg, _group([([5, 6, 2, 11, 12, 13], [1, 1, 1, 0, 0, 0]), other]))
    alone = _grads(tiny_model, cfg, _group([([5, 6, 2], [1, 1, 1]), other]))
    assert masked.keys() == alone.keys() and any(bool(g.abs().sum() > 0) for g in alone.values())
    for k in alone:
        torch.testing.assert_close(masked[k], alone[k], rtol=1e-4, atol=1e-6)


def test_without_a_proximal_policy_the_mismatch_is_zero(tiny_model):
    cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=32, off_policy="none")
    m = Trainer(cfg, str(tiny_model), device="cpu", seed=0).train_step(make_batch(seed=4, behav_noise=0.2))
    assert m["behav_prox_kl_k1"] == m["behav_prox_kl_k3"] == m["behav_prox_chi2"] == 0.0
    assert m["behav_prox_ratio_p01"] == m["behav_prox_ratio_p50"] == m["behav_prox_ratio_p99"] == 1.0


@pytest.mark.parametrize("kw, field", [
    ({"correction": CorrectionConfig(low=0.5), "off_policy": "tis"}, "correction.low"),
    ({"correction": CorrectionConfig(level="sequence"), "off_policy": "none"}, "correction.level"),
])
def test_contradicting_correction_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        LearnerConfig(**kw)


def test_correction_low_must_stay_below_one():
    with pytest.raises(ValueError, match=r"correction\.low=1\.0"):
        CorrectionConfig(low=1.0)


def test_correction_is_set_from_the_run_config():
    cfg = from_dict(RunConfig, {"learner": {"correction": {"level": "geometric", "low": 0.5}}})
    assert cfg.learner.correction == CorrectionConfig(level="geometric", low=0.5)


def test_rollout_precision_defaults():
    """Model-dtype rollouts keep the learner's defaults; FP8 rollouts call for token TIS with C = 2, and the run
    config gives it to them when learner.off_policy is left "auto" (a user's own choice stays)."""
    bf16, default = rollout_correction_default("model"), LearnerConfig()
    assert default.off_policy == "auto"
    assert (bf16.off_policy, bf16.importance_cap, bf16.level) == (default.resolved_off_policy, default.importance_cap,
                                                                  default.correction.level)
    assert tuple(rollout_correction_default("fp8")) == ("tis", 2.0, "token")
    with pytest.raises(ValueError, match="weights_dtype"):
        rollout_correction_default("int4")
    fp8 = {"model": {"dtype": "bfloat16"}, "generator": {"weights_dtype": "fp8"}}
    assert from_dict(RunConfig, fp8).learner.resolved_off_policy == "tis"
    assert from_dict(RunConfig, {"generator": {"weights_dtype": "model"}}).learner.resolved_off_policy == "decoupled"
    kept = from_dict(RunConfig, {**fp8, "learner": {"off_policy": "decoupled"}})
    assert kept.learner.off_policy == "decoupled"
    with pytest.raises(ValueError, match='model.dtype="bfloat16"'):
        from_dict(RunConfig, {"generator": {"weights_dtype": "fp8"}, "model": {"dtype": "float32"}})
