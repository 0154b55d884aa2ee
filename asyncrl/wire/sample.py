"""The Sample record on the wire: its straight-line check and `PackedSample`, a Sample kept as its bytes.

`Sample` carries the volume, so it is checked field by field without the per-field dispatch of
`asyncrl.wire.schema`, to the same rules. The hub never needs a sample's arrays: it decodes with
`decode_packed` and keeps each sample as a `PackedSample`, its exact msgpack bytes plus the few fields
the hub reads, validated as fully as `decode` does. `asyncrl.wire.encode` splices those bytes into
the frames that carry them (Batch, Completion): never decoded or encoded again. Reward workers get only
the response text (`PackedSample.response_text`, read from the bytes without building the arrays).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np

from asyncrl import records as R
from asyncrl.wire.arrays import F4, I4, as_numpy, vector
from asyncrl.wire.checks import Where, WireError, dict_of, fail, path, scalar
from asyncrl.wire.frames import unpackb

_FIELDS = frozenset(f.name for f in dataclasses.fields(R.Sample))
_FINISH = {e.value: e for e in R.FinishReason}
_TIMINGS = dict_of(scalar(str), scalar(float))


@dataclasses.dataclass(slots=True)
class PackedSample:
    """A validated Sample kept as its exact msgpack bytes: what the hub stores, logs and forwards.

    `wire.encode` splices `raw` in wherever a Sample goes; `unpack()` builds the full record."""

    prompt_id: str
    sample_index: int
    min_version: int | None  # oldest policy version among its tokens; None for an empty response
    raw: bytes | memoryview  # the Sample's msgpack map, as it arrived
    finite: bool = True  # every logprob is finite (the hub fails a sample that is not)

    def unpack(self) -> R.Sample:
        return check_sample(unpackb(self.raw), "Sample")

    @property
    def response_text(self) -> str:
        """The sample's response text, read from `raw` (validated on arrival) skipping every other value."""
        u = msgpack.Unpacker(raw=False)
        u.feed(self.raw)
        for _ in range(u.read_map_header()):
            if u.unpack() == "response_text":
                return u.unpack()
            u.skip()
        return ""


def check_sample(v: Any, where: Where) -> R.Sample:
    """One unpacked Sample map -> the record (arrays are views of the frame)."""
    pid, idx, finish, prompt, resp, logp, vers, text, timings, gen = _parts(v, where)
    return R.Sample(prompt_id=pid, sample_index=idx, finish_reason=finish, prompt_token_ids=as_numpy(prompt, I4),
                    response_token_ids=as_numpy(resp, I4), logprobs=as_numpy(logp, F4),
                    versions=as_numpy(vers, I4), response_text=text, timings=timings, generator=gen)


def pack_sample(v: Any, raw: memoryview, where: Where) -> PackedSample:
    """One unpacked Sample map and its bytes `raw` -> a PackedSample, checked as `check_sample` checks."""
    pid, idx, _, _, _, logp, vers, _, _, _ = _parts(v, where)
    n = vers[1]
    oldest = int(as_numpy(vers, I4).min()) if n else None
    finite = bool(np.isfinite(as_numpy(logp, F4)).all()) if n else True
    return PackedSample(prompt_id=pid, sample_index=idx, min_version=oldest, raw=raw, finite=finite)


def _parts(v: Any, where: Where) -> tuple[Any, ...]:
    """Validate one Sample map. Returns (prompt_id, sample_index, finish_reason, prompt_token_ids,
    response_token_ids, logprobs, versions, response_text, timings, generator), each array as
    (payload bytes, length)."""
    if type(v) is not dict:
        raise fail(where, "Sample", v)
    if not v.keys() <= _FIELDS:
        raise WireError(f"{path(where)}: unknown fields {sorted(map(str, v.keys() - _FIELDS))} for Sample")
    pid = _need(v, "prompt_id", where)
    if type(pid) is not str:
        raise fail((where, "prompt_id"), "str", pid)
    idx = _need(v, "sample_index", where)
    if type(idx) is not int:
        raise fail((where, "sample_index"), "int", idx)
    prompt = vector(_need(v, "prompt_token_ids", where), I4, (where, "prompt_token_ids"))
    resp = vector(_need(v, "response_token_ids", where), I4, (where, "response_token_ids"))
    logp = vector(_need(v, "logprobs", where), F4, (where, "logprobs"))
    vers = vector(_need(v, "versions", where), I4, (where, "versions"))
    finish = _finish(_need(v, "finish_reason", where), where)
    if not resp[1] == logp[1] == vers[1]:
        raise WireError(f"{path(where)}: response has {resp[1]} tokens but {logp[1]} logprobs and {vers[1]} versions")
    text, gen = v.get("response_text", ""), v.get("generator", "")
    if type(text) is not str:
        raise fail((where, "response_text"), "str", text)
    if type(gen) is not str:
        raise fail((where, "generator"), "str", gen)
    timings = _TIMINGS(v["timings"], (where, "timings")) if "timings" in v else {}
    if idx < 0:
        raise WireError(f"{path(where)}: sample_index {idx} < 0")
    return pid, idx, finish, prompt, resp, logp, vers, text, timings, gen


def _need(v: dict, name: str, where: Where) -> Any:
    try:
        return v[name]
    except KeyError:
        raise WireError(f"{path(where)}: Sample needs field {name!r}") from None


def _finish(fr: Any, where: Where) -> R.FinishReason:
    finish = _FINISH.get(fr) if type(fr) is str else None
    if finish is None:
        raise WireError(f"{path((where, 'finish_reason'))}: {fr!r} is not one of {list(_FINISH)}")
    return finish
