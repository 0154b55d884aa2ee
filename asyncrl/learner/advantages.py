"""Advantage estimators: small pure functions on tensors, each named by an algorithm's recipe
(`Recipe.advantage`, asyncrl/learner/algorithms.py).

Two shapes of estimator:
* outcome-level (one scalar reward per sample, normalised within its prompt's group):
  `fn(rewards [S], group_ids [S]) -> advantages [S]`, broadcast to the sample's response tokens;
* token-level (per-token rewards over padded responses, `mask` marks real tokens):
  `fn(token_rewards [B, L], mask [B, L], values [B, L] | None, gamma, lam, reduce) -> (advantages, returns)`.

`reduce` (token-level only) sums a tensor over learner ranks so batch statistics are global; None
means this process holds the whole batch. Reward shaping (`overlong_penalty`, `outcome_token_rewards`)
and DAPO's group filter (`dapo_keep_mask`) are separate helpers the loop calls before the estimator.
Formulas, deliberate choices and differences from TRL / verl: docs/algorithms.md.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from asyncrl.learner.algorithms import RECIPES, SIGNAL_SPREAD, recipe

ReduceFn = Callable[[Tensor], Tensor]
EPS = 1e-6


# ---------------------------------------------------------------- group statistics


def _group_count(group_ids: Tensor, num_groups: int, dtype: torch.dtype) -> Tensor:
    ones = torch.ones_like(group_ids, dtype=dtype)
    return torch.zeros(num_groups, dtype=dtype).index_add_(0, group_ids, ones)  # [G]


def group_mean(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Mean reward of each sample's group, per sample.  rewards [S] float, group_ids [S] int -> [S]"""
    g = int(group_ids.max()) + 1 if group_ids.numel() else 0
    sums = torch.zeros(g, dtype=rewards.dtype).index_add_(0, group_ids, rewards)  # [G]
    return (sums / _group_count(group_ids, g, rewards.dtype))[group_ids]


