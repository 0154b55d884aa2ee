"""The wire format: the only module that turns records into bytes and back.

A frame is one msgpack map ``{"v": SCHEMA_VERSION, "t": <record type name>, "b": <body>}``.
Bodies are maps of field name -> value, built from the record dataclasses in `asyncrl.records`.
Numeric arrays travel as msgpack ext type 1: ``[dtype code: u8][ndim: u8][shape: ndim x u32 LE][raw
little-endian bytes]``; decoding wraps the received bytes with `np.frombuffer` (no further copy).

Decoding is schema driven: every field is checked against the record's type annotations (types,
enum values, array dtypes, ranks and lengths), and a frame longer than ``max_frame_bytes`` is refused
before msgpack sees it. Anything wrong raises `WireError`; nothing here ever unpickles.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import types
import typing
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from asyncrl import records as R

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
_ARRAY_EXT = 1

# dtype code <-> numpy dtype (always little-endian on the wire)
_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<i4"),
    2: np.dtype("<f4"),
    3: np.dtype("<i8"),
    4: np.dtype("<f8"),
    5: np.dtype("u1"),
    6: np.dtype("<i2"),
    7: np.dtype("<f2"),
    8: np.dtype("?"),
}
_CODES = {dt: code for code, dt in _DTYPES.items()}

# Message types allowed at the top level of a frame; their class name is the wire name.
MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        R.Heartbeat, R.FatalError, R.WeightVersion, R.Stats, R.ErrorReply, R.Ack, R.SubmitPrompts,
        R.LeaseRequest, R.Lease, R.SampleBatch, R.ReturnPrompts, R.ScoreRequest, R.ToScore,
        R.ScoredBatch, R.BatchRequest, R.Batch, R.CommitStep, R.StatsRequest, R.Completion,
        R.Shutdown, R.Prompt, R.Sample, R.ScoredSample, R.Group, R.WeightJoin, R.WeightGroupInit,
        R.WeightBegin, R.WeightBucket, R.WeightEnd,
    )
}

# Array fields: (record, field) -> required dtype and rank.
_ARRAY_FIELDS: dict[tuple[type, str], tuple[np.dtype, int]] = {
    (R.Prompt, "token_ids"): (np.dtype("<i4"), 1),
    (R.Sample, "prompt_token_ids"): (np.dtype("<i4"), 1),
    (R.Sample, "response_token_ids"): (np.dtype("<i4"), 1),
    (R.Sample, "logprobs"): (np.dtype("<f4"), 1),
    (R.Sample, "versions"): (np.dtype("<i4"), 1),
}


class WireError(ValueError):
    """A frame that does not decode or does not validate. The message says why."""


# ------------------------------------------------------------------------------------- encode


def _pack_array(arr: np.ndarray) -> msgpack.ExtType:
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    code = _CODES.get(np.dtype(dt))
    if code is None:
        raise TypeError(f"array dtype {arr.dtype} cannot travel; allowed: {sorted(map(str, _CODES))}")
    if arr.ndim > 8:
        raise TypeError(f"array rank {arr.ndim} > 8")
    header = struct.pack(f"<BB{arr.ndim}I", code, arr.ndim, *arr.shape)
    return msgpack.ExtType(_ARRAY_EXT, header + np.ascontiguousarray(arr, dtype=dt).tobytes())


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def encode(msg: Any) -> bytes:
    """Record -> one frame."""
    name = type(msg).__name__
    if MESSAGE_TYPES.get(name) is not type(msg):
        raise TypeError(f"{name} is not a wire message type")
    return msgpack.packb({"v": R.SCHEMA_VERSION, "t": name, "b": msg}, default=_default, use_bin_type=True)


# ------------------------------------------------------------------------------------- decode


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _ARRAY_EXT:
        raise WireError(f"unknown ext type {code}")
    if len(data) < 2:
        raise WireError("array header truncated")
    dcode, ndim = data[0], data[1]
    dt = _DTYPES.get(dcode)
    if dt is None:
        raise WireError(f"unknown array dtype code {dcode}")
    if ndim > 8 or len(data) < 2 + 4 * ndim:
        raise WireError(f"bad array header (ndim {ndim})")
    shape = struct.unpack_from(f"<{ndim}I", data, 2)
    offset = 2 + 4 * ndim
    count = int(np.prod(shape, dtype=np.int64)) if ndim else 1
    if len(data) - offset != count * dt.itemsize:
        raise WireError(f"array payload is {len(data) - offset} bytes, shape {shape} {dt} needs {count * dt.itemsize}")
    return np.frombuffer(data, dtype=dt, offset=offset, count=count).reshape(shape)


Check = Callable[[Any, str], Any]


def _fail(where: str, want: str, got: Any) -> WireError:
    return WireError(f"{where}: expected {want}, got {type(got).__name__}")


def _scalar(kind: type) -> Check:
    def check(v: Any, where: str) -> Any:
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if kind is int and isinstance(v, bool):
            raise _fail(where, "int", v)
        if not isinstance(v, kind):
            raise _fail(where, kind.__name__, v)
        return v

    return check


def _any(v: Any, where: str) -> Any:
    if isinstance(v, np.ndarray):
        raise _fail(where, "plain msgpack value", v)
    if isinstance(v, dict):
        return {_scalar(str)(k, where): _any(x, where) for k, x in v.items()}
    if isinstance(v, list):
        return [_any(x, where) for x in v]
    return v


def _array(dtype: np.dtype, ndim: int) -> Check:
    def check(v: Any, where: str) -> Any:
        if not isinstance(v, np.ndarray):
            raise _fail(where, f"array {dtype}", v)
        if v.dtype != dtype or v.ndim != ndim:
            raise WireError(f"{where}: expected {ndim}-d {dtype} array, got {v.ndim}-d {v.dtype}")
        return v

    return check


def _enum(kind: type[enum.Enum]) -> Check:
    def check(v: Any, where: str) -> Any:
        try:
            return kind(v)
        except (ValueError, TypeError):
            raise WireError(f"{where}: {v!r} is not one of {[e.value for e in kind]}") from None

    return check


def _optional(inner: Check) -> Check:
    return lambda v, where: None if v is None else inner(v, where)


def _list(inner: Check) -> Check:
    def check(v: Any, where: str) -> Any:
        if not isinstance(v, list):
            raise _fail(where, "list", v)
        return [inner(x, f"{where}[{i}]") for i, x in enumerate(v)]

    return check


def _dict(key: Check, val: Check) -> Check:
    def check(v: Any, where: str) -> Any:
        if not isinstance(v, dict):
            raise _fail(where, "map", v)
        return {key(k, where): val(x, f"{where}.{k}") for k, x in v.items()}

    return check


_CHECKS: dict[type, Check] = {}


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
    fields_checks: list[tuple[str, Check | None, bool]] = []

    def check(v: Any, where: str) -> Any:
        if not isinstance(v, dict):
            raise _fail(where, cls.__name__, v)
        unknown = v.keys() - {n for n, _, _ in fields_checks}
        if unknown:
            raise WireError(f"{where}: unknown fields {sorted(map(str, unknown))} for {cls.__name__}")
        kwargs = {}
        for fname, fcheck, required in fields_checks:
            if fname in v:
                kwargs[fname] = fcheck(v[fname], f"{where}.{fname}")
            elif required:
                raise WireError(f"{where}: {cls.__name__} needs field {fname!r}")
        try:
            obj = cls(**kwargs)
        except (ValueError, TypeError) as e:
            raise WireError(f"{where}: {e}") from None
        post = _POST_CHECKS.get(cls)
        if post is not None:
            post(obj, where)
        return obj

    _CHECKS[cls] = check  # registered before recursing (records refer to each other)
    hints = typing.get_type_hints(cls, vars(R))
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields_checks.append((f.name, _check_for(hints[f.name], cls, f.name), required))
    return check


def _check_sample(s: R.Sample, where: str) -> None:
    n = len(s.response_token_ids)
    if len(s.logprobs) != n or len(s.versions) != n:
        raise WireError(
            f"{where}: response has {n} tokens but {len(s.logprobs)} logprobs and {len(s.versions)} versions"
        )
    if s.sample_index < 0:
        raise WireError(f"{where}: sample_index {s.sample_index} < 0")


_POST_CHECKS: dict[type, Callable[[Any, str], None]] = {R.Sample: _check_sample}


def decode(frame: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """One frame -> record. Raises WireError for anything that is not a valid message."""
    if len(frame) > max_frame_bytes:
        raise WireError(f"frame of {len(frame)} bytes exceeds max_frame_bytes={max_frame_bytes}")
    try:
        top = msgpack.unpackb(frame, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except WireError:
        raise
    except Exception as e:  # msgpack raises many types for garbage (ValueError, ExtraData, ...)
        raise WireError(f"not msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(top, dict) or not {"v", "t", "b"} <= top.keys():
        raise WireError("frame is not a {v, t, b} envelope")
    if top["v"] != R.SCHEMA_VERSION:
        raise WireError(f"schema version {top['v']!r} != {R.SCHEMA_VERSION}")
    cls = MESSAGE_TYPES.get(top["t"]) if isinstance(top["t"], str) else None
    if cls is None:
        raise WireError(f"unknown message type {top['t']!r}")
    return _record(cls)(top["b"], cls.__name__)


def message_type(frame: bytes) -> str:
    """Best-effort type name of a frame, for error replies; '' when unreadable."""
    try:
        top = msgpack.unpackb(frame, raw=False, ext_hook=lambda c, d: None)
        return str(top.get("t", ""))[:64] if isinstance(top, dict) else ""
    except Exception:
        return ""
