"""The learner's SwiGLU MLP forward with gate and up as one matmul (merged_linear.py).

HF computes down_proj(act(gate_proj(x)) * up_proj(x)): two [T, I] GEMMs in the forward, and in the backward
two GEMMs for the gradient of x plus an addition of two [T, hidden] tensors. Here gate and up come out of
one [T, 2I] GEMM and the backward's gradient of x is one GEMM. Same parameters, names and math; patched
per module instance, only for classes whose forward is exactly this (checked in tests/learner/test_lean_mlp.py)
and only when both projections are plain `nn.Linear`s.
"""

from __future__ import annotations

import types
from collections.abc import Callable

from torch import Tensor, nn

from asyncrl.learner.merged_linear import mergeable, merged_linear

SUPPORTED = frozenset({"LlamaMLP", "Qwen2MLP", "Qwen3MLP"})


def install(hf: nn.Module) -> int:
    """Swap the forward of every supported MLP module of `hf` (in place). Idempotent. Returns the count."""
    count = 0
    for module in hf.modules():
        if (type(module).__name__ in SUPPORTED and hasattr(module, "act_fn") and hasattr(module, "down_proj")
                and mergeable(getattr(module, "gate_proj", None), getattr(module, "up_proj", None))):
            module.forward = types.MethodType(_forward_with(int(module.gate_proj.out_features)), module)
            count += 1
    return count


def _forward_with(intermediate: int) -> Callable[[nn.Module, Tensor], Tensor]:
    """The intermediate size as a default argument: a constant under `compile(dynamic=True)` (see
    lean_attention._forward_with for why ints read from modules are not)."""
    def forward(self: nn.Module, x: Tensor, _intermediate: int = intermediate) -> Tensor:
        gate_up = merged_linear(x, (self.gate_proj, self.up_proj))  # [..., 2I]
        gate, up = gate_up.split(_intermediate, dim=-1)  # [..., I] each (views)
        return self.down_proj(self.act_fn(gate) * up)
    return forward
