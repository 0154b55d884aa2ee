"""The rollout seam: how the generator turns a leased prompt into finished samples.

    GeneratorWorker ──start(prompt)──► Rollout ──GenerationRequests──► engine
          ▲     └──on_output(out)────►   │  ◄── outputs ──────────────┘
          └──── (prompt_id, Trajectory) ◄┘ poll(): requests for next turns, finished episodes

`SingleTurn` (asyncrl.rollout.single_turn) is one engine request per prompt, its n samples sharing the
prefill: what the generator always did. `MultiTurn` (asyncrl.rollout.multi_turn) plays each sample as an
episode against an environment. The worker owns leases, weights and the hub; a rollout owns what happens
between a prompt and its samples, and nothing it does blocks the engine's loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from asyncrl import records as R
from asyncrl.engine.protocol import GenerationOutput, GenerationRequest


@dataclass(kw_only=True, slots=True)
class Trajectory:
    """One finished sample: the Sample's generated fields."""

    sample_index: int
    token_ids: np.ndarray  # [resp_len] int32: every token after the prompt
    logprobs: np.ndarray  # [resp_len] float32 (0.0 on environment tokens)
    versions: np.ndarray  # [resp_len] int32
    finish_reason: R.FinishReason
    timings: dict[str, float] = field(default_factory=dict)
    loss_mask: np.ndarray | None = None  # [resp_len] int32; None: every token is the model's
    turn_rewards: np.ndarray | None = None  # [turns] float32
    env_reward: float | None = None
    env_error: str = ""
    stats: dict[str, float] = field(default_factory=dict)  # -> Sample.rollout


Finished = tuple[str, Trajectory]  # (prompt_id, trajectory)


class Rollout(Protocol):
    def start(self, prompt: R.Prompt, token_ids: np.ndarray, sampling: R.SamplingParams) -> list[GenerationRequest]:
        """A leased prompt: the engine requests to add now (possibly none, while environments reset)."""

    def owner(self, request_id: str) -> str | None:
        """The prompt id an engine request belongs to (None: not this rollout's)."""

    def on_output(self, out: GenerationOutput, version: int) -> list[Finished]:
        """A finished (not aborted) engine output; `version`: the engine's weight version now."""

    def poll(self, version: int) -> tuple[list[GenerationRequest], list[Finished]]:
        """Environment calls that answered: engine requests for the next turns, and finished samples."""

    def rejected(self, request_id: str, reason: str) -> list[Finished]:
        """The engine refused a next-turn request from `poll` (e.g. no KV room): its episode ends."""

    def drop(self, prompt_id: str) -> list[str]:
        """Forget a prompt (its lease goes back to the hub); returns its engine request ids still running."""

    def finished(self, prompt_id: str) -> None:
        """Every sample of the prompt went to the hub: forget it."""

    def busy(self) -> bool:
        """Environment calls in flight (the worker keeps polling while the engine is idle)."""

    def stats(self) -> dict[str, float]:
        """Counters for the generator's heartbeat (episodes, failures by reason, ...)."""

    def close(self) -> None: ...
