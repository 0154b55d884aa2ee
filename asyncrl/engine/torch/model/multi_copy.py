"""`multi_copy`: many (destination, source) copies in as few multi-tensor launches as CUDA's fast path allows.

A push lands as hundreds of small tensors (a 7B LoRA push: 392 adapters and 57 norms). `torch._foreach_copy_`
copies a whole list in a few kernels only when every pair in it has the same sizes and strides, every source one
dtype and every destination one dtype (casting between the two is fine); one pair that breaks this sends the whole
list down the per-tensor path, one kernel launch and its host work each. The slot of one target inside a fused
projection's block-diagonal B is a strided view, so mixing those into one list cost every other pair its fast
path. Grouping the pairs by (destination dtype, source dtype, strides match) keeps the fast path for every group
that can have it; the strided ones go per tensor as they must. On the CPU each group is a loop in C++ either way.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor


def multi_copy(pairs: list[tuple[Tensor, Tensor]]) -> None:
    """dst.copy_(src) for every (dst, src) pair (casting to dst's dtype), grouped for the fast path."""
    groups: dict[tuple[torch.dtype, torch.dtype, bool], tuple[list[Tensor], list[Tensor]]] = defaultdict(
        lambda: ([], []))
    for dst, src in pairs:
        dsts, srcs = groups[dst.dtype, src.dtype, dst.stride() == src.stride()]
        dsts.append(dst)
        srcs.append(src)
    with torch.no_grad():
        for dsts, srcs in groups.values():
            torch._foreach_copy_(dsts, srcs)
