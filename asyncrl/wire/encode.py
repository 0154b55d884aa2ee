"""Records -> frames.

A body is the record's fields as a msgpack map, nested records as maps, arrays as ext type 1, a Sample's
versions as runs (ext type 2) where that is smaller (`asyncrl.wire.arrays`). Messages that carry samples
(SampleBatch, Batch, Completion) are composed piece by piece: each `PackedSample`'s bytes are spliced in as
they are, and each Sample's arrays go in as views of their memory behind a prebuilt ext header (no ExtType,
no copy until the frame's one join). The frame is byte-identical to encoding the full Samples with msgpack
(tests/test_wire*.py hold it to that).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np

from asyncrl import records as R
from asyncrl.wire.arrays import ARRAY_EXT, DTYPES, F4, I4, RUNS_EXT, VECTOR_HEADER, IntRuns, array_pieces, pack_array
from asyncrl.wire.envelope import wire_name
from asyncrl.wire.sample import PackedSample, sample_body

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # record class -> field names (encode hot path)
_SPLICE_MESSAGES = (R.SampleBatch, R.Batch, R.Completion)  # what carries samples: composed, not packb
_SPLICE_PARENTS = (R.Batch, R.Group, R.ScoredSample, R.SampleBatch, R.Completion)
_SPLICE_KEYS: dict[type, tuple[bytes, list[tuple[str, bytes]]]] = {}
_SCORED_FIELDS = ("sample", "reward", "components", "status", "reason")  # the order `_compose` writes them in


def encode(msg: Any) -> bytes:
    """Record -> one frame. `PackedSample`s inside Batch and Completion are spliced in as their bytes."""
    name = wire_name(msg)
    if type(msg) in _SPLICE_MESSAGES:
        out = [_PACKER.pack_map_header(3), _pack("v"), _pack(R.SCHEMA_VERSION), _pack("t"), _pack(name), _pack("b")]
        _compose(msg, out)
        return b"".join(out)
    body = _to_score_body(msg) if type(msg) is R.ToScore else msg
    return msgpack.packb({"v": R.SCHEMA_VERSION, "t": name, "b": body}, default=_default, use_bin_type=True)


def _to_score_body(msg: R.ToScore) -> dict[str, Any]:
    """ToScore's body as the maps `_default` makes of it, in one comprehension: the hub sends one item per
    sample it hands out, and two hook calls per item (the item, its RewardSpec) cost ~1 us a sample more.
    tests/test_wire.py holds the frame to the generic packing's bytes (a field added to either record and
    not here fails it)."""
    return {"items": [{"prompt_id": it.prompt_id, "sample_index": it.sample_index, "response_text": it.response_text,
                       "reward": {"target": it.reward.target, "params": it.reward.params},
                       "finish_reason": it.finish_reason, "env_reward": it.env_reward, "env_error": it.env_error}
                      for it in msg.items]}


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return pack_array(obj)
    if type(obj) is IntRuns:
        return msgpack.ExtType(RUNS_EXT, obj.payload)
    if type(obj) is PackedSample:  # outside a splicing message: correct, not fast
        return _default(obj.unpack())
    if type(obj) is R.Sample:  # the multi-turn fields only when set: single-turn bytes stay as they were
        return sample_body(obj)
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


_PACKER = msgpack.Packer(default=_default, use_bin_type=True)
_pack = _PACKER.pack


def _compose(obj: Any, out: list[Any]) -> None:
    """Append the msgpack pieces of `obj` to `out` (buffers for one join), each PackedSample as its bytes."""
    if type(obj) is PackedSample:
        out.append(obj.raw)
    elif type(obj) is R.Sample:
        _compose_sample(obj, out)
    elif type(obj) is R.ScoredSample:  # one per sample of a Batch: straight-line, same bytes as the loop below
        header, keys = _splice_keys(R.ScoredSample)
        out.append(header)
        out.append(keys[0][1])
        _compose(obj.sample, out)
        out.append(b"".join((keys[1][1], _pack(obj.reward), keys[2][1], _pack(obj.components), keys[3][1],
                             _pack(obj.status), keys[4][1], _pack(obj.reason))))
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


def _compose_sample(s: R.Sample, out: list[Any]) -> None:
    """A Sample's map (`sample_body`: the same keys in the same order) with each array as its headers and the
    array itself (the frame's join reads its memory): the bytes msgpack would write, without packing arrays."""
    body = sample_body(s)
    out.append(_PACKER.pack_map_header(len(body)))
    keys, vectors = _SAMPLE_KEYS, _VECTOR_CODES
    for name, value in body.items():
        out.append(keys[name])
        if type(value) is not np.ndarray:
            out.append(_pack(value))
            continue
        code = vectors.get(value.dtype) if value.ndim == 1 and value.flags.c_contiguous else None
        if code is None:  # any other array: correct, not fast
            out.extend(array_pieces(value, _ext_header))
            continue
        head = _VECTOR_HEADS.get((code, len(value)))
        if head is None:
            head = _vector_head(code, len(value))
            if len(_VECTOR_HEADS) < _MAX_VECTOR_HEADS:
                _VECTOR_HEADS[(code, len(value))] = head
        out.append(head)
        out.append(value)


def _vector_head(code: int, n: int) -> bytes:
    """ext header + array header of a 1-d array of dtype `code` and length n."""
    return _ext_header(VECTOR_HEADER + n * DTYPES[code].itemsize) + bytes((code, 1)) + n.to_bytes(4, "little")


def _ext_header(length: int) -> bytes:
    """msgpack's header of an ARRAY_EXT value of `length` payload bytes (fixext where msgpack uses one)."""
    fixed = _FIXEXT.get(length)
    if fixed is not None:
        return fixed
    if length <= 0xFF:
        return b"\xc7" + length.to_bytes(1, "big") + _EXT_CODE
    if length <= 0xFFFF:
        return b"\xc8" + length.to_bytes(2, "big") + _EXT_CODE
    return b"\xc9" + length.to_bytes(4, "big") + _EXT_CODE


_EXT_CODE = ARRAY_EXT.to_bytes(1, "big")
_FIXEXT = {1: b"\xd4" + _EXT_CODE, 2: b"\xd5" + _EXT_CODE, 4: b"\xd6" + _EXT_CODE, 8: b"\xd7" + _EXT_CODE,
           16: b"\xd8" + _EXT_CODE}
_SAMPLE_KEYS = {f.name: _pack(f.name) for f in dataclasses.fields(R.Sample)}
_VECTOR_CODES = {DTYPES[I4]: I4, DTYPES[F4]: F4}  # the dtypes of a Sample's arrays (little-endian)
_VECTOR_HEADS: dict[tuple[int, int], bytes] = {}  # (dtype code, length) -> headers: response lengths repeat
_MAX_VECTOR_HEADS = 8192  # bound of that cache (beyond it headers are built each time)


def _splice_keys(cls: type) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Map header and packed field names of a record class (cached)."""
    got = _SPLICE_KEYS.get(cls)
    if got is None:
        names = [f.name for f in dataclasses.fields(cls)]
        assert cls is not R.ScoredSample or names == list(_SCORED_FIELDS), f"ScoredSample fields are {names}"
        got = _SPLICE_KEYS[cls] = (_PACKER.pack_map_header(len(names)), [(n, _pack(n)) for n in names])
    return got
