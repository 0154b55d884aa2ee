"""Shared bits of the reward tests: samples, configs, and a dotted path to reward_fns."""

import sys
from pathlib import Path

import numpy as np

from asyncrl.records import FinishReason, RewardSpec, Sample
from asyncrl.reward.config import RewardComponentConfig, RewardConfig

sys.path.insert(0, str(Path(__file__).parent))  # pool processes inherit sys.path and import reward_fns


def fn(name: str) -> str:
    return f"reward_fns:{name}"


def sample(text: str, prompt_id: str = "p0", index: int = 0) -> Sample:
    ids = np.arange(3, dtype=np.int32)
    return Sample(prompt_id=prompt_id, sample_index=index, prompt_token_ids=ids, response_token_ids=ids,
                  logprobs=np.zeros(3, np.float32), versions=np.zeros(3, np.int32),
                  finish_reason=FinishReason.STOP, response_text=text)


def config(*components: dict, timeout_s: float = 5.0, process_pool: int = 1, **kw) -> RewardConfig:
    return RewardConfig(components=[RewardComponentConfig(**c) for c in components], timeout_s=timeout_s,
                        process_pool=process_pool, **kw)


def spec(target: str | None = None, **params) -> RewardSpec:
    return RewardSpec(target=target, params=params)
