"""`LoadPlans`: the copies of a received weight bucket, worked out once for each bucket layout and replayed after.

A learner pushes the same buckets every version: the same names, shapes and dtype in the same order. Loading one
the general way (`unflatten` makes a view per tensor, `load_weights` finds each one's destination by name, checks
it, groups the copies) is host work per tensor: ~7 us at 7B on an H100 host, 449 tensors in an adapter push, and on
a staged CUDA IPC push that host work is what the generator is paused for. A plan keeps the outcome of that work
for one layout (each tensor's destination, whether it can be copied as a flat run of elements), so a later bucket
of the same layout costs a split of its flat buffer into parts (one call), one multi-tensor copy per destination
dtype, and one copy per run of strided destinations (the B slot of a fused projection's block-diagonal adapter, in
every layer the bucket holds: `strided_runs`).

    first bucket of a layout:   load_weights(unflatten(...))      the general path: errors, names, checks
                                 └─ on success: plan = destinations of every tensor (by name, as it loaded them)
    later buckets, same layout:  typed = flat.view(dtype); parts = typed.split(sizes)   (1-D views, one call)
                                 _foreach_copy_(flat destinations, dense parts)         (per destination dtype)
                                 run.dst.copy_(typed.as_strided(...)) for each run of strided destinations
                                 adapters.arrived |= the plan's adapters                (the end-of-update check)

A plan is made only after the general path loaded the bucket without error, so a layout that fails (a wrong name,
shape, a read-only tensor) fails every time, with the general path's message. The key is the layout's names, dtype
and byte count; the shapes are compared too. The destinations are the engine's parameters and adapter slots,
which stay where they are for the engine's life (`parameter_index` is walked once too). An engine that merges
adapters (`AdapterMerge`: a merge per target at the end of the update) takes the general path every time.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.engine.bucket_layout import BucketLayout, numel, parse_dtype, unflatten
from asyncrl.engine.torch.adapter_slots import AdapterSlots

MAX_PLANS = 64  # layouts kept; a learner's push has a handful (one per bucket)


@dataclass(frozen=True, slots=True)
class _Dense:
    """The parts copied as flat runs into one destination dtype: their indices and the destinations' 1-D views."""

    pick: Callable[[tuple[Tensor, ...]], tuple[Tensor, ...]]  # parts -> the parts of this group, in order
    dsts: list[Tensor]  # 1-D views of the destinations


@dataclass(frozen=True, slots=True)
class _StridedRun:
    """`count` strided destinations equally spaced in one allocation whose sources lie equally spaced in the bucket:
    one copy between two strided views (one kernel) instead of `count` copies. count 1: a copy of its own."""

    first: int  # index of the first source tensor in the bucket
    start: int  # its offset in elements from the bucket's start
    step: int  # elements from one source to the next
    shape: torch.Size  # of one destination (its source is contiguous, of this shape)
    dst: Tensor  # [count, *shape] (the destinations as one view), or the one destination when count is 1
    count: int


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """One layout's copies."""

    shapes: list[list[int]]  # the layout's shapes (compared on each use)
    dtype: torch.dtype  # of every tensor in the bucket (one dtype a bucket)
    sizes: list[int]  # elements of each tensor, in order
    dense: list[_Dense]
    strided: list[_StridedRun]
    adapters: dict[str, frozenset[str]]  # target path -> the adapter leaves this bucket brings

    def run(self, flat: Tensor, slots: AdapterSlots | None) -> None:
        """Copy the bucket `flat` (uint8 [nbytes]) into the destinations."""
        typed = flat.view(self.dtype)  # [elements]
        parts = typed.split(self.sizes)  # 1-D views, [numel] each
        with torch.no_grad():
            for group in self.dense:
                torch._foreach_copy_(group.dsts, list(group.pick(parts)))
            base = typed.storage_offset()
            for run in self.strided:
                if run.count == 1:
                    run.dst.copy_(parts[run.first].view(run.shape))
                else:  # the sources as one view [count, *shape] of the bucket
                    rows, cols = run.shape
                    run.dst.copy_(typed.as_strided((run.count, rows, cols), (run.step, cols, 1), base + run.start))
        if slots is not None:
            slots.arrive(self.adapters)


def _picker(indices: list[int]) -> Callable[[tuple[Tensor, ...]], tuple[Tensor, ...]]:
    if len(indices) == 1:
        i = indices[0]
        return lambda parts: (parts[i],)
    return operator.itemgetter(*indices)


