"""Shared bits of the reward tests: items to score, configs, and a dotted path to reward_fns."""

import asyncio
import sys
from pathlib import Path

from asyncrl.records import RewardSpec, ToScoreItem
from asyncrl.reward.config import RewardComponentConfig, RewardConfig
from asyncrl.reward.scorer import Scorer
from asyncrl.reward.worker import RewardWorker

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


def run_worker(cfg, peer) -> RewardWorker:
    """Run a worker against `peer` until the peer asks it to shut down (10 s at most)."""
    async def go():
        scorer = Scorer(cfg)
        worker = RewardWorker(peer, scorer, cfg, "reward-7", wait_s=0.05)
        try:
            await asyncio.wait_for(worker.run(), 10)
        finally:
            worker.close()
            await scorer.close()
        return worker
    return asyncio.run(go())
