"""A protocol-faithful stand-in for an SGLang 0.5.23 HTTP server (docs/sglang.md), on 127.0.0.1.

Real process groups, fake model: weight updates join a real gloo group by TCP rendezvous and receive
real broadcasts (in `FakeRanks` processes, one per TP rank); generation samples from `FakeModel`,
whose logits depend only on (weights version, prompt, position), so tests can recompute logprobs.

    HTTP handler threads (ThreadingHTTPServer, one per connection)
      /generate ─ admit (waits while paused or while an update holds the writer lock)
                  └► decode loop: one token per `token_delay_s` for each sample of the call ─► answer
      control   ─ change the shared state under `cond`; broadcasts are received outside it
                  (weight-update endpoints: sglang_double_weights.py)
    FakeRanks  ─ TP rank processes: rendezvous + gloo broadcast receive, driven over pipes

Strict where the real server is: an endpoint that takes a request object refuses a missing body (422),
/abort_request acts only on a rid the server holds exactly (the prefix rule applies after that check),
integer sampling fields refuse floats, a duplicate group name fails after the rendezvous, and every
piece of state (session, pause, groups, version) outlives the client that set it. The radix cache
(`sglang_double_radix`) serves KV across requests by `extra_key` whatever weights computed it, as SGLang's
does, and poisons a request that got KV of other weights (`stale_kv_served`).

All shared state is guarded by one Condition. Every wait has a timeout (`block_timeout_s`,
`group_timeout_s`), so a test that forgets a step fails instead of hanging.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any, Literal, Self

import numpy as np
import torch

from tests.doubles.fake_model import FakeModel, log_softmax
from tests.doubles.sglang_double_generate import BadRequest, Req, parse_generate, render
from tests.doubles.sglang_double_lora import ROUTES as lora_routes
from tests.doubles.sglang_double_lora import LoadedLora, acquire, lora_names
from tests.doubles.sglang_double_radix import RadixCache
from tests.doubles.sglang_double_weights import NOT_FOUND
from tests.doubles.sglang_double_weights import ROUTES as weight_routes
from tests.doubles.sglang_ranks import FakeRanks
from tests.doubles.sglang_transport import Crashed as _Crashed
from tests.doubles.sglang_transport import Handler as _Handler
from tests.doubles.sglang_transport import encode as _encode

BODY_REQUIRED = frozenset({
    "/generate", "/pause_generation", "/continue_generation", "/abort_request", "/update_weight_version",
    "/release_memory_occupation", "/resume_memory_occupation", "/begin_weight_update", "/end_weight_update",
    "/init_weights_update_group", "/destroy_weights_update_group", "/update_weights_from_distributed",
    "/update_weights_from_tensor", "/load_lora_adapter", "/unload_lora_adapter",
})  # fmt: skip
"""Endpoints whose FastAPI handler takes a request object: POSTing no body is a 422."""
MISSING_BODY = {"detail": [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]}
FLUSH_OK = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"


@dataclass(kw_only=True)
class DoubleConfig:
    tp_size: int = 1
    version_mode: Literal["0.5.23", "legacy"] = "0.5.23"
    weight_version: str = "default"
    skip_tokenizer_init: bool = True
    context_len: int = 400
    eos_ids: tuple[int, ...] = (2,)
    vocab_size: int = 32
    stop_after: int = 24  # output position from which EOS is all but certain
    token_delay_s: float = 0.002  # one decode step
    deterministic: bool = False  # --enable-deterministic-inference: sampling_seed (default 42) fixes samples
    param_names: frozenset[str] | None = None  # known parameters (None: all); others only warn
    api_key: str = ""
    group_timeout_s: float = 10.0  # rendezvous and broadcast waits of the fake ranks
    block_timeout_s: float = 20.0  # longest any request waits on pause / writer lock / idle
    seed: int = 0
    enable_fp32_lm_head: bool = False  # --enable-fp32-lm-head (reported by /server_info, like every server arg)
    quantization: str | None = None  # --quantization (e.g. "fp8"; None: the checkpoint's dtype)
    load_format: str = "dummy"  # --load-format, reported by /model_info ("dummy": random weights until a push)
    enable_lora: bool = False  # --enable-lora (LoRA serving: sglang_double_lora.py)
    max_lora_rank: int | None = None  # --max-lora-rank (None: inferred from --lora-paths, i.e. not checked)
    lora_target_modules: tuple[str, ...] | None = None  # --lora-target-modules (None: not checked)
    max_loras_per_batch: int = 8  # --max-loras-per-batch (reported only)



class SGLangDouble:
    def __init__(self, config: DoubleConfig | None = None, **overrides: Any) -> None:
        self.config = config or DoubleConfig(**overrides)
        c = self.config
        self.model = FakeModel(vocab_size=c.vocab_size, eos_ids=tuple(c.eos_ids), stop_after=c.stop_after)
        self.cond = threading.Condition()
        self.paused: str | None = None
        self.session_open = False
        self.session_loaded = False
        self.groups: set[str] = set()
        self.weights: dict[str, torch.Tensor] = {}
        self.warnings: list[str] = []
        self.version = c.weight_version
        self.in_flight: dict[str, Req] = {}
        self.prefix_cache_dirty = False
        self.weights_garbage = False
        self.crashed = False
        self.tokens_generated = 0
        self.calls: list[tuple[str, Any]] = []  # (path, JSON body) of every POST, for tests to inspect
        self.prefix_cache = RadixCache()
        self.loras: dict[str, LoadedLora] = {}  # loaded LoRA adapters by name
        self.unloading: dict[str, LoadedLora] = {}  # unregistered, waiting for their requests to finish
        self.unloaded: list[str] = []  # names unloaded, in order
        self.stale_kv_served = 0  # requests that were given KV computed by other weights than the server's
        self._writer = False
        self._writers_waiting = 0
        self._closed = False
        self._n_reqs = 0
        self.ranks = FakeRanks(c.tp_size, c.group_timeout_s)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.double = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="sglang-double", daemon=True
        )
        self._thread.start()
        self._routes: dict[str, Callable[[Any, dict], tuple[int, Any]]] = {
            "/generate": self._generate, "/model_info": self._model_info, "/get_model_info": self._model_info,
            "/server_info": self._server_info, "/flush_cache": self._flush_cache,
            "/pause_generation": self._pause, "/continue_generation": self._continue,
            "/abort_request": self._abort_request,
            "/update_weight_version": self._update_weight_version,
            "/release_memory_occupation": self._release, "/resume_memory_occupation": self._resume_memory,
            "/health": self._health, "/health_generate": self._health, "/ready": self._health,
            "/v1/loads": self._loads,
        }  # fmt: skip
        for path, handler in (weight_routes | lora_routes).items():
            self._routes[path] = lambda body, query, handler=handler: handler(self, body)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        with self.cond:
            self._closed = True
            self.cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self.ranks.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- dispatch

    def handle(self, method: str, path: str, query: dict, auth: str | None, raw: bytes) -> tuple[int, str, bytes]:
        """Raises _Crashed when the connection must be dropped."""
        if self.crashed or self._closed:
            raise _Crashed
        if self.config.api_key and auth != f"Bearer {self.config.api_key}":
            return _encode(401, {"error": "Unauthorized"})
        route = self._routes.get(path)
        if route is None:
            return _encode(*NOT_FOUND)
        if not raw and method != "GET" and path in BODY_REQUIRED:
            return _encode(422, MISSING_BODY)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return _encode(400, {"error": {"message": "request body is not valid JSON"}})
        if method != "GET":
            with self.cond:
                self.calls.append((path, body))
        try:
            return _encode(*route(body, query))
        except BadRequest as e:
            return _encode(400, e.body)

    # ---------------------------------------------------------------- generation

    def _generate(self, body: Any, query: dict) -> tuple[int, Any]:
        c = self.config
        call = parse_generate(body, context_len=c.context_len, skip_tokenizer_init=c.skip_tokenizer_init,
                              vocab_size=c.vocab_size)  # fmt: skip
        names = lora_names(body.get("lora_path"), len(call.prompts))
        with self.cond:
            self._wait(lambda: self.paused is None and not self._writer and not self._writers_waiting, "generation")
            adapters = acquire(self, names)
            reqs = [self._new_req(call, i, s, adapters[i]) for i in range(len(call.prompts)) for s in range(call.n)]
        try:
            self._decode_loop(reqs)
        finally:
            with self.cond:
                for r in reqs:
                    self.in_flight.pop(r.rid, None)
                    self._cache(r)
                    if r.lora is not None:
                        r.lora.in_use -= 1
                self.cond.notify_all()
        answers = [self._render(r, call.logprob_start_len) for r in reqs]
        return 200, answers[0] if call.single else answers

    def _new_req(self, call: Any, prompt_index: int, sample: int, lora: LoadedLora | None) -> Req:
        prompt, params = call.prompts[prompt_index], call.params[prompt_index]
        self._n_reqs += 1
        seed = [self.config.seed, self._n_reqs]
        if self.config.deterministic:
            seed = [params.get("sampling_seed", 42)]
        req = Req(rid=call.rids[prompt_index * call.n + sample], prompt=list(prompt), params=params,
                  rng=np.random.default_rng(seed), return_logprob=call.return_logprob,
                  logprob_start_len=call.logprob_start_len)  # fmt: skip
        req.extra_key = call.extra_keys[prompt_index]
        if lora is not None:  # SGLang's radix cache never shares KV across adapters
            lora.in_use += 1
            req.lora, req.extra_key = lora, f"{req.extra_key}|lora:{lora.key}"
        req.cached_tokens = self._prefill(req, len(prompt))
        self.prefix_cache.insert(req.extra_key, req.prompt, req.kv_versions)
        self.in_flight[req.rid] = req
        return req

    def _prefill(self, r: Req, fed: int) -> int:
        """The KV of the request's first `fed` ids: the radix cache's longest match, the rest computed now ->
        the ids matched. Caller holds `cond`."""
        cached = self.prefix_cache.match(r.extra_key, (r.prompt + r.output)[: fed + 1])[:fed]
        if any(v != self.version for v in cached):
            r.stale = True
            self.stale_kv_served += 1
        r.kv_versions = cached + [self.version] * (fed - len(cached))
        return len(cached)

    def _fed(self, r: Req) -> int:
        """Ids whose KV exists: the prompt, and every output id but the last (the next step's input)."""
        return len(r.prompt) + max(len(r.output) - 1, 0)

    def _cache(self, r: Req) -> None:
        """Keep a request's KV in the radix cache (SGLang caches finished, aborted and retracted requests)."""
        fed = self._fed(r)
        self.prefix_cache.insert(r.extra_key, (r.prompt + r.output)[:fed], r.kv_versions[:fed])

    def _decode_loop(self, reqs: list[Req]) -> None:
        while True:
            with self.cond:
                if self.crashed or self._closed:
                    raise _Crashed
                for r in reqs:
                    if r.finish is None and r.abort_message is not None:
                        r.finish = {"type": "abort", "message": r.abort_message, "status_code": None, "err_type": None}
                    elif r.finish is None and self.paused is None:
                        self._decode(r)
                if all(r.finish is not None for r in reqs):
                    return
            time.sleep(self.config.token_delay_s)

    def _decode(self, r: Req) -> None:
        """One token for one sample; caller holds `cond`. Length is checked before stop tokens (SGLang)."""
        limit = int(r.params.get("max_new_tokens", 128))
        if len(r.output) < limit:
            if r.output:  # this step feeds the last output id: its KV is computed by the weights of now
                r.kv_versions.append(self.version)
            version = "garbage" if self.weights_garbage else self.version
            version = f"{version}+stale-kv" if r.stale else version
            version = f"{version}+lora:{r.lora.key}" if r.lora is not None else version  # the adapter is applied
            token, lp = self.model.sample(r.rng, version, r.prompt, len(r.output), r.params)
            r.output.append(token)
            r.logprobs.append(lp)
            r.versions.append(self.version)
            self.tokens_generated += 1
        stops = set(self.config.eos_ids) | set(r.params.get("stop_token_ids") or [])
        if len(r.output) >= limit:
            r.finish = {"type": "length", "length": limit}
        elif not r.params.get("ignore_eos", False) and r.output[-1] in stops:
            r.finish = {"type": "stop", "matched": r.output[-1]}

    def _render(self, r: Req, start: int) -> dict:
        inputs = None
        if r.return_logprob and start >= 0:
            inputs = [[None, r.prompt[start], None]] + [
                [float(log_softmax(self.model.logits(self.version, r.prompt[:j], 0))[r.prompt[j]]), r.prompt[j], None]
                for j in range(start + 1, len(r.prompt))
            ]
        text = None if self.config.skip_tokenizer_init else "".join(chr(97 + t % 26) for t in r.output)
        return render(r, version_now=self.version, input_logprobs=inputs, text=text)

    # ---------------------------------------------------------------- pause, abort, cache

    def _pause(self, body: dict, query: dict) -> tuple[int, Any]:
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise BadRequest(f"mode must be 'abort', 'retract' or 'in_place', got {mode!r}")
        with self.cond:
            self.paused = mode
            for r in self.in_flight.values():
                if mode == "abort":
                    self._abort(r)
                elif mode == "retract" and r.state == "running" and r.finish is None:
                    r.state = "waiting"  # its KV goes to the radix cache; continue recomputes what is not there
                    r.num_retractions += 1
                    self._cache(r)
            self.cond.notify_all()
            if mode == "abort":
                self._wait(lambda: not self.in_flight, "aborted requests to return")
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    def _continue(self, body: dict, query: dict) -> tuple[int, Any]:
        with self.cond:
            self.paused = None
            for r in self.in_flight.values():
                if r.state == "waiting":
                    self._prefill(r, self._fed(r))
                r.state = "running"
            self.cond.notify_all()
        return 200, {"message": "Generation continued successfully.", "status": "ok"}

    def _abort(self, r: Req) -> None:
        if r.finish is None and r.abort_message is None:
            r.abort_message = "Abort in waiting queue" if r.state == "waiting" else "Aborted"
            r.reduced_meta = r.state == "waiting"

    def _abort_request(self, body: dict, query: dict) -> tuple[int, Any]:
        rid, abort_all = str(body.get("rid", "")), bool(body.get("abort_all", False))
        with self.cond:
            if not abort_all and (not rid or rid not in self.in_flight):
                return 200, b""  # the front door drops an abort for a rid it does not hold exactly
            for r in self.in_flight.values():
                if abort_all or r.rid.startswith(rid):  # then the scheduler's prefix rule
                    self._abort(r)
        return 200, b""

    def _flush_cache(self, body: Any, query: dict) -> tuple[int, Any]:
        timeout = float(query.get("timeout", ["0"])[0])
        with self.cond:
            idle = self.cond.wait_for(self._idle, timeout=timeout) if timeout > 0 else self._idle()
            if idle:
                self.prefix_cache.clear()
                self.prefix_cache_dirty = False
                return 200, FLUSH_OK
        if timeout > 0:
            return 400, "Timed out waiting for idle state."
        return 400, "Cache not flushed. There are running or waiting requests; retry when the server is idle.\n"

    def _idle(self) -> bool:
        """Nothing running; waiting (retracted) requests do not count while paused."""
        live = [r for r in self.in_flight.values() if r.finish is None]
        return not any(r.state == "running" or not self.paused for r in live)

    def _update_weight_version(self, body: dict, query: dict) -> tuple[int, Any]:
        if "new_version" not in body:
            raise BadRequest("new_version is required")
        new = str(body["new_version"])
        with self.cond:
            if body.get("abort_all_requests", True):  # SGLang's default aborts everything in flight
                for r in self.in_flight.values():
                    self._abort(r)
            self.version = new
        return 200, {"success": True, "message": f"Weight version updated to {new}", "new_version": new}

    # ---------------------------------------------------------------- memory, info, health

    def _release(self, body: dict, query: dict) -> tuple[int, Any]:
        with self.cond:
            if self.in_flight:  # the scheduler asserts idle; the assert kills the server
                self.crashed = True
                self.cond.notify_all()
                raise _Crashed
        return 200, None

    def _resume_memory(self, body: dict, query: dict) -> tuple[int, Any]:
        tags = body.get("tags") if isinstance(body, dict) else None
        if tags is None or "weights" in tags:
            with self.cond:
                self.weights_garbage = True  # until the next weight update
        return 200, None

    def _model_info(self, body: Any, query: dict) -> tuple[int, Any]:
        return 200, {
            "model_path": "fake/model", "served_model_name": "fake/model", "tokenizer_path": None,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": self.version,
            "load_format": self.config.load_format, "reasoning_parser": None, "tool_call_parser": None,
            "disaggregation_mode": "null", "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": "fake", "architectures": ["FakeForCausalLM"],
        }  # fmt: skip

    def _server_info(self, body: Any, query: dict) -> tuple[int, Any]:
        c = self.config
        return 200, {"tp_size": c.tp_size, "dp_size": 1, "context_length": c.context_len,
                     "skip_tokenizer_init": c.skip_tokenizer_init, "weight_version": self.version,
                     "enable_fp32_lm_head": c.enable_fp32_lm_head, "quantization": c.quantization, "enable_lora": c.enable_lora,
                     "max_lora_rank": c.max_lora_rank, "max_loras_per_batch": c.max_loras_per_batch,
                     "lora_target_modules": list(c.lora_target_modules) if c.lora_target_modules else None,
                     "version": "0.5.23" if c.version_mode == "0.5.23" else "0.5.20"}  # fmt: skip

    def _health(self, body: Any, query: dict) -> tuple[int, Any]:
        return (503, b"") if self.paused else (200, b"")

    def _loads(self, body: Any, query: dict) -> tuple[int, Any]:
        with self.cond:
            live = [r for r in self.in_flight.values() if r.finish is None]
            running = sum(r.state == "running" for r in live)
        return 200, [{"num_running_reqs": running, "num_waiting_reqs": len(live) - running}]

    # ---------------------------------------------------------------- helpers

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """`_wait` for the endpoint modules (sglang_double_weights, sglang_double_lora); caller holds `cond`."""
        self._wait(predicate, what)

    def _wait(self, predicate: Callable[[], bool], what: str) -> None:
        """cond.wait_for with the double's timeout; caller holds `cond`."""
        if not self.cond.wait_for(lambda: predicate() or self.crashed or self._closed, self.config.block_timeout_s):
            raise BadRequest(f"test double: timed out after {self.config.block_timeout_s} s waiting for {what}")
        if self.crashed or self._closed:
            raise _Crashed

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """SGLang's model-update writer lock, taken only when generation is not paused."""
        with self.cond:
            if self.paused:
                taken = False
            else:
                self._writers_waiting += 1
                try:
                    self._wait(lambda: not self.in_flight and not self._writer, "in-flight requests (writer lock)")
                finally:
                    self._writers_waiting -= 1
                self._writer = taken = True
        try:
            yield
        finally:
            if taken:
                with self.cond:
                    self._writer = False
                    self.cond.notify_all()
