"""Reward scoring: the RewardFn Protocol, its built-in kinds, the Scorer that combines them by weight,
and the reward worker loop that serves the hub."""

from asyncrl.reward.config import RewardComponentConfig, RewardConfig
from asyncrl.reward.protocol import RewardFn, RewardValue
from asyncrl.reward.scorer import Scorer
from asyncrl.reward.worker import RewardWorker

__all__ = ["RewardComponentConfig", "RewardConfig", "RewardFn", "RewardValue", "RewardWorker", "Scorer"]
