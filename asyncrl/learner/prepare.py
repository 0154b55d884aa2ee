"""Batch -> this rank's mini-batches of packed micro-batches, with outcome advantages and loss weights.

Every rank receives the whole `records.Batch` and runs this deterministically, so all batch-level
quantities (reward shaping, DAPO's group filter, group-normalised advantages, loss normalisers, the
number of micro-batches per mini-batch) agree across ranks without communication. The samples become one
columnar table (sample_table.py) once; each phase maps its columns to new ones:

    flatten (drop failed / empty) -> SampleTable -> reward  <- overlong penalty (reward, lengths)
    -> rows     <- group filter (accuracy or reward, group)   (DAPO)
    -> advantage <- outcome estimator (reward, group)
    -> rank, mini <- groups dealt to ranks round-robin, each rank's split into `mini_batches`
    -> loss_weight <- aggregation weights from each mini-batch's global (all ranks) totals
    -> packed micro-batches of this rank, padded with fillers to the same count on every rank

The group filter drops groups without signal; the batch then trains on fewer samples (it is not refilled),
and the loss normalisers count only the kept samples, so the per-token scale of the update is unchanged.
Token counts (normalisers, `tokens`, staleness) count the policy's tokens only: a multi-turn sample's
environment tokens (loss_mask 0) are packed but never trained.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from asyncrl import records
from asyncrl.learner import advantages as adv
from asyncrl.learner import losses
from asyncrl.learner.algorithms import Recipe
from asyncrl.learner.batch_tensors import (
    MicroBatch,
    SeqRecord,
    build_micro_batch,
    filler_micro_batch,
    flatten_batch,
    pack_micro_batches,
)
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.sample_table import SampleTable


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    mini_batches: list[list[MicroBatch]]  # this rank's; same shape (counts) on every rank
    seqs: list[SeqRecord]  # every kept sample of the batch (all ranks), by SeqRecord.index
    table: SampleTable  # the same samples' columns: row i is seqs[i]
    metrics: dict[str, float]  # batch-level, identical on every rank

    def micro_batches(self) -> list[MicroBatch]:
        """Every micro-batch of this rank, mini-batch by mini-batch."""
        return [mb for mbs in self.mini_batches for mb in mbs]


def prepare_batch(batch: records.Batch, cfg: LearnerConfig, rank: int, world_size: int,
                  version: int) -> PreparedBatch:
    flat, skipped = flatten_batch(batch)
    table = SampleTable.from_records(flat)
    _check_finite(table, flat)
    metrics = reward_metrics(table, skipped, len(batch.groups))
    table = replace(table, reward=shaped_rewards(table, cfg))
    keep = kept_rows(table, cfg.resolved_filter_groups)  # [S] bool
    table = table.take(keep)
    metrics.update(groups_kept=float(len(np.unique(table.group))), **staleness_metrics(table, version))
    table = replace(table, advantage=outcome_advantages(table, cfg.recipe))
    table_rank, mini = group_slots(table.group, world_size, cfg.mini_batches)
    table = replace(table, rank=table_rank, mini=mini)
    table = replace(table, loss_weight=loss_weights(table, cfg))
    seqs = kept_records(flat, np.flatnonzero(keep), table)
    return PreparedBatch(mini_batches=_mini_batches(seqs, table, cfg, rank, world_size), seqs=seqs, table=table,
                         metrics=metrics)


def check_finite(seqs: list[SeqRecord]) -> None:
    """The hub fails samples with non-finite rewards or logprobs, so none may reach the loss."""
    _check_finite(SampleTable.from_records(seqs), seqs)


def _check_finite(table: SampleTable, seqs: list[SeqRecord]) -> None:
    """One vectorised check of the table's columns; the per-sample walk only runs to name the offender."""
    if np.isfinite(table.reward).all() and np.isfinite(table.behav_logp).all():
        return
    for s in seqs:
        assert np.isfinite(s.reward) and np.isfinite(s.behav_logp).all(), (
            f"sample {s.index} (group {s.group}) has a non-finite reward {s.reward} or behaviour logprob: "
            "the hub should have failed it")


def reward_metrics(table: SampleTable, skipped: int, groups: int) -> dict[str, float]:
    r, n = table.accuracy, len(table)
    return {
        "reward_mean": float(r.mean()) if n else 0.0,
        "reward_std": float(r.std()) if n else 0.0,
        "samples": float(n),
        "samples_skipped": float(skipped),
        "groups": float(groups),
        "response_len_mean": float(np.mean(table.response_len)) if n else 0.0,
    }


def shaped_rewards(table: SampleTable, cfg: LearnerConfig) -> np.ndarray:
    """[S] float64: the reward plus the overlong penalty (DAPO soft punishment)."""
    buffers = torch.tensor([cfg.overlong_buffer_for(m) for m in table.max_new_tokens.tolist()], dtype=torch.int64)
    if not bool((buffers > 0).any()):
        return table.reward
    t = torch.from_numpy
    pen = adv.overlong_penalty(t(table.response_len), t(table.max_new_tokens), buffers, cfg.overlong_penalty)  # [S]
    return table.reward + pen.numpy().astype(np.float64)


