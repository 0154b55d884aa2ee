"""An algorithm is one Recipe in asyncrl/learner/algorithms.py: the registry is complete, every "auto" setting
comes from it, and a new entry trains with nothing else changed."""

import math
import typing
from dataclasses import replace

import pytest
import torch
from learner_helpers import make_batch, params_snapshot

from asyncrl.learner import advantages as adv
from asyncrl.learner import algorithms
from asyncrl.learner.algorithms import GRPO, RECIPES
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer


def test_the_config_accepts_exactly_the_registered_algorithms():
    hints = typing.get_type_hints(LearnerConfig)
    assert typing.get_args(hints["algorithm"]) == tuple(RECIPES)
    assert set(RECIPES) == {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo"}


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_names_an_estimator_of_its_level(name):
    r = RECIPES[name]
    fn = adv.estimator(r.advantage)
    assert (adv.TOKEN_ADVANTAGES if r.token_level else adv.OUTCOME_ADVANTAGES)[name] is fn
    assert not r.value_head or r.token_level  # a critic needs per-token advantages


@pytest.mark.parametrize("name", list(RECIPES))
def test_auto_settings_resolve_to_the_recipe(name):
    r, cfg = RECIPES[name], LearnerConfig(algorithm=name)
    assert cfg.recipe is r
    assert cfg.resolved_ratio_level == r.ratio_level
    assert cfg.resolved_loss_agg == ("seq_mean" if r.ratio_level == "sequence" else r.loss_agg)
    assert cfg.resolved_clip_eps_high == (cfg.clip_eps_low if r.clip_eps_high is None else r.clip_eps_high)
    assert cfg.resolved_filter_groups == r.group_filter
    assert cfg.resolved_filter_refill == (r.filter_refill and r.group_filter == "accuracy")
    assert cfg.overlong_buffer_for(1000) == math.floor(1000 * r.overlong_share)


def test_an_unknown_algorithm_names_the_field_and_the_registry():
    with pytest.raises(ValueError, match=r"learner\.algorithm.*'a2c'.*RECIPES"):
        LearnerConfig(algorithm="a2c")
    with pytest.raises(ValueError, match="Recipe.advantage='nope'"):
        adv.estimator("nope")


def test_kl_in_reward_names_the_token_level_recipes():
    with pytest.raises(ValueError, match="reinforce_pp or ppo"):
        LearnerConfig(algorithm="grpo", kl_in_reward=True)


@pytest.fixture
def dr_dapo(monkeypatch):
    """A new algorithm registered as docs/algorithms.md says, touching nothing but the registry: DAPO's recipe
    with Dr.GRPO's unnormalised advantages."""
    monkeypatch.setitem(RECIPES, "dr_dapo", replace(RECIPES["dapo"], advantage="dr_grpo"))
    return "dr_dapo"


@pytest.fixture
def sign_grpo(monkeypatch):
    """A new algorithm with a new estimator: one function in advantages.py, one entry in the registry."""
    def sign_advantage(rewards, group_ids):  # [S] -> [S]: +1 above the group mean, -1 below
        return torch.sign(rewards - adv.group_mean(rewards, group_ids))

    monkeypatch.setattr(adv, "sign_advantage", sign_advantage, raising=False)
    monkeypatch.setitem(RECIPES, "sign_grpo", replace(GRPO, advantage="sign_advantage", loss_agg="token_mean",
                                                      clip_eps_high=0.3))
    return "sign_grpo"


def _one_step(tiny_model, algorithm: str) -> tuple[LearnerConfig, dict[str, float], list[str]]:
    cfg = LearnerConfig(algorithm=algorithm, lr=1e-3, micro_batch_tokens=32)
    trainer = Trainer(cfg, str(tiny_model), device="cpu", seed=0)
    before = params_snapshot(trainer)
    metrics = trainer.train_step(make_batch(seed=2, groups=3, n=4))
    after = params_snapshot(trainer)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    return cfg, metrics, [k for k in before if torch.equal(before[k], after[k])]


def test_a_registered_algorithm_trains_with_its_recipe(tiny_model, dr_dapo):
    cfg, m, unchanged = _one_step(tiny_model, dr_dapo)
    assert not unchanged, unchanged
    assert cfg.resolved_clip_eps_high == 0.28 and cfg.resolved_loss_agg == "token_mean"
    assert cfg.resolved_filter_refill and cfg.overlong_buffer_for(20480) == 4096
    assert m["groups_kept"] == 2.0  # DAPO's accuracy filter dropped the all-correct group
    # Dr.GRPO's advantages: rewards 0/1 in groups of four, mean 0.5, no std division -> +-0.5
    assert m["adv_max"] == pytest.approx(0.5) and m["adv_min"] == pytest.approx(-0.5)
    assert algorithms.recipe(dr_dapo).advantage == "dr_grpo"


def test_a_registered_estimator_is_the_one_trained_with(tiny_model, sign_grpo):
    cfg, m, unchanged = _one_step(tiny_model, sign_grpo)
    assert not unchanged, unchanged
    assert cfg.resolved_clip_eps_high == 0.3 and cfg.resolved_filter_groups == "off"
    assert m["adv_max"] == 1.0 and m["adv_min"] == -1.0  # the sign estimator's values, not GRPO's z-scores
    assert m["groups_kept"] == 3.0
