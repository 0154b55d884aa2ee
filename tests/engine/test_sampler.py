"""Sampling: counter-based uniforms, inverse-CDF sampling matches softmax, top-k / top-p, logprob definition."""

from __future__ import annotations

import math

import torch

from asyncrl.engine.torch import rng
from asyncrl.engine.torch.sampler import SamplingBatch, inverse_cdf, mask_top_k_top_p, sample


def batch(n: int, vocab: int, temperature=1.0, top_p=1.0, top_k=None, seed=0, steps=None) -> SamplingBatch:
    top_k = vocab if top_k is None else top_k
    return SamplingBatch(
        temperatures=torch.full((n,), float(temperature)), top_ps=torch.full((n,), float(top_p)),
        top_ks=torch.full((n,), top_k, dtype=torch.int64), seeds=torch.full((n,), seed, dtype=torch.int64),
        steps=torch.arange(n) if steps is None else steps, needs_truncation=top_p < 1 or top_k < vocab,
    )


def test_uniform_is_deterministic_in_range_and_row_independent():
    seeds = torch.tensor([1, 2, 2**62 + 5]), torch.tensor([0, 0, 7])
    u = rng.uniform(*seeds, 1000)
    assert torch.equal(u, rng.uniform(*seeds, 1000))
    assert torch.equal(u[1:2], rng.uniform(seeds[0][1:2], seeds[1][1:2], 1000))  # no batch dependence
    assert u.min() > 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.03
    assert not torch.equal(u[0], u[1])


def test_row_uniform_is_column_zero_of_the_uniforms():
    seeds, steps = torch.tensor([1, 2**62 + 5, 9]), torch.tensor([0, 7, 123456])
    assert torch.equal(rng.row_uniform(seeds, steps), rng.uniform(seeds, steps, 4)[:, 0])


def test_inverse_cdf_takes_the_first_token_whose_running_mass_exceeds_u():
    probs = torch.tensor([0.1, 0.2, 0.0, 0.7])
    scaled = torch.log(probs).repeat(5, 1)  # the zero becomes -inf, as top-k / top-p masking leaves it
    u = torch.tensor([0.05, 0.1, 0.15, 0.31, 1 - 2**-24])
    # running mass 0.1, 0.3, 0.3, 1.0: u = 0.1 is not exceeded by 0.1 (strictly greater), and the masked token
    # is skipped although its running mass ties the one before it
    assert inverse_cdf(scaled, u).tolist() == [0, 1, 1, 3, 3]
    tail_masked = torch.log(torch.tensor([[0.6, 0.4, 0.0]]))
    assert inverse_cdf(tail_masked, torch.tensor([1 - 2**-24])).tolist() == [1]  # never the masked tail


def test_inverse_cdf_samples_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(20000, 1)
    tokens, _ = sample(logits, batch(20000, 5, temperature=0.8, seed=3))
    freq = torch.bincount(tokens, minlength=5).float() / 20000
    want = torch.softmax(logits[0] / 0.8, -1)
    assert (freq - want).abs().max() < 0.015


def test_logprob_is_full_vocab_log_softmax_of_scaled_logits():
    logits = torch.randn(6, 50) * 3
    tokens, lps = sample(logits, batch(6, 50, temperature=0.6, top_p=0.5, top_k=5, seed=1))
    want = torch.log_softmax(logits / 0.6, -1).gather(-1, tokens[:, None])[:, 0]  # no truncation in the logprob
    assert torch.allclose(lps, want)
    g_tokens, g_lps = sample(logits, batch(6, 50, temperature=0.0))
    assert torch.equal(g_tokens, logits.argmax(-1))
    assert torch.allclose(g_lps, torch.log_softmax(logits, -1).max(-1).values)


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(mask_top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0]))[0, 2:]).all()
    kept = ~torch.isinf(mask_top_k_top_p(logits, torch.tensor([4]), torch.tensor([0.7])))[0]
    assert kept.tolist() == [True, True, False, False]  # 0.5 < 0.7 so the 0.3 token is kept too
    tokens, _ = sample(logits.repeat(500, 1), batch(500, 4, top_k=1))
    assert (tokens == 0).all()
    tokens, _ = sample(logits.repeat(2000, 1), batch(2000, 4, top_p=0.7))
    assert set(tokens.tolist()) == {0, 1}
    assert math.isclose((tokens == 0).float().mean().item(), 0.5 / 0.8, abs_tol=0.04)


def test_forced_rows_take_their_token_and_leave_sampled_rows_bitwise_unchanged():
    logits = torch.randn(8, 50) * 3
    b = batch(8, 50, temperature=0.7, top_k=10, seed=4)
    tokens, lps = sample(logits, b)
    b.forced = torch.tensor([-1, 3, -1, 49, 0, -1, -1, 7])
    f_tokens, f_lps = sample(logits, b)
    forced = b.forced >= 0
    assert torch.equal(f_tokens[~forced], tokens[~forced]) and torch.equal(f_lps[~forced], lps[~forced])
    assert torch.equal(f_tokens[forced], b.forced[forced])  # even outside the top-k
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, b.forced.clamp(min=0)[:, None])[:, 0]
    assert torch.equal(f_lps[forced], want[forced])
    b.forced = tokens  # forcing what was sampled scores it bitwise
    assert torch.equal(sample(logits, b)[1], lps)
