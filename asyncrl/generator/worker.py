"""The generator loop: lease prompts from the hub, keep the engine full, send finished groups back.

    hub ──Lease(prompts)──▶ GeneratorWorker ──add──▶ Engine ──step()──▶ outputs
     ▲                          │   ▲                                      │
     └──SampleBatch(group)──────┘   └── weights.poll() between steps ◀─────┘

One thread drives everything, so weight updates land exactly between two decode steps.
* Idle (nothing to decode): it waits on the weight socket for IDLE_WAIT_S, then asks the hub again
  (a non-blocking lease), so a push never waits behind a hub long-poll.
* Backpressure: the worker asks for at most `free // n` prompts (whole groups that fit in
  `max_running`), and only when its weights are as new as the hub's policy version; the hub's
  staleness rule may answer with fewer (or none).
* A group is sent once all n samples finished. Whether a weight update aborts running groups is the
  push's pause mode (the learner sends `generator.inflight_update`); aborted outputs come back from
  `weights.poll()` and their prompts go back to the hub (nothing partial is ever sent).
* Staleness: each token carries the version that sampled it; with "continue", one sample may span
  several versions (the hub drops by the oldest).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from asyncrl import records as R
from asyncrl.engine.protocol import Engine, GenerationOutput
from asyncrl.generator.admission import why_not
from asyncrl.net.heartbeat import Hub  # timeout_s is shortened at shutdown: an exit never hangs on a dead hub
from asyncrl.net.heartbeat import Heartbeats
from asyncrl.rollout.protocol import Finished, Rollout, Trajectory
from asyncrl.rollout.single_turn import SingleTurn
from asyncrl.observe.timeline import Timeline
from asyncrl.weights.receiver import UpdateResult

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.02  # with nothing to decode: how long to wait for a weight push before asking the hub again
BUSY_WAIT_S = 0.002  # the same while episodes wait on their environments (poll them again soon)


class WeightSource(Protocol):
    def poll(self, timeout_s: float = 0.0) -> UpdateResult | None:
        """Handle pending weight-push messages, waiting up to timeout_s for one; None when no update ran
        (`UpdateResult.aborted`: outputs aborted by the pause)."""

    @property
    def mid_update(self) -> bool:
        """An update failed half done (the learner dropped us, a transfer broke): the engine holds no complete
        weight version and must not step until the next update completes it."""


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Any, skip_special_tokens: bool = ...) -> str: ...


@dataclass(slots=True)
class _Group:
    prompt: R.Prompt
    lease_id: str
    token_ids: np.ndarray  # [prompt_len] int32: what the engine got, sent back as Sample.prompt_token_ids
    leased_at: float
    outputs: dict[int, Trajectory] = field(default_factory=dict)


class GeneratorWorker:
    def __init__(
        self, *, name: str, engine: Engine, hub: Hub, tokenizer: Tokenizer | None, max_running: int,
        weights: WeightSource | None = None, seed: int = 0,
        heartbeat_s: float = 2.0, timeline: Timeline | None = None, group_size: int = 1,
        rollout: Rollout | None = None,
    ) -> None:
        """`rollout`: how a prompt becomes samples (asyncrl.rollout); default one model turn per sample."""
        self.name, self.engine, self.hub, self.tokenizer = name, engine, hub, tokenizer
        self.max_running, self.weights = max_running, weights
        self.seed, self.heartbeat_s = seed, heartbeat_s
        self.group_size = group_size  # expected samples per prompt, to size lease requests
        self.timeline = timeline or Timeline(None, name)
        self.rollout: Rollout = rollout or SingleTurn()
        self.groups: dict[str, _Group] = {}
        self.hub_version = 0
        self.stopping = False
        self.beats = Heartbeats("generator", name, heartbeat_s)
        self._stats = {"samples_sent": 0.0, "tokens_generated": 0.0, "groups_returned": 0.0, "prompts_failed": 0.0}
        self.limits = engine.limits()
        self.last_failure = ""  # reason of the latest prompt this generator could not take
        self._t0 = time.monotonic()

    # ------------------------------------------------------------------ loop

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Loop until the hub asks for shutdown or `stop()`; then give unfinished prompts back."""
        try:
            while not (self.stopping or stop()):
                self.run_once()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Give unfinished prompts back to the hub (best effort: the hub may be gone)."""
        self.hub.timeout_s = min(self.hub.timeout_s, 5.0)  # never hang an exit on a dead hub
        try:
            self._return_all("shutdown")
        except Exception as e:  # noqa: BLE001
            log.warning("%s: could not return prompts at shutdown: %s", self.name, e)

    def run_once(self) -> None:
        self._sync_weights()
        self._lease()
        self._advance()
        if self.engine.has_work() and not (self.weights is not None and self.weights.mid_update):
            start = time.time()
            outputs = self.engine.step()
            self.timeline.record("generate", start, time.time())
            self._collect(outputs)
        else:
            self._idle()
        self._heartbeat()

    def _idle(self) -> None:
        """Nothing to decode (or weights half updated): wait on the weight socket (not on the hub), so a push is
        served at once; episodes waiting on their environments are polled again after it (`_advance`)."""
        wait = BUSY_WAIT_S if self.rollout.busy() else IDLE_WAIT_S
        if self.weights is None:
            time.sleep(wait)
        else:
            self._sync_weights(wait)

    # ------------------------------------------------------------------ phases

    def _sync_weights(self, timeout_s: float = 0.0) -> None:
        if self.weights is None:
            return
        result = self.weights.poll(timeout_s)
        if result is not None and result.aborted:
            self._collect(result.aborted)

    def _free_slots(self) -> int:
        running = sum(g.prompt.n - len(g.outputs) for g in self.groups.values())
        return self.max_running - running

    def _lease(self) -> None:
        if self.weights is not None and self.engine.weight_version < self.hub_version:
            return  # behind the learner: take no prompts until the push lands (run_once idles on it)
        free = self._free_slots()
        n = max((g.prompt.n for g in self.groups.values()), default=self.group_size)
        if free < n:
            return
        lease = self.hub.request(R.LeaseRequest(generator=self.name, max_prompts=max(1, free // n), wait_s=0.0))
        self.hub_version = max(self.hub_version, lease.policy_version)
        for prompt in lease.prompts:
            if prompt.n > free:
                self.hub.request(R.ReturnPrompts(lease_id=lease.lease_id, prompt_ids=[prompt.prompt_id]))
                continue
            free -= prompt.n
            self._start(prompt, lease.lease_id)

    def _start(self, prompt: R.Prompt, lease_id: str) -> None:
        """Start a leased prompt, or fail it at the hub with the reason the engine cannot take it."""
        try:
            ids = prompt.token_ids if prompt.token_ids is not None else self._tokenize(prompt.text or "")
            reason = why_not(ids, prompt.sampling.max_new_tokens, self.limits)
            if not reason:
                self._add(prompt, lease_id, ids)
                return
        except ValueError as e:  # the engine's own check (KV cache room, ...) or the tokenizer refused it
            reason = str(e)
        self._fail(prompt, lease_id, reason)

    def _fail(self, prompt: R.Prompt, lease_id: str, reason: str) -> None:
        self._stats["prompts_failed"] += 1
        self.last_failure = reason[:300]
        log.warning("%s: prompt %r failed: %s", self.name, prompt.prompt_id, reason)
        self.hub.request(R.ReturnPrompts(lease_id=lease_id, prompt_ids=[prompt.prompt_id], reason=reason[:1000]))

    def _add(self, prompt: R.Prompt, lease_id: str, ids: np.ndarray) -> None:
        """Hand the prompt to the rollout and its first requests to the engine (ValueError: the engine
        refused one; then nothing stays registered)."""
        sampling = R.SamplingParams(
            temperature=prompt.sampling.temperature, top_p=prompt.sampling.top_p, top_k=prompt.sampling.top_k,
            max_new_tokens=prompt.sampling.max_new_tokens, stop_token_ids=list(prompt.sampling.stop_token_ids),
            ignore_eos=prompt.sampling.ignore_eos,
            seed=prompt.sampling.seed if prompt.sampling.seed is not None else self._seed_for(prompt.prompt_id),
        )
        try:
            for request in self.rollout.start(prompt, ids, sampling):
                self.engine.add(request)  # raises ValueError for a request it cannot take
        except ValueError:
            self.engine.abort(self.rollout.drop(prompt.prompt_id))  # drop names every request it made
            raise
        self.groups[prompt.prompt_id] = _Group(prompt, lease_id, ids, time.time())

    def _advance(self) -> None:
        """Environment calls that answered: next turns into the engine, finished episodes into their groups."""
        requests, finished = self.rollout.poll(self.engine.weight_version)
        for request in requests:
            try:
                self.engine.add(request)
            except ValueError as e:  # e.g. the history outgrew the KV cache: that episode ends, not the run
                finished += self.rollout.rejected(request.request_id, str(e))
        self._take(finished)

    def _tokenize(self, text: str) -> np.ndarray:
        if self.tokenizer is None:
            raise ValueError("prompt has text but this generator has no tokenizer: send token_ids")
        ids = self.tokenizer.encode(text)  # with the model's special tokens (BOS), as a chat template would
        return np.asarray(ids, dtype=np.int32)

    def _seed_for(self, prompt_id: str) -> int:
        return zlib.crc32(f"{self.seed}:{prompt_id}".encode()) & 0x7FFFFFFF

    def _collect(self, outputs: list[GenerationOutput]) -> None:
        finished: list[Finished] = []
        aborted: set[str] = set()
        for out in outputs:
            prompt_id = self.rollout.owner(out.request_id)
            if prompt_id is None or prompt_id not in self.groups or prompt_id in aborted:
                continue
            if out.finish_reason == R.FinishReason.ABORT:
                aborted.add(prompt_id)
                continue
            self._stats["tokens_generated"] += len(out.token_ids)
            finished += self.rollout.on_output(out, self.engine.weight_version)
        for prompt_id in aborted:
            self._return_group(prompt_id)
        self._take(finished)

    def _take(self, finished: list[Finished]) -> None:
        done: list[_Group] = []
        for prompt_id, trajectory in finished:
            group = self.groups.get(prompt_id)
            if group is None:
                continue
            group.outputs[trajectory.sample_index] = trajectory
            if len(group.outputs) == group.prompt.n:
                done.append(group)
        self._send(done)

    def _send(self, done: list[_Group]) -> None:
        by_lease: dict[str, list[R.Sample]] = {}
        for group in done:
            del self.groups[group.prompt.prompt_id]
            self.rollout.finished(group.prompt.prompt_id)
            by_lease.setdefault(group.lease_id, []).extend(self._samples(group))
        for lease_id, samples in by_lease.items():
            self.hub.request(R.SampleBatch(lease_id=lease_id, samples=samples))
            self._stats["samples_sent"] += len(samples)

    def _samples(self, group: _Group) -> list[R.Sample]:
        out = []
        for index in range(group.prompt.n):
            o = group.outputs[index]
            text = self.tokenizer.decode(o.token_ids, skip_special_tokens=True) if self.tokenizer else ""
            out.append(R.Sample(
                prompt_id=group.prompt.prompt_id, sample_index=index, prompt_token_ids=group.token_ids,
                response_token_ids=o.token_ids, logprobs=o.logprobs, versions=o.versions,  # dtypes: the Engine protocol's
                finish_reason=o.finish_reason, response_text=text,
                timings={**o.timings, "lease_to_done": time.time() - group.leased_at}, generator=self.name,
                loss_mask=o.loss_mask, turn_rewards=o.turn_rewards, env_reward=o.env_reward, env_error=o.env_error,
                rollout=o.stats,
            ))
        return out

    def _return_group(self, prompt_id: str) -> None:
        group = self.groups.pop(prompt_id, None)
        if group is None:
            return
        self.engine.abort(self.rollout.drop(prompt_id))
        self.hub.request(R.ReturnPrompts(lease_id=group.lease_id, prompt_ids=[prompt_id]))
        self._stats["groups_returned"] += 1

    def _return_all(self, why: str) -> None:
        """One ReturnPrompts per lease; stops at the first failure (the hub may be gone)."""
        if not self.groups:
            return
        log.info("%s: returning %d unfinished prompts (%s)", self.name, len(self.groups), why)
        self.engine.abort([rid for prompt_id in self.groups for rid in self.rollout.drop(prompt_id)])
        by_lease: dict[str, list[str]] = {}
        for prompt_id, group in self.groups.items():
            by_lease.setdefault(group.lease_id, []).append(prompt_id)
        self.groups.clear()
        for lease_id, prompt_ids in by_lease.items():
            self.hub.request(R.ReturnPrompts(lease_id=lease_id, prompt_ids=prompt_ids))
            self._stats["groups_returned"] += len(prompt_ids)

    def _heartbeat(self) -> None:
        if not self.beats.due():
            return
        now = time.monotonic()
        es = self.engine.stats()
        stats = {**self._stats, **self.rollout.stats(), "running": float(es.running), "waiting": float(es.waiting),
                 "tokens_per_s": self._stats["tokens_generated"] / max(now - self._t0, 1e-9),
                 "weight_version": float(es.weight_version), "prefill_tokens": float(es.prefill_tokens),
                 "prefix_cache_hit_tokens": float(es.prefix_cache_hit_tokens)}
        answer = self.beats.send(self.hub, stats)
        if answer.policy_version is not None:
            self.hub_version = max(self.hub_version, answer.policy_version)
        if answer.shutdown:
            self.stopping = True
