"""Multi-turn samples in the learner: environment tokens (loss_mask 0) are packed as context but get no
gradient and count in no normaliser, token count or statistic; a sample without a loss_mask trains as before."""

import numpy as np
import pytest
import torch
from learner_helpers import VOCAB, make_batch

from asyncrl import records
from asyncrl.learner import losses
from asyncrl.learner.batch_tensors import build_micro_batch, flatten_batch, pack_micro_batches
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.prepare import prepare_batch
from asyncrl.learner.trainer import Trainer


def with_masks(batch: records.Batch, seed: int = 0, env_version: int | None = None) -> records.Batch:
    """Give every other sample a random loss_mask (its first token the policy's), env logprobs 0."""
    rng = np.random.default_rng(seed)
    for g in batch.groups:
        for k, sc in enumerate(g.samples):
            s = sc.sample
            if k % 2 == 1 or len(s.response_token_ids) < 2:
                continue
            mask = rng.integers(0, 2, len(s.response_token_ids)).astype(np.int32)
            mask[0] = 1
            s.loss_mask, s.logprobs = mask, np.where(mask == 1, s.logprobs, 0.0).astype(np.float32)
            if env_version is not None:
                s.versions = np.where(mask == 1, s.versions, env_version).astype(np.int32)
    return batch


def segments(mb):
    """(SeqRecord index, start, length) of each sequence of a micro-batch."""
    start = 0
    for length, index in zip(mb.seq_lens.tolist(), mb.seq_index):
        yield index, start, length
        start += length


# ------------------------------------------------------------------ packing and normalisers


def test_packing_keeps_each_mask_on_its_own_tokens():
    seqs, _ = flatten_batch(with_masks(make_batch(seed=3, groups=4, n=4), seed=1))
    assert any(s.loss_mask is not None for s in seqs) and any(s.loss_mask is None for s in seqs)
    bins = pack_micro_batches(seqs, 16)  # several packs, longest first: the order differs from the batch's
    assert len(bins) > 1
    for mb in map(build_micro_batch, bins):
        assert mb.mask.shape == mb.targets.shape and mb.mask.dtype == torch.float32
        for index, start, length in segments(mb):
            s = seqs[index]
            want = np.ones(length) if s.loss_mask is None else s.loss_mask
            assert mb.mask[start:start + length].tolist() == list(want)
            assert mb.targets[start:start + length].tolist() == s.response.tolist()


@pytest.mark.parametrize("agg", ["seq_mean", "token_mean", "constant"])
def test_loss_weights_count_the_policy_tokens_only(agg):
    batch = with_masks(make_batch(seed=0, groups=3, n=4), seed=2)
    cfg = LearnerConfig(algorithm="grpo", loss_agg=agg, micro_batch_tokens=16)
    preps = [prepare_batch(batch, cfg, r, 2, version=0) for r in range(2)]
    seqs = preps[0].seqs
    trained = sum(s.num_trained_tokens for s in seqs)
    assert trained < sum(len(s.response) for s in seqs)
    total = 0.0
    for mb in (mb for p in preps for mbs in p.mini_batches for mb in mbs):
        assert bool((mb.agg_weights[mb.mask == 0] == 0).all())  # environment (and filler) tokens: no weight
        for index, start, length in segments(mb):
            if index < 0:
                continue
            s, w = seqs[index], mb.agg_weights[start:start + length]
            expected = {"seq_mean": 1 / (s.num_trained_tokens * len(seqs)), "token_mean": 1 / trained,
                        "constant": 1 / (8 * len(seqs))}[agg]
            torch.testing.assert_close(w[mb.mask[start:start + length] > 0], torch.full((s.num_trained_tokens,), expected))
        total += float(mb.agg_weights.sum())
    if agg != "constant":
        assert total == pytest.approx(1.0, abs=1e-5)  # a mean over the policy's tokens


