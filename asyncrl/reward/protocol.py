"""The reward-function Protocol: every kind (rules, math, task, python, http, classifier) implements it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from asyncrl.records import RewardSpec

# A score: one number, or a dict of numbers whose "reward" entry is the score and whose other
# entries are reported alongside it (not weighted).
RewardValue = float | dict[str, float]


@runtime_checkable
class RewardFn(Protocol):
    async def __call__(self, response: str, spec: RewardSpec) -> RewardValue:
        """Score one completion. Raise to mark the sample failed; the caller applies the timeout."""

    async def close(self) -> None:
        """Release connections or processes this function holds."""
