"""The reward-function Protocols: every text kind (rules, math, task, python, http, classifier) implements
`RewardFn`; a kind scored from what the environment reported about the episode (`environment`) implements
`EpisodeRewardFn` instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from asyncrl.records import FinishReason, RewardSpec

# A score: one number, or a dict of numbers whose "reward" entry is the score and whose other
# entries are reported alongside it (not weighted).
RewardValue = float | dict[str, float]


class NotScorable(Exception):
    """Raised by a reward function that cannot score this sample: fails it with exactly this reason."""


@dataclass(frozen=True, slots=True)
class Episode:
    """What the generator's rollout reported about one sample (asyncrl.records.Sample's episode fields)."""

    finish_reason: FinishReason = FinishReason.STOP
    env_reward: float | None = None  # the environment's episode reward; None: no environment gave one
    env_error: str = ""  # why the environment failed the episode ("": it did not)


@runtime_checkable
class RewardFn(Protocol):
    async def __call__(self, response: str, spec: RewardSpec) -> RewardValue:
        """Score one completion. Raise to mark the sample failed; the caller applies the timeout."""

    async def close(self) -> None:
        """Release connections or processes this function holds."""


@runtime_checkable
class EpisodeRewardFn(Protocol):
    async def score_episode(self, episode: Episode, spec: RewardSpec) -> RewardValue:
        """Score one sample from its episode. Raise to mark the sample failed; the caller applies the timeout."""

    async def close(self) -> None:
        """Release what this function holds."""