def kept_rows(table: SampleTable, mode: str) -> np.ndarray:
    """[S] bool, DAPO dynamic sampling: False in groups whose accuracy (the raw reward) or, for mode "shaped",
    shaped reward is all equal. Mode "off" keeps every group."""
    if mode == "off" or not len(table):
        return np.ones(len(table), dtype=bool)
    metric = table.accuracy if mode == "accuracy" else table.reward  # [S]
    return adv.dapo_keep_mask(_f32(metric), _group_ids(table.group)).numpy()


def outcome_advantages(table: SampleTable, recipe: Recipe) -> np.ndarray:
    """[S] float32: each sample's advantage from the recipe's outcome-level estimator (token-level recipes: 0,
    the trainer computes theirs per token)."""
    if recipe.token_level or not len(table):
        return table.advantage
    return adv.estimator(recipe.advantage)(_f32(table.reward), _group_ids(table.group)).numpy()


def group_slots(group: np.ndarray, world_size: int, mini_batches: int) -> tuple[np.ndarray, np.ndarray]:
    """Groups dealt to ranks round-robin (whole groups stay together), each rank's groups split into contiguous
    mini-batches.  group [S] -> (rank [S], mini-batch [S])"""
    groups = np.unique(group)  # [G] sorted
    g_rank = np.arange(len(groups)) % world_size  # [G]
    g_mini = np.zeros(len(groups), dtype=np.int64)
    for r in range(world_size):
        mine = np.arange(r, len(groups), world_size)
        sizes = [len(p) for p in np.array_split(np.arange(len(mine)), mini_batches)]
        g_mini[mine] = np.repeat(np.arange(mini_batches), sizes)
    pos = np.searchsorted(groups, group)  # [S]
    return g_rank[pos], g_mini[pos]


def split_groups(seqs: list[SeqRecord], world_size: int, mini_batches: int) -> list[list[list[SeqRecord]]]:
    """`group_slots` on records: [rank][mini_batch] -> seqs."""
    rank, mini = group_slots(np.array([s.group for s in seqs], dtype=np.int64), world_size, mini_batches)
    return [[[seqs[i] for i in np.flatnonzero((rank == r) & (mini == m))] for m in range(mini_batches)]
            for r in range(world_size)]


def loss_weights(table: SampleTable, cfg: LearnerConfig) -> np.ndarray:
    """[S] float32: the per-token aggregation weight of each sample's trained tokens, from the global totals of
    its mini-batch (losses.sample_weights)."""
    constant = float(table.max_new_tokens.max()) if len(table) else 1.0
    out = np.zeros(len(table), dtype=np.float32)
    for m in range(cfg.mini_batches):
        rows = table.mini == m  # [S] over every rank
        lens = table.trained_len[rows]
        out[rows] = losses.sample_weights(torch.from_numpy(lens), cfg.resolved_loss_agg, float(lens.sum()),
                                          float(rows.sum()), constant).numpy()
    return out


def kept_records(flat: list[SeqRecord], rows: np.ndarray, table: SampleTable) -> list[SeqRecord]:
    """The kept samples' records (flat[rows[i]]) re-indexed, carrying their final per-sample columns."""
    return [replace(flat[r], index=i, reward=float(table.reward[i]), advantage=float(table.advantage[i]),
                    loss_weight=float(table.loss_weight[i])) for i, r in enumerate(rows.tolist())]


def _mini_batches(seqs: list[SeqRecord], table: SampleTable, cfg: LearnerConfig, rank: int,
                  world_size: int) -> list[list[MicroBatch]]:
    """This rank's packed micro-batches per mini-batch, padded with fillers to the most any rank has."""
    minis = []
    for m in range(cfg.mini_batches):
        bins = [pack_micro_batches([seqs[i] for i in np.flatnonzero((table.rank == r) & (table.mini == m))],
                                   cfg.micro_batch_tokens) for r in range(world_size)]
        fillers = max(len(b) for b in bins) - len(bins[rank])
        mbs = [build_micro_batch(b) for b in bins[rank]] + [filler_micro_batch() for _ in range(fillers)]
        if mbs:
            minis.append(mbs)
    return minis


def staleness_metrics(table: SampleTable, version: int) -> dict[str, float]:
    """How far the policy's tokens lag `version` (environment tokens were not sampled from it)."""
    v = table.versions[table.trained]  # [trained tokens]
    if not len(v):
        return {"staleness_mean": 0.0, "staleness_max": 0.0, "tokens": 0.0}
    lag = version - v
    return {"staleness_mean": float(lag.mean()), "staleness_max": float(lag.max()), "tokens": float(len(v))}


def _f32(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x.astype(np.float32))  # [S]


def _group_ids(group: np.ndarray) -> torch.Tensor:
    _, inverse = np.unique(group, return_inverse=True)
    return torch.from_numpy(inverse.astype(np.int64))  # [S] compact 0..G-1
