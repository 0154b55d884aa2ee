"""Golden numbers (hand-computed) for every loss function."""

import math

import pytest
import torch

from asyncrl.learner import losses


def close(a, b, tol=1e-6):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


def test_ppo_clip_asymmetric():
    ratio = torch.tensor([1.5, 0.5, 1.1, 1.5, 0.5])
    logp = ratio.log().requires_grad_()
    a = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    loss, clipped = losses.ppo_clip_loss(logp, torch.zeros(5), a, eps_low=0.2, eps_high=0.28)
    # A>0: min(1.5, 1.28) -> clipped; min(0.5, 0.8) -> 0.5. A<0: min(-1.1,-1.1); min(-1.5,-1.28); min(-0.5,-0.8) clipped
    close(loss, [-1.28, -0.5, 1.1, 1.5, 0.8])
    assert clipped.tolist() == [True, False, False, False, True]
    loss.sum().backward()
    close(logp.grad, [0.0, -0.5, 1.1, 1.5, 0.0])  # d/dlogp of -r*A = -r*A; clipped tokens: 0


def test_importance_weights_modes():
    prox = torch.log(torch.tensor([0.5, 1.0, 3.0]))
    behav = torch.zeros(3)
    w, dropped = losses.importance_weights(prox, behav, "decoupled", cap=2.0)
    close(w, [0.5, 1.0, 0.0])
    assert dropped.tolist() == [False, False, True]
    w, dropped = losses.importance_weights(prox, behav, "tis", cap=2.0)
    close(w, [0.5, 1.0, 2.0])
    assert not dropped.any()
    w, _ = losses.importance_weights(prox, behav, "none", cap=2.0)
    close(w, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="off_policy"):
        losses.importance_weights(prox, behav, "vtrace", cap=2.0)


def test_kl_estimators():
    logp = torch.tensor([math.log(0.5), -1.0])
    ref = torch.tensor([math.log(0.25), -1.0])
    close(losses.kl_k3(logp, ref), [0.5 + math.log(2.0) - 1.0, 0.0])  # 0.193147
    close(losses.kl_k1(logp, ref), [math.log(2.0), 0.0])


def test_value_loss_clipped():
    v = torch.tensor([1.0, 0.0, 0.6])
    old = torch.tensor([0.5, 0.5, 0.5])
    ret = torch.tensor([2.0, 0.0, 0.0])
    loss, clipped = losses.value_loss(v, old, ret, clip=0.2)
    # v=1 -> clipped to 0.7: max(1, 1.69); v=0 -> 0.3: max(0, 0.09); v=0.6 inside the range: 0.36
    close(loss, [0.845, 0.045, 0.18])
    assert clipped.tolist() == [True, True, False]


def test_aggregation_weights_modes():
    lens = torch.tensor([2, 3])
    close(losses.aggregation_weights(lens, "token_mean", total_tokens=10, total_seqs=4), [0.1] * 5)
    close(losses.aggregation_weights(lens, "seq_mean", total_tokens=10, total_seqs=4), [1 / 8] * 2 + [1 / 12] * 3)
    close(losses.aggregation_weights(lens, "constant", total_tokens=10, total_seqs=4, constant=8), [1 / 32] * 5)
    with pytest.raises(ValueError, match="loss_agg"):
        losses.aggregation_weights(lens, "sum", 1, 1)


def test_aggregate_seq_mean():
    w = losses.aggregation_weights(torch.tensor([2, 3]), "seq_mean", total_tokens=5, total_seqs=4)
    close(losses.aggregate(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), w), 1.375)  # (1+2)/8 + (3+4+5)/12


def test_token_mean_vs_seq_mean_split_invariance():
    """Two micro-batches with global normalisers add up to the loss of the whole batch."""
    tok = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    lens = torch.tensor([2, 3, 1])
    for mode in ("token_mean", "seq_mean", "constant"):
        whole = losses.aggregate(tok, losses.aggregation_weights(lens, mode, 6, 3, 4))
        a = losses.aggregate(tok[:2], losses.aggregation_weights(lens[:1], mode, 6, 3, 4))
        b = losses.aggregate(tok[2:], losses.aggregation_weights(lens[1:], mode, 6, 3, 4))
        close(a + b, whole)


def test_value_loss_in_range_is_not_clipped():
    """old + clamp(v - old) differs from v by an ulp here (-0.2 + 0.14 != -0.06 in fp32); clamping v itself
    keeps in-range predictions exact, so they are neither counted as clipped nor given a different loss."""
    v, old, ret = torch.tensor([-0.06]), torch.tensor([-0.2]), torch.tensor([0.0])
    assert (old + (v - old).clamp(-0.2, 0.2)) != v  # the ulp the old formula introduced
    loss, clipped = losses.value_loss(v, old, ret, clip=0.2)
    assert torch.equal(loss, 0.5 * (v - ret) ** 2) and not clipped.any()


