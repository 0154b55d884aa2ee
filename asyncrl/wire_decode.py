"""Frames -> records: unpacking and validation, the decode half of `asyncrl.wire` (use it through there).

msgpack unpacks a frame in C; ext values come out as ``slice(code, data)`` (a C-level pair, far cheaper
than a Python hook per array) and are only checked and wrapped where the schema expects an array.
Every field is then checked against the record's type annotations (types, enum values, array dtypes,
ranks and lengths); anything wrong raises `WireError`, and nothing here ever unpickles.

`Sample`, the record that carries the volume, has its own straight-line check (no per-field dispatch).
The hub decodes with `decode_packed`: the samples of a SampleBatch then stay as `PackedSample`s, their
exact msgpack bytes plus the few fields the hub reads, validated as fully as `decode` does but without
building numpy arrays it would never use.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
import types
import typing
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from asyncrl import records as R
from asyncrl.wire_bounds import bound
from asyncrl.wire_checks import Check, Where, WireError
from asyncrl.wire_checks import any_value as _any
from asyncrl.wire_checks import dict_of as _dict
from asyncrl.wire_checks import enum_check as _enum
from asyncrl.wire_checks import fail as _fail
from asyncrl.wire_checks import key as _key
from asyncrl.wire_checks import list_of as _list
from asyncrl.wire_checks import optional as _optional
from asyncrl.wire_checks import path as _path
from asyncrl.wire_checks import scalar as _scalar

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
ARRAY_EXT = 1

# dtype code <-> numpy dtype (always little-endian on the wire)
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<i4"),
    2: np.dtype("<f4"),
    3: np.dtype("<i8"),
    4: np.dtype("<f8"),
    5: np.dtype("u1"),
    6: np.dtype("<i2"),
    7: np.dtype("<f2"),
    8: np.dtype("?"),
}
_I4, _F4 = 1, 2  # dtype codes of token ids / versions and of logprobs

# Message types allowed at the top level of a frame; their class name is the wire name.
MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        R.Heartbeat, R.FatalError, R.WeightVersion, R.Stats, R.ErrorReply, R.Ack, R.SubmitPrompts,
        R.LeaseRequest, R.Lease, R.SampleBatch, R.ReturnPrompts, R.ScoreRequest, R.ToScore,
        R.ScoredBatch, R.ScoredIds, R.BatchRequest, R.Batch, R.CommitStep, R.StatsRequest, R.Completion,
        R.Shutdown, R.PeerDown, R.Prompt, R.Sample, R.ScoredSample, R.Group, R.WeightJoin, R.WeightGroupInit,
        R.WeightBegin, R.WeightBucket, R.WeightEnd,
    )
}

# Array fields outside Sample: (record, field) -> required dtype and rank.
_ARRAY_FIELDS: dict[tuple[type, str], tuple[np.dtype, int]] = {(R.Prompt, "token_ids"): (np.dtype("<i4"), 1)}
_SHAPES = [struct.Struct(f"<{ndim}I") for ndim in range(9)]


# ------------------------------------------------------------------------------------- arrays


def _array_header(v: Any, where: Where) -> tuple[np.dtype, tuple[int, ...], bytes, int]:
    """An array ext value -> (dtype, shape, payload bytes, payload offset); checks header and size."""
    if type(v) is not slice:
        raise _fail(where, "array", v)
    code, data = v.start, v.stop
    if code != ARRAY_EXT:
        raise WireError(f"{_path(where)}: unknown ext type {code}")
    if len(data) < 2:
        raise WireError(f"{_path(where)}: array header truncated")
    dt = DTYPES.get(data[0])
    ndim = data[1]
    if dt is None:
        raise WireError(f"{_path(where)}: unknown array dtype code {data[0]}")
    if ndim > 8 or len(data) < 2 + 4 * ndim:
        raise WireError(f"{_path(where)}: bad array header (ndim {ndim})")
    shape = _SHAPES[ndim].unpack_from(data, 2)
    offset, count = 2 + 4 * ndim, math.prod(shape)
    if len(data) - offset != count * dt.itemsize:
        raise WireError(f"{_path(where)}: array payload is {len(data) - offset} bytes, shape {shape} {dt} "
                        f"needs {count * dt.itemsize}")
    return dt, shape, data, offset


def _vector(v: Any, code: int, where: Where) -> tuple[bytes, int]:
    """A 1-d array of dtype `code`, checked by its header only -> (payload bytes, length). Hot path."""
    if type(v) is slice and v.start == ARRAY_EXT:
        data = v.stop
        if len(data) >= 6 and data[0] == code and data[1] == 1:
            n = int.from_bytes(data[2:6], "little")
            if len(data) == 6 + 4 * n:
                return data, n
    dt, shape, _, _ = _array_header(v, where)  # the reason it is wrong
    raise WireError(f"{_path(where)}: expected 1-d {DTYPES[code]} array, got {len(shape)}-d {dt}")


def _array(dtype: np.dtype, ndim: int) -> Check:
    def check(v: Any, where: Where) -> Any:
        dt, shape, data, offset = _array_header(v, where)
        if dt != dtype or len(shape) != ndim:
            raise WireError(f"{_path(where)}: expected {ndim}-d {dtype} array, got {len(shape)}-d {dt}")
        arr = np.frombuffer(data, dtype=dt, offset=offset, count=math.prod(shape))
        return arr if ndim == 1 else arr.reshape(shape)

    return check


# ------------------------------------------------------------------------------------- samples

_SAMPLE_FIELDS = frozenset(f.name for f in dataclasses.fields(R.Sample))
_FINISH = {e.value: e for e in R.FinishReason}


def _sample_parts(v: Any, where: Where) -> tuple[Any, ...]:
    """Validate one Sample map. Returns (prompt_id, sample_index, finish_reason, prompt_token_ids,
    response_token_ids, logprobs, versions, response_text, timings, generator), each array as
    (payload bytes, length)."""
    if type(v) is not dict:
        raise _fail(where, "Sample", v)
    if not v.keys() <= _SAMPLE_FIELDS:
        raise WireError(f"{_path(where)}: unknown fields {sorted(map(str, v.keys() - _SAMPLE_FIELDS))} for Sample")
    pid = _need(v, "prompt_id", where)
    if type(pid) is not str:
        raise _fail((where, "prompt_id"), "str", pid)
    idx = _need(v, "sample_index", where)
    if type(idx) is not int:
        raise _fail((where, "sample_index"), "int", idx)
    prompt = _vector(_need(v, "prompt_token_ids", where), _I4, (where, "prompt_token_ids"))
    resp = _vector(_need(v, "response_token_ids", where), _I4, (where, "response_token_ids"))
    logp = _vector(_need(v, "logprobs", where), _F4, (where, "logprobs"))
    vers = _vector(_need(v, "versions", where), _I4, (where, "versions"))
    fr = _need(v, "finish_reason", where)
    finish = _FINISH.get(fr) if type(fr) is str else None
    if finish is None:
        raise WireError(f"{_path((where, 'finish_reason'))}: {fr!r} is not one of {list(_FINISH)}")
    if not resp[1] == logp[1] == vers[1]:
        raise WireError(f"{_path(where)}: response has {resp[1]} tokens but {logp[1]} logprobs and {vers[1]} versions")
    text, gen = v.get("response_text", ""), v.get("generator", "")
    if type(text) is not str:
        raise _fail((where, "response_text"), "str", text)
    if type(gen) is not str:
        raise _fail((where, "generator"), "str", gen)
    timings = _TIMINGS(v["timings"], (where, "timings")) if "timings" in v else {}
    if idx < 0:
        raise WireError(f"{_path(where)}: sample_index {idx} < 0")
    return pid, idx, finish, prompt, resp, logp, vers, text, timings, gen


def _need(v: dict, name: str, where: Where) -> Any:
    try:
        return v[name]
    except KeyError:
        raise WireError(f"{_path(where)}: Sample needs field {name!r}") from None


def _sample(v: Any, where: Where) -> R.Sample:
    pid, idx, finish, prompt, resp, logp, vers, text, timings, gen = _sample_parts(v, where)
    return R.Sample(prompt_id=pid, sample_index=idx, finish_reason=finish, prompt_token_ids=_i4(prompt),
                    response_token_ids=_i4(resp), logprobs=np.frombuffer(logp[0], DTYPES[_F4], logp[1], 6),
                    versions=_i4(vers), response_text=text, timings=timings, generator=gen)


def _i4(vec: tuple[bytes, int]) -> np.ndarray:
    return np.frombuffer(vec[0], DTYPES[_I4], vec[1], 6)  # payload after the 6-byte 1-d header


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
        return _sample(_unpackb(self.raw), "Sample")


def _packed(v: Any, raw: memoryview, where: Where) -> PackedSample:
    pid, idx, _, _, _, (lp, _), (data, n), _, _, _ = _sample_parts(v, where)
    oldest = int(np.frombuffer(data, DTYPES[_I4], n, 6).min()) if n else None
    finite = bool(np.isfinite(np.frombuffer(lp, DTYPES[_F4], n, 6)).all()) if n else True
    return PackedSample(prompt_id=pid, sample_index=idx, min_version=oldest, raw=raw, finite=finite)


_TIMINGS = _dict(_scalar(str), _scalar(float))
_CHECKS: dict[type, Check] = {R.Sample: _sample}


def _check_for(tp: Any, owner: type | None = None, name: str = "") -> Check:
    if owner is not None and (owner, name) in _ARRAY_FIELDS:
        dt, nd = _ARRAY_FIELDS[(owner, name)]
        arr = _array(dt, nd)
        return _optional(arr) if _is_optional(tp) else arr
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        assert len(args) == 1, f"unsupported union {tp}"
        return _optional(_check_for(args[0]))
    if origin is list:
        return _list(_check_for(typing.get_args(tp)[0]))
    if origin is dict:
        k, v = typing.get_args(tp)
        return _dict(_check_for(k), _check_for(v))
    if tp is Any:
        return _any
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp)
    if dataclasses.is_dataclass(tp):
        return _record(tp)
    if tp in (str, int, float, bool):
        return _scalar(tp)
    raise TypeError(f"no wire check for {tp}")


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _record(cls: type) -> Check:
    if cls in _CHECKS:
        return _CHECKS[cls]
    # (name, exact type that needs no check or conversion, full check, required)
    fields_checks: list[tuple[str, type | None, Check, bool]] = []
    names: set[str] = set()

    def check(v: Any, where: Where) -> Any:
        if type(v) is not dict:
            raise _fail(where, cls.__name__, v)
        if not v.keys() <= names:
            unknown = sorted(map(str, v.keys() - names))
            raise WireError(f"{_path(where)}: unknown fields {unknown} for {cls.__name__}")
        kwargs = {}
        for fname, exact, fcheck, required in fields_checks:
            x = v.get(fname, _MISSING)
            if x is _MISSING:
                if required:
                    raise WireError(f"{_path(where)}: {cls.__name__} needs field {fname!r}")
            elif type(x) is exact:  # hot path: plain scalars are taken as they are
                kwargs[fname] = x
            else:
                kwargs[fname] = fcheck(x, (where, fname))
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as e:
            raise WireError(f"{_path(where)}: {e}") from None

    _CHECKS[cls] = check  # registered before recursing (records refer to each other)
    hints = typing.get_type_hints(cls, vars(R))
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        tp = hints[f.name]
        fields_checks.append((f.name, _exact_type(tp), _check_for(tp, cls, f.name), required))
        names.add(f.name)
    return check


_MISSING = object()


def _exact_type(tp: Any) -> type | None:
    """The type a value may have to skip its check: str/int/float/bool fields (also when optional)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    return tp if tp in (str, int, float, bool) else None


