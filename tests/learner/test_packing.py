"""records.Batch -> packed micro-batches and the per-rank split."""

import numpy as np
import pytest
from learner_helpers import make_batch

from asyncrl import records
from asyncrl.learner.batch_tensors import (
    build_micro_batch,
    filler_micro_batch,
    flatten_batch,
    pack_micro_batches,
)
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.prepare import prepare_batch, split_groups


def test_build_micro_batch_layout():
    seqs, _ = flatten_batch(make_batch(seed=0, groups=1, n=2))
    mb = build_micro_batch(seqs)
    a, b = seqs
    la, lb = len(a.prompt) + len(a.response) - 1, len(b.prompt) + len(b.response) - 1
    assert mb.input_ids.shape == (1, la + lb)
    assert mb.position_ids[0].tolist() == list(range(la)) + list(range(lb))
    # the token at gather position + 1 is the target (teacher forcing), within each sequence
    ids = mb.input_ids[0].tolist() + [None]
    for pos, tgt in zip(mb.gather_idx.tolist(), mb.targets.tolist()):
        assert ids[pos + 1] == tgt or pos + 1 in (la, la + lb)
    assert mb.targets.tolist() == a.response.tolist() + b.response.tolist()
    assert mb.seq_lens.tolist() == [len(a.response), len(b.response)]


def test_pack_respects_budget():
    seqs, _ = flatten_batch(make_batch(seed=3, groups=4, n=4))
    bins = pack_micro_batches(seqs, 16)
    assert sorted(s.index for b in bins for s in b) == list(range(len(seqs)))
    for b in bins:
        assert len(b) == 1 or sum(s.num_input_tokens for s in b) <= 16


def test_failed_and_empty_samples_skipped():
    batch = make_batch(seed=0, groups=1, n=3)
    batch.groups[0].samples[0].status = records.ScoreStatus.FAILED
    s = batch.groups[0].samples[1].sample
    s.response_token_ids, s.logprobs, s.versions = s.response_token_ids[:0], s.logprobs[:0], s.versions[:0]
    seqs, skipped = flatten_batch(batch)
    assert len(seqs) == 1 and skipped == 2


def test_mismatched_logprobs_rejected():
    batch = make_batch(seed=0, groups=1, n=1)
    batch.groups[0].samples[0].sample.logprobs = np.zeros(99, np.float32)
    with pytest.raises(ValueError, match="logprobs"):
        flatten_batch(batch)


def test_split_groups_whole_groups_round_robin():
    seqs, _ = flatten_batch(make_batch(seed=0, groups=3, n=2))
    parts = split_groups(seqs, world_size=2, mini_batches=1)
    assert {s.group for s in parts[0][0]} == {0, 2} and {s.group for s in parts[1][0]} == {1}


def test_prepare_pads_ranks_and_weights_sum():
    cfg = LearnerConfig(algorithm="grpo", micro_batch_tokens=16)
    batch = make_batch(seed=0, groups=3, n=4)
    preps = [prepare_batch(batch, cfg, r, 2, version=0) for r in range(2)]
    assert len(preps[0].mini_batches[0]) == len(preps[1].mini_batches[0])
    total = sum(float(mb.agg_weights.sum()) for p in preps for mb in p.mini_batches[0])
    assert total == pytest.approx(1.0, abs=1e-5)  # seq_mean: the weights of the global batch sum to 1


def test_prepare_dapo_filters_and_staleness():
    cfg = LearnerConfig(algorithm="dapo")
    prep = prepare_batch(make_batch(seed=0, groups=3, n=4, versions=1), cfg, 0, 1, version=3)
    assert prep.metrics["groups_kept"] == 2.0  # the last group's rewards are all equal
    assert prep.metrics["staleness_mean"] == 2.0 and prep.metrics["staleness_max"] == 2.0


def test_filler_has_no_weight():
    mb = filler_micro_batch()
    assert mb.mask.sum() == 0 and mb.seq_index == [-1] and mb.num_tokens == 2


def test_pack_spreads_tokens_evenly_over_the_fewest_bins():
    """As many bins as first-fit-decreasing needs, but loads within one sequence of each other (FFD alone
    leaves the last bin nearly empty)."""
    from asyncrl.learner.batch_tensors import _first_fit_decreasing

    seqs, _ = flatten_batch(make_batch(seed=1, groups=8, n=8))
    budget = sum(s.num_input_tokens for s in seqs) // 2 - 1  # FFD: two full bins and a small third
    longest_first = sorted(seqs, key=lambda s: (-s.num_input_tokens, s.index))
    ffd = _first_fit_decreasing(longest_first, [s.num_input_tokens for s in longest_first], budget)
    bins = pack_micro_batches(seqs, budget)
    assert len(bins) == len(ffd) == 3
    loads = [sum(s.num_input_tokens for s in b) for b in bins]
    assert max(loads) <= budget and max(loads) - min(loads) <= max(s.num_input_tokens for s in seqs)
    assert min(sum(s.num_input_tokens for s in b) for b in ffd) < min(loads)
    assert sorted(s.index for b in bins for s in b) == list(range(len(seqs)))
