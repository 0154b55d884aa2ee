"""Advantage estimators: small pure functions on tensors, each named by an algorithm's recipe
(`Recipe.advantage`, asyncrl/learner/algorithms.py).

Two shapes of estimator:
* outcome-level (one scalar reward per sample, normalised within its prompt's group):
  `fn(rewards [S], group_ids [S]) -> advantages [S]`, broadcast to the sample's response tokens;
* token-level (per-token rewards over the batch's trained tokens, packed: sequences end to end):
  `fn.packed(token_rewards [N], seq_lens [B], values [N] | None, gamma, lam, reduce) -> (advantages, returns)`,
  made by `@token_estimator` (which also lets `fn` take padded [B, L] rows with a mask).

`reduce` (token-level only) sums a tensor over learner ranks so batch statistics are global; None
means this process holds the whole batch. Reward shaping (`overlong_penalty`, `packed_token_rewards`)
and DAPO's group filter (`dapo_keep_mask`) are separate helpers the loop calls before the estimator.
Formulas, deliberate choices and differences from TRL / verl: docs/algorithms.md.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from asyncrl.learner.algorithms import RECIPES, recipe
from asyncrl.records import SIGNAL_SPREAD

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
# On packed tokens: the trained tokens of B sequences end to end (a multi-turn sample's environment tokens
# left out), token tensors [N] with seq_lens [B] (int64 on the host, sum N). The tensors stay on their device;
# a scan walks every sequence backwards at once, one position per step, with index plans made on the host.


def _reverse_plan(seq_lens: Tensor, device: torch.device) -> list[tuple[Tensor, Tensor]]:
    """Steps of a backward scan over packed sequences, t = longest - 1 down to 0: (rows [b_t] of the
    sequences longer than t, their token t's packed positions [b_t]), on `device` (one copy)."""
    lens = seq_lens.numpy()  # [B] host
    starts = np.cumsum(lens) - lens  # [B]
    rows = [np.flatnonzero(lens > t) for t in range(int(lens.max(initial=0)) - 1, -1, -1)]
    sizes = [len(r) for r in rows]
    positions = [starts[r] + (len(rows) - 1 - i) for i, r in enumerate(rows)]  # token t = longest - 1 - i
    flat = np.concatenate([np.zeros(0, np.int64)] + rows + positions)
    both = host_to(device, torch.from_numpy(flat.astype(np.int64))).split(sizes * 2)
    return list(zip(both[:len(rows)], both[len(rows):]))


def host_to(device: torch.device, x: Tensor) -> Tensor:
    """A host tensor on `device` without blocking the host (a pageable copy to a GPU waits for the queued
    kernels; a pinned one does not, and the caching host allocator keeps the buffer until the copy is done)."""
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def packed_token_rewards(rewards: Tensor, seq_lens: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token rewards: the outcome reward on each sequence's last token, minus kl_coef * kl on every token
    (KL-in-reward, k1).  rewards [B] (device), seq_lens [B] (host), kl [N] -> [N]"""
    has = seq_lens > 0  # [B]
    ends = (torch.cumsum(seq_lens, 0) - 1)[has]  # [B'] packed position of each non-empty sequence's last token
    out = torch.zeros(int(seq_lens.sum()), dtype=torch.float32, device=rewards.device)  # [N]
    out[host_to(rewards.device, ends)] = rewards[host_to(rewards.device, has)].to(torch.float32)
    if kl is not None and kl_coef:
        out = out - kl_coef * kl
    return out


def packed_returns(token_rewards: Tensor, seq_lens: Tensor, gamma: float) -> Tensor:
    """G_t = sum_{k >= t} gamma^(k-t) r_k within each sequence.  [N], seq_lens [B] -> [N]"""
    out = torch.zeros_like(token_rewards)  # [N]
    running = torch.zeros(len(seq_lens), dtype=token_rewards.dtype, device=token_rewards.device)  # [B]
    for rows, pos in _reverse_plan(seq_lens, token_rewards.device):
        g = token_rewards[pos] + gamma * running[rows]  # [b_t]
        running[rows] = g
        out[pos] = g
    return out


def whiten(x: Tensor, reduce: ReduceFn | None = None) -> Tensor:
    """(x - mean) / (std + eps) over every packed token of the batch (`masked_whiten` with all tokens in).  [N]"""
    return masked_whiten(x, torch.ones_like(x), reduce)


def token_estimator(packed: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Tensor, Tensor]]:
    """A token-level estimator written on packed tokens, `packed(token_rewards [N], seq_lens [B], values [N] |
    None, gamma, lam, reduce) -> (advantages [N], returns [N])`, which the trainer calls as `fn.packed`. The
    function this returns also takes the padded form of the formulas, token tensors [B, L] whose `mask` [B, L]
    marks each row's prefix of real tokens, and pads its results back ([B, L], 0 past each row)."""

    @functools.wraps(packed)
    def padded(token_rewards: Tensor, mask: Tensor, values: Tensor | None = None, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        keep = mask > 0  # [B, L]
        lens = keep.sum(-1).cpu()  # [B]
        a, ret = packed(token_rewards[keep], lens, None if values is None else values[keep], *args, **kwargs)
        return _unpack(a, keep), _unpack(ret, keep)

    padded.packed = packed  # type: ignore[attr-defined]
    return padded


def _unpack(x: Tensor, keep: Tensor) -> Tensor:
    """Packed [N] -> padded [B, L], 0 where `keep` is False."""
    return torch.zeros(keep.shape, dtype=x.dtype, device=x.device).masked_scatter(keep, x)


def outcome_token_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """`packed_token_rewards` on padded rows.  rewards [B], mask [B, L], kl [B, L] -> [B, L]"""
    keep = mask > 0
    return _unpack(packed_token_rewards(rewards, keep.sum(-1).cpu(), None if kl is None else kl[keep], kl_coef), keep)


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """`packed_returns` on padded rows.  [B, L] -> [B, L]"""
    keep = mask > 0
    return _unpack(packed_returns(token_rewards[keep], keep.sum(-1).cpu(), gamma), keep)


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


@token_estimator
def reinforce_pp(token_rewards: Tensor, seq_lens: Tensor, values: Tensor | None = None, gamma: float = 1.0,
                 lam: float = 1.0, reduce: ReduceFn | None = None) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns, whitened over every token of the batch; no critic.
    [N], seq_lens [B] -> (advantages [N], returns [N])"""
    returns = packed_returns(token_rewards, seq_lens, gamma)
    return whiten(returns, reduce), returns


@token_estimator
def gae(token_rewards: Tensor, seq_lens: Tensor, values: Tensor | None = None, gamma: float = 1.0,
        lam: float = 0.95, reduce: ReduceFn | None = None) -> tuple[Tensor, Tensor]:
    """PPO generalised advantage estimation with a critic (V after the last token is 0):
    delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lam A_{t+1};  returns = A + V.
    Advantages are whitened over the batch.  [N], seq_lens [B] -> (advantages [N], returns [N])"""
    assert values is not None, "gae needs the critic's values"
    adv = torch.zeros_like(token_rewards)  # [N]
    next_v = torch.zeros(len(seq_lens), dtype=token_rewards.dtype, device=token_rewards.device)  # [B]
    next_a = torch.zeros_like(next_v)
    for rows, pos in _reverse_plan(seq_lens, token_rewards.device):
        delta = token_rewards[pos] + gamma * next_v[rows] - values[pos]  # [b_t]
        a = delta + gamma * lam * next_a[rows]
        adv[pos] = a
        next_v[rows] = values[pos]
        next_a[rows] = a
    return whiten(adv, reduce), adv + values


def estimator(name: str) -> Callable[..., Any]:
    """The estimator a recipe names (`Recipe.advantage`): the function of this module called `name`."""
    fn = getattr(sys.modules[__name__], name, None)
    if not inspect.isfunction(fn):
        raise ValueError(f"Recipe.advantage={name!r}: asyncrl/learner/advantages.py has no such function; "
                         "name one of its estimators or add it there")
    return fn


def packed_estimator(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """The packed form of the token-level estimator a recipe names (`Recipe.advantage`)."""
    fn = estimator(name)
    if not hasattr(fn, "packed"):
        raise ValueError(f"Recipe.advantage={name!r} is token-level but not written on packed tokens: decorate it "
                         "with @token_estimator in asyncrl/learner/advantages.py")
    return fn.packed


# The built-in algorithms' estimators by level, as the registry had them at import (the loop reads the recipe).
OUTCOME_ADVANTAGES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    name: estimator(r.advantage) for name, r in RECIPES.items() if not r.token_level}
TOKEN_ADVANTAGES: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    name: estimator(r.advantage) for name, r in RECIPES.items() if r.token_level}


def is_token_level(algorithm: str) -> bool:
    return recipe(algorithm).token_level
