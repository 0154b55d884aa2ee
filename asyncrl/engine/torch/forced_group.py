"""`ForcedGroup`: a prompt and responses to score (`TorchEngine.score`), with the sampling params they
were generated with.

The params matter because a token's logprob is log_softmax(logits / T) at that token (greedy, T = 0,
scores with T = 1), exactly as sampling recorded it; top-k / top-p do not change the logprob but pick
the sampler (fused kernel or torch) on GPU, and so its last ulp. max_new_tokens, stop tokens and
ignore_eos are not used: a forced response ends where its tokens end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asyncrl.records import SamplingParams


@dataclass(kw_only=True, slots=True)
class ForcedGroup:
    prompt_token_ids: np.ndarray  # [prompt_len] int
    response_token_ids: list[np.ndarray]  # n x [response_len] int; the n samples share one prefill
    sampling: SamplingParams

    def __post_init__(self) -> None:
        self.prompt_token_ids = _token_ids(self.prompt_token_ids, "prompt_token_ids")
        if not isinstance(self.sampling, SamplingParams):
            raise TypeError(f"ForcedGroup.sampling: a records.SamplingParams, not {type(self.sampling).__name__}")
        if len(self.response_token_ids) == 0:
            raise ValueError("ForcedGroup.response_token_ids: empty: give at least one response to score")
        self.response_token_ids = [
            _token_ids(r, f"response_token_ids[{i}]") for i, r in enumerate(self.response_token_ids)
        ]

    @property
    def n(self) -> int:
        return len(self.response_token_ids)


def _token_ids(ids, name: str) -> np.ndarray:
    """-> a non-empty 1-D int64 array (what every token list here must be)."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"ForcedGroup.{name}: shape {arr.shape}: must be a non-empty 1-D array of token ids")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"ForcedGroup.{name}: dtype {arr.dtype}: token ids must be integers")
    return arr.astype(np.int64, copy=False)
