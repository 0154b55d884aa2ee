"""Algorithms: one frozen `Recipe` per algorithm, in one registry (`RECIPES`).

"What is DAPO?" is answered here and nowhere else: GRPO's advantages with clip-higher 0.28, a token-mean
loss, groups of equal accuracy dropped (and refilled by the hub), and a soft overlong penalty over the last
fifth of max_new_tokens. Every `"auto"` setting of `LearnerConfig` resolves to its algorithm's recipe
(`LearnerConfig.resolved_*`); a setting given explicitly wins. The loop reads the recipe, never the name:
prepare.py (outcome advantages, shaping, the group filter), trainer.py (token-level advantages, the value
head), losses.py (ratio level, clip range) and the replay hub (refill, `records.SIGNAL_SPREAD`).

Adding an algorithm is one entry in `RECIPES` (and, for a new estimator, one function in advantages.py
that `Recipe.advantage` names); docs/algorithms.md shows an example. This module stays free of torch:
every process reads it through the run config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    advantage: str
    """The estimator: the name of a function in asyncrl/learner/advantages.py. Outcome level (`token_level`
    false): fn(rewards [S], group_ids [S]) -> [S]; token level: a function decorated with `@token_estimator`,
    on packed tokens: fn(token_rewards [N], seq_lens [B], values, gamma, lam, reduce) -> (advantages, returns)."""
    token_level: bool = False
    """The estimator works on per-token rewards (after the old pass, in the trainer) instead of one reward per
    sample (in prepare.py). Only token-level algorithms can put the KL into the reward."""
    value_head: bool = False
    """The policy carries a value head (a critic) and the loss a clipped value term."""
    loss_agg: Literal["token_mean", "seq_mean", "constant"] = "token_mean"
    """`loss_agg = "auto"` with a token-level ratio (a sequence-level ratio always gets seq_mean: one loss per
    sample)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """`ratio_level = "auto"`."""
    clip_eps_high: float | None = None
    """`clip_eps_high = "auto"`; None: symmetric, = clip_eps_low."""
    group_filter: Literal["off", "accuracy", "shaped"] = "off"
    """`filter_groups = "auto"`."""
    filter_refill: bool = False
    """`filter_refill = "auto"`, when the group filter in effect is accuracy (the hub sees raw rewards only)."""
    overlong_share: Fraction = Fraction(0)
    """`overlong_buffer = "auto"`: the buffer as a share of the sample's max_new_tokens (0: no shaping)."""

    def overlong_buffer(self, max_new_tokens: int) -> int:
        """The auto overlong buffer in tokens, rounded down."""
        return int(max_new_tokens * self.overlong_share)


GRPO = Recipe(advantage="grpo", loss_agg="seq_mean")
RECIPES: dict[str, Recipe] = {
    "grpo": GRPO,
    # Dr.GRPO (Liu et al. 2025): no std division, the constant normaliser sum / (S x max_new_tokens).
    "dr_grpo": replace(GRPO, advantage="dr_grpo", loss_agg="constant"),
    # DAPO (Yu et al. 2025, sec. 3 and 4.1): clip-higher 0.28, token-level mean, dynamic sampling on accuracy
    # with refill, and a soft overlong buffer of 4,096 of 20,480 generated tokens.
    "dapo": replace(GRPO, loss_agg="token_mean", clip_eps_high=0.28, group_filter="accuracy", filter_refill=True,
                    overlong_share=Fraction(4096, 20480)),
    # RLOO (Ahmadian et al. 2024), as TRL's RLOOTrainer: leave-one-out baseline, sequence-level ratio.
    "rloo": Recipe(advantage="rloo", ratio_level="sequence"),
    "reinforce_pp": Recipe(advantage="reinforce_pp", token_level=True),
    "ppo": Recipe(advantage="gae", token_level=True, value_head=True),
}
# learner.algorithm's type: the registry's names (docs/config.md lists them).
Algorithm = Literal[tuple(RECIPES)]  # type: ignore[valid-type]


def recipe(algorithm: str) -> Recipe:
    """The registered recipe of `algorithm`."""
    if algorithm not in RECIPES:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {sorted(RECIPES)} (an algorithm is one Recipe "
                         "in asyncrl/learner/algorithms.py RECIPES)")
    return RECIPES[algorithm]


def token_level_algorithms() -> list[str]:
    return [name for name, r in RECIPES.items() if r.token_level]
