"""Numeric arrays on the wire: msgpack ext type 1, both directions.

Layout of the ext payload: ``[dtype code: u8][ndim: u8][shape: ndim x u32 LE][raw little-endian bytes]``.
Encoding copies only when the array is big-endian or not C-contiguous; decoding wraps the received bytes
with `np.frombuffer` (no copy). msgpack hands ext values to the checks as ``slice(code, data)`` (see
`asyncrl.wire.frames`), so a check here takes such a slice.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from asyncrl.wire.checks import Check, Where, WireError, fail, path

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
I4, F4 = 1, 2  # dtype codes of token ids / versions and of logprobs
VECTOR_HEADER = 6  # bytes before the payload of a 1-d array: code, ndim, one u32 length

_CODES = {dt: code for code, dt in DTYPES.items()}
_HEADERS = [struct.Struct(f"<BB{ndim}I") for ndim in range(9)]  # encode: code, ndim, shape
_SHAPES = [struct.Struct(f"<{ndim}I") for ndim in range(9)]  # decode: shape after code and ndim


# ------------------------------------------------------------------------------------- encode


def pack_array(arr: np.ndarray) -> msgpack.ExtType:
    header, arr = _array_header(arr)
    return msgpack.ExtType(ARRAY_EXT, header + arr.tobytes())


def array_pieces(arr: np.ndarray, ext_header: Callable[[int], bytes]) -> tuple[bytes, memoryview]:
    """The msgpack bytes of `pack_array(arr)` as (ext header + array header, a view of the array's memory):
    no copy where the array is little-endian and C-contiguous. `ext_header(n)`: msgpack's ext header for a
    payload of n bytes."""
    header, arr = _array_header(arr)
    data = memoryview(arr).cast("B") if arr.ndim else memoryview(arr.tobytes())
    return ext_header(len(header) + len(data)) + header, data


def _array_header(arr: np.ndarray) -> tuple[bytes, np.ndarray]:
    """(dtype code, ndim, shape) header of `arr`, and `arr` as little-endian C-contiguous (a copy only if not)."""
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    code = _CODES.get(dt)
    if code is None:
        raise TypeError(f"array dtype {arr.dtype} cannot travel; allowed: {sorted(map(str, _CODES))}")
    if arr.ndim > 8:
        raise TypeError(f"array rank {arr.ndim} > 8")
    header = _HEADERS[arr.ndim].pack(code, arr.ndim, *arr.shape)
    if dt is not arr.dtype or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=dt)
    return header, arr


# ------------------------------------------------------------------------------------- decode


def array_header(v: Any, where: Where) -> tuple[np.dtype, tuple[int, ...], bytes, int]:
    """An array ext value -> (dtype, shape, payload bytes, payload offset); checks header and size."""
    if type(v) is not slice:
        raise fail(where, "array", v)
    code, data = v.start, v.stop
    if code != ARRAY_EXT:
        raise WireError(f"{path(where)}: unknown ext type {code}")
    if len(data) < 2:
        raise WireError(f"{path(where)}: array header truncated")
    dt = DTYPES.get(data[0])
    ndim = data[1]
    if dt is None:
        raise WireError(f"{path(where)}: unknown array dtype code {data[0]}")
    if ndim > 8 or len(data) < 2 + 4 * ndim:
        raise WireError(f"{path(where)}: bad array header (ndim {ndim})")
    shape = _SHAPES[ndim].unpack_from(data, 2)
    offset, count = 2 + 4 * ndim, math.prod(shape)
    if len(data) - offset != count * dt.itemsize:
        raise WireError(f"{path(where)}: array payload is {len(data) - offset} bytes, shape {shape} {dt} "
                        f"needs {count * dt.itemsize}")
    return dt, shape, data, offset


def vector(v: Any, code: int, where: Where) -> tuple[bytes, int]:
    """A 1-d array of dtype `code`, checked by its header only -> (payload bytes, length). Hot path."""
    if type(v) is slice and v.start == ARRAY_EXT:
        data = v.stop
        if len(data) >= VECTOR_HEADER and data[0] == code and data[1] == 1:
            n = int.from_bytes(data[2:6], "little")
            if len(data) == VECTOR_HEADER + 4 * n:
                return data, n
    dt, shape, _, _ = array_header(v, where)  # the reason it is wrong
    raise WireError(f"{path(where)}: expected 1-d {DTYPES[code]} array, got {len(shape)}-d {dt}")


def as_numpy(vec: tuple[bytes, int], code: int) -> np.ndarray:
    """A `vector` result -> its array, a view of the received bytes."""
    return np.frombuffer(vec[0], DTYPES[code], vec[1], VECTOR_HEADER)


def array(dtype: np.dtype, ndim: int) -> Check:
    """Check for an array field of exactly this dtype and rank; returns the array (a view, no copy)."""
    def check(v: Any, where: Where) -> Any:
        dt, shape, data, offset = array_header(v, where)
        if dt != dtype or len(shape) != ndim:
            raise WireError(f"{path(where)}: expected {ndim}-d {dtype} array, got {len(shape)}-d {dt}")
        arr = np.frombuffer(data, dtype=dt, offset=offset, count=math.prod(shape))
        return arr if ndim == 1 else arr.reshape(shape)

    return check
