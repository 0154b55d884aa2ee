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