def group_std(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Unbiased (n - 1) std of each sample's group, per sample; 0 for groups of one.  [S] -> [S]"""
    g = int(group_ids.max()) + 1 if group_ids.numel() else 0
    count = _group_count(group_ids, g, rewards.dtype)  # [G]
    dev2 = (rewards - group_mean(rewards, group_ids)) ** 2  # [S]
    ss = torch.zeros(g, dtype=rewards.dtype).index_add_(0, group_ids, dev2)  # [G]
    return (ss / (count - 1).clamp(min=1)).sqrt()[group_ids]


# ---------------------------------------------------------------- outcome-level estimators


def grpo(rewards: Tensor, group_ids: Tensor, eps: float = EPS) -> Tensor:
    """GRPO: (r - mean_group) / (std_group + eps).  [S] -> [S]"""
    return (rewards - group_mean(rewards, group_ids)) / (group_std(rewards, group_ids) + eps)


def dr_grpo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr.GRPO: r - mean_group (no std division; pair with the constant loss normaliser).  [S] -> [S]"""
    return rewards - group_mean(rewards, group_ids)


def rloo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: r_i - mean of the other samples of the group; 0 in a group of one (no baseline).  [S] -> [S]"""
    g = int(group_ids.max()) + 1 if group_ids.numel() else 0
    count = _group_count(group_ids, g, rewards.dtype)[group_ids]  # [S]
    sums = torch.zeros(g, dtype=rewards.dtype).index_add_(0, group_ids, rewards)[group_ids]  # [S]
    baseline = (sums - rewards) / (count - 1).clamp(min=1)
    return torch.where(count > 1, rewards - baseline, torch.zeros_like(rewards))


def dapo_keep_mask(rewards: Tensor, group_ids: Tensor, tol: float = SIGNAL_SPREAD) -> Tensor:
    """DAPO dynamic sampling: False for samples of groups whose rewards are all equal (zero advantage,
    no signal). The paper passes accuracy here (the raw reward before overlong shaping).  [S] -> [S] bool"""
    g = int(group_ids.max()) + 1 if group_ids.numel() else 0
    hi = torch.full((g,), -torch.inf, dtype=rewards.dtype).scatter_reduce_(0, group_ids, rewards, "amax")
    lo = torch.full((g,), torch.inf, dtype=rewards.dtype).scatter_reduce_(0, group_ids, rewards, "amin")
    return ((hi - lo) > tol)[group_ids]


def overlong_penalty(lengths: Tensor, max_len: Tensor, buffer: int | Tensor, penalty: float) -> Tensor:
    """DAPO soft overlong punishment added to the reward (paper eq. 13, times `penalty`): 0 up to
    max_len - buffer, then ((max_len - buffer) - len) / buffer down to -1 at max_len, -1 beyond; no
    penalty where buffer is 0.  lengths [S], max_len [S], buffer int or [S] -> [S]"""
    buf = torch.as_tensor(buffer, dtype=torch.float32).expand(lengths.shape)  # [S]
    excess = (lengths - max_len).to(torch.float32) + buf  # [S] tokens into the buffer
    frac = (excess / buf.clamp(min=1.0)).clamp(0.0, 1.0)
    return torch.where(buf > 0, -penalty * frac, torch.zeros_like(frac))


# ---------------------------------------------------------------- token-level estimators


def outcome_token_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token rewards: the outcome reward on each response's last token, minus kl_coef * kl on every
    token (KL-in-reward, k1).  rewards [B], mask [B, L], kl [B, L] -> [B, L]"""
    lengths = mask.sum(-1).long()  # [B]
    out = torch.zeros(mask.shape, dtype=torch.float32)
    has = lengths > 0
    out[has.nonzero().squeeze(-1), lengths[has] - 1] = rewards[has].to(torch.float32)
    if kl is not None and kl_coef:
        out = out - kl_coef * kl * mask
    return out * mask


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = sum_{k >= t} gamma^(k-t) r_k within each response.  [B, L] -> [B, L]"""
    out = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        running = token_rewards[:, t] + gamma * running * mask[:, t]
        out[:, t] = running
    return out * mask


def masked_whiten(x: Tensor, mask: Tensor, reduce: ReduceFn | None = None, eps: float = 1e-8) -> Tensor:
    """(x - mean) / (std + eps) over the masked entries of the whole batch (population std); `reduce`
    sums the statistics over ranks.  [...] -> [...]"""
    m = mask.to(x.dtype)
    stats = torch.stack([(x * m).sum(), m.sum(), (x * x * m).sum()])  # [3]
    if reduce is not None:
        stats = reduce(stats)
    s, n, ss = stats.unbind()
    mean = s / n.clamp(min=1)
    var = (ss / n.clamp(min=1) - mean * mean).clamp(min=0)
    return (x - mean) / (var.sqrt() + eps) * m


def reinforce_pp(token_rewards: Tensor, mask: Tensor, values: Tensor | None = None, gamma: float = 1.0,
                 lam: float = 1.0, reduce: ReduceFn | None = None) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns, whitened over every token of the batch; no critic.
    [B, L] -> (advantages [B, L], returns [B, L])"""
    returns = discounted_returns(token_rewards, mask, gamma)
    return masked_whiten(returns, mask, reduce), returns


def gae(token_rewards: Tensor, mask: Tensor, values: Tensor | None = None, gamma: float = 1.0,
        lam: float = 0.95, reduce: ReduceFn | None = None) -> tuple[Tensor, Tensor]:
    """PPO generalised advantage estimation with a critic (V after the last token is 0):
    delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lam A_{t+1};  returns = A + V.
    Advantages are whitened over the batch.  [B, L] -> (advantages [B, L], returns [B, L])"""
    assert values is not None, "gae needs the critic's values"
    m = mask.to(token_rewards.dtype)
    adv = torch.zeros_like(token_rewards)
    next_v = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)  # [B]
    next_a = torch.zeros_like(next_v)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        delta = token_rewards[:, t] + gamma * next_v - values[:, t]
        a = (delta + gamma * lam * next_a) * m[:, t]
        adv[:, t] = a
        next_v = values[:, t] * m[:, t]
        next_a = a
    returns = (adv + values) * m
    return masked_whiten(adv, mask, reduce), returns


def estimator(name: str) -> Callable[..., Any]:
    """The estimator a recipe names (`Recipe.advantage`): the function of this module called `name`."""
    fn = getattr(sys.modules[__name__], name, None)
    if not inspect.isfunction(fn):
        raise ValueError(f"Recipe.advantage={name!r}: asyncrl/learner/advantages.py has no such function; "
                         "name one of its estimators or add it there")
    return fn


# The built-in algorithms' estimators by level, as the registry had them at import (the loop reads the recipe).
OUTCOME_ADVANTAGES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    name: estimator(r.advantage) for name, r in RECIPES.items() if not r.token_level}
TOKEN_ADVANTAGES: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    name: estimator(r.advantage) for name, r in RECIPES.items() if r.token_level}


def is_token_level(algorithm: str) -> bool:
    return recipe(algorithm).token_level
