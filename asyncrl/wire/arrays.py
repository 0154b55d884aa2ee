"""Numeric arrays on the wire: msgpack ext type 1, both directions; int32 runs: ext type 2.

Layout of the ext payload: ``[dtype code: u8][ndim: u8][shape: ndim x u32 LE][raw little-endian bytes]``.
Encoding copies only when the array is big-endian or not C-contiguous; decoding wraps the received bytes
with `np.frombuffer` (no copy). msgpack hands ext values to the checks as ``slice(code, data)`` (see
`asyncrl.wire.frames`), so a check here takes such a slice.

A Sample's per-token policy versions are one value for nearly every sample (a weight update lands inside a
generation rarely), so they travel as runs when that is smaller (`int_runs`), as ext type 2:
``[length n: u32][runs r: u32][values: r x i32][ends: r x u32]``, all little-endian, `ends` the exclusive
end of each run, strictly increasing, the last == n (r == 0 exactly when n == 0). 1,024 tokens of one
version: 16 bytes instead of 4,102. `int_vector` accepts either form where an int32 vector may come as runs
and checks runs before anything is expanded; `as_numpy` expands them.
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
RUNS_EXT = 2
RUNS_HEADER = 8  # n, r
_ONE_RUN = struct.Struct("<IIiI")  # n, r = 1, the value, its end = n: how nearly every sample's versions travel
_NO_RUNS = bytes(RUNS_HEADER)  # n = 0, r = 0: an empty response

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
    """A `vector` (or `int_vector`) result -> its array: a view of the received bytes, or runs expanded."""
    if type(vec[0]) is Runs:
        return expand_runs(vec[0])
    return np.frombuffer(vec[0], DTYPES[code], vec[1], VECTOR_HEADER)


class Runs(bytes):
    """The payload of a RUNS_EXT value, checked (`int_vector`): where a vector's bytes would be."""


class IntRuns:
    """An int32 vector to encode as RUNS_EXT (`int_runs`); `asyncrl.wire.encode` packs it."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


def int_runs(arr: np.ndarray) -> IntRuns | None:
    """`arr` (1-d int32) as runs where that is smaller than the plain vector, else None."""
    n = len(arr)
    if n == 0:
        return IntRuns(_NO_RUNS)
    first = int(arr[0])
    if n > 3 and not (arr != first).any():  # one run (3 values or fewer: smaller as a vector)
        return IntRuns(_ONE_RUN.pack(n, 1, first, n))
    breaks = np.flatnonzero(arr[1:] != arr[:-1]) + 1  # [r - 1]
    r = len(breaks) + 1
    if RUNS_HEADER + 8 * r >= VECTOR_HEADER + 4 * n:
        return None
    values = np.ascontiguousarray(arr[np.concatenate(([0], breaks))], dtype="<i4")
    ends = np.concatenate((breaks, [n])).astype("<u4")
    return IntRuns(n.to_bytes(4, "little") + r.to_bytes(4, "little") + values.tobytes() + ends.tobytes())


def int_vector(v: Any, where: Where) -> tuple[bytes, int]:
    """A 1-d int32 vector, plain (`vector`) or as runs (checked here: a `Runs` payload) -> (bytes, length)."""
    if type(v) is slice and v.start == RUNS_EXT:
        return _runs(v.stop, where), int.from_bytes(v.stop[:4], "little")
    return vector(v, I4, where)


def runs_ok(data: bytes) -> bool:
    """Whether `data` is a well-formed RUNS_EXT payload (the hub's straight-line check; `int_vector` words why not)."""
    if len(data) == _ONE_RUN.size:  # the usual payload, checked without numpy: one run ending at n > 0
        return data[4:8] == b"\x01\x00\x00\x00" and data[12:16] == data[:4] and data[:4] != b"\x00\x00\x00\x00"
    if len(data) < RUNS_HEADER:
        return False
    n, r = int.from_bytes(data[:4], "little"), int.from_bytes(data[4:8], "little")
    if len(data) != RUNS_HEADER + 8 * r or r > n or (r == 0) != (n == 0):
        return False
    if r == 0:
        return True
    ends = np.frombuffer(data, "<u4", r, RUNS_HEADER + 4 * r)
    return bool(ends[-1] == n and ends[0] > 0 and (ends[1:] > ends[:-1]).all())


def _runs(data: bytes, where: Where) -> Runs:
    if not runs_ok(data):
        if len(data) < RUNS_HEADER:
            raise WireError(f"{path(where)}: runs header truncated ({len(data)} bytes)")
        n, r = int.from_bytes(data[:4], "little"), int.from_bytes(data[4:8], "little")
        if len(data) != RUNS_HEADER + 8 * r:
            raise WireError(f"{path(where)}: {r} runs need {RUNS_HEADER + 8 * r} bytes, got {len(data)}")
        raise WireError(f"{path(where)}: {r} runs do not cover {n} values with strictly increasing ends")
    return Runs(data)


def runs_min(data: bytes) -> int | None:
    """The smallest value of a checked runs payload (None when it holds no value)."""
    r = int.from_bytes(data[4:8], "little")
    if r == 1:
        return int.from_bytes(data[8:12], "little", signed=True)
    return int(np.frombuffer(data, "<i4", r, RUNS_HEADER).min()) if r else None


def expand_runs(data: bytes) -> np.ndarray:
    """A checked runs payload -> its int32 values, one per position."""
    r = int.from_bytes(data[4:8], "little")
    if r == 0:
        return np.zeros(0, DTYPES[I4])
    if r == 1:
        return np.full(int.from_bytes(data[:4], "little"), int.from_bytes(data[8:12], "little", signed=True),
                       DTYPES[I4])
    values = np.frombuffer(data, "<i4", r, RUNS_HEADER)
    ends = np.frombuffer(data, "<u4", r, RUNS_HEADER + 4 * r).astype(np.int64)
    return np.repeat(values, np.diff(ends, prepend=0)).astype(DTYPES[I4], copy=False)


def array(dtype: np.dtype, ndim: int) -> Check:
    """Check for an array field of exactly this dtype and rank; returns the array (a view, no copy)."""
    def check(v: Any, where: Where) -> Any:
        dt, shape, data, offset = array_header(v, where)
        if dt != dtype or len(shape) != ndim:
            raise WireError(f"{path(where)}: expected {ndim}-d {dtype} array, got {len(shape)}-d {dt}")
        arr = np.frombuffer(data, dtype=dt, offset=offset, count=math.prod(shape))
        return arr if ndim == 1 else arr.reshape(shape)

    return check
