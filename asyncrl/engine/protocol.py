"""The generation-engine Protocol: every backend (built-in torch, SGLang) implements it.

The generator service drives an engine from one thread: it `add`s requests, calls `step()` in a loop
(each call runs one scheduling round: a prefill and/or one decode step) and collects the finished
outputs it returns. Weight updates happen between steps: `pause` -> `begin_weight_update` ->
`load_weights` (one or more buckets) -> `end_weight_update(version)` -> `resume`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import torch

from asyncrl.records import FinishReason, SamplingParams


@dataclass(kw_only=True, slots=True)
class GenerationRequest:
    request_id: str  # unique; the n samples of it get outputs with sample_index 0..n-1
    prompt_token_ids: np.ndarray  # [prompt_len] int32, as in Prompt.token_ids and Sample.prompt_token_ids
    sampling: SamplingParams
    n: int = 1


@dataclass(kw_only=True, slots=True)
class GenerationOutput:
    request_id: str
    sample_index: int
    token_ids: np.ndarray  # [resp_len] int32 (includes the stop token that ended it)
    logprobs: np.ndarray  # [resp_len] float32: log_softmax(logits / T)[token] over the full vocab
    versions: np.ndarray  # [resp_len] int32: weight version that produced each token
    finish_reason: FinishReason
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class EngineStats:
    running: int  # sequences decoding
    waiting: int  # sequences not yet prefilled
    tokens_generated: int  # total since start
    weight_version: int
    prefill_tokens: int = 0  # prompt tokens prefilled since start (their KV computed)
    prefix_cache_hit_tokens: int = 0  # prompt tokens whose KV a prefix cache supplied instead, since start


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What an engine can take, checked by the generator before `add` (generator/admission.py); None: not
    known here (the engine's own check in `add` still applies)."""
    vocab_size: int | None  # token ids must be in [0, vocab_size)
    max_model_len: int | None  # prompt + response tokens the engine can hold


PauseMode = Literal["abort", "continue"]


@runtime_checkable
class Engine(Protocol):
    @property
    def weight_version(self) -> int: ...

    def add(self, request: GenerationRequest) -> None:
        """Queue a request; its n samples share one prefill."""

    def step(self) -> list[GenerationOutput]:
        """Run one scheduling round; return the samples that finished in it."""

    def has_work(self) -> bool: ...

    def limits(self) -> EngineLimits:
        """Vocabulary size and context length, for admission before `add`."""

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenerationOutput]:
        """Stop these requests (all when None); return their partial outputs (finish_reason=abort)."""

    def pause(self, mode: PauseMode) -> list[GenerationOutput]:
        """Stop stepping. 'abort' aborts in-flight work and returns it; 'continue' keeps it in place."""

    def resume(self) -> None: ...

    def begin_weight_update(self) -> None: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors (Hugging Face parameter names) into the model, in place."""

    def end_weight_update(self, version: int) -> None:
        """Tokens generated after this call are stamped with `version`."""

    def receiving_ranks(self) -> int:
        """Ranks this engine adds to a weight group (world_size = 1 + this): 1 when this process receives
        the weights; an SGLang server's TP size, whose scheduler ranks receive them."""

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...