def test_dual_clip_caps_negative_advantages():
    # verl's clip_ratio_c = 3: for A < 0 the loss -min(rA, clip(r)A) is capped at -3A
    ratio = torch.tensor([4.0, 2.0, 4.0, 0.5])
    logp = ratio.log().requires_grad_()
    a = torch.tensor([-1.0, -1.0, 1.0, -2.0])
    loss, clipped = losses.ppo_clip_loss(logp, torch.zeros(4), a, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    # 4 -> min(4, 3) = 3 (dual-clipped); 2 -> 2 (below the cap); A>0: -min(4, 1.2) = -1.2; 0.5: -min(-1, -1.6) = 1.6
    close(loss, [3.0, 2.0, -1.2, 1.6])
    assert clipped.tolist() == [True, False, True, True]
    loss.sum().backward()
    close(logp.grad, [0.0, 2.0, 0.0, 0.0])
    off, _ = losses.ppo_clip_loss(ratio.log(), torch.zeros(4), a, eps_low=0.2, eps_high=0.2, dual_clip=0.0)
    close(off, [4.0, 2.0, -1.2, 1.6])


# Three packed samples: diffs logp - old per token, advantages broadcast per sample.
SEQ_LENS = torch.tensor([2, 1, 3])
DIFFS = torch.tensor([0.05, 0.05, -0.3, 0.5, 0.6, 0.1])
SEQ_ADV = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, -1.0])


def test_sequence_ratio_is_exp_of_summed_log_diffs():
    rho = losses.sequence_ratio(DIFFS, torch.zeros(6), SEQ_LENS)
    e = [math.exp(0.1), math.exp(-0.3), math.exp(1.2)]
    close(rho, [e[0], e[0], e[1], e[2], e[2], e[2]])


def test_policy_loss_rloo_sequence_ratio_golden():
    """RLOO paper / TRL: rho_s = exp(sum_t dlogp), loss_s = -min(rho A, clip(rho) A), mean over samples.
    rho = e^0.1 = 1.105171 (A=+1, inside the range); e^-0.3 = 0.740818 (A=-1: clipped at 0.8);
    e^1.2 = 3.320117 (A=-1: -min(-3.32, -1.2) = 3.32, dual-clipped at 3)."""
    from asyncrl.learner.config import LearnerConfig

    cfg = LearnerConfig(algorithm="rloo")
    assert cfg.resolved_ratio_level == "sequence" and cfg.resolved_loss_agg == "seq_mean"
    logp = DIFFS.clone().requires_grad_()
    loss, clipped = losses.policy_loss(logp, torch.zeros(6), SEQ_ADV, SEQ_LENS, cfg)
    close(loss, [-1.105171] * 2 + [0.8] + [3.0] * 3)
    assert clipped.tolist() == [False, False, True, True, True, True]
    w = losses.aggregation_weights(SEQ_LENS, cfg.resolved_loss_agg, total_tokens=6, total_seqs=3)
    total = losses.aggregate(loss, w)
    close(total, (-1.105171 + 0.8 + 3.0) / 3)
    total.backward()
    # REINFORCE with a sequence ratio: d/dlogp_t = -(1/S) rho_s A_s on every token of an unclipped sample
    close(logp.grad, [-1.105171 / 3] * 2 + [0.0] * 4)


def test_policy_loss_token_form_keeps_per_token_ratios():
    from asyncrl.learner.config import LearnerConfig

    cfg = LearnerConfig(algorithm="rloo", ratio_level="token", dual_clip=0.0)
    assert cfg.resolved_loss_agg == "token_mean"  # the per-token form, as before
    loss, _ = losses.policy_loss(DIFFS, torch.zeros(6), SEQ_ADV, SEQ_LENS, cfg)
    r = DIFFS.exp()
    expect = -torch.minimum(r * SEQ_ADV, r.clamp(0.8, 1.2) * SEQ_ADV)
    close(loss, expect)


def test_sequence_ratio_matches_a_per_sample_loop():
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([3, 1, 5, 2])
    logp, old = -torch.rand(11, generator=g), -torch.rand(11, generator=g)
    rho = losses.sequence_ratio(logp, old, lens)
    for s, (start, n) in enumerate(zip((0, 3, 4, 9), lens.tolist())):
        expect = torch.exp((logp[start:start + n] - old[start:start + n]).sum())
        close(rho[start:start + n], [expect.item()] * n, tol=1e-6)


def test_kl_k3_clamp():
    logp = torch.zeros(4, requires_grad=True)
    ref = torch.tensor([-15.0, 100.0, -30.0, -1.0])
    k = losses.kl_k3(logp, ref, clamp=10.0)
    # d = -15: e^-15 + 14 = 14.0000003 -> 10; d = 100 overflows exp unclamped -> 10; d = -1: e^-1 + 1 - 1
    close(k, [10.0, 10.0, 10.0, math.exp(-1.0)])
    k.sum().backward()
    assert torch.isfinite(logp.grad).all()
    close(logp.grad, [0.0, 0.0, 0.0, 1.0 - math.exp(-1.0)])  # dk3/dlogp = 1 - e^d
    close(losses.kl_k3(torch.zeros(1), torch.tensor([-15.0]), clamp=0.0), [14.0 + math.exp(-15.0)], tol=1e-5)
