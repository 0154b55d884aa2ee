"""The /generate exchange: build the request body of one GenerationRequest, turn the answer into
GenerationOutputs (docs/sglang.md, "Generation").

Types: SGLang >= 0.5.22 parses sampling params strictly and answers HTTP 400 "invalid type: floating
point, expected i64" for `top_k=20.0`; every integer field is converted here (an integral float such as
20.0 becomes 20, anything else is a ValueError that names the field), so the body is valid JSON of the
right types whatever the request was built from (YAML floats, numpy scalars).

Answers are read defensively: an abort in SGLang's waiting queue returns a reduced meta_info, so
every key is read with `.get()`.
"""

from __future__ import annotations

import logging
import numbers
import zlib
from typing import Any

import numpy as np

from asyncrl.engine.protocol import GenerationOutput, GenerationRequest
from asyncrl.engine.sglang.client import SGLangError
from asyncrl.records import FinishReason

log = logging.getLogger(__name__)

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def version_number(label: Any) -> int:
    """SGLang versions are strings, asyncrl's ints. A non-integer label (SGLang's initial "default", or a
    custom --weight-version) is the weights the server started with: version 0."""
    try:
        return int(label)
    except (TypeError, ValueError):
        return 0


def as_int(value: Any, name: str) -> int:
    """`value` as a JSON integer; integral floats (20.0) are converted, anything else is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}={value!r}: SGLang expects an integer (i64)")
    if isinstance(value, numbers.Integral):
        return int(value)
    if not float(value).is_integer():
        raise ValueError(f"{name}={value!r}: SGLang expects an integer (i64); round it first")
    return int(value)


def sample_rids(rid: str, n: int, deterministic: bool) -> list[str]:
    """The exact rids SGLang knows this request's samples by: what /abort_request must name, because
    SGLang's front door drops an abort whose rid it does not hold (the prefix rule applies only later,
    in the scheduler). Empty when SGLang picks the rids itself (n > 1 without deterministic mode)."""
    if deterministic:
        return [f"{rid}-{i}" for i in range(n)]
    return [rid] if n == 1 else []


def generate_payload(
    request: GenerationRequest, *, deterministic: bool, extra: dict[str, Any], rid: str
) -> dict[str, Any]:
    """The /generate body. With deterministic inference every sample needs its own `sampling_seed`
    (else all n samples are identical), so the n samples go as a batch of n copies, n=1 each.
    Raises ValueError for a field SGLang would refuse as non-integer."""
    s = request.sampling
    params: dict[str, Any] = {
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "top_k": as_int(s.top_k, "sampling.top_k"),
        "max_new_tokens": as_int(s.max_new_tokens, "sampling.max_new_tokens"),
        "stop_token_ids": [as_int(t, "sampling.stop_token_ids[]") for t in s.stop_token_ids],
        "ignore_eos": bool(s.ignore_eos),
        **extra,
    }
    prompt = request.prompt_token_ids.tolist()  # int32: JSON integers as they are
    body: dict[str, Any] = {"return_logprob": True}
    rids = sample_rids(rid, request.n, deterministic)
    if not deterministic:
        body["input_ids"] = prompt
        body["sampling_params"] = params | {"n": as_int(request.n, "n")}
        if rids:
            body["rid"] = rids[0]
        return body
    seed = as_int(s.seed, "sampling.seed") if s.seed is not None else zlib.crc32(request.request_id.encode())
    body["input_ids"] = [prompt] * request.n
    body["sampling_params"] = [params | {"sampling_seed": seed + i} for i in range(request.n)]
    body["rid"] = rids
    return body


def with_cache_key(body: dict[str, Any], key: str) -> dict[str, Any]:
    """The body with SGLang's radix-cache namespace (`extra_key`, one per prompt of a batch): a request reuses
    only KV computed under the same key, which the adapter renews at every weight update."""
    batch = isinstance(body["input_ids"][0], list)
    return body | {"extra_key": [key] * len(body["input_ids"]) if batch else key}


def cache_counts(answer: Any) -> tuple[int, int]:
    """-> (prompt tokens, of them served by the server's prefix cache), summed over the samples it reports."""
    items = answer if isinstance(answer, list) else [answer]
    metas = [(item.get("meta_info") or {}) if isinstance(item, dict) else {} for item in items]
    return sum(int(m.get("prompt_tokens") or 0) for m in metas), sum(int(m.get("cached_tokens") or 0) for m in metas)


def parse_outputs(request: GenerationRequest, answer: Any, timings: dict[str, float]) -> list[GenerationOutput]:
    """One GenerationOutput per sample, sample_index = position in SGLang's (prompt-major) list."""
    items = answer if isinstance(answer, list) else [answer]
    if len(items) != request.n:
        raise SGLangError(f"request {request.request_id!r}: asked for n={request.n}, SGLang returned {len(items)}")
    return [parse_output(request.request_id, i, item, timings) for i, item in enumerate(items)]


def parse_output(
    request_id: str, sample_index: int, item: dict[str, Any], timings: dict[str, float]
) -> GenerationOutput:
    meta = item.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs") or []
    tokens = np.array([p[1] for p in pairs], dtype=np.int32)  # [resp_len]
    logprobs = np.array([p[0] for p in pairs], dtype=np.float32)  # [resp_len]
    output_ids = item.get("output_ids")
    if output_ids is not None and list(output_ids) != tokens.tolist():
        raise SGLangError(
            f"request {request_id!r}: output_token_logprobs ({len(tokens)} tokens) do not match output_ids "
            f"({len(output_ids)}); was return_logprob dropped by a proxy?"
        )
    e2e = meta.get("e2e_latency")
    return GenerationOutput(
        request_id=request_id,
        sample_index=sample_index,
        token_ids=tokens,
        logprobs=logprobs,
        versions=token_versions(meta, len(tokens)),
        finish_reason=finish_reason(meta.get("finish_reason"), request_id),
        timings=timings | ({"e2e": float(e2e)} if e2e is not None else {}),
    )


def finish_reason(value: Any, request_id: str) -> FinishReason:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in _FINISH:
        return _FINISH[kind]
    log.warning("request %r: unexpected finish_reason %r, treated as abort", request_id, value)
    return FinishReason.ABORT


def token_versions(meta: dict[str, Any], n_tokens: int) -> np.ndarray:
    """[n_tokens] int32 from `weight_versions` spans (>= 0.5.20), else the single `weight_version`."""
    last = version_number(meta.get("weight_version"))
    versions = np.full(n_tokens, last, dtype=np.int32)
    for span in meta.get("weight_versions") or []:
        start, end = int(span.get("start", 0)), int(span.get("end", n_tokens))
        versions[max(start, 0) : min(end, n_tokens)] = version_number(span.get("version"))
    return versions


def aborted_unsent(request: GenerationRequest, version: int) -> list[GenerationOutput]:
    """Outputs of a request that never reached the server: aborted, no tokens."""
    empty_i = np.zeros(0, dtype=np.int32)
    return [
        GenerationOutput(
            request_id=request.request_id,
            sample_index=i,
            token_ids=empty_i,
            logprobs=np.zeros(0, dtype=np.float32),
            versions=np.full(0, version, dtype=np.int32),
            finish_reason=FinishReason.ABORT,
        )
        for i in range(request.n)
    ]
