"""One batch's trainable samples as columns: built once from the flattened records, then mapped column ->
column by prepare.py (shaping, the group filter, advantages, loss weights); rows are never rebuilt as objects.

S rows, one per sample, in flattened order (group-major); N = sum(response_len) tokens for the ragged
columns, each sample's response tokens contiguous, in row order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from asyncrl.learner.batch_tensors import SeqRecord


@dataclass(frozen=True, kw_only=True, slots=True)
class SampleTable:
    group: np.ndarray  # [S] int64, the sample's group index in the batch
    input_len: np.ndarray  # [S] int64, prompt + response - 1 packed tokens
    response_len: np.ndarray  # [S] int64
    trained_len: np.ndarray  # [S] int64, the policy's tokens (loss_mask 1; all of a single-turn sample)
    max_new_tokens: np.ndarray  # [S] int64
    accuracy: np.ndarray  # [S] float64, the reward as scored (before shaping)
    reward: np.ndarray  # [S] float64, after shaping
    advantage: np.ndarray  # [S] float32, outcome-level (0: token-level recipes fill per token later)
    loss_weight: np.ndarray  # [S] float32, per-token aggregation weight of the sample's trained tokens
    rank: np.ndarray  # [S] int64, the learner rank that trains the sample
    mini: np.ndarray  # [S] int64, its mini-batch on that rank
    behav_logp: np.ndarray  # [N] float32, the generator's logprobs
    versions: np.ndarray  # [N] int64, policy version of each token
    trained: np.ndarray  # [N] bool, the policy's tokens

    @classmethod
    def from_records(cls, seqs: list[SeqRecord]) -> SampleTable:
        s, zero = len(seqs), np.zeros(0)
        reward = np.array([x.reward for x in seqs], dtype=np.float64)  # [S]
        return cls(
            group=np.array([x.group for x in seqs], dtype=np.int64),
            input_len=np.array([x.num_input_tokens for x in seqs], dtype=np.int64),
            response_len=np.array([len(x.response) for x in seqs], dtype=np.int64),
            trained_len=np.array([x.num_trained_tokens for x in seqs], dtype=np.int64),
            max_new_tokens=np.array([x.max_new_tokens for x in seqs], dtype=np.int64),
            accuracy=reward, reward=reward, advantage=np.zeros(s, np.float32), loss_weight=np.zeros(s, np.float32),
            rank=np.zeros(s, np.int64), mini=np.zeros(s, np.int64),
            behav_logp=np.concatenate([zero.astype(np.float32)] + [x.behav_logp for x in seqs]).astype(np.float32),
            versions=np.concatenate([zero.astype(np.int64)] + [x.versions for x in seqs]).astype(np.int64),
            trained=np.concatenate([zero.astype(bool)] + [x.trained_mask() > 0 for x in seqs]),
        )

    def __len__(self) -> int:
        return len(self.group)

    def take(self, keep: np.ndarray) -> SampleTable:
        """The rows where `keep` ([S] bool) holds, with their tokens."""
        tokens = np.repeat(keep, self.response_len)  # [N]
        rows = {k: getattr(self, k)[keep] for k in _ROW_COLUMNS}
        return replace(self, **rows, **{k: getattr(self, k)[tokens] for k in _TOKEN_COLUMNS})


_TOKEN_COLUMNS = ("behav_logp", "versions", "trained")
_ROW_COLUMNS = tuple(k for k in SampleTable.__slots__ if k not in _TOKEN_COLUMNS)
