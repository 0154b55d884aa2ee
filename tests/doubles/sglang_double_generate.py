"""The double's /generate contract: validating a request body, the per-sample `Req`, and the answer's
JSON (docs/sglang.md, "Generation"; 0.5.23 behaviour).

`BadRequest` carries the exact error body SGLang returns: `{"error": "<text>"}` for the strict JSON
contract (unknown sampling keys), `{"error": {"message": ...}}` for everything else.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SAMPLING_KEYS = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "stop", "stop_token_ids", "stop_regex", "ignore_eos", "n",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "logit_bias", "sampling_seed",
    "json_schema", "regex", "ebnf", "structural_tag", "custom_params", "beam_width", "stream_interval", "watermark",
})  # fmt: skip


I64_KEYS = frozenset({"max_new_tokens", "top_k", "min_new_tokens", "n", "sampling_seed", "stream_interval", "beam_width"})
I64_LIST_KEYS = frozenset({"stop_token_ids"})


class BadRequest(Exception):
    def __init__(self, message: str, contract: bool = False) -> None:
        super().__init__(message)
        self.body = {"error": message} if contract else {"error": {"message": message}}


@dataclass(slots=True)
class Req:
    """One sample in flight."""

    rid: str
    prompt: list[int]
    params: dict[str, Any]
    rng: np.random.Generator
    return_logprob: bool
    logprob_start_len: int
    start: float = field(default_factory=time.monotonic)
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)  # version that produced each output token
    state: str = "running"  # "running" | "waiting" (retracted)
    num_retractions: int = 0
    abort_message: str | None = None  # set by an abort; the generation loop then finishes the Req
    finish: dict[str, Any] | None = None
    reduced_meta: bool = False  # aborted in the waiting queue: SGLang's reduced meta_info
    cached_tokens: int = 0
    extra_key: str | None = None  # the radix-cache namespace the request was sent with
    kv_versions: list[str] = field(default_factory=list)  # version that computed the KV of each id fed so far
    stale: bool = False  # it was served KV of other weights (sglang_double_radix): its logits are poisoned
    lora: Any = None  # the LoadedLora it was sent with (sglang_double_lora), applied to its logits


@dataclass(slots=True)
class GenerateCall:
    prompts: list[list[int]]
    params: list[dict[str, Any]]  # one per prompt
    n: int
    single: bool  # one prompt and n == 1: answer a dict, else a list
    rids: list[str]  # one per sample, prompt-major
    return_logprob: bool
    logprob_start_len: int
    extra_keys: list[str | None]  # one per prompt


def parse_generate(body: Any, *, context_len: int, skip_tokenizer_init: bool, vocab_size: int) -> GenerateCall:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", contract=True)
    if body.get("stream"):
        raise BadRequest("the test double does not stream")
    prompts, batch = _prompts(body, skip_tokenizer_init, vocab_size)
    raw = body.get("sampling_params") or {}
    params = raw if isinstance(raw, list) else [raw] * len(prompts)
    if len(params) != len(prompts):
        raise BadRequest(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
    params = [_check_params(p) for p in params]
    ns = {int(p.get("n", 1)) for p in params}
    if len(ns) != 1:
        raise BadRequest("sampling_params.n must be the same for every prompt of a batch")
    n = ns.pop()
    for ids, p in zip(prompts, params, strict=True):
        total = len(ids) + int(p.get("max_new_tokens", 128))
        if total > context_len:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
                f"You requested a total of {total} tokens: {len(ids)} tokens from the input messages and "
                f"{total - len(ids)} tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit."
            )
    start = -1 if body.get("logprob_start_len") is None else int(body["logprob_start_len"])
    if any(start > len(ids) for ids in prompts):
        raise BadRequest(f"logprob_start_len ({start}) is larger than the input length")
    return GenerateCall(
        prompts=prompts, params=params, n=n, single=not batch and n == 1,
        rids=_rids(body.get("rid"), len(prompts), n, batch),
        return_logprob=bool(body.get("return_logprob", False)), logprob_start_len=start,
        extra_keys=_extra_keys(body.get("extra_key"), len(prompts)),
    )  # fmt: skip


def _extra_keys(value: Any, n_prompts: int) -> list[str | None]:
    """GenerateReqInput.extra_key: a string (every prompt) or one string per prompt."""
    values = value if isinstance(value, list) else [value] * n_prompts
    if len(values) != n_prompts or not all(v is None or isinstance(v, str) for v in values):
        raise BadRequest(f"extra_key must be a string or a list of {n_prompts} strings, got {value!r}")
    return values


def _prompts(body: dict, skip_tokenizer_init: bool, vocab_size: int) -> tuple[list[list[int]], bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("Either text or input_ids should be provided.")
    if text is not None:
        if skip_tokenizer_init:
            raise BadRequest("text input needs a tokenizer (the server runs with skip_tokenizer_init)")
        texts = text if isinstance(text, list) else [text]
        return [[b % vocab_size for b in t.encode()] for t in texts], isinstance(text, list)
    if not isinstance(ids, list) or not ids:
        raise BadRequest("input_ids cannot be empty.")
    batch = isinstance(ids[0], list)
    prompts = ids if batch else [ids]
    for p in prompts:
        if not p or not all(isinstance(t, int) and 0 <= t < vocab_size for t in p):
            raise BadRequest(f"input_ids must be non-empty lists of token ids in [0, {vocab_size})")
    return prompts, batch


def _check_params(p: Any) -> dict[str, Any]:
    if not isinstance(p, dict):
        raise BadRequest("sampling_params must be an object", contract=True)
    unknown = sorted(set(p) - SAMPLING_KEYS)
    if unknown:
        raise BadRequest(f"sampling_params: unknown field(s) {unknown}", contract=True)
    _check_i64(p)
    t = p.get("temperature", 1.0)
    if not (isinstance(t, int | float) and math.isfinite(t) and t >= 0):
        raise BadRequest(f"temperature must be a finite number >= 0, got {t!r}")
    if not 0 < p.get("top_p", 1.0) <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {p['top_p']!r}")
    k = p.get("top_k", -1)
    if not (k == -1 or k >= 1):
        raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {k!r}")
    m = p.get("max_new_tokens", 128)
    if not (isinstance(m, int) and m >= 0):
        raise BadRequest(f"max_new_tokens must be a non-negative int, got {m!r}")
    if int(p.get("n", 1)) < 1:
        raise BadRequest("n must be >= 1")
    return p


def _check_i64(p: dict[str, Any]) -> None:
    """SGLang >= 0.5.22 parses integer fields strictly: 20.0 is refused, not rounded."""
    for key in I64_KEYS & set(p):
        _require_ints(key, [p[key]])
    for key in I64_LIST_KEYS & set(p):
        if p[key] is not None:
            if not isinstance(p[key], list):
                raise BadRequest(f"sampling_params.{key}: invalid type: expected a sequence", contract=True)
            _require_ints(key, p[key])


def _require_ints(key: str, values: list[Any]) -> None:
    for v in values:
        if isinstance(v, float):
            raise BadRequest(f"sampling_params.{key}: invalid type: floating point `{v}`, expected i64", contract=True)
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadRequest(f"sampling_params.{key}: invalid type: {type(v).__name__}, expected i64", contract=True)


def _rids(rid: Any, n_prompts: int, n: int, batch: bool) -> list[str]:
    """§2.3: n > 1 samples get fresh uuids; with n == 1 a string rid on a batch becomes f"{rid}_{i}"."""
    if n > 1 or rid is None:
        return [uuid.uuid4().hex for _ in range(n_prompts * n)]
    if isinstance(rid, list):
        if len(rid) != n_prompts:
            raise BadRequest(f"rid has {len(rid)} entries for {n_prompts} prompts")
        return [str(r) for r in rid]
    return [f"{rid}_{i}" for i in range(n_prompts)] if batch else [str(rid)]


def render(req: Req, *, version_now: str, input_logprobs: list[list[Any]] | None, text: str | None) -> dict:
    """The answer for one finished Req."""
    spans = _spans(req.versions)
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish,
        "weight_version": spans[-1]["version"] if spans else version_now,
        "completion_tokens": len(req.output),
        "e2e_latency": time.monotonic() - req.start,
        "weight_versions": spans,
    }
    if not req.reduced_meta:
        meta |= {"prompt_tokens": len(req.prompt), "num_retractions": req.num_retractions,
                 "reasoning_tokens": 0, "cached_tokens": req.cached_tokens}  # fmt: skip
    if req.return_logprob:
        meta["input_token_logprobs"] = input_logprobs or []
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.logprobs, req.output, strict=True)]
        meta["output_token_logprobs_length"] = len(req.output)
    out: dict[str, Any] = {"output_ids": list(req.output), "meta_info": meta}
    if text is not None:
        out["text"] = text
    return out


def _spans(versions: list[str]) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans
