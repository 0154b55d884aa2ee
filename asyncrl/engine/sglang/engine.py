"""SGLang as an asyncrl `Engine`: an adapter for a running SGLang HTTP server (0.5.23 protocol; servers
<= 0.5.20 are detected and driven without the begin/end session). See docs/sglang.md.

Concurrency:

    generator thread          worker threads (max_in_flight)              SGLang server
    add() ──► _waiting ─────► POST /generate, blocks until it finishes ──► scheduler (continuous batching)
    step() ◄── _finished ◄─── parsed outputs / errors ◄────────────────────
    pause / resume / abort ── control POSTs, in the caller's thread ──────►
    weight receiver thread ── update_weights_from_distributed ────────────► scheduler ranks ◄── learner broadcast

* `add` never blocks; a request waits in `_waiting` until a worker is free and generation is not paused.
* Workers block on HTTP only. A /generate that reaches a paused server waits there until continue.
* `step` returns whatever finished since the last call, waiting at most 10 ms for the first output.
* Staleness: none is added here; each token carries the version SGLang reports for it (its
  `weight_versions` spans), so tokens of a request that spans an update are stamped per token.
* Prefix cache: every /generate carries `extra_key`, SGLang's radix-cache namespace, renewed at every weight
  update (`_cache_key`, taken when a worker sends the request). A request sent after an update can then never be
  served KV the old weights computed, even where the cache cannot be flushed (continue_mode "in_place"); the
  requests in the server at the update keep theirs, the documented continue mode. abort and retract pauses also
  flush the cache while the server is idle, which frees the old pages at once.

Weights: one public API, the weight receiver's (asyncrl.weights.transport.DirectReceiver):
`init_weights_group` -> (`begin_weight_update` -> `receive_bucket`... -> `end_weight_update`)... ->
`destroy_weights_group`. SGLang's scheduler ranks, not this process, receive the broadcast. A learner on
the same GPU (CUDA IPC) is not supported: SGLang's ranks must receive by broadcast from another GPU.

Start-up recovers what a dead predecessor left on the server (an open weight-update session, a pause);
see asyncrl.engine.sglang.weights.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Self

import torch

from asyncrl.engine.protocol import EngineLimits, EngineStats, GenerationOutput, GenerationRequest, PauseMode
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.client import SGLangConnectionError, SGLangError, SGLangHTTP
from asyncrl.engine.sglang.generate import (
    aborted_unsent,
    cache_counts,
    generate_payload,
    parse_outputs,
    sample_rids,
    version_number,
    with_cache_key,
)
from asyncrl.engine.sglang.server_checks import check_logits, check_weights_dtype
from asyncrl.engine.sglang.lora import JoinChannel, Lease, SGLangAdapters
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.engine.sglang.weights import INCOMPLETE, SGLangWeightSync
from asyncrl.records import FinishReason, WeightBucket, WeightGroupInit

log = logging.getLogger(__name__)

_STEP_WAIT_S = 0.01


@dataclass(slots=True)
class _Job:
    request: GenerationRequest
    rid: str  # our key; SGLang knows the samples by `sample_rids` (empty: SGLang picked them)
    body: dict[str, Any]  # the /generate body, built (and type-checked) by add()
    sample_rids: list[str]
    queued_at: float


class SGLangEngine:
    def __init__(self, config: SGLangConfig, *, logits_fp32: bool = False, lora: LoraSpec | None = None,
                 adapter_channel: JoinChannel | None = None, weights_dtype: str = "model") -> None:
        """logits_fp32: the learner computes fp32 logits (ModelConfig.logits_fp32); the server must too.
        weights_dtype: "fp8" needs a server started with --quantization fp8, "model" one without (server_checks.py).
        lora: adapter pushes (learner.lora_push = "adapter"): this process receives each version's adapters and
        the server applies them through its LoRA serving (lora.py); ValueError when the server cannot.
        adapter_channel: how this process joins the weight group to receive them (lora.JoinChannel)."""
        self.config = config
        self._http = SGLangHTTP(config.base_url, config.api_key)
        model_info = self._model_info()
        label = str(model_info.get("weight_version"))
        info = self._server_info()
        check_logits(info, logits_fp32, config.base_url)
        check_weights_dtype(info, weights_dtype, config.base_url)
        self._weights = SGLangWeightSync(self._http, config, label)
        if self._weights.recover():
            label = INCOMPLETE
            model_info = model_info | {"weight_version": label}
        self._lora = (SGLangAdapters(self._http, config, lora, info, model_info, adapter_channel)
                      if lora else None)
        self._version = version_number(label)
        self._cache_key = _cache_key(self._version)
        self._tp_size: int | None = None
        self._group_name: str | None = None  # the group joined through init_weights_group
        self._cond = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._running: dict[str, _Job] = {}
        self._finished: list[GenerationOutput] = []
        self._errors: list[SGLangError] = []
        self._paused = False
        self._closed = False
        self._tokens = 0
        self._prompt_tokens = self._cached_tokens = 0  # as the server reports them
        self._workers = [
            threading.Thread(target=self._work, name=f"sglang-generate-{i}", daemon=True)
            for i in range(config.max_in_flight)
        ]
        for w in self._workers:
            w.start()

    # ---------------------------------------------------------------- generation

    @property
    def weight_version(self) -> int:
        return self._version

    def add(self, request: GenerationRequest) -> None:
        """Raises ValueError for a request SGLang would refuse (e.g. a non-integral top_k)."""
        if request.n < 1 or len(request.prompt_token_ids) == 0:
            raise ValueError(f"request {request.request_id!r}: needs n >= 1 and a non-empty prompt")
        rid = f"asyncrl-{uuid.uuid4().hex}"
        c = self.config
        body = generate_payload(request, deterministic=c.deterministic, extra=c.extra_sampling_params, rid=rid)
        job = _Job(request, rid, body, sample_rids(rid, request.n, c.deterministic), time.monotonic())
        with self._cond:
            if self._closed:
                raise SGLangError("SGLangEngine is closed")
            self._waiting.append(job)
            self._cond.notify()

    def step(self) -> list[GenerationOutput]:
        """Finished samples since the last call; raises the first failed /generate (then the next...)."""
        with self._cond:
            if not self._finished and not self._errors and (self._waiting or self._running):
                self._cond.wait(_STEP_WAIT_S)
            if self._errors:
                raise self._errors.pop(0)
            out, self._finished = self._finished, []
        return out

    def has_work(self) -> bool:
        with self._cond:
            return bool(self._waiting or self._running or self._finished)

    def limits(self) -> EngineLimits:
        """The server's context length (/server_info); the vocabulary is not reported (the server checks
        ids itself, and its refusal fails the prompt like any other)."""
        info = self._server_info()
        context = info.get("context_length")
        return EngineLimits(vocab_size=None, max_model_len=int(context) if isinstance(context, int) and context > 0 else None)

    def stats(self) -> EngineStats:
        with self._cond:
            return EngineStats(
                running=sum(j.request.n for j in self._running.values()),
                waiting=sum(j.request.n for j in self._waiting),
                tokens_generated=self._tokens,
                weight_version=self._version,
                prefill_tokens=self._prompt_tokens - self._cached_tokens,
                prefix_cache_hit_tokens=self._cached_tokens,
            )

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenerationOutput]:
        """Abort these requests (all when None) and return their partial outputs. Each sample is aborted
        by its exact rid (SGLang ignores an abort for a rid it does not hold). SGLang gives the n > 1
        samples of a request fresh rids unless deterministic=true, so such a request can only be
        aborted by aborting all."""
        ids = None if request_ids is None else set(request_ids)
        unsent, in_flight = self._take_jobs(lambda j: ids is None or j.request.request_id in ids)
        if ids is None and in_flight:
            self._post("/abort_request", {"abort_all": True})
        elif ids is not None:
            alone = [j for j in in_flight if j.sample_rids]
            for rid in (rid for job in alone for rid in job.sample_rids):
                self._post("/abort_request", {"rid": rid})
            for job in in_flight:
                if not job.sample_rids:
                    log.warning(
                        "request %r (n=%d) cannot be aborted alone; it will finish",
                        job.request.request_id,
                        job.request.n,
                    )
            in_flight = alone
        self._wait_returned(in_flight)
        return self._take_aborted({j.request.request_id for j in in_flight}) + unsent

    # ---------------------------------------------------------------- pause / resume

    def pause(self, mode: PauseMode) -> list[GenerationOutput]:
        """'abort': SGLang aborts everything in flight (partial outputs are returned here, with the
        requests not yet sent), then the prefix cache is flushed. 'continue': requests stay in SGLang
        under `config.continue_mode` ("retract" by default: their KV is dropped and recomputed under the
        new weights, so the cache can be flushed; "in_place" keeps their old KV and cannot flush, and the
        requests sent after the update reuse none of it: a new cache namespace, `end_weight_update`).
        Adapter pushes change nothing in the server until new requests name the new adapter, so the server is
        not paused then: 'continue' only holds new requests here, 'abort' aborts what runs."""
        if mode not in ("abort", "continue"):
            raise ValueError(f"pause mode {mode!r}: must be 'abort' or 'continue'")
        if self._lora is not None:
            with self._cond:
                self._paused = True
            return self.abort() if mode == "abort" else []
        if mode == "continue":
            with self._cond:
                self._paused = True
            self._post("/pause_generation", {"mode": self.config.continue_mode})
            if self.config.continue_mode == "retract":
                self.flush_cache()
            return []
        with self._cond:
            self._paused = True  # workers send nothing new from here on
            sent = list(self._running.values())
        self._post("/pause_generation", {"mode": "abort"})
        unsent, running = self._take_jobs(lambda j: True)
        in_flight = list({j.rid: j for j in sent + running}.values())
        self._wait_returned(in_flight)
        self.flush_cache()
        return self._take_aborted({j.request.request_id for j in in_flight}) + unsent

    def resume(self) -> None:
        if self._lora is None:
            self._post("/continue_generation", {})
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def flush_cache(self) -> None:
        """Drop the prefix cache; SGLang refuses while requests run, so retry until idle."""
        deadline = time.monotonic() + self.config.flush_timeout_s
        delay = 0.02
        while True:
            resp = self._http.call("/flush_cache", None, timeout_s=self.config.request_timeout_s, allow=(400,))
            if resp.status < 400:
                return
            if time.monotonic() + delay > deadline:
                raise SGLangError(
                    f"SGLang {self.config.base_url}/flush_cache still refused after {self.config.flush_timeout_s:g} s "
                    f"({resp.text().strip()!r}); requests are still running (is generation paused?)"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    # ---------------------------------------------------------------- weights

    def begin_weight_update(self) -> None:
        """Open SGLang's update session (ending one a dead client left open first); none for adapter pushes."""
        if self._lora is None:
            self._weights.begin()

    def end_weight_update(self, version: int) -> None:
        if self._lora is not None:
            self._lora.publish(version)  # loaded as an adapter; requests sent from now on name it
        else:
            self._weights.end(version)
        with self._cond:
            self._version = version
            self._cache_key = _cache_key(version)  # requests sent from now on reuse no KV of older weights

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Not supported: SGLang loads weights in its own scheduler processes, from a broadcast."""
        raise SGLangError(
            "SGLang loads weights inside its own scheduler processes, not in this one: they arrive by "
            "broadcast through init_weights_group / receive_bucket (the weight receiver does this). A learner "
            "on the same GPU as the SGLang server is not supported; place them on different GPUs (docs/sglang.md)."
        )

    def receiving_ranks(self) -> int:
        """How many ranks this server adds to a weight group (its TP size): world_size = 1 + this. With adapter
        pushes this process is the one receiving rank."""
        return 1 if self._lora is not None else self._server_tp_size()

    def init_weights_group(self, init: WeightGroupInit) -> None:
        """Blocks until the server's ranks and the learner's rank 0 have met. Raises SGLangGroupError
        when the server refuses the group (join again with a fresh name)."""
        if init.backend not in ("nccl", "gloo"):
            raise SGLangError(
                f"weight group backend {init.backend!r}: SGLang receives only by broadcast (nccl, or gloo on "
                "CPU); a learner on the same GPU as the SGLang server is not supported, use separate GPUs"
            )
        if self._lora is not None:
            self._lora.join(init, self.config.weight_update_timeout_s)
            self._group_name = init.group_name
            return
        self._weights.init_group(
            init.master_address, init.master_port, init.rank_offset, init.world_size, init.group_name, init.backend
        )
        self._group_name = init.group_name

    def receive_bucket(self, bucket: WeightBucket) -> None:
        """Returns once SGLang has received this bucket's broadcast and loaded it."""
        if self._group_name is None:
            raise SGLangError("receive_bucket before init_weights_group: no weight group to receive on")
        if self._lora is not None:
            self._lora.receive(bucket)
        else:
            self._weights.receive_bucket(bucket, self._group_name)

    def destroy_weights_group(self) -> None:
        name, self._group_name = self._group_name, None
        if self._lora is not None:
            self._lora.leave()
        elif name is not None:
            try:
                self._weights.destroy_group(name)
            except SGLangError as e:  # leaving a broken group: log, the next join replaces it
                log.warning("destroying weight group %s: %s", name, e)

    @property
    def legacy(self) -> bool | None:
        """True for SGLang <= 0.5.20 (no begin/end session); None until the first begin_weight_update."""
        return self._weights.legacy

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Stop sending, abort what runs in the server (best effort), stop the workers. The server
        itself keeps running."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._waiting.clear()
            busy = bool(self._running)
            self._cond.notify_all()
        if busy:
            try:
                self._post("/abort_request", {"abort_all": True})
            except SGLangError as e:
                log.warning("close: abort_all failed: %s", e)
        deadline = time.monotonic() + self.config.abort_drain_s
        for w in self._workers:
            w.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._lora is not None:
            self._lora.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or (self._waiting and not self._paused))
                if self._closed:
                    return
                job = self._waiting.popleft()
                self._running[job.rid] = job
                key = self._cache_key
                lease = self._lora.acquire() if self._lora is not None else None  # the adapter of now
            outputs: list[GenerationOutput] = []
            error: SGLangError | None = None
            try:
                outputs = self._generate(job, key, lease)
            except SGLangError as e:
                e.add_note(f"while generating request {job.request.request_id!r}")
                error = e
            finally:
                if lease is not None and self._lora is not None:
                    self._lora.release(lease)
            with self._cond:
                del self._running[job.rid]
                self._finished.extend(outputs)
                self._tokens += sum(len(o.token_ids) for o in outputs)
                if error is not None:
                    self._errors.append(error)
                self._cond.notify_all()

    def _generate(self, job: _Job, cache_key: str, lease: Lease | None) -> list[GenerationOutput]:
        sent = time.monotonic()
        body = with_cache_key(job.body, cache_key)
        if lease is not None and lease.name is not None:
            body["lora_path"] = lease.name  # SGLang's field for the adapter's *name* (one for every prompt)
        resp = self._http.call("/generate", body, timeout_s=self.config.generate_timeout_s)
        timings = {"queue": sent - job.queued_at, "http": time.monotonic() - sent}
        answer = resp.json()
        prompt_tokens, cached_tokens = cache_counts(answer)
        with self._cond:
            self._prompt_tokens += prompt_tokens
            self._cached_tokens += cached_tokens
        outputs = parse_outputs(job.request, answer, timings)
        if lease is not None:  # the server's label is its base's; every token came from the request's adapter
            for o in outputs:
                o.versions[:] = lease.version
        return outputs

    def _take_jobs(self, match: Callable[[_Job], bool]) -> tuple[list[GenerationOutput], list[_Job]]:
        """Remove matching unsent jobs (returned as empty aborted outputs); list matching running ones."""
        with self._cond:
            unsent = [j for j in self._waiting if match(j)]
            self._waiting = deque(j for j in self._waiting if not match(j))
            running = [j for j in self._running.values() if match(j)]
        return [o for j in unsent for o in aborted_unsent(j.request, self._version)], running

    def _wait_returned(self, jobs: list[_Job]) -> None:
        with self._cond:
            done = self._cond.wait_for(
                lambda: not any(j.rid in self._running for j in jobs), timeout=self.config.abort_drain_s
            )
        if not done:
            log.warning(
                "aborted /generate calls did not return within %.1f s; they finish later", self.config.abort_drain_s
            )

    def _take_aborted(self, request_ids: set[str]) -> list[GenerationOutput]:
        with self._cond:
            taken = [o for o in self._finished if o.finish_reason == FinishReason.ABORT and o.request_id in request_ids]
            self._finished = [
                o for o in self._finished if not (o.finish_reason == FinishReason.ABORT and o.request_id in request_ids)
            ]
        return taken

    def _post(self, path: str, payload: dict[str, Any]) -> None:
        self._http.call(path, payload, timeout_s=self.config.request_timeout_s)

    def _model_info(self) -> dict[str, Any]:
        """GET /model_info, retried for `startup_wait_s` while the server is not up yet."""
        deadline = time.monotonic() + self.config.startup_wait_s
        while True:
            try:
                resp = self._http.call(
                    "/model_info", None, method="GET", timeout_s=self.config.request_timeout_s, allow=(404,)
                )
                if resp.status == 404:  # older servers: only the deprecated alias
                    resp = self._http.call(
                        "/get_model_info", None, method="GET", timeout_s=self.config.request_timeout_s
                    )
                return resp.json() or {}
            except SGLangConnectionError as e:
                if time.monotonic() >= deadline:
                    raise SGLangConnectionError(
                        f"{e} (waited {self.config.startup_wait_s:g} s; raise sglang.startup_wait_s if it is still starting)"
                    ) from e
                time.sleep(0.5)

    def _server_tp_size(self) -> int:
        if self._tp_size is None:
            self._tp_size = int(self._server_info().get("tp_size", 1))
        return self._tp_size

    def _server_info(self) -> dict[str, Any]:
        info = self._http.call("/server_info", None, method="GET", timeout_s=self.config.request_timeout_s).json()
        return info if isinstance(info, dict) else {}


def _cache_key(version: int) -> str:
    """A radix-cache namespace for the weights loaded now: unique per update and per adapter (a version number
    may recur: a restarted run, a recovered server's label), so no two weights ever share one."""
    return f"asyncrl-v{version}-{uuid.uuid4().hex[:12]}"
