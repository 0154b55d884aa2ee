"""Scores samples with the configured reward components and combines them by weight.

Each component runs under `reward.timeout_s`; all components of a sample run concurrently. A component
that raises, times out, or returns something other than a finite number (or a dict of them with a
"reward" entry) fails the sample: status FAILED, reward 0.0, the reason names the component. The
components that did answer are still reported. `ScoreResult.components` holds each component's
unweighted score under its name (and extra dict entries as "name/key"); the reward is the weighted sum.
A sample arrives as a `ToScoreItem` (id, response text, reward spec, and what its rollout reported: finish
reason, environment reward and error) and leaves as a `ScoreResult` (by id). A sample whose environment
failed (finish_reason env_error) is FAILED with reason "environment: <env_error>" and reaches no component.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from typing import Any

from asyncrl.records import FinishReason, ScoreResult, ScoreStatus, ToScoreItem
from asyncrl.reward.config import RewardComponentConfig, RewardConfig
from asyncrl.reward.environment import EnvironmentReward
from asyncrl.reward.http import HttpClient, HttpReward
from asyncrl.reward.mathverify import MathVerify
from asyncrl.reward.offload import Offload
from asyncrl.reward.protocol import Episode, EpisodeRewardFn, NotScorable, RewardFn
from asyncrl.reward.python_fn import PythonFunction
from asyncrl.reward.rules import ExactMatch, RegexMatch, TaskVerifier


class ComponentError(Exception):
    """A component's failure, with the reason reported in ScoreResult.reason."""


class Scorer:
    def __init__(self, cfg: RewardConfig) -> None:
        self.cfg = cfg
        self.offload = Offload(cfg.process_pool)
        self.http = HttpClient()
        self.components: list[tuple[RewardComponentConfig, RewardFn | EpisodeRewardFn]] = [
            (c, self._build(c)) for c in cfg.components]

    def _build(self, c: RewardComponentConfig) -> RewardFn | EpisodeRewardFn:
        try:
            match c.kind:
                case "exact_match":
                    return ExactMatch(c.options)
                case "regex":
                    return RegexMatch(c.options)
                case "task":
                    return TaskVerifier(c.options)
                case "math":
                    return MathVerify(c.options, self.offload)
                case "python":
                    return PythonFunction(c.options, self.offload)
                case "http":
                    return HttpReward(c.options, self.http, self.cfg.timeout_s)
                case "environment":
                    return EnvironmentReward(c.options)
                case "reasoning_gym":
                    from asyncrl.reward.reasoning_gym import ReasoningGymReward  # reasoning-gym: only when used

                    return ReasoningGymReward(c.options, self.offload)
                case "classifier":
                    from asyncrl.reward.classifier import SequenceClassifier  # torch + transformers: only when used

                    return SequenceClassifier(c.options)
        except ValueError as e:
            raise ValueError(f"reward component {c.name!r}: {e}") from None
        raise AssertionError(f"kind {c.kind!r} passed validation but has no implementation")

    async def score(self, item: ToScoreItem) -> ScoreResult:
        episode = episode_of(item)
        if episode.finish_reason is FinishReason.ENV_ERROR:
            return ScoreResult(prompt_id=item.prompt_id, sample_index=item.sample_index, reward=0.0,
                               status=ScoreStatus.FAILED, reason=f"environment: {episode.env_error or 'no reason given'}")
        results = await asyncio.gather(*(self._run(c, fn, item, episode) for c, fn in self.components))
        components: dict[str, float] = {}
        reasons: list[str] = []
        total = 0.0
        for (c, _), result in zip(self.components, results):
            if isinstance(result, ComponentError):
                reasons.append(str(result))
                continue
            components.update(result)
            total += c.weight * result[c.name]
        out = ScoreResult(prompt_id=item.prompt_id, sample_index=item.sample_index, reward=total, components=components)
        if reasons:
            out.reward, out.status, out.reason = 0.0, ScoreStatus.FAILED, "; ".join(reasons)
        return out

    async def _run(self, c: RewardComponentConfig, fn: RewardFn | EpisodeRewardFn, item: ToScoreItem,
                   episode: Episode) -> dict[str, float] | ComponentError:
        try:
            call = (fn.score_episode(episode, item.reward) if isinstance(fn, EpisodeRewardFn)
                    else fn(item.response_text, item.reward))
            value = await asyncio.wait_for(call, self.cfg.timeout_s)
        except TimeoutError:
            return ComponentError(f"{c.name}: timed out after {self.cfg.timeout_s:g} s")
        except NotScorable as e:
            return ComponentError(f"{c.name}: {e}")
        except Exception as e:  # a user function may raise anything; the worker keeps going
            return ComponentError(f"{c.name}: raised {type(e).__name__}: {e}")
        try:
            return _as_components(c.name, value)
        except ComponentError as e:
            return e

    async def close(self) -> None:
        for _, fn in self.components:
            await fn.close()
        await self.http.close()
        self.offload.close()


def episode_of(item: ToScoreItem) -> Episode:
    """What the item's rollout reported (the hub fills these fields of ToScoreItem from
    PackedSample.finish_reason / env_reward / env_error)."""
    return Episode(finish_reason=item.finish_reason, env_reward=item.env_reward, env_error=item.env_error)


def _as_components(name: str, value: Any) -> dict[str, float]:
    if isinstance(value, dict):
        if "reward" not in value:
            raise ComponentError(f"{name}: returned a dict without a 'reward' entry (keys {sorted(value)[:5]})")
        out = {name: _number(name, value["reward"])}
        out.update({f"{name}/{k}": _number(f"{name}/{k}", v) for k, v in value.items() if k != "reward"})
        return out
    return {name: _number(name, value)}


def _number(name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real):
        raise ComponentError(f"{name}: returned {type(value).__name__} {str(value)[:50]!r}, not a number")
    if not math.isfinite(value):
        raise ComponentError(f"{name}: returned a non-finite value {value}")
    return float(value)
