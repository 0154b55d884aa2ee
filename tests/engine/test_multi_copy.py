"""multi_copy: every pair copied (cast to the destination's dtype), in groups that keep CUDA's multi-tensor fast path:
a pair whose strides differ from its source's (a target's slot inside a fused block-diagonal B) never shares a
`_foreach_copy_` call with pairs that match."""

from __future__ import annotations

import torch

from asyncrl.engine.torch.model import load_weights
from asyncrl.engine.torch.model import loader
from asyncrl.engine.torch.model.multi_copy import multi_copy


def test_pairs_are_copied_and_grouped_by_strides_and_dtypes(monkeypatch):
    b = torch.zeros(6, 4, dtype=torch.bfloat16)  # a fused B: two targets' blocks on its diagonal
    a = torch.zeros(4, 5, dtype=torch.bfloat16)
    pairs = [(b[0:3, 0:2], torch.randn(3, 2)), (b[3:6, 2:4], torch.randn(3, 2)),  # strided slots
             (a[0:2], torch.randn(2, 5)), (a[2:4], torch.randn(2, 5)),  # rows: strides match
             (torch.zeros(3), torch.randn(3, dtype=torch.float64))]  # same strides, another source dtype
    calls = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda d, s: (calls.append(len(d)), real(d, s)))
    multi_copy(pairs)
    for dst, src in pairs:
        assert torch.equal(dst, src.to(dst.dtype))
    assert sorted(calls) == [1, 2, 2]  # strided pair apart from the matching ones; the fp64 source apart too
    assert torch.count_nonzero(b[0:3, 2:4]) == 0 and torch.count_nonzero(b[3:6, 0:2]) == 0  # off-diagonal kept 0


def test_load_weights_with_nothing_to_load_walks_no_module(monkeypatch):
    """An adapter-only push leaves nothing for the model's own parameters: no parameter index is built for it."""
    monkeypatch.setattr(loader, "parameter_index", lambda model: (_ for _ in ()).throw(AssertionError("walked")))
    assert load_weights(torch.nn.Linear(2, 2), iter([])) == []
