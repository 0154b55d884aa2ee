"""LoRA adapters kept apart from the weights, inside the engine's matmuls (`generator.lora_apply = "unmerged"`).

One `LowRank` sits beside each projection of the compact model that a LoRA target feeds (the fused q/k/v, o_proj,
the fused gate/up, down_proj) and adds the adapters' update to its output, in the form the learner's `LoraLinear`
computes it (asyncrl/learner/lora.py), in the engine's dtype:

    y = x W^T + b                                   the projection as it runs without LoRA
    y + scale * ((x A^T) B^T)                       A [R, in], B [out, R], R = rank x (targets fused here)

Fused projections stack their targets' adapters: A's rows are q's A, then k's, then v's; B is block diagonal, q's
B in q's output rows and q's columns, and so on, zero elsewhere (a target the learner does not train, in a fused
projection with one it does, keeps a zero block). So one pair of small matmuls serves a fused projection, and the
zeros add exact zeros: every output row gets the same dot products as its own target's adapters alone.

The buffers are made once, at the rank the learner trains, before the engine sizes its KV cache and captures its
CUDA graphs; a push copies the adapters into them (views: `slots`), so the graphs read the new values with no
capture again and no weight is ever rewritten. Before the first push B is zero and the model computes its base.
The same projection of every layer keeps its buffers in one allocation ([layers, out, R] for B), one layer apart:
q's B slot of every layer is then one strided view, which a push fills with one copy (load_plan.py) where a slot
a layer would take a copy each (140 of them at 7B).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one target's adapters live inside its projection's buffers."""

    lora_A: Tensor  # [r, in], a view of LowRank.a
    lora_B: Tensor  # [rows, r], a view of LowRank.b (its rows of the fused output, its rank's columns)


class LowRank:
    """The adapters of one (possibly fused) projection: y + scale * (x A^T) B^T."""

    def __init__(self, parts: list[tuple[str, int, int]], in_features: int, out_features: int, rank: int,
                 scale: float, dtype: torch.dtype, device: torch.device,
                 buffers: tuple[Tensor, Tensor] | None = None) -> None:
        """parts: (target path, first output row, rows) of each targeted projection fused into this one. buffers:
        (a, b) to keep the adapters in (zeros, contiguous, of the shapes below); None: allocated here."""
        self.scale = scale
        width = rank * len(parts)
        if buffers is None:
            buffers = (torch.zeros(width, in_features, dtype=dtype, device=device),
                       torch.zeros(out_features, width, dtype=dtype, device=device))
        self.a, self.b = buffers  # [R, in]; [out, R], block diagonal
        self.slots = {
            path: Slot(self.a[i * rank:(i + 1) * rank], self.b[row:row + rows, i * rank:(i + 1) * rank])
            for i, (path, row, rows) in enumerate(parts)
        }

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        """x [n, in] the projection's input, y [n, out] its output -> y plus the adapters' update [n, out]."""
        low = F.linear(x, self.a)  # [n, R]
        return y + self.scale * F.linear(low, self.b)


def attach(model: torch.nn.Module, targets: tuple[str, ...], rank: int, scale: float) -> dict[str, Slot]:
    """Give every projection of `model` (a fused CausalLM) that a target feeds its LowRank; -> {target path: Slot}.
    Targets name the Hugging Face linears (q_proj, ..., down_proj); the engine runs q/k/v and gate/up fused."""
    plans: dict[str, list[tuple[torch.nn.Module, list[tuple[str, int, int]], Tensor]]] = {}
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}"
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv is None or mlp.gate_up is None:
            raise ValueError("LoRA adapters kept unmerged need the engine's fused projections (fuse_projections)")
        groups = {
            "qkv_lora": (attn, f"{prefix}.self_attn", ("q_proj", "k_proj", "v_proj"), attn.qkv[0]),
            "o_lora": (attn, f"{prefix}.self_attn", ("o_proj",), attn.o_proj.weight),
            "gate_up_lora": (mlp, f"{prefix}.mlp", ("gate_proj", "up_proj"), mlp.gate_up[0]),
            "down_lora": (mlp, f"{prefix}.mlp", ("down_proj",), mlp.down_proj.weight),
        }
        for attr, (module, owner, names, weight) in groups.items():
            parts, row = [], 0
            for name in names:
                rows = getattr(module, name).weight.shape[0]
                if name in targets:
                    parts.append((f"{owner}.{name}", row, rows))
                row += rows
            if parts:
                plans.setdefault(attr, []).append((module, parts, weight))
    slots: dict[str, Slot] = {}
    for attr, layers in plans.items():
        for (module, parts, weight), buffers in zip(layers, _layer_buffers(layers, rank), strict=True):
            low = LowRank(parts, weight.shape[1], weight.shape[0], rank, scale, weight.dtype, weight.device, buffers)
            setattr(module, attr, low)
            slots.update(low.slots)
    return slots


def _layer_buffers(layers: list[tuple[torch.nn.Module, list[tuple[str, int, int]], Tensor]], rank: int
                   ) -> list[tuple[Tensor, Tensor] | None]:
    """(a, b) of each layer's LowRank of one projection, as views of one allocation per buffer when every layer's
    is alike (same parts, shape, dtype, device: the usual decoder); None each (own allocations) otherwise."""
    shapes = {(tuple((r, n) for _, r, n in parts), tuple(w.shape), w.dtype, w.device) for _, parts, w in layers}
    if len(shapes) != 1:
        return [None] * len(layers)
    _, parts, weight = layers[0]
    width = rank * len(parts)
    out_features, in_features = weight.shape
    a = torch.zeros(len(layers), width, in_features, dtype=weight.dtype, device=weight.device)  # [L, R, in]
    b = torch.zeros(len(layers), out_features, width, dtype=weight.dtype, device=weight.device)  # [L, out, R]
    return [(a[i], b[i]) for i in range(len(layers))]
