"""The environment a multi-turn episode plays against: what a user writes, in one file of their own.

    class Calculator:                                   # generator.rollout.environment = "my_envs:Calculator"
        async def reset(self, task: Task) -> Observation | None: ...
        async def step(self, action: Action) -> Step: ...

One instance per episode (built with generator.rollout.options as keyword arguments). `reset` sees the
task (the prompt and its reward spec) and may append an observation to the prompt; each `step` gets the
model's turn and answers with the next observation, a reward, and whether the episode is over. Either
method may be `async def` (run on the generator's environment loop) or a plain function (run in a thread
pool): both run off the engine's loop, bounded by generator.rollout.step_timeout_s.

An observation is what the environment adds to the conversation, at one of three levels:
    Observation(token_ids=[...])                 token level: these ids are appended as they are
    Observation(text="...")                      text: encoded without special tokens, appended
    Observation(message={"role": "user", ...})   message level: the chat template's turn for it (the end of
                                                 the model's turn, the message, the assistant header)
The tokens already in the episode are never decoded and encoded again.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class Task:
    """What an episode starts from: the leased prompt."""

    prompt_id: str
    token_ids: np.ndarray  # [prompt_len] int32, what the engine sees first
    text: str | None  # the prompt's text when it came as text (else None: read metadata)
    target: str | None  # the reward spec's reference answer
    params: dict[str, Any]  # the reward spec's extras
    metadata: dict[str, Any]  # the prompt's metadata (held-out prompts carry "question")
    sample_index: int  # which of the group's samples this episode is


@dataclass(frozen=True, slots=True)
class Action:
    """The model's turn."""

    text: str  # decoded without special tokens
    token_ids: np.ndarray  # [turn_len] int32, as sampled (the stop token included when one ended it)
    finish_reason: str  # "stop" or "length"
    turn: int  # 1 for the first model turn
    version: int = 0  # the weight version that sampled the turn's first token (the learner step that made it)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the environment appends: exactly one of token_ids, text, message."""

    token_ids: list[int] | None = None
    text: str | None = None
    message: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """The environment's answer to a turn. `observation` None ends the episode as `done` does."""

    observation: Observation | None = None
    reward: float = 0.0  # this turn's reward; the episode's is their sum (discount inside the environment)
    done: bool = False
    tool_calls: int = 0  # tools the environment ran for this turn (reported in metrics)
    info: dict[str, float] = field(default_factory=dict)  # more numbers for the episode's stats


class Environment(Protocol):
    def reset(self, task: Task) -> Any:
        """Start the episode; returns (or, when async, resolves to) an Observation appended to the prompt, or None."""

    def step(self, action: Action) -> Any:
        """The model's turn -> (or, when async, resolves to) a Step."""


class EnvironmentLoadError(ValueError):
    pass


def load_environment(spec: str) -> type:
    """'module:Name' -> the class (or factory); one line naming generator.rollout.environment when it fails."""
    module_name, _, attr = spec.partition(":")
    where = f"generator.rollout.environment={spec!r}"
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the config's
        raise EnvironmentLoadError(f"{where}: cannot import {module_name!r} ({type(e).__name__}: {e})") from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise EnvironmentLoadError(f"{where}: {module_name!r} has no callable {attr!r}")
    for method in ("reset", "step"):
        if not callable(getattr(factory, method, None)):
            raise EnvironmentLoadError(f"{where}: {attr} has no {method}() method (see asyncrl/rollout/environment.py)")
    return factory
