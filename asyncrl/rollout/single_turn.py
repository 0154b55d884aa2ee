"""`SingleTurn`: one model turn per sample, the n samples of a prompt in one engine request (shared prefill)."""

from __future__ import annotations

import numpy as np

from asyncrl import records as R
from asyncrl.engine.protocol import GenerationOutput, GenerationRequest
from asyncrl.rollout.protocol import Finished, Trajectory


class SingleTurn:
    def __init__(self) -> None:
        self.prompts: set[str] = set()

    def start(self, prompt: R.Prompt, token_ids: np.ndarray, sampling: R.SamplingParams) -> list[GenerationRequest]:
        self.prompts.add(prompt.prompt_id)
        return [GenerationRequest(request_id=prompt.prompt_id, prompt_token_ids=token_ids, sampling=sampling,
                                  n=prompt.n)]

    def owner(self, request_id: str) -> str | None:
        return request_id if request_id in self.prompts else None

    def on_output(self, out: GenerationOutput, version: int) -> list[Finished]:
        return [(out.request_id, Trajectory(sample_index=out.sample_index, token_ids=out.token_ids,
                                            logprobs=out.logprobs, versions=out.versions,
                                            finish_reason=out.finish_reason, timings=out.timings))]

    def poll(self, version: int) -> tuple[list[GenerationRequest], list[Finished]]:
        return [], []

    def rejected(self, request_id: str, reason: str) -> list[Finished]:
        return []  # poll() never asks for a request: the only one goes through the worker's admission

    def drop(self, prompt_id: str) -> list[str]:
        self.prompts.discard(prompt_id)
        return [prompt_id]

    def finished(self, prompt_id: str) -> None:
        self.prompts.discard(prompt_id)

    def busy(self) -> bool:
        return False

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass
