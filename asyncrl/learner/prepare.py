"""Batch -> this rank's mini-batches of packed micro-batches, with outcome advantages and loss weights.

Every rank receives the whole `records.Batch` and runs this deterministically, so all batch-level
quantities (reward shaping, DAPO's group filter, group-normalised advantages, loss normalisers, the
number of micro-batches per mini-batch) agree across ranks without communication:

    flatten (drop failed / empty) -> overlong penalty -> group filter (DAPO) -> outcome advantages
    -> groups dealt to ranks round-robin -> each rank's groups split into `mini_batches`
    -> packed micro-batches, padded with fillers to the same count on every rank
    -> per-token aggregation weights from the global (all ranks) totals of each mini-batch

The group filter drops groups without signal; the batch then trains on fewer samples (it is not refilled),
and the loss normalisers count only the kept samples, so the per-token scale of the update is unchanged.
Token counts (normalisers, `tokens`, staleness) count the policy's tokens only: a multi-turn sample's
environment tokens (loss_mask 0) are packed but never trained.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from asyncrl import records
from asyncrl.learner import advantages as adv
from asyncrl.learner import losses
from asyncrl.learner.batch_tensors import (
    MicroBatch,
    SeqRecord,
    build_micro_batch,
    filler_micro_batch,
    flatten_batch,
    pack_micro_batches,
)
from asyncrl.learner.config import LearnerConfig


@dataclass(slots=True)
class PreparedBatch:
    mini_batches: list[list[MicroBatch]]  # this rank's; same shape (counts) on every rank
    seqs: list[SeqRecord]  # every kept sample of the batch (all ranks), by SeqRecord.index
    metrics: dict[str, float] = field(default_factory=dict)  # batch-level, identical on every rank


def prepare_batch(batch: records.Batch, cfg: LearnerConfig, rank: int, world_size: int,
                  version: int) -> PreparedBatch:
    seqs, skipped = flatten_batch(batch)
    check_finite(seqs)
    metrics = reward_metrics(seqs, skipped, len(batch.groups))
    accuracy = _rewards(seqs)  # [S] the raw rewards, before shaping
    shape_rewards(seqs, cfg)
    seqs = filter_groups(seqs, accuracy, cfg.resolved_filter_groups)
    metrics["groups_kept"] = float(len({s.group for s in seqs}))
    if seqs and not cfg.recipe.token_level:
        set_outcome_advantages(seqs, cfg.recipe.advantage)
    metrics.update(staleness_metrics(seqs, version))
    per_rank = split_groups(seqs, world_size, cfg.mini_batches)  # [rank][mini] -> seqs
    constant = float(max((s.max_new_tokens for s in seqs), default=1))
    minis = []
    for m in range(cfg.mini_batches):
        bins = [pack_micro_batches(per_rank[r][m], cfg.micro_batch_tokens) for r in range(world_size)]
        total_tokens = float(sum(s.num_trained_tokens for r in range(world_size) for s in per_rank[r][m]))
        total_seqs = float(sum(len(per_rank[r][m]) for r in range(world_size)))
        count = max(len(b) for b in bins)
        mbs = [build_micro_batch(b) for b in bins[rank]] + [filler_micro_batch() for _ in range(count - len(bins[rank]))]
        for mb in mbs:
            mb.agg_weights = losses.aggregation_weights(mb.seq_lens, cfg.resolved_loss_agg, total_tokens, total_seqs,
                                                        constant, _trained_lens(mb, seqs)) * mb.mask
        if count:
            minis.append(mbs)
    return PreparedBatch(mini_batches=minis, seqs=seqs, metrics=metrics)


def _trained_lens(mb: MicroBatch, seqs: list[SeqRecord]) -> torch.Tensor | None:
    """[s] the policy's tokens per sequence of `mb` (None: every token, no sample has a loss_mask)."""
    mine = [seqs[i] for i in mb.seq_index if i >= 0]
    if all(s.loss_mask is None for s in mine):
        return None
    return torch.tensor([seqs[i].num_trained_tokens if i >= 0 else 1 for i in mb.seq_index], dtype=torch.int64)


