"""Shared bits of the reward tests: items to score, configs, and a dotted path to reward_fns."""

import sys
from pathlib import Path

from asyncrl.records import RewardSpec, ToScoreItem
from asyncrl.reward.config import RewardComponentConfig, RewardConfig

sys.path.insert(0, str(Path(__file__).parent))  # pool processes inherit sys.path and import reward_fns


def fn(name: str) -> str:
    return f"reward_fns:{name}"


def item(text: str, spec: RewardSpec | None = None, prompt_id: str = "p0", index: int = 0) -> ToScoreItem:
    """What the hub hands a reward worker for one sample."""
    return ToScoreItem(prompt_id=prompt_id, sample_index=index, response_text=text, reward=spec or RewardSpec())


def config(*components: dict, timeout_s: float = 5.0, process_pool: int = 1, **kw) -> RewardConfig:
    return RewardConfig(components=[RewardComponentConfig(**c) for c in components], timeout_s=timeout_s,
                        process_pool=process_pool, **kw)


def spec(target: str | None = None, **params) -> RewardSpec:
    return RewardSpec(target=target, params=params)