# ------------------------------------------------------------------------------------- frames


def _unpackb(data: bytes | memoryview) -> Any:
    try:
        return msgpack.unpackb(data, ext_hook=slice, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises many types for garbage (ValueError, ExtraData, ...)
        raise WireError(f"not msgpack: {type(e).__name__}: {e}") from None


def _check_size(frame: bytes | memoryview, max_frame_bytes: int) -> None:
    """Size, then structure (depth, value count) where the frame could build much: before any unpacking."""
    if len(frame) > max_frame_bytes:
        raise WireError(f"frame of {len(frame)} bytes exceeds max_frame_bytes={max_frame_bytes}")
    bound(frame)


def decode(frame: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """One frame -> record. Raises WireError for anything that is not a valid message."""
    _check_size(frame, max_frame_bytes)
    return _validate(_unpackb(frame))


def _envelope(top: Any) -> type:
    if not isinstance(top, dict) or not {"v", "t", "b"} <= top.keys():
        raise WireError("frame is not a {v, t, b} envelope")
    if top["v"] != R.SCHEMA_VERSION:
        raise WireError(f"schema version {top['v']!r} != {R.SCHEMA_VERSION}")
    cls = MESSAGE_TYPES.get(top["t"]) if isinstance(top["t"], str) else None
    if cls is None:
        raise WireError(f"unknown message type {top['t']!r}")
    return cls


def _validate(top: Any) -> Any:
    cls = _envelope(top)
    return _record(cls)(top["b"], cls.__name__)


def decode_packed(frame: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """Like `decode` (same validation), but a SampleBatch's samples come back as `PackedSample`s whose
    `raw` are views into `frame` (keep `frame` immutable while they live). Other messages as `decode`."""
    top, view, spans = _unpack_with_spans(frame, max_frame_bytes)
    if _envelope(top) is not R.SampleBatch:
        return _validate(top)
    body = top["b"]
    if type(body) is not dict:
        raise _fail("SampleBatch", "SampleBatch", body)
    if not body.keys() <= {"lease_id", "samples"} or not {"lease_id", "samples"} <= body.keys():
        return _validate(top)  # generic path words the error
    lease_id, samples = body["lease_id"], body["samples"]
    if type(lease_id) is not str:
        raise _fail(("SampleBatch", "lease_id"), "str", lease_id)
    if type(samples) is not list:
        raise _fail(("SampleBatch", "samples"), "list", samples)
    assert len(spans) == len(samples), "one span per sample of the last 'samples' key"
    where = ("SampleBatch", "samples")
    return R.SampleBatch(lease_id=lease_id, samples=[
        _packed(s, view[a:b], (where, i)) for i, (s, (a, b)) in enumerate(zip(samples, spans))])


def _unpack_with_spans(frame: bytes | memoryview, max_frame_bytes: int) -> tuple[Any, memoryview, list[tuple[int, int]]]:
    """Unpack a frame, noting the byte span of each element of the body's (last) "samples" list."""
    _check_size(frame, max_frame_bytes)
    spans: list[tuple[int, int]] = []
    try:
        u = msgpack.Unpacker(ext_hook=slice, raw=False, strict_map_key=True, max_buffer_size=len(frame) + 1)
        u.feed(frame)
        top = {}
        for _ in range(u.read_map_header()):
            key = u.unpack()
            top[key] = _body_with_spans(u, spans) if key == "b" else u.unpack()
        if u.tell() != len(frame):
            raise WireError(f"{len(frame) - u.tell()} bytes of trailing data after the frame")
    except WireError:
        raise
    except Exception as e:  # msgpack raises many types for garbage
        raise WireError(f"not msgpack: {type(e).__name__}: {e}") from None
    return top, memoryview(frame), spans


def _body_with_spans(u: msgpack.Unpacker, spans: list[tuple[int, int]]) -> Any:
    body = {}
    for _ in range(u.read_map_header()):
        key = u.unpack()
        if key != "samples":
            body[key] = u.unpack()
            continue
        spans.clear()  # a repeated key: the last one wins, as in the dict
        items = []
        for _ in range(u.read_array_header()):
            start = u.tell()
            items.append(u.unpack())
            spans.append((start, u.tell()))
        body[key] = items
    return body


def message_type(frame: bytes | memoryview) -> str:
    """Best-effort type name of a frame, for error replies; '' when unreadable."""
    try:
        bound(frame)
        top = msgpack.unpackb(frame, raw=False, ext_hook=lambda c, d: None)
        return str(top.get("t", ""))[:64] if isinstance(top, dict) else ""
    except Exception:
        return ""