def check_finite(seqs: list[SeqRecord]) -> None:
    """The hub fails samples with non-finite rewards or logprobs, so none may reach the loss (one vectorised
    check; the per-sample walk only runs to name the offender)."""
    if not seqs:
        return
    rewards = np.array([s.reward for s in seqs], dtype=np.float64)
    if np.isfinite(rewards).all() and np.isfinite(np.concatenate([s.behav_logp for s in seqs])).all():
        return
    for s in seqs:
        assert np.isfinite(s.reward) and np.isfinite(s.behav_logp).all(), (
            f"sample {s.index} (group {s.group}) has a non-finite reward {s.reward} or behaviour logprob: "
            "the hub should have failed it")


def reward_metrics(seqs: list[SeqRecord], skipped: int, groups: int) -> dict[str, float]:
    r = np.array([s.reward for s in seqs], dtype=np.float64)
    return {
        "reward_mean": float(r.mean()) if len(r) else 0.0,
        "reward_std": float(r.std()) if len(r) else 0.0,
        "samples": float(len(seqs)),
        "samples_skipped": float(skipped),
        "groups": float(groups),
        "response_len_mean": float(np.mean([len(s.response) for s in seqs])) if seqs else 0.0,
    }


def shape_rewards(seqs: list[SeqRecord], cfg: LearnerConfig) -> None:
    """Add the overlong penalty (DAPO soft punishment) to each reward, in place."""
    buffers = torch.tensor([cfg.overlong_buffer_for(s.max_new_tokens) for s in seqs], dtype=torch.int64)  # [S]
    if not bool((buffers > 0).any()):
        return
    lengths = torch.tensor([len(s.response) for s in seqs])
    max_len = torch.tensor([s.max_new_tokens for s in seqs])
    pen = adv.overlong_penalty(lengths, max_len, buffers, cfg.overlong_penalty)
    for s, p in zip(seqs, pen.tolist()):
        s.reward += p


def filter_groups(seqs: list[SeqRecord], accuracy: torch.Tensor, mode: str) -> list[SeqRecord]:
    """DAPO dynamic sampling: drop groups whose `accuracy` ([S], the raw rewards) or, for mode "shaped",
    shaped rewards are all equal; re-index the rest. Mode "off" keeps every group."""
    if mode == "off" or not seqs:
        return seqs
    metric = accuracy if mode == "accuracy" else _rewards(seqs)  # [S]
    keep = adv.dapo_keep_mask(metric, _group_ids(seqs)).tolist()
    kept = [s for s, k in zip(seqs, keep) if k]
    for i, s in enumerate(kept):
        s.index = i
    return kept


def set_outcome_advantages(seqs: list[SeqRecord], advantage: str) -> None:
    """Each sample's advantage from the recipe's outcome-level estimator (`Recipe.advantage`), in place."""
    a = adv.estimator(advantage)(_rewards(seqs), _group_ids(seqs))  # [S]
    for s, v in zip(seqs, a.tolist()):
        s.advantage = v


def split_groups(seqs: list[SeqRecord], world_size: int, mini_batches: int) -> list[list[list[SeqRecord]]]:
    """Deal groups to ranks round-robin (whole groups stay together), then split each rank's groups
    into contiguous mini-batches. Returns [rank][mini_batch] -> seqs."""
    groups = sorted({s.group for s in seqs})
    by_group: dict[int, list[SeqRecord]] = {g: [] for g in groups}
    for s in seqs:
        by_group[s.group].append(s)
    out = []
    for r in range(world_size):
        mine = groups[r::world_size]
        parts = np.array_split(np.arange(len(mine)), mini_batches)
        out.append([[s for i in part for s in by_group[mine[i]]] for part in parts])
    return out


def staleness_metrics(seqs: list[SeqRecord], version: int) -> dict[str, float]:
    """How far the policy's tokens lag `version` (environment tokens were not sampled from it)."""
    v = np.concatenate([np.zeros(0, np.int64)] + [s.versions if s.loss_mask is None else s.versions[s.loss_mask == 1]
                                                   for s in seqs]).astype(np.int64)  # [trained tokens]
    if not len(v):
        return {"staleness_mean": 0.0, "staleness_max": 0.0, "tokens": 0.0}
    lag = version - v
    return {"staleness_mean": float(lag.mean()), "staleness_max": float(lag.max()), "tokens": float(len(v))}


def _rewards(seqs: list[SeqRecord]) -> torch.Tensor:
    return torch.tensor([s.reward for s in seqs], dtype=torch.float32)  # [S]


def _group_ids(seqs: list[SeqRecord]) -> torch.Tensor:
    _, inverse = np.unique([s.group for s in seqs], return_inverse=True)
    return torch.from_numpy(inverse.astype(np.int64))  # [S] compact 0..G-1
