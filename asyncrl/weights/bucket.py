"""Bucketing of (Hugging Face name, tensor) streams into flat byte buffers, and the inverse.

A bucket is one contiguous uint8 buffer holding several tensors back to back, plus its layout
(names, dtypes, shapes, byte offsets, total bytes). Every bucket holds tensors of one dtype only, so each
offset is a multiple of that dtype's itemsize without padding; the layout is exactly SGLang's
``load_format="flattened_bucket"`` (off_0 = 0, off_{i+1} = off_i + nbytes_i; docs/sglang.md).

    (name, tensor) stream --iter_buckets--> (flat uint8 [nbytes], BucketLayout) ... --unflatten--> views

`iter_buckets` streams: it holds at most ``bucket_bytes`` of pending tensors per dtype (a tensor larger
than that travels alone). `BucketLayout.validate` checks a layout before any byte moves, so a bad layout
is a clear `ValueError` instead of a broadcast that hangs or corrupts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from asyncrl.records import WeightBucket

DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024

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
            expected = off + _numel(shape) * itemsize
        if self.nbytes != expected:
            raise ValueError(f"bucket nbytes={self.nbytes} but its tensors need {expected} bytes")
        if max_nbytes is not None and self.nbytes > max_nbytes:
            raise ValueError(f"bucket of {self.nbytes} bytes exceeds the limit of {max_nbytes} bytes")


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def flatten(named: list[tuple[str, torch.Tensor]], device: torch.device | str | None = None,
            dtype: torch.dtype | None = None) -> tuple[torch.Tensor, BucketLayout]:
    """Pack tensors of one dtype into one uint8 buffer [nbytes] on `device`, cast to `dtype` if given.

    One concatenation (and at most one cast) per bucket, not one copy per tensor: a bucket of a few hundred
    tensors was host-bound on the per-tensor launches (5 ms of a 14 ms push of the 0.5B shape)."""
    tensors = [t.detach() for _, t in named]
    source = tensors[0].dtype
    if any(t.dtype != source for t in tensors):
        raise ValueError(f"bucket mixes dtypes {sorted({str(t.dtype) for t in tensors})}; one dtype per bucket")
    out_dtype = dtype or source
    layout = layout_of([n for n, _ in named], [list(t.shape) for t in tensors], out_dtype)
    target = torch.device(device) if device is not None else tensors[0].device
    flat = torch.empty(layout.nbytes, dtype=torch.uint8, device=target)
    typed = flat.view(out_dtype)  # [numel]
    parts = [t.reshape(-1) for t in tensors]
    if out_dtype == source and parts[0].device == target:
        torch.cat(parts, out=typed)
    else:
        typed.copy_(torch.cat(parts))  # casts and/or moves once
    return flat, layout


def layout_of(names: list[str], shapes: list[list[int]], dtype: torch.dtype) -> BucketLayout:
    """The layout of tensors of one dtype packed back to back in this order (validated)."""
    itemsize, name = dtype.itemsize, dtype_name(dtype)
    offsets, off = [], 0
    for shape in shapes:
        offsets.append(off)
        off += _numel(shape) * itemsize
    layout = BucketLayout(names=list(names), dtypes=[name] * len(names), shapes=shapes, offsets=offsets, nbytes=off)
    layout.validate()
    return layout


def unflatten(flat: torch.Tensor, layout: BucketLayout) -> list[tuple[str, torch.Tensor]]:
    """Views of `flat` (uint8 [nbytes]) as the named tensors of `layout` (no copy)."""
    layout.validate()
    if flat.dtype != torch.uint8 or flat.dim() != 1 or flat.numel() != layout.nbytes:
        raise ValueError(f"flat buffer is {flat.dtype} {tuple(flat.shape)}, layout needs uint8 ({layout.nbytes},)")
    out = []
    for name, dt, shape, off in zip(layout.names, layout.dtypes, layout.shapes, layout.offsets, strict=True):
        dtype = parse_dtype(dt)
        size = _numel(shape) * dtype.itemsize
        out.append((name, flat[off : off + size].view(dtype).view(shape)))
    return out


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Iterator[tuple[torch.Tensor, BucketLayout]]:
    """Group a (name, tensor) stream into flat one-dtype buckets of at most `bucket_bytes` each. With `dtype`,
    floating-point tensors travel cast to it (the generator's dtype: fp32 masters would double the bytes);
    other tensors keep theirs."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be >= 1")
    pending: dict[tuple[torch.dtype, torch.dtype], list[tuple[str, torch.Tensor]]] = {}
    pending_bytes: dict[tuple[torch.dtype, torch.dtype], int] = {}
    for name, t in named_tensors:
        dtype_name(t.dtype)  # reject an unsupported dtype before buffering anything
        out = dtype if dtype is not None and t.dtype.is_floating_point else t.dtype
        key = (t.dtype, out)
        size = t.numel() * out.itemsize
        group = pending.setdefault(key, [])
        if group and pending_bytes[key] + size > bucket_bytes:
            yield flatten(group, device, out)
            group.clear()
            pending_bytes[key] = 0
        group.append((name, t))
        pending_bytes[key] = pending_bytes.get(key, 0) + size
    for (_, out), group in pending.items():
        if group:
            yield flatten(group, device, out)


def drain(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Run the iterator to its end without sending anything: what FSDP ranks != 0 do during a push
    (each `full_tensor()` inside the iterator is a collective all ranks must join)."""
    for _ in named_tensors:
        pass
