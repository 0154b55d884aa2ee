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
import math
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


_HEADERS = [struct.Struct(f"<BB{ndim}I") for ndim in range(9)]  # array header per rank
_SHAPES = [struct.Struct(f"<{ndim}I") for ndim in range(9)]
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # record class -> field names (encode hot path)


def _pack_array(arr: np.ndarray) -> msgpack.ExtType:
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    code = _CODES.get(np.dtype(dt))
    if code is None:
        raise TypeError(f"array dtype {arr.dtype} cannot travel; allowed: {sorted(map(str, _CODES))}")
    if arr.ndim > 8:
        raise TypeError(f"array rank {arr.ndim} > 8")
    header = _HEADERS[arr.ndim].pack(code, arr.ndim, *arr.shape)
    if dt is not arr.dtype or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=dt)
    return msgpack.ExtType(_ARRAY_EXT, header + arr.tobytes())


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    names = _FIELD_NAMES.get(type(obj))
    if names is not None:
        return {n: getattr(obj, n) for n in names}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        _FIELD_NAMES[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
        return _default(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def encode(msg: Any, raw: dict[int, bytes | memoryview] | None = None) -> bytes:
    """Record -> one frame.

    `raw` maps id(record) -> that record's exact msgpack bytes (from `decode_with_raw`): those records
    are spliced in as they are instead of being encoded again (a relay forwarding samples). The frame
    is byte-identical to a plain encode.
    """
    name = type(msg).__name__
    if MESSAGE_TYPES.get(name) is not type(msg):
        raise TypeError(f"{name} is not a wire message type")
    if not raw:
        return msgpack.packb({"v": R.SCHEMA_VERSION, "t": name, "b": msg}, default=_default, use_bin_type=True)
    out = [_PACKER.pack_map_header(3), _pack("v"), _pack(R.SCHEMA_VERSION), _pack("t"), _pack(name), _pack("b")]
    _compose(msg, raw, out)
    return b"".join(out)


_PACKER = msgpack.Packer(default=_default, use_bin_type=True)
_pack = _PACKER.pack
_SPLICE_PARENTS = (R.ToScore, R.ToScoreItem, R.Batch, R.Group, R.ScoredSample, R.SampleBatch)


def _compose(obj: Any, raw: dict[int, bytes | memoryview], out: list[bytes | memoryview]) -> None:
    done = raw.get(id(obj))
    if done is not None:
        out.append(done)
    elif type(obj) is list:
        out.append(_PACKER.pack_array_header(len(obj)))
        for x in obj:
            _compose(x, raw, out)
    elif isinstance(obj, _SPLICE_PARENTS):
        header, keys = _splice_keys(type(obj))
        out.append(header)
        for name, packed_name in keys:
            out.append(packed_name)
            value = getattr(obj, name)
            if type(value) is list or isinstance(value, _SPLICE_PARENTS) or id(value) in raw:
                _compose(value, raw, out)
            else:
                out.append(_pack(value))
    else:
        out.append(_pack(obj))


_SPLICE_KEYS: dict[type, tuple[bytes, list[tuple[str, bytes]]]] = {}


def _splice_keys(cls: type) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Map header and packed field names of a record class (cached)."""
    got = _SPLICE_KEYS.get(cls)
    if got is None:
        names = [f.name for f in dataclasses.fields(cls)]
        got = _SPLICE_KEYS[cls] = (_PACKER.pack_map_header(len(names)), [(n, _pack(n)) for n in names])
    return got


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
    shape = _SHAPES[ndim].unpack_from(data, 2)
    offset = 2 + 4 * ndim
    count = math.prod(shape)
    if len(data) - offset != count * dt.itemsize:
        raise WireError(f"array payload is {len(data) - offset} bytes, shape {shape} {dt} needs {count * dt.itemsize}")
    arr = np.frombuffer(data, dtype=dt, offset=offset, count=count)
    return arr if ndim == 1 else arr.reshape(shape)


# Where a value sits in a frame: a name, or (parent, field name | list index). Built as cheap tuples on
# the hot path and only turned into text ("SampleBatch.samples[3].logprobs") when a check fails.
Where = str | tuple[Any, str | int]
Check = Callable[[Any, Where], Any]


def _path(where: Where) -> str:
    parts: list[str] = []
    while isinstance(where, tuple):
        where, seg = where
        parts.append(f"[{seg}]" if isinstance(seg, int) else f".{seg}")
    return where + "".join(reversed(parts))


def _fail(where: Where, want: str, got: Any) -> WireError:
    return WireError(f"{_path(where)}: expected {want}, got {type(got).__name__}")


def _scalar(kind: type) -> Check:
    def check(v: Any, where: Where) -> Any:
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if kind is int and isinstance(v, bool):
            raise _fail(where, "int", v)
        if not isinstance(v, kind):
            raise _fail(where, kind.__name__, v)
        return v

    return check


def _key(k: Any, where: Where) -> str:
    if not isinstance(k, str):
        raise _fail(where, "str key", k)
    return k


def _any(v: Any, where: Where) -> Any:
    if isinstance(v, np.ndarray):
        raise _fail(where, "plain msgpack value", v)
    if isinstance(v, dict):
        return {_key(k, where): _any(x, where) for k, x in v.items()}
    if isinstance(v, list):
        return [_any(x, where) for x in v]
    return v


def _array(dtype: np.dtype, ndim: int) -> Check:
    def check(v: Any, where: Where) -> Any:
        if not isinstance(v, np.ndarray):
            raise _fail(where, f"array {dtype}", v)
        if v.dtype != dtype or v.ndim != ndim:
            raise WireError(f"{_path(where)}: expected {ndim}-d {dtype} array, got {v.ndim}-d {v.dtype}")
        return v

    return check


def _enum(kind: type[enum.Enum]) -> Check:
    def check(v: Any, where: Where) -> Any:
        try:
            return kind(v)
        except (ValueError, TypeError):
            raise WireError(f"{_path(where)}: {v!r} is not one of {[e.value for e in kind]}") from None

    return check


def _optional(inner: Check) -> Check:
    return lambda v, where: None if v is None else inner(v, where)


def _list(inner: Check) -> Check:
    def check(v: Any, where: Where) -> Any:
        if not isinstance(v, list):
            raise _fail(where, "list", v)
        return [inner(x, (where, i)) for i, x in enumerate(v)]

    return check


def _dict(key: Check, val: Check) -> Check:
    def check(v: Any, where: Where) -> Any:
        if not isinstance(v, dict):
            raise _fail(where, "map", v)
        return {key(k, where): val(x, (where, str(k))) for k, x in v.items()}

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
            obj = cls(**kwargs)
        except (ValueError, TypeError) as e:
            raise WireError(f"{_path(where)}: {e}") from None
        post = _POST_CHECKS.get(cls)
        if post is not None:
            post(obj, where)
        return obj

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


def _check_sample(s: R.Sample, where: Where) -> None:
    n = len(s.response_token_ids)
    if len(s.logprobs) != n or len(s.versions) != n:
        raise WireError(
            f"{_path(where)}: response has {n} tokens but {len(s.logprobs)} logprobs and {len(s.versions)} versions"
        )
    if s.sample_index < 0:
        raise WireError(f"{_path(where)}: sample_index {s.sample_index} < 0")


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
    return _validate(top)


def _validate(top: Any) -> Any:
    if not isinstance(top, dict) or not {"v", "t", "b"} <= top.keys():
        raise WireError("frame is not a {v, t, b} envelope")
    if top["v"] != R.SCHEMA_VERSION:
        raise WireError(f"schema version {top['v']!r} != {R.SCHEMA_VERSION}")
    cls = MESSAGE_TYPES.get(top["t"]) if isinstance(top["t"], str) else None
    if cls is None:
        raise WireError(f"unknown message type {top['t']!r}")
    return _record(cls)(top["b"], cls.__name__)


def decode_with_raw(frame: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[Any, list[memoryview]]:
    """Like `decode`, and also the exact bytes of each element of the body's "samples" list (a
    SampleBatch's samples), as views into `frame`, in order; [] for other messages. Validation is the
    same as `decode`'s."""
    if len(frame) > max_frame_bytes:
        raise WireError(f"frame of {len(frame)} bytes exceeds max_frame_bytes={max_frame_bytes}")
    view = memoryview(frame)
    spans: list[tuple[int, int]] = []
    try:
        u = msgpack.Unpacker(ext_hook=_ext_hook, raw=False, strict_map_key=True, max_buffer_size=len(frame) + 1)
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
    msg = _validate(top)
    return msg, [view[a:b] for a, b in spans] if isinstance(msg, R.SampleBatch) else []


def _body_with_spans(u: msgpack.Unpacker, spans: list[tuple[int, int]]) -> Any:
    body = {}
    for _ in range(u.read_map_header()):
        key = u.unpack()
        if key != "samples":
            body[key] = u.unpack()
            continue
        items = []
        for _ in range(u.read_array_header()):
            start = u.tell()
            items.append(u.unpack())
            spans.append((start, u.tell()))
        body[key] = items
    return body


def message_type(frame: bytes) -> str:
    """Best-effort type name of a frame, for error replies; '' when unreadable."""
    try:
        top = msgpack.unpackb(frame, raw=False, ext_hook=lambda c, d: None)
        return str(top.get("t", ""))[:64] if isinstance(top, dict) else ""
    except Exception:
        return ""


# ------------------------------------------------------------------------------------- log records


def encode_record(value: Any) -> bytes:
    """Plain data (maps, lists, str, int, float, bool, None, bytes) -> msgpack, for on-disk logs.

    Not a network message: no envelope, no schema check. The replay hub's log frames these itself
    (length + crc32) and embeds network frames as bytes where it logs a whole request.
    """
    return msgpack.packb(value, use_bin_type=True)


def decode_record(data: bytes | memoryview) -> Any:
    """Inverse of `encode_record`. Raises WireError for bytes that are not one msgpack value."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:
        raise WireError(f"log record is not msgpack: {type(e).__name__}: {e}") from None
