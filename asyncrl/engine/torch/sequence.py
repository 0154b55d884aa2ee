"""State of one sample (`Sequence`) and of the n samples of a request waiting for one prefill
(`SequenceGroup`).

A sequence's tokens are prompt + output. During decode its KV cache holds every token but the
last one (the last sampled token is the next decode input). Per output token it keeps the
sampling logprob and the weight version that produced it. A forced sequence (scoring) takes its
tokens from `forced_token_ids` instead of sampling them, through the same prefill / decode / sampler.
"""

from __future__ import annotations

import enum
import time

import numpy as np

from asyncrl.engine.protocol import GenerationOutput
from asyncrl.records import FinishReason, SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self, request_id: str, sample_index: int, prompt: list[int], sampling: SamplingParams, seed: int,
        arrival: float, forced_token_ids: list[int] | None = None,
    ) -> None:
        self.request_id, self.sample_index = request_id, sample_index
        self.prompt_token_ids = prompt  # shared by the n samples; never mutated
        self.sampling, self.seed = sampling, seed
        self.forced_token_ids = forced_token_ids  # [response_len]: the tokens to take (scoring); None: sample
        self.output_token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.block_table: list[int] = []
        self.kv_weights: int | None = None  # prefix cache: the weights (`PrefixCache.weights`) that computed the KV
        self.page_keys: list[bytes] = []  # prefix cache: keys of the first full pages of the KV, as far as computed
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.arrival = arrival
        self.prefill_start: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.prefill_s = 0.0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_outputs(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_token(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def forced_token(self) -> int:
        """The token the next step must take, or -1: sample (the samplers' per-row convention)."""
        return -1 if self.forced_token_ids is None else self.forced_token_ids[self.num_outputs]

    @property
    def forced_done(self) -> bool:
        return self.forced_token_ids is not None and self.num_outputs >= len(self.forced_token_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def append(self, token: int, logprob: float, version: int, now: float) -> None:
        self.output_token_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if self.first_token_at is None:
            self.first_token_at = now

    def finish(self, reason: FinishReason, now: float) -> None:
        self.status, self.finish_reason, self.finished_at = SequenceStatus.FINISHED, reason, now

    def to_output(self) -> GenerationOutput:
        assert self.finish_reason is not None, "only finished sequences produce outputs"
        return GenerationOutput(
            request_id=self.request_id,
            sample_index=self.sample_index,
            token_ids=np.asarray(self.output_token_ids, dtype=np.int32),
            logprobs=np.asarray(self.logprobs, dtype=np.float32),
            versions=np.asarray(self.versions, dtype=np.int32),
            finish_reason=self.finish_reason,
            timings=self.timings(),
        )

    def timings(self) -> dict[str, float]:
        end = self.finished_at if self.finished_at is not None else time.perf_counter()
        start = self.prefill_start if self.prefill_start is not None else end
        first = self.first_token_at if self.first_token_at is not None else end
        return {
            "queue": start - self.arrival, "prefill": self.prefill_s, "decode": end - first, "total": end - self.arrival
        }


class SequenceGroup:
    """Sequences prefilled together from one token list: the n fresh samples of a request (one
    prefill, KV shared), or a single preempted sequence being recomputed (`is_resume`)."""

    def __init__(self, seqs: list[Sequence], is_resume: bool = False) -> None:
        assert seqs and (not is_resume or len(seqs) == 1)
        self.seqs, self.is_resume = seqs, is_resume
        self.cow_pairs: list[tuple[int, int]] = []  # (src, dst) blocks to copy after the prefill
        self.num_cached = 0  # leading prefill tokens whose KV a prefix-cache hit supplies (whole pages)
        self.page_keys: tuple[int, list[bytes]] | None = None  # (weights, keys of the prefill's full pages)

    @property
    def request_id(self) -> str:
        return self.seqs[0].request_id

    def prefill_token_ids(self) -> list[int]:
        """Fresh: the prompt (its last logits give every sample's first token). Resume: every token
        but the last, which is the next decode input."""
        seq = self.seqs[0]
        return seq.token_ids()[:-1] if self.is_resume else seq.prompt_token_ids
