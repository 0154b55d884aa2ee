"""`Episode`: one sample played against an environment, its tokens kept exactly as they were made.

    prompt_token_ids | model turn 1 | env tokens | model turn 2 | ...      (response = everything after the prompt)
    loss_mask            1 1 1 1       0 0 0 0      1 1 1 1
    logprobs             engine's      0.0          engine's
    versions             per token     engine's version when appended

The engine continues each turn from `context()`: the prompt followed by the response so far, the same ids
that were sampled and appended (never text decoded and encoded again).
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncrl import records as R
from asyncrl.rollout.environment import Task
from asyncrl.rollout.protocol import Trajectory


@dataclass(slots=True)
class Episode:
    prompt_id: str
    index: int  # sample index in its group
    prompt_ids: np.ndarray  # [prompt_len] int32
    env: Any  # the environment instance
    task: Task
    sampling: R.SamplingParams
    budget: int  # response tokens at most (model + environment)
    tokens: list[np.ndarray] = field(default_factory=list)  # segments, in order
    logprobs: list[np.ndarray] = field(default_factory=list)
    versions: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turns: int = 0  # model turns so far
    pending: Future | None = None  # the environment call in flight
    pending_kind: str = ""  # "reset" or "step"
    env_time_s: float = 0.0
    tool_calls: int = 0
    info: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    last_finish: R.FinishReason = R.FinishReason.STOP

    def length(self) -> int:
        return sum(len(t) for t in self.tokens)

    def remaining(self) -> int:
        return self.budget - self.length()

    def context(self) -> np.ndarray:
        """[prompt_len + resp_len] int32: what the engine continues from."""
        return np.concatenate([self.prompt_ids, *self.tokens]).astype(np.int32, copy=False)

    def add_model_turn(self, token_ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray,
                       finish: R.FinishReason, timings: dict[str, float]) -> None:
        n = len(token_ids)
        self._append(token_ids, logprobs.astype(np.float32, copy=False), versions.astype(np.int32, copy=False),
                     np.ones(n, np.int32))
        self.turns += 1
        self.last_finish = finish
        for k, v in timings.items():
            self.timings[k] = self.timings.get(k, 0.0) + v

    def add_env_tokens(self, token_ids: np.ndarray, version: int) -> None:
        n = len(token_ids)
        if n:
            self._append(token_ids.astype(np.int32, copy=False), np.zeros(n, np.float32),
                         np.full(n, version, np.int32), np.zeros(n, np.int32))

    def _append(self, ids: np.ndarray, logp: np.ndarray, vers: np.ndarray, mask: np.ndarray) -> None:
        self.tokens.append(ids)
        self.logprobs.append(logp)
        self.versions.append(vers)
        self.masks.append(mask)

    def last_model_token(self) -> int | None:
        for ids, mask in zip(reversed(self.tokens), reversed(self.masks)):
            if len(ids) and mask[-1]:
                return int(ids[-1])
        return None

    def trajectory(self, finish: R.FinishReason, error: str = "") -> Trajectory:
        cat = (lambda parts, dt: np.concatenate(parts).astype(dt, copy=False) if parts else np.zeros(0, dt))
        rewards = np.asarray(self.turn_rewards, np.float32)
        finite = bool(np.isfinite(rewards).all())
        return Trajectory(
            sample_index=self.index, token_ids=cat(self.tokens, np.int32), logprobs=cat(self.logprobs, np.float32),
            versions=cat(self.versions, np.int32), loss_mask=cat(self.masks, np.int32), finish_reason=finish,
            timings=dict(self.timings), turn_rewards=rewards,
            env_reward=float(math.fsum(self.turn_rewards)) if self.turn_rewards and finite and not error else None,
            env_error=error, stats={"turns": float(self.turns), "env_time_s": self.env_time_s,
                                    "tool_calls": float(self.tool_calls), **self.info})
