"""The `environment` reward kind: the episode reward the rollout's environment reported (Sample.env_reward).

It trusts the environment completely and reads nothing of the response: the environment already judged
the episode (tests passed, the game was won, the tool call succeeded), and its reward arrives with the
sample. A sample without one (a single-turn rollout, an environment that gave no reward) fails with a
reason instead of scoring 0, so a misconfigured run shows up as failures rather than as a flat reward.
"""

from __future__ import annotations

from typing import Any

from asyncrl.records import RewardSpec
from asyncrl.reward.protocol import Episode, NotScorable


class EnvironmentReward:
    """Sample.env_reward as the score (an EpisodeRewardFn)."""

    def __init__(self, options: dict[str, Any]) -> None:
        if options:
            raise ValueError(f"environment reward takes no options, got {sorted(options)}")

    async def score_episode(self, episode: Episode, spec: RewardSpec) -> float:
        if episode.env_reward is None:
            raise NotScorable("the sample has no env_reward: it did not come from an environment rollout, or the "
                              "environment gave no reward (use this kind with rollouts whose environment rewards)")
        return episode.env_reward

    async def close(self) -> None:
        pass
