"""Golden numbers (hand-computed) for every advantage estimator and reward-shaping helper."""

import pytest
import torch

from asyncrl.learner import advantages as adv

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])
GID = torch.tensor([0, 0, 0, 0, 1, 1])


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


def test_grpo_group_normalised():
    # group 0: mean 0.5, unbiased std sqrt(1/3); group 1: mean 3, std sqrt(2)
    close(adv.grpo(R, GID), [0.866025, -0.866025, -0.866025, 0.866025, -0.707107, 0.707107])


def test_grpo_all_equal_group_is_zero():
    close(adv.grpo(torch.tensor([3.0, 3.0, 3.0]), torch.tensor([0, 0, 0])), [0.0, 0.0, 0.0])


def test_dr_grpo_mean_only():
    close(adv.dr_grpo(R, GID), [0.5, -0.5, -0.5, 0.5, -1.0, 1.0])


def test_rloo_leave_one_out():
    # r=1: baseline (2-1)/3 = 1/3 -> 2/3; r=0: baseline 2/3 -> -2/3; pair: +-2; singleton: 0
    r = torch.cat([R, torch.tensor([5.0])])
    g = torch.cat([GID, torch.tensor([2])])
    close(adv.rloo(r, g), [2 / 3, -2 / 3, -2 / 3, 2 / 3, -2.0, 2.0, 0.0])


def test_dapo_keep_mask_drops_all_equal_groups():
    keep = adv.dapo_keep_mask(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 1, 1]))
    assert keep.tolist() == [False, False, False, True, True]


def test_overlong_penalty_soft_buffer():
    lengths = torch.tensor([5, 6, 7, 8, 10, 12])
    pen = adv.overlong_penalty(lengths, torch.full((6,), 10), buffer=4, penalty=1.0)
    close(pen, [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    close(adv.overlong_penalty(lengths, torch.full((6,), 10), buffer=0, penalty=1.0), [0.0] * 6)


MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_outcome_token_rewards_with_kl():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    close(adv.outcome_token_rewards(torch.tensor([1.0, 2.0]), MASK), [[0, 0, 1.0], [0, 2.0, 0]])
    close(adv.outcome_token_rewards(torch.tensor([1.0, 2.0]), MASK, kl, 0.5),
          [[-0.05, -0.1, 0.85], [-0.2, 1.75, 0.0]])


def test_discounted_returns():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    close(adv.discounted_returns(r, MASK, gamma=0.5), [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])


def test_masked_whiten_population_std():
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    close(adv.masked_whiten(x, m), [[-1.224745, 0.0], [1.224745, 0.0]])


def test_masked_whiten_reduce_sums_statistics():
    x = torch.tensor([1.0, 3.0])
    seen = []
    out = adv.masked_whiten(x, torch.ones(2), reduce=lambda t: (seen.append(t.clone()), t * 2)[1])
    close(seen[0], [4.0, 2.0, 10.0])  # sum, count, sum of squares
    close(out, [-1.0, 1.0])  # doubling every statistic leaves mean 2 and std 1


def test_reinforce_pp_batch_normalised_returns():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    a, ret = adv.reinforce_pp(r, MASK, gamma=1.0)
    close(ret, [[1, 1, 1], [2, 2, 0]])
    # tokens {1,1,1,2,2}: mean 1.4, std sqrt(0.24)
    close(a, [[-0.816497, -0.816497, -0.816497], [1.224745, 1.224745, 0.0]])


def test_gae_hand_values():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 9.0]])
    a, ret = adv.gae(r, MASK, v, gamma=1.0, lam=0.5)
    # row 0: deltas 0.1, 0.1, 0.3 -> A = 0.225, 0.25, 0.3; row 1: deltas 0.2, 0.6 -> A = 0.5, 0.6
    close(ret, [[0.725, 0.85, 1.0], [0.7, 1.0, 0.0]])
    raw = torch.tensor([0.225, 0.25, 0.3, 0.5, 0.6])
    expect = (raw - raw.mean()) / (raw.var(unbiased=False).sqrt() + 1e-8)
    close(a[MASK.bool()], expect)
    assert a[1, 2] == 0


def test_gae_discount():
    _, ret = adv.gae(torch.tensor([[0.0, 1.0]]), torch.ones(1, 2), torch.tensor([[0.0, 0.0]]), gamma=0.9, lam=1.0)
    close(ret, [[0.9, 1.0]])


def test_registry():
    assert set(adv.OUTCOME_ADVANTAGES) | set(adv.TOKEN_ADVANTAGES) == {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"}
    assert adv.is_token_level("ppo") and not adv.is_token_level("grpo")
    with pytest.raises(ValueError, match="unknown algorithm"):
        adv.is_token_level("a2c")


def test_overlong_penalty_per_sample_buffer_paper_formula():
    # DAPO eq. 13: ((L_max - L_cache) - |y|) / L_cache inside the buffer; -1 past L_max; buffer 0: no penalty
    lengths = torch.tensor([3, 5, 8, 16, 17, 20])
    max_len = torch.tensor([8, 8, 8, 20, 20, 20])
    pen = adv.overlong_penalty(lengths, max_len, torch.tensor([4, 4, 4, 4, 0, 0]), penalty=0.5)
    close(pen, [0.0, -0.125, -0.5, 0.0, 0.0, 0.0])
