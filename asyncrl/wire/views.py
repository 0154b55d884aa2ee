"""A SampleBatch frame decoded by msgspec: the hub's fast path for the message that carries the volume.

`packed(frame)` decodes a SampleBatch whose samples are all single-turn with msgspec's C decoder,
against typed views built from `records.Sample`'s base fields (arrays as `msgspec.msgpack.Ext`: type code and
payload), checks every array's type and vector header here, and returns what `decode_packed`'s msgpack path
returns: the `PackedSample`s, each `raw` a view of its bytes in the frame (`msgspec.Raw`), and their
offsets. Anything else (another message, a multi-turn sample, a malformed value of any kind) gives None, and
`decode_packed` takes its msgpack path, which accepts it or words the error. So this path accepts a subset
of what the msgpack path accepts, by the same rules, with the same result (tests/test_wire_views.py holds
the two to each other on valid and on broken frames).

Why: msgpack builds every sample's map in Python objects before the checks read it; msgspec checks the
types in C. Decoding a SampleBatch: 7.5 -> 5.1 us a sample (`bench.hub_core`); the hub 18.8k -> 19.7k samples
per CPU-second (`bench.replay`, docs/benchmarks.md).

A ScoredIds (one result per scored sample) takes the same path: a view with `records.ScoreResult`'s fields,
then the records.

msgspec is optional: without it (`HAVE_MSGSPEC` false) `packed` always answers None.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import numpy as np

from asyncrl import records as R
from asyncrl.wire.arrays import ARRAY_EXT, F4, I4, RUNS_EXT, VECTOR_HEADER, Runs, runs_ok
from asyncrl.wire.sample import EPISODE_FIELDS, PackedSample, _token_checks

try:
    import msgspec
except ImportError:  # a machine without the wheel: the msgpack path does all the work
    msgspec = None  # type: ignore[assignment]

HAVE_MSGSPEC = msgspec is not None
_ARRAYS = ("prompt_token_ids", "response_token_ids", "logprobs", "versions")
_DECODE_ERRORS: tuple[type[BaseException], ...] = (RecursionError,)
_HEADS: dict[int, tuple[bytes, bytes]] = {}  # response length -> its vector headers (lengths repeat)
_MAX_HEADS = 65536


def _view(cls: type, name: str, overrides: dict[str, Any] | None = None, skip: Any = ()) -> Any:
    """A msgspec struct with the fields of record class `cls` (their types, or `overrides`, and defaults), minus
    `skip`, that refuses any other key (so a map the record check would refuse is refused here too)."""
    hints = typing.get_type_hints(cls, vars(R))
    fields: list[tuple] = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp = (overrides or {}).get(f.name, hints[f.name])
        if f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, tp, msgspec.field(default_factory=f.default_factory)))
        elif f.default is not dataclasses.MISSING:
            fields.append((f.name, tp, f.default))
        else:
            fields.append((f.name, tp))
    return msgspec.defstruct(name, fields, forbid_unknown_fields=True)


def _decoders() -> tuple[Any, Any, Any, Any]:
    """(envelope, SampleBatch body, Sample, ScoredIds body) decoders. The Sample view has `records.Sample`'s base
    fields (arrays as Ext; a multi-turn sample is not its), the ScoredIds view `records.ScoreResult`'s."""
    sample = _view(R.Sample, "SampleView", {name: msgspec.msgpack.Ext for name in _ARRAYS}, EPISODE_FIELDS)
    envelope = msgspec.defstruct("EnvelopeView", [("v", Any), ("t", Any), ("b", msgspec.Raw)])
    body = msgspec.defstruct("SampleBatchView", [("lease_id", str), ("samples", list[msgspec.Raw])],
                             forbid_unknown_fields=True)
    scores = msgspec.defstruct("ScoredIdsView", [("scores", list[_view(R.ScoreResult, "ScoreResultView")])],
                               forbid_unknown_fields=True)
    return tuple(msgspec.msgpack.Decoder(t) for t in (envelope, body, sample, scores))  # type: ignore[return-value]


if HAVE_MSGSPEC:
    _ENVELOPE, _BODY, _SAMPLE, _SCORES = _decoders()
    _DECODE_ERRORS = (msgspec.DecodeError, RecursionError)


def packed(frame: bytes | memoryview) -> Any | None:
    """`decode_packed`'s answer for a SampleBatch of single-turn samples or a ScoredIds in `frame` (sized and
    bounded by the caller); None where this path does not decide (module doc)."""
    if not HAVE_MSGSPEC:
        return None
    try:
        env = _ENVELOPE.decode(frame)
        if type(env.v) is not int or env.v != R.SCHEMA_VERSION:
            return None
        if env.t == "SampleBatch":
            return _sample_batch(frame, _BODY.decode(env.b))
        if env.t == "ScoredIds":
            return R.ScoredIds(scores=[R.ScoreResult(prompt_id=v.prompt_id, sample_index=v.sample_index, reward=v.reward,
                                                     components=v.components, status=v.status, reason=v.reason)
                                       for v in _SCORES.decode(env.b).scores])
    except _DECODE_ERRORS:  # msgspec's ValidationError is a DecodeError
        return None
    return None


def _sample_batch(frame: bytes | memoryview, body: Any) -> R.SampleBatch | None:
    """The SampleBatch of a decoded body view, its samples as `PackedSample`s; None if a sample is not this
    path's (msgspec's errors are the caller's to catch)."""
    views = [_SAMPLE.decode(raw) for raw in body.samples]
    checked = [_arrays(v) for v in views]
    if None in checked:
        return None
    offsets = _offsets(frame, body.samples)
    if offsets is None:
        return None
    oldest, finite = _token_checks([c[1] for c in checked], [c[0] for c in checked])  # type: ignore[index]
    return R.SampleBatch(lease_id=body.lease_id, samples=[
        PackedSample(prompt_id=v.prompt_id, sample_index=v.sample_index, min_version=old, raw=memoryview(raw),
                     finite=fin, scoring=(v.response_text, v.finish_reason, None, ""), offset=at)
        for v, raw, old, fin, at in zip(views, body.samples, oldest, finite, offsets)])


def _arrays(v: Any) -> tuple[tuple[bytes, int], tuple[bytes, int]] | None:
    """A sample view's arrays checked as `sample._plain_parts` checks them -> ((logprobs, n), (versions, n)),
    each its ext payload, in the form `_token_checks` takes; None if any rule fails (or the index is
    negative)."""
    prompt, resp, logp, vers = v.prompt_token_ids, v.response_token_ids, v.logprobs, v.versions
    if v.sample_index < 0 or not prompt.code == resp.code == logp.code == ARRAY_EXT:
        return None
    p, r, lp, vs = prompt.data, resp.data, logp.data, vers.data
    if len(r) < VECTOR_HEADER:
        return None
    n = (len(r) - VECTOR_HEADER) >> 2
    heads = _HEADS.get(n) or _heads(n)
    if (r[:VECTOR_HEADER] != heads[0] or len(r) != VECTOR_HEADER + 4 * n or lp[:VECTOR_HEADER] != heads[1]
            or len(lp) != len(r) or p[:2] != heads[0][:2] or len(p) != VECTOR_HEADER + 4 * int.from_bytes(p[2:6], "little")):
        return None
    if vers.code == RUNS_EXT:  # the usual form: runs of one version
        if not (runs_ok(vs) and vs[:4] == r[2:6]):
            return None
        return (lp, n), (Runs(vs), n)
    if vers.code != ARRAY_EXT or len(vs) != len(r) or vs[:VECTOR_HEADER] != heads[0]:  # plain (older peers)
        return None
    return (lp, n), (vs, n)


def _heads(n: int) -> tuple[bytes, bytes]:
    """The vector headers (dtype code, ndim 1, length n) of int32 and float32 arrays of length n (cached)."""
    heads = (bytes((I4, 1)) + n.to_bytes(4, "little"), bytes((F4, 1)) + n.to_bytes(4, "little"))
    if len(_HEADS) < _MAX_HEADS:
        _HEADS[n] = heads
    return heads


def _offsets(frame: Any, raws: list[Any]) -> list[int] | None:
    """Where each sample starts in `frame`: the first found by address, the rest by adding lengths (a msgpack
    list's values lie back to back); None if the last does not land where its address says."""
    if not raws:
        return []
    base = _address(frame)
    at, offsets = _address(raws[0]) - base, []
    for raw in raws:
        offsets.append(at)
        at += len(memoryview(raw))
    last = raws[-1]
    if not 0 <= offsets[0] or _address(last) - base != offsets[-1] or at > len(memoryview(frame)):
        return None
    return offsets


def _address(buf: Any) -> int:
    return np.frombuffer(buf, np.uint8).ctypes.data if len(memoryview(buf)) else 0
