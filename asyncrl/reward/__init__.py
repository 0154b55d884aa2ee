"""Reward scoring: the RewardFn Protocol (and EpisodeRewardFn for kinds that read the episode's environment
reward), the built-in kinds, the Scorer that combines them by weight, and the reward worker loop that serves
the hub."""

from asyncrl.reward.config import RewardComponentConfig, RewardConfig
from asyncrl.reward.protocol import Episode, EpisodeRewardFn, RewardFn, RewardValue
from asyncrl.reward.scorer import Scorer
from asyncrl.reward.worker import RewardWorker

__all__ = ["Episode", "EpisodeRewardFn", "RewardComponentConfig", "RewardConfig", "RewardFn", "RewardValue", "RewardWorker",
           "Scorer"]
