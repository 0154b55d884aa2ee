"""`MultiTurn`: every sample of a prompt is an episode against its own environment instance.

    start ─► reset() ×n ─(all answered, no observation)─► one request, n samples (shared prefill)
                        └(some observation)─────────────► one request per episode
    model turn done ─► step(action) ─► observation ─► next turn: a request continuing from the exact ids
                                   └─► done / last turn / no budget / failure ─► Trajectory

Concurrency: environment calls run on the EnvLoop (asyncio thread + thread pool); this object is used from
the generator thread only and never waits on them: `poll` collects the calls that answered. Episodes
waiting on their environment hold their group's slots in the worker (its backpressure), not engine rows.
Each turn is a new request with the whole history as its prompt; the engine's prefix cache serves the KV of
the turns before (within one weight version), so the turn prefills only its new tokens (docs/rollouts.md).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
from collections import Counter

import numpy as np

from asyncrl import records as R
from asyncrl.engine.protocol import GenerationOutput, GenerationRequest
from asyncrl.rollout.chat import ObservationEncoder, ObservationError
from asyncrl.rollout.config import RolloutConfig
from asyncrl.rollout.env_loop import EnvLoop, Failure
from asyncrl.rollout.environment import Action, Observation, Step, Task
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.protocol import Finished

log = logging.getLogger(__name__)
TURN_SEED_STRIDE = 1_000_003  # turn t of sample i samples with seed + t * stride + i


class MultiTurn:
    def __init__(self, cfg: RolloutConfig, factory: type, tokenizer: object, vocab_size: int | None,
                 loop: EnvLoop | None = None) -> None:
        self.cfg, self.factory, self.vocab_size = cfg, factory, vocab_size
        self.tokenizer = tokenizer
        self.encoder = ObservationEncoder(tokenizer)
        self.env_kwargs = {**cfg.options, **_wanted(factory, tokenizer=tokenizer)}
        self.loop = loop or EnvLoop(cfg.env_threads)
        self.episodes: dict[str, list[Episode]] = {}  # prompt id -> its episodes
        self.requests: dict[str, tuple[str, int | None]] = {}  # engine request id -> (prompt id, index; None: all)
        self.shared_left: dict[str, int] = {}  # n-sample request id -> outputs still to come
        self.resets: dict[str, int] = {}  # prompt id -> resets not answered yet
        self.counts: Counter[str] = Counter()

    # ------------------------------------------------------------------ the worker's calls

    def start(self, prompt: R.Prompt, token_ids: np.ndarray, sampling: R.SamplingParams) -> list[GenerationRequest]:
        budget = self.cfg.max_total_tokens or self.cfg.max_turns * sampling.max_new_tokens
        eps = []
        for i in range(prompt.n):
            task = Task(prompt_id=prompt.prompt_id, token_ids=token_ids, text=prompt.text, target=prompt.reward.target,
                        params=dict(prompt.reward.params), metadata=dict(prompt.metadata), sample_index=i)
            ep = Episode(prompt.prompt_id, i, token_ids, None, task, sampling, budget)
            try:
                ep.env = self.factory(**self.env_kwargs)
            except Exception as e:  # noqa: BLE001 - a broken environment fails its episodes, not the generator
                ep.env = _Broken(f"building the environment raised {type(e).__name__}: {str(e)[:300]}")
            eps.append(ep)
        self.episodes[prompt.prompt_id] = eps
        self.resets[prompt.prompt_id] = len(eps)
        for ep in eps:
            self._call(ep, "reset", ep.task)
        self.counts["episodes_started"] += len(eps)
        return []

    def owner(self, request_id: str) -> str | None:
        owner = self.requests.get(request_id)
        return owner[0] if owner else None

    def on_output(self, out: GenerationOutput, version: int) -> list[Finished]:
        prompt_id, index = self.requests[out.request_id]
        ep = self.episodes[prompt_id][out.sample_index if index is None else index]
        ep.add_model_turn(out.token_ids, out.logprobs, out.versions, out.finish_reason, out.timings)
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        first_version = int(out.versions[0]) if len(out.versions) else version
        self._call(ep, "step", Action(text=text, token_ids=out.token_ids, finish_reason=str(out.finish_reason),
                                      turn=ep.turns, version=first_version))
        left = self.shared_left.get(out.request_id, 1) - 1  # an n-sample request stays until its last output
        self.shared_left[out.request_id] = left
        if left <= 0:
            self.requests.pop(out.request_id, None)
            self.shared_left.pop(out.request_id, None)
        return []

    def poll(self, version: int) -> tuple[list[GenerationRequest], list[Finished]]:
        requests: list[GenerationRequest] = []
        finished: list[Finished] = []
        for prompt_id, eps in list(self.episodes.items()):
            for ep in eps:
                if ep.pending is not None and ep.pending.done():
                    kind, outcome = ep.pending_kind, ep.pending.result()
                    ep.pending = None
                    ep.env_time_s += outcome.seconds
                    done = self._reset_done(ep, outcome.value, version) if kind == "reset" \
                        else self._step_done(ep, outcome.value, version, requests)
                    if done is not None:
                        finished.append((prompt_id, done))
            if self.resets.get(prompt_id) == 0:
                del self.resets[prompt_id]
                requests += self._first_turn(prompt_id, eps)
        return requests, finished

    def rejected(self, request_id: str, reason: str) -> list[Finished]:
        prompt_id, index = self.requests.pop(request_id, (None, None))
        if prompt_id is None or index is None or prompt_id not in self.episodes:
            return []
        return [(prompt_id, self._fail(self.episodes[prompt_id][index], Failure("too_long", reason[:300])))]

    def drop(self, prompt_id: str) -> list[str]:
        for ep in self.episodes.pop(prompt_id, []):
            if ep.pending is not None:
                ep.pending.cancel()
        self.resets.pop(prompt_id, None)
        ids = [rid for rid, (pid, _) in self.requests.items() if pid == prompt_id]
        for rid in ids:
            del self.requests[rid]
            self.shared_left.pop(rid, None)
        return ids

    def finished(self, prompt_id: str) -> None:
        self.drop(prompt_id)

    def busy(self) -> bool:
        return any(ep.pending is not None for eps in self.episodes.values() for ep in eps)

    def stats(self) -> dict[str, float]:
        """Episode counters, and the environment class's process-wide ones where it has them (`shared_stats`:
        e.g. the OpenAI endpoint's refusals), for the generator's heartbeat and metrics."""
        out = {k: float(v) for k, v in self.counts.items()}
        shared = getattr(self.factory, "shared_stats", None)
        if callable(shared):
            out.update({k: float(v) for k, v in shared().items()})
        return out

    def close(self) -> None:
        self.loop.close()

    # ------------------------------------------------------------------ phases

    def _call(self, ep: Episode, kind: str, arg: object) -> None:
        fn = getattr(ep.env, kind)
        ep.pending, ep.pending_kind = self.loop.call(fn, arg, self.cfg.step_timeout_s), kind

    def _reset_done(self, ep: Episode, value: object, version: int) -> object:
        self.resets[ep.prompt_id] -= 1
        if isinstance(value, Failure):
            return self._fail(ep, value)
        if value is not None:
            try:
                ep.add_env_tokens(self.encoder.encode(value, None, self.vocab_size), version)
            except ObservationError as e:
                return self._fail(ep, Failure("invalid", f"reset returned a bad observation: {e}"))
        return None

    def _first_turn(self, prompt_id: str, eps: list[Episode]) -> list[GenerationRequest]:
        live = [ep for ep in eps if not ep.tokens and not _is_failed(ep)]
        if live and len(live) == len(eps):  # no observation from any reset: one request, a shared prefill
            rid = f"{prompt_id}#t1"
            self.requests[rid], self.shared_left[rid] = (prompt_id, None), len(eps)
            return [GenerationRequest(request_id=rid, prompt_token_ids=eps[0].prompt_ids,
                                      sampling=eps[0].sampling, n=len(eps))]
        return [self._turn_request(ep) for ep in eps if not _is_failed(ep) and ep.turns == 0]

    def _step_done(self, ep: Episode, value: object, version: int, requests: list[GenerationRequest]):
        if isinstance(value, Failure):
            return self._fail(ep, value)
        if not isinstance(value, Step) or not _finite(value.reward) or \
                not (value.observation is None or isinstance(value.observation, Observation)):
            return self._fail(ep, Failure("invalid", f"step returned {_describe(value)}, not a Step with a finite "
                                                     "reward and an Observation or None"))
        ep.turn_rewards.append(float(value.reward))
        ep.tool_calls += int(value.tool_calls)
        for k, v in value.info.items():
            if isinstance(v, (int, float)) and _finite(v):
                ep.info[k] = ep.info.get(k, 0.0) + float(v)
        if value.done or value.observation is None:
            return self._finish(ep, ep.last_finish)  # an aborted turn never reaches here: its prompt went back
        if ep.turns >= self.cfg.max_turns:
            return self._finish(ep, R.FinishReason.LENGTH)
        try:
            ids = self.encoder.encode(value.observation, ep.last_model_token(), self.vocab_size)
        except ObservationError as e:
            return self._fail(ep, Failure("invalid", f"step returned a bad observation: {e}"))
        if not len(ids):  # the next turn would join this one: turns are the runs of model tokens
            return self._fail(ep, Failure("invalid", "step returned an empty observation; end the episode with "
                                                     "done=True or observation=None instead"))
        if len(ids) >= ep.remaining():  # no room left for a model token after it
            return self._finish(ep, R.FinishReason.LENGTH)
        ep.add_env_tokens(ids, version)
        requests.append(self._turn_request(ep))
        return None

    def _turn_request(self, ep: Episode) -> GenerationRequest:
        rid = f"{ep.prompt_id}#t{ep.turns + 1}s{ep.index}"
        self.requests[rid] = (ep.prompt_id, ep.index)
        seed = None if ep.sampling.seed is None else \
            (ep.sampling.seed + (ep.turns + 1) * TURN_SEED_STRIDE + ep.index) & 0x7FFFFFFF
        sampling = dataclasses.replace(ep.sampling, max_new_tokens=min(ep.sampling.max_new_tokens, ep.remaining()),
                                       seed=seed)
        return GenerationRequest(request_id=rid, prompt_token_ids=ep.context(), sampling=sampling, n=1)

    def _finish(self, ep: Episode, finish: R.FinishReason):
        self.counts["episodes_done"] += 1
        self.counts["turns"] += ep.turns
        return ep.trajectory(finish)

    def _fail(self, ep: Episode, failure: Failure):
        self.counts[f"episode_failed_{failure.reason}"] += 1
        log.warning("episode %s/%d failed (%s): %s", ep.prompt_id, ep.index, failure.reason, failure.detail)
        ep.info["failed"] = 1.0
        return ep.trajectory(R.FinishReason.ENV_ERROR, error=f"{failure.reason}: {failure.detail}")


class _Broken:
    """Stands in for an environment whose constructor raised: every call fails with that reason."""

    def __init__(self, why: str) -> None:
        self.why = why

    def reset(self, task: Task) -> None:
        raise RuntimeError(self.why)

    def step(self, action: Action) -> None:
        raise RuntimeError(self.why)


def _wanted(factory: type, **offers: object) -> dict[str, object]:
    """The offers (the generator's tokenizer) that the environment's constructor names as parameters."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in offers.items() if k in params}


def _is_failed(ep: Episode) -> bool:
    return ep.info.get("failed", 0.0) > 0


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _describe(v: object) -> str:
    return f"{type(v).__name__} {str(v)[:80]!r}"
