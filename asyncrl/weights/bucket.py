"""Bucketing of (Hugging Face name, tensor) streams into flat byte buffers, and the inverse.

A bucket is one contiguous uint8 buffer holding several tensors back to back, plus its layout
(`asyncrl.engine.bucket_layout.BucketLayout`: names, dtypes, shapes, byte offsets, total bytes; exactly
SGLang's ``load_format="flattened_bucket"``, one dtype per bucket).

    (name, tensor) stream --iter_buckets--> (flat uint8 [nbytes], BucketLayout) ... --unflatten--> views

`iter_buckets` streams: it holds at most ``bucket_bytes`` of pending tensors per dtype (a tensor larger
than that travels alone).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from asyncrl.engine.bucket_layout import BucketLayout, dtype_name, numel

DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024


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
        off += numel(shape) * itemsize
    layout = BucketLayout(names=list(names), dtypes=[name] * len(names), shapes=shapes, offsets=offsets, nbytes=off)
    layout.validate()
    return layout


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
