"""The wire format: the only module that turns records into bytes and back (decoding lives in
`asyncrl.wire_decode` and is re-exported here; callers use `wire.*` only).

A frame is one msgpack map ``{"v": SCHEMA_VERSION, "t": <record type name>, "b": <body>}``.
Bodies are maps of field name -> value, built from the record dataclasses in `asyncrl.records`.
Numeric arrays travel as msgpack ext type 1: ``[dtype code: u8][ndim: u8][shape: ndim x u32 LE][raw
little-endian bytes]``; decoding wraps the received bytes with `np.frombuffer` (no further copy).

Decoding is schema driven: every field is checked against the record's type annotations (types,
enum values, array dtypes, ranks and lengths), and a frame longer than ``max_frame_bytes`` is refused
before msgpack sees it. Anything wrong raises `WireError`; nothing here ever unpickles.

Samples kept as their wire bytes (`PackedSample`, what the hub holds) are spliced into the frames that
carry them (ToScore, Batch, Completion) as they are: never decoded or encoded again.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import msgpack
import numpy as np

from asyncrl import records as R
from asyncrl.wire_decode import (ARRAY_EXT, DEFAULT_MAX_FRAME_BYTES, DTYPES, MESSAGE_TYPES, PackedSample, WireError,
                                 decode, decode_packed, message_type)

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "MESSAGE_TYPES", "PackedSample", "WireError", "decode", "decode_packed",
           "encode", "message_type"]

_CODES = {dt: code for code, dt in DTYPES.items()}


# ------------------------------------------------------------------------------------- encode


_HEADERS = [struct.Struct(f"<BB{ndim}I") for ndim in range(9)]  # array header per rank
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
    return msgpack.ExtType(ARRAY_EXT, header + arr.tobytes())


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    if type(obj) is PackedSample:  # outside a splicing message: correct, not fast
        return _default(obj.unpack())
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


def encode(msg: Any) -> bytes:
    """Record -> one frame. `PackedSample`s inside ToScore, Batch and Completion are spliced in as their bytes
    (the frame is byte-identical to encoding the full Samples)."""
    name = type(msg).__name__
    if MESSAGE_TYPES.get(name) is not type(msg):
        raise TypeError(f"{name} is not a wire message type")
    if type(msg) not in _SPLICE_MESSAGES:
        return msgpack.packb({"v": R.SCHEMA_VERSION, "t": name, "b": msg}, default=_default, use_bin_type=True)
    out = [_PACKER.pack_map_header(3), _pack("v"), _pack(R.SCHEMA_VERSION), _pack("t"), _pack(name), _pack("b")]
    _compose(msg, out)
    return b"".join(out)


_PACKER = msgpack.Packer(default=_default, use_bin_type=True)
_pack = _PACKER.pack
_SPLICE_MESSAGES = (R.ToScore, R.Batch, R.Completion)  # what the hub sends with stored samples inside
_SPLICE_PARENTS = (R.ToScore, R.ToScoreItem, R.Batch, R.Group, R.ScoredSample, R.SampleBatch, R.Completion)


def _compose(obj: Any, out: list[bytes | memoryview]) -> None:
    if type(obj) is PackedSample:
        out.append(obj.raw)
    elif type(obj) is list:
        out.append(_PACKER.pack_array_header(len(obj)))
        for x in obj:
            _compose(x, out)
    elif isinstance(obj, _SPLICE_PARENTS):
        header, keys = _splice_keys(type(obj))
        out.append(header)
        for name, packed_name in keys:
            out.append(packed_name)
            value = getattr(obj, name)
            if type(value) in (list, PackedSample) or isinstance(value, _SPLICE_PARENTS):
                _compose(value, out)
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

