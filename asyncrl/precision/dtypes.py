"""The dtypes a model may be loaded in and what "auto" means: one table and one rule for the engine,
the learner, the exports and the reward models (an engine and a learner that disagree here compute
different logprobs for the same tokens)."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""ModelConfig.dtype's names besides "auto" (torch's spelling) -> the torch dtype."""


def torch_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """A name from DTYPES, "auto" (bfloat16 on CUDA, float32 elsewhere) or a torch.dtype -> the torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: use 'auto' or one of {sorted(DTYPES)}")
    return DTYPES[dtype]
