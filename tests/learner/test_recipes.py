"""Per-algorithm recipes: what "auto" resolves to, and DAPO's group filter on accuracy vs shaped reward."""

import numpy as np
import pytest

from asyncrl import records
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.prepare import prepare_batch


def test_dapo_resolves_to_the_paper_recipe():
    cfg = LearnerConfig(algorithm="dapo")
    assert cfg.resolved_clip_eps_high == 0.28 and cfg.clip_eps_low == 0.2
    assert cfg.resolved_loss_agg == "token_mean"
    assert cfg.resolved_filter_groups == "accuracy"
    assert cfg.overlong_buffer_for(20480) == 4096 and cfg.overlong_buffer_for(1024) == 204
    assert cfg.resolved_ratio_level == "token" and cfg.dual_clip == 3.0 and cfg.kl_clamp == 10.0
    assert cfg.resolved_filter_refill  # dynamic sampling refills the batch, as in the paper


def test_dapo_recipe_parts_are_overridable():
    cfg = LearnerConfig(algorithm="dapo", clip_eps_high=0.2, loss_agg="seq_mean", filter_groups="shaped",
                        overlong_buffer=0)
    assert cfg.resolved_clip_eps_high == 0.2 and cfg.resolved_loss_agg == "seq_mean"
    assert cfg.resolved_filter_groups == "shaped" and cfg.overlong_buffer_for(20480) == 0
    assert not cfg.resolved_filter_refill  # the hub sees raw rewards only: a shaped filter runs in the learner
    assert not LearnerConfig(algorithm="dapo", filter_refill=False).resolved_filter_refill
    assert LearnerConfig(algorithm="grpo", filter_groups="accuracy", filter_refill=True).resolved_filter_refill


def test_other_algorithms_keep_plain_defaults():
    cfg = LearnerConfig(algorithm="grpo", clip_eps_low=0.1)
    assert cfg.resolved_clip_eps_high == 0.1  # symmetric unless set
    assert cfg.resolved_filter_groups == "off" and cfg.overlong_buffer_for(20480) == 0
    assert cfg.resolved_loss_agg == "seq_mean" and cfg.resolved_ratio_level == "token"
    assert LearnerConfig(algorithm="grpo", filter_groups="accuracy").resolved_filter_groups == "accuracy"
    assert not cfg.resolved_filter_refill
    assert not LearnerConfig(algorithm="grpo", filter_groups="accuracy").resolved_filter_refill


@pytest.mark.parametrize("kw, field", [({"dual_clip": 1.0}, "dual_clip"), ({"kl_clamp": -1.0}, "kl_clamp"),
                                       ({"clip_eps_high": 0.0}, "clip_eps_high"),
                                       ({"overlong_buffer": -1}, "overlong_buffer"),
                                       ({"host_threads": -1}, "host_threads"),
                                       ({"filter_refill": True}, "filter_refill"),
                                       ({"algorithm": "dapo", "filter_groups": "shaped", "filter_refill": True},
                                        "filter_refill")])
def test_invalid_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        LearnerConfig(**kw)


def test_a_group_filter_needs_groups_of_several_samples():
    from asyncrl.config.run import RunConfig
    from asyncrl.replay.config import BatchConfig

    with pytest.raises(ValueError, match="samples_per_prompt"):
        RunConfig(learner=LearnerConfig(algorithm="dapo"), batch=BatchConfig(samples_per_prompt=1))
    RunConfig(learner=LearnerConfig(algorithm="grpo"), batch=BatchConfig(samples_per_prompt=1))  # no filter: fine


def _group(gid: int, lengths: list[int], rewards: list[float], max_new_tokens: int = 8) -> records.Group:
    prompt = records.Prompt(prompt_id=f"p{gid}", n=len(lengths), token_ids=np.array([1, 2], np.int32),
                            sampling=records.SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens))
    samples = [records.ScoredSample(sample=records.Sample(
        prompt_id=prompt.prompt_id, sample_index=i, prompt_token_ids=prompt.token_ids,
        response_token_ids=np.full(n, 3, np.int32), logprobs=np.full(n, -1.0, np.float32),
        versions=np.zeros(n, np.int32), finish_reason=records.FinishReason.STOP), reward=r)
        for i, (n, r) in enumerate(zip(lengths, rewards))]
    return records.Group(prompt=prompt, samples=samples)


def _advantages(filter_groups: str) -> tuple[dict[str, float], list[tuple[int, float]]]:
    """Issue 12's example: four correct answers of lengths 3, 3, 3, 5 (max 8, buffer 4) shape to
    rewards 1, 1, 1, 0.75; a second group is mixed (1, 0)."""
    batch = records.Batch(step=1, policy_version=0, groups=[_group(0, [3, 3, 3, 5], [1.0] * 4),
                                                          _group(1, [2, 2], [1.0, 0.0])])
    cfg = LearnerConfig(algorithm="dapo", overlong_buffer=4, filter_groups=filter_groups)
    prep = prepare_batch(batch, cfg, rank=0, world_size=1, version=0)
    return prep.metrics, [(s.group, s.advantage) for s in prep.seqs]


def test_dapo_filters_on_accuracy_by_default():
    metrics, adv = _advantages("auto")
    assert metrics["groups_kept"] == 1.0  # all four correct: no signal, dropped despite the length penalty
    assert [g for g, _ in adv] == [1, 1]
    assert adv[0][1] == pytest.approx(0.7071, abs=1e-4) and adv[1][1] == pytest.approx(-0.7071, abs=1e-4)


def test_dapo_shaped_filter_keeps_the_length_penalty_as_signal():
    # mean 0.9375, Bessel std 0.125: (1 - 0.9375) / 0.125 = 0.5, (0.75 - 0.9375) / 0.125 = -1.5
    metrics, adv = _advantages("shaped")
    assert metrics["groups_kept"] == 2.0
    assert [a for g, a in adv if g == 0] == pytest.approx([0.5, 0.5, 0.5, -1.5], abs=1e-4)


def test_host_threads_auto_caps_the_pool_and_an_explicit_value_wins():
    import os

    assert LearnerConfig().resolved_host_threads == min(4, os.cpu_count() or 1)
    assert LearnerConfig(host_threads=7).resolved_host_threads == 7