def test_token_counts_and_staleness_skip_environment_tokens():
    batch = with_masks(make_batch(seed=1, groups=2, n=4, versions=3), seed=3, env_version=0)
    prep = prepare_batch(batch, LearnerConfig(algorithm="grpo"), 0, 1, version=5)
    trained = sum(s.num_trained_tokens for s in prep.seqs)
    assert prep.metrics["tokens"] == trained < sum(len(s.response) for s in prep.seqs)
    assert prep.metrics["staleness_max"] == 2.0 and prep.metrics["staleness_mean"] == 2.0  # env tokens' version 0 unseen
    assert prep.metrics["response_len_mean"] == np.mean([len(s.response) for s in prep.seqs])  # the whole response


def test_samples_without_a_loss_mask_prepare_exactly_as_all_ones():
    cfg = LearnerConfig(algorithm="grpo", micro_batch_tokens=16)
    plain = prepare_batch(make_batch(seed=2, groups=3, n=4), cfg, 0, 1, version=0)
    ones = make_batch(seed=2, groups=3, n=4)
    for g in ones.groups:
        for sc in g.samples:
            sc.sample.loss_mask = np.ones(len(sc.sample.response_token_ids), np.int32)
    masked = prepare_batch(ones, cfg, 0, 1, version=0)
    assert plain.metrics == masked.metrics
    for a, b in zip(plain.mini_batches[0], masked.mini_batches[0]):
        assert torch.equal(a.mask, b.mask) and torch.equal(a.agg_weights, b.agg_weights)
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.targets, b.targets)


def test_a_bad_loss_mask_is_rejected_with_the_sample_named():
    batch = make_batch(seed=0, groups=1, n=1)
    s = batch.groups[0].samples[0].sample
    s.loss_mask = np.ones(len(s.response_token_ids) + 1, np.int32)
    with pytest.raises(ValueError, match=f"sample {s.prompt_id}/0: loss_mask must be"):
        flatten_batch(batch)
    s.loss_mask = np.full(len(s.response_token_ids), 2, np.int32)
    with pytest.raises(ValueError, match="values \\[2\\]"):
        flatten_batch(batch)


def test_sequence_ratio_and_weights_ignore_masked_tokens():
    logp = torch.tensor([-1.0, -2.0, -9.0, -0.5, -3.0], requires_grad=True)
    old = torch.tensor([-1.2, -2.0, 0.0, -0.4, 0.0])  # environment tokens: behaviour logprob 0
    lens, mask = torch.tensor([3, 2]), torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    rho = losses.sequence_ratio(logp, old, lens, mask)
    torch.testing.assert_close(rho.detach(), torch.tensor([np.exp(0.2)] * 3 + [np.exp(-0.1)] * 2, dtype=torch.float32))
    rho.sum().backward()
    assert logp.grad[2] == 0 and logp.grad[4] == 0 and bool((logp.grad[[0, 1, 3]] != 0).all())
    torch.testing.assert_close(losses.sequence_ratio(logp, old, lens), losses.sequence_ratio(logp, old, lens, None))
    w = losses.aggregation_weights(lens, "seq_mean", 3.0, 2.0, trained_lens=torch.tensor([2, 1]))
    torch.testing.assert_close(w, torch.tensor([0.25, 0.25, 0.25, 0.5, 0.5]))
    torch.testing.assert_close(losses.aggregation_weights(lens, "seq_mean", 5.0, 2.0),
                               losses.aggregation_weights(lens, "seq_mean", 5.0, 2.0, trained_lens=lens))


# ------------------------------------------------------------------ gradients of a real step


def group(responses: list[tuple[list[int], list[int] | None]], max_new_tokens: int = 32) -> records.Batch:
    """One prompt; sample i has response ids and loss_mask (None: single-turn), reward i % 2."""
    prompt = records.Prompt(prompt_id="p", n=len(responses), token_ids=np.array([3, 1, 4], np.int32),
                            sampling=records.SamplingParams(max_new_tokens=max_new_tokens))
    samples = []
    for i, (ids, mask) in enumerate(responses):
        m = np.ones(len(ids), np.int32) if mask is None else np.array(mask, np.int32)
        s = records.Sample(prompt_id="p", sample_index=i, prompt_token_ids=prompt.token_ids,
                           response_token_ids=np.array(ids, np.int32),
                           logprobs=np.where(m == 1, -np.log(VOCAB), 0.0).astype(np.float32),
                           versions=np.zeros(len(ids), np.int32), finish_reason=records.FinishReason.STOP,
                           loss_mask=None if mask is None else m)
        samples.append(records.ScoredSample(sample=s, reward=float(i % 2)))
    return records.Batch(step=1, policy_version=0, groups=[records.Group(prompt=prompt, samples=samples)])


def step_grads(tiny_model, cfg: LearnerConfig, batch: records.Batch) -> dict[str, torch.Tensor]:
    trainer = Trainer(cfg, str(tiny_model), device="cpu", seed=0)
    trainer.train_step(batch)
    grads = {n: p.grad.detach().clone() for n, p in trainer.masters if p.grad is not None}
    assert grads and any(bool(g.abs().sum() > 0) for g in grads.values())
    return grads


def assert_same_grads(a: dict, b: dict, same: bool = True) -> None:
    assert a.keys() == b.keys()
    close = all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)
    assert close == same, max(float((a[k] - b[k]).abs().max()) for k in a)


OUTCOME = [pytest.param({"algorithm": "grpo"}, id="grpo-seq_mean"),
           pytest.param({"algorithm": "dapo", "filter_groups": "off"}, id="dapo-token_mean"),
           pytest.param({"algorithm": "dr_grpo"}, id="dr_grpo-constant"),
           pytest.param({"algorithm": "grpo", "kl_coef": 0.1, "off_policy": "none"}, id="grpo-kl"),
           pytest.param({"algorithm": "grpo", "off_policy": "tis"}, id="grpo-tis"),
           pytest.param({"algorithm": "rloo"}, id="rloo-sequence_ratio")]


@pytest.mark.parametrize("kw", OUTCOME + [
    pytest.param({"algorithm": "reinforce_pp"}, id="reinforce_pp-token_advantages")])
def test_trailing_environment_tokens_leave_the_gradient_of_the_sample_without_them(tiny_model, kw):
    """A model turn followed by environment tokens trains exactly like that model turn alone: the environment
    tokens neither get gradient nor enter the normalisers (the sample's other tokens cannot attend to them)."""
    cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=64, **kw)
    other = ([7, 8, 9, 10], None)
    masked = step_grads(tiny_model, cfg, group([([5, 6, 2, 11, 12, 13], [1, 1, 1, 0, 0, 0]), other]))
    alone = step_grads(tiny_model, cfg, group([([5, 6, 2], None), other]))
    assert_same_grads(masked, alone)
    unmasked = step_grads(tiny_model, cfg, group([([5, 6, 2, 11, 12, 13], None), other]))
    assert_same_grads(masked, unmasked, same=False)  # the test can tell: trained, those tokens change the gradient


@pytest.mark.parametrize("kw", OUTCOME + [pytest.param({"algorithm": "reinforce_pp"}, id="reinforce_pp"),
                                    pytest.param({"algorithm": "ppo", "kl_coef": 0.05}, id="ppo-kl")])
def test_environment_positions_get_no_gradient(tiny_model, monkeypatch, kw):
    """d loss / d logp_t is exactly 0 at every environment token, nonzero at the policy's tokens."""
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    forward = Trainer._forward

    def keep_grad(self, model, mb):
        logp, entropy, values = forward(self, model, mb)
        if torch.is_grad_enabled() and logp.requires_grad:
            logp.retain_grad()
            kept.append((logp, mb.mask))
        return logp, entropy, values

    monkeypatch.setattr(Trainer, "_forward", keep_grad)
    cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=64, **kw)
    step_grads(tiny_model, cfg, group([([5, 9, 9, 6, 2], [1, 0, 0, 1, 1]), ([7, 8, 9, 10, 4], [0, 1, 1, 0, 1])]))
    assert kept
    for logp, mask in kept:
        assert bool((logp.grad[mask == 0] == 0).all()), logp.grad
        assert bool((logp.grad[mask > 0] != 0).any()), logp.grad  # (a clipped token may have none)
