"""One matmul for several projections of the same input (q/k/v) in the learner's forward.

    x [T, in] @ cat(W_1 .. W_n)^T [in, sum(out)] -> [T, sum(out)] -> split into the n outputs (views)

The parameters stay what they are (same names, shapes, state dict, weight push); only the forward
concatenates them, a copy of a few MB per layer. In the backward the n input gradients arrive as one
[T, sum(out)] tensor, so the gradient of x is one matmul with K = sum(out) instead of n matmuls and n - 1
additions, and the projections with few outputs (k and v: 128 columns on the 0.5B shape) stop running as
their own thin, inefficient GEMMs.

Not used for SwiGLU's gate/up: there the input gradient arrives through Inductor's fused "pointwise cat"
of the two halves, a kernel that computes both halves' expressions for every element. On an H200 (0.5B
shape, bench.learner, 2026-12-01) SwiGLU's backward went from 18.3 to 36.5 ms a step, more than the merged
GEMMs saved.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def mergeable(*layers: nn.Module) -> bool:
    """Plain `nn.Linear`s (not adapters or quantised wrappers, whose forward is more than x @ W^T + b) with
    the same input size and either all or none with a bias."""
    return (all(type(layer) is nn.Linear for layer in layers)
            and len({layer.in_features for layer in layers}) == 1
            and len({layer.bias is None for layer in layers}) == 1)


def merged_linear(x: Tensor, layers: tuple[nn.Linear, ...]) -> Tensor:
    """x [..., in] -> [..., sum(out)], the layers' outputs side by side."""
    weight = torch.cat([layer.weight for layer in layers])  # [sum(out), in]
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return F.linear(x, weight, bias)
