"""A fake engine and a fake hub for GeneratorWorker tests (tests/generator, tests/rollout)."""

from __future__ import annotations

import numpy as np

from asyncrl import records as R
from asyncrl.engine.protocol import EngineLimits, EngineStats, GenerationOutput


class FakeEngine:
    """Finishes sample i of a request after i+1 steps; tokens are [request index, sample index]."""

    def __init__(self) -> None:
        self.weight_version = 0
        self.pending: list[tuple[str, int, int]] = []  # (request_id, sample_index, steps_left)
        self.aborted: list[str] = []
        self.requests = []

    def add(self, request) -> None:
        self.requests.append(request)
        self.pending += [(request.request_id, i, i + 1) for i in range(request.n)]

    def has_work(self) -> bool:
        return bool(self.pending)

    def limits(self) -> EngineLimits:
        return EngineLimits(vocab_size=None, max_model_len=None)

    def step(self):
        done, left = [], []
        for rid, i, k in self.pending:
            (done if k == 1 else left).append((rid, i, k - 1))
        self.pending = left
        return [self._out(rid, i, R.FinishReason.STOP) for rid, i, _ in done]

    def _out(self, rid, i, reason):
        n = 3
        return GenerationOutput(request_id=rid, sample_index=i, token_ids=np.full(n, i, np.int32),
                                logprobs=np.full(n, -0.5, np.float32),
                                versions=np.full(n, self.weight_version, np.int32), finish_reason=reason)

    def abort(self, ids=None):
        ids = set(ids) if ids is not None else None
        out = [self._out(r, i, R.FinishReason.ABORT) for r, i, _ in self.pending if ids is None or r in ids]
        self.pending = [p for p in self.pending if ids is not None and p[0] not in ids]
        self.aborted += sorted({o.request_id for o in out})
        return out

    def stats(self):
        return EngineStats(running=len(self.pending), waiting=0, tokens_generated=0, weight_version=self.weight_version)


class FakeHub:
    timeout_s = 30.0

    def __init__(self, prompts: list[R.Prompt], version: int = 0) -> None:
        self.queue = list(prompts)
        self.version = version
        self.sent: list[R.SampleBatch] = []
        self.returned: list[str] = []
        self.lease_sizes: list[int] = []

    def request(self, msg):
        if isinstance(msg, R.LeaseRequest):
            self.lease_sizes.append(msg.max_prompts)
            take, self.queue = self.queue[: msg.max_prompts], self.queue[msg.max_prompts:]
            return R.Lease(lease_id=f"L{len(self.lease_sizes)}", prompts=take, policy_version=self.version,
                           expires_in_s=60.0)
        if isinstance(msg, R.SampleBatch):
            self.sent.append(msg)
        elif isinstance(msg, R.ReturnPrompts):
            self.returned += msg.prompt_ids
        return R.Ack(info={"policy_version": self.version})