class LoadPlans:
    """The plans of one engine, by layout: `params` (parameters by Hugging Face name) and `slots` (the adapters'
    slots, or None) are where a bucket's tensors go, as the general path resolves them."""

    def __init__(self, params: Mapping[str, Tensor], slots: AdapterSlots | None, skipped: Iterable[str]) -> None:
        self.params = params
        self.slots = slots
        self.skipped = tuple(skipped)  # name suffixes the general path ignores (derived buffers)
        self.plans: dict[tuple[tuple[str, ...], str, int], LoadPlan] = {}
        self.hits = 0  # buckets loaded by a plan (a test and bench figure)

    def load(self, flat: Tensor, layout: BucketLayout, general: Callable[[list[tuple[str, Tensor]]], None]) -> None:
        """Load the bucket: by its layout's plan, or by `general` (the named tensors' path), then plan it."""
        key = (tuple(layout.names), layout.dtypes[0] if layout.dtypes else "", layout.nbytes)
        plan = self.plans.get(key)
        if plan is not None and plan.shapes == layout.shapes:
            plan.run(flat, self.slots)
            self.hits += 1
            return
        general(unflatten(flat, layout, validated=True))
        plan = self._make(layout)
        if plan is not None:
            if len(self.plans) >= MAX_PLANS:
                self.plans.pop(next(iter(self.plans)))
            self.plans[key] = plan

    def _make(self, layout: BucketLayout) -> LoadPlan | None:
        """The plan of a layout that the general path just loaded (None: one that no plan may replay)."""
        if not layout.names or len(set(layout.dtypes)) != 1:
            return None
        dtype = parse_dtype(layout.dtypes[0])
        dense: dict[torch.dtype, tuple[list[int], list[Tensor]]] = {}
        strided: list[tuple[int, Tensor]] = []
        adapters: dict[str, set[str]] = {}
        for i, name in enumerate(layout.names):
            if name.endswith(self.skipped):
                continue
            dst, adapter = self._destination(name)
            if dst is None or list(dst.shape) != list(layout.shapes[i]):
                return None
            if adapter is not None:
                adapters.setdefault(adapter[0], set()).add(adapter[1])
            if dst.is_contiguous():
                idx, dsts = dense.setdefault(dst.dtype, ([], []))
                idx.append(i)
                dsts.append(dst.view(-1))
            else:
                strided.append((i, dst))
        starts = [off // dtype.itemsize for off in layout.offsets]
        return LoadPlan(shapes=[list(s) for s in layout.shapes], dtype=dtype,
                        sizes=[numel(s) for s in layout.shapes],
                        dense=[_Dense(_picker(idx), dsts) for idx, dsts in dense.values()],
                        strided=strided_runs(strided, starts),
                        adapters={p: frozenset(leaves) for p, leaves in adapters.items()})

    def _destination(self, name: str) -> tuple[Tensor | None, tuple[str, str] | None]:
        if self.slots is not None:
            hit = self.slots.slot_of(name)
            if hit is not None:
                path, leaf, kept = hit
                return kept, (path, leaf)
        return self.params.get(name), None


def strided_runs(strided: list[tuple[int, Tensor]], starts: list[int]) -> list[_StridedRun]:
    """Group strided 2-D destinations (bucket index, destination) into runs: the same slot of every layer of a fused
    projection (a B of q, k, v, gate or up) when the layers' buffers are one allocation (`low_rank.attach`) and the
    bucket holds the layers' tensors at one spacing. Destinations are grouped by what makes them alike (dtype,
    shape, strides, allocation, column within the row), then cut into runs of equal spacing on both sides, in
    bucket order. Anything irregular still copies, one run of 1 each."""
    alike: dict[tuple, list[tuple[int, Tensor]]] = {}
    for i, dst in strided:
        if dst.dim() != 2:
            alike.setdefault((id(dst),), []).append((i, dst))
            continue
        key = (dst.dtype, tuple(dst.shape), dst.stride(), dst.untyped_storage().data_ptr(),
               dst.storage_offset() % dst.stride(0))
        alike.setdefault(key, []).append((i, dst))
    runs: list[_StridedRun] = []
    for group in alike.values():
        k = 0
        while k < len(group):
            n = 1
            if group[k][1].dim() == 2 and k + 1 < len(group):
                step = starts[group[k + 1][0]] - starts[group[k][0]]
                gap = group[k + 1][1].storage_offset() - group[k][1].storage_offset()
                while (k + n < len(group) and step > 0 and gap > 0
                       and starts[group[k + n][0]] - starts[group[k + n - 1][0]] == step
                       and group[k + n][1].storage_offset() - group[k + n - 1][1].storage_offset() == gap):
                    n += 1
            first, dst = group[k]
            if n == 1:
                runs.append(_StridedRun(first, starts[first], 0, dst.shape, dst, 1))
            else:
                view = dst.as_strided((n, *dst.shape), (gap, *dst.stride()), dst.storage_offset())
                runs.append(_StridedRun(first, starts[first], step, dst.shape, view, n))
            k += n
    return runs
