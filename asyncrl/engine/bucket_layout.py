"""The layout of one flat weight bucket: the names, dtypes, shapes and byte offsets of the tensors packed
back to back in it, one dtype per bucket, so each offset is a multiple of that dtype's itemsize without
padding. It is exactly SGLang's ``load_format="flattened_bucket"`` (off_0 = 0, off_{i+1} = off_i + nbytes_i;
docs/sglang.md): the weight push packs buckets in it (`asyncrl.weights.bucket`) and an engine that receives
buckets itself (the SGLang adapter) checks it. `BucketLayout.validate` checks a layout before any byte moves,
so a bad layout is a clear `ValueError` instead of a broadcast that hangs or corrupts. `unflatten` reads the
named tensors back out of a received bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from asyncrl.records import WeightBucket

# Wire names (torch attribute names, no "torch." prefix) of the dtypes a bucket may carry.
_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
        "float8_e4m3fn", "float8_e5m2",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
}
_NAMES = {dt: name for name, dt in _DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the form SGLang's getattr(torch, s) accepts)."""
    name = _NAMES.get(dtype)
    if name is None:
        raise TypeError(f"dtype {dtype} cannot travel in a weight bucket; allowed: {sorted(_DTYPES)}")
    return name


def parse_dtype(name: str) -> torch.dtype:
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise ValueError(f"unknown bucket dtype {name!r}; allowed: {sorted(_DTYPES)} (no 'torch.' prefix)")
    return dtype


@dataclass(kw_only=True, slots=True)
class BucketLayout:
    """Where each tensor of one flat bucket lives."""

    names: list[str]  # Hugging Face parameter names
    dtypes: list[str]  # dtype_name() of each tensor
    shapes: list[list[int]]  # [] for a scalar
    offsets: list[int]  # byte offset of each tensor in the flat buffer
    nbytes: int  # total bytes of the flat buffer

    @classmethod
    def of(cls, bucket: WeightBucket) -> BucketLayout:
        """The layout a WeightBucket announces."""
        return cls(names=bucket.names, dtypes=bucket.dtypes, shapes=bucket.shapes, offsets=bucket.offsets,
                   nbytes=bucket.nbytes)

    def validate(self, max_nbytes: int | None = None) -> None:
        """Raise ValueError naming the first thing wrong; called by both sides before any transfer."""
        n = len(self.names)
        if n == 0:
            raise ValueError("empty weight bucket: a bucket needs at least one tensor")
        lengths = {"dtypes": len(self.dtypes), "shapes": len(self.shapes), "offsets": len(self.offsets)}
        if any(v != n for v in lengths.values()):
            raise ValueError(f"bucket has {n} names but {lengths}: every list needs one entry per tensor")
        if len(set(self.names)) != n or not all(isinstance(s, str) and s for s in self.names):
            raise ValueError("bucket names must be unique non-empty strings")
        expected = 0
        for name, dt, shape, off in zip(self.names, self.dtypes, self.shapes, self.offsets, strict=True):
            itemsize = parse_dtype(dt).itemsize
            if any(not isinstance(d, int) or d < 0 for d in shape):
                raise ValueError(f"bucket tensor {name!r}: shape {shape} has a negative or non-integer dim")
            if off % itemsize:
                raise ValueError(f"bucket tensor {name!r}: offset {off} is not a multiple of {dt} itemsize {itemsize}")
            if off != expected:
                raise ValueError(f"bucket tensor {name!r}: offset {off}, expected {expected} (tensors are packed back to back)")
            expected = off + numel(shape) * itemsize
        if self.nbytes != expected:
            raise ValueError(f"bucket nbytes={self.nbytes} but its tensors need {expected} bytes")
        if max_nbytes is not None and self.nbytes > max_nbytes:
            raise ValueError(f"bucket of {self.nbytes} bytes exceeds the limit of {max_nbytes} bytes")


def numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def unflatten(flat: torch.Tensor, layout: BucketLayout, validated: bool = False) -> list[tuple[str, torch.Tensor]]:
    """Views of `flat` (uint8 [nbytes]) as the named tensors of `layout` (no copy). `validated`: the caller
    already ran `layout.validate()` on this layout (the receiver does, before the transfer)."""
    if not validated:
        layout.validate()
    if flat.dtype != torch.uint8 or flat.dim() != 1 or flat.numel() != layout.nbytes:
        raise ValueError(f"flat buffer is {flat.dtype} {tuple(flat.shape)}, layout needs uint8 ({layout.nbytes},)")
    out: list[tuple[str, torch.Tensor]] = []
    n, i = len(layout.names), 0
    while i < n:  # a run of tensors of one dtype: one typed view, split in C++, then each tensor's shape
        dt = layout.dtypes[i]
        j = i + 1
        while j < n and layout.dtypes[j] == dt:
            j += 1
        dtype = parse_dtype(dt)
        sizes = [numel(layout.shapes[k]) for k in range(i, j)]
        start = layout.offsets[i]
        typed = flat[start : start + sum(sizes) * dtype.itemsize].view(dtype)
        for k, part in zip(range(i, j), typed.split(sizes), strict=True):
            out.append((layout.names[k], part.view(layout.shapes[k])))
        i = j
    return out
