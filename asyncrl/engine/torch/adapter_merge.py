"""Adapter-only weight updates for the torch engine: W = W0 + scale * B @ A from a kept pristine base.

With LoRA (`learner.lora_rank > 0`, `learner.lora_push = "adapter"`) the learner pushes only each targeted
linear's adapters, `<module>.lora_A` [r, in] and `<module>.lora_B` [out, r] in fp32, a few MB, plus the base
tensors it trains beside them (`learner.lora_trainable`: the norms' gains by default, KBs) instead of the
merged model. The engine keeps a pristine copy W0 of every targeted weight and, at the end of each update,
recomputes W from it:

    load_weights(stream) ──take()──► "<module>.lora_A" / ".lora_B"   held (copied: the stream's tensors are
                            │                                         views of a receive buffer)
                            ├──────► "<module>.weight" of a target    copied into W0 (a full push: the base)
                            └──────► everything else                  the model, as before: a trained norm
                                                                      replaces the base tensor wholesale (no
                                                                      merge, so no drift); a name the model
                                                                      lacks is load_weights' ValueError
    end_weight_update(v) ──apply()─► W = merge(W0, A, B, scale) (`merge_into`: the same bits, a third of the
                                     memory traffic) for every module whose W0 or adapters arrived

W is never merged onto an already merged W, so nothing drifts over versions, and `merge` is the one
function the learner's merged stream uses too (`asyncrl.learner.lora.merge_weight`), so an adapter push gives
the weights, bit for bit, that a merged push of the same version gives on the same kind of device.

Memory: W0 is one more copy of every targeted weight, in the engine's dtype, on the engine's device (Qwen2.5
0.5B with every projection targeted: 358 M parameters, 0.72 GB in bf16). It is taken in the engine's
constructor, before the KV cache is sized from the free memory, so it comes out of the KV budget and never
out of the headroom. The held adapters add their own fp32 size (the push's bytes). While `apply` runs, one
target at a time has one fp32 temporary of its size (B @ A).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from asyncrl.engine.torch.kernels import lora_merge
from asyncrl.engine.torch.model.multi_copy import multi_copy

ADAPTER_LEAVES = ("lora_A", "lora_B")


@torch.no_grad()
def merge(weight: Tensor, lora_a: Tensor, lora_b: Tensor, scale: float) -> Tensor:
    """W [out, in] + scale * B [out, r] @ A [r, in] -> [out, in] fp32 (a new tensor: W is left as it is). On a GPU
    the fused kernel (kernels/lora_merge.py), on a CPU the torch form."""
    if lora_merge.usable(weight, lora_a, lora_b):
        out = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
        lora_merge.merge_into(out, weight.contiguous(), lora_a.contiguous(), lora_b.contiguous(), scale)
        return out
    return weight.float() + scale * (lora_b.float() @ lora_a.float())


@torch.no_grad()
def merge_into(out: Tensor, weight: Tensor, lora_a: Tensor, lora_b: Tensor, scale: float) -> None:
    """out.copy_(merge(weight, lora_a, lora_b, scale)), bit for bit, with one fp32 temporary instead of four.

    Per element of W, merge + copy_ moves ~36 bytes (W in fp32, B @ A, the scaled product and the sum each
    written and read again); this moves 12 (B @ A written, then read once with W and rounded into `out`), 20
    when the scale is no power of two. The same roundings: a power-of-two scale multiplies A exactly
    (B @ (2^k A) is 2^k (B @ A) in every partial sum), any other scales the product in place as merge does,
    the addition is commutative, and `add(..., out=)` rounds the fp32 sum to out's dtype as copy_ does.
    On a GPU both go through the fused kernel instead (4 bytes an element, kernels/lora_merge.py), whose sum
    `merge` returns in fp32 and this rounds once, so the two still agree bit for bit there."""
    if lora_merge.usable(out, weight, lora_a, lora_b):
        lora_merge.merge_into(out, weight, lora_a.contiguous(), lora_b.contiguous(), scale)
    else:
        merge_into_torch(out, weight, lora_a, lora_b, scale)


@torch.no_grad()
def merge_into_torch(out: Tensor, weight: Tensor, lora_a: Tensor, lora_b: Tensor, scale: float) -> None:
    """merge_into's torch form (a CPU's; on a GPU the form before the kernel, which bench.adapter_merge times)."""
    a = lora_a.float()
    exact = _power_of_two(scale)
    prod = lora_b.float() @ (a * scale if exact else a)  # [out, in] fp32
    if not exact:
        prod.mul_(scale)
    torch.add(prod, weight, out=out)


def _power_of_two(x: float) -> bool:
    mantissa, _ = math.frexp(x)
    return x > 0 and mantissa == 0.5


@dataclass(frozen=True, slots=True)
class LoraSpec:
    """What the engine needs to apply adapters: the targeted linears, the scale (lora_alpha / lora_rank), and how
    (generator.lora_apply: "merge" into the weights here, or "unmerged" in the matmuls, adapter_slots.py, which
    sizes its buffers by the rank)."""

    targets: tuple[str, ...]  # last component of the targeted linears' module names, e.g. ("q_proj", "v_proj")
    scale: float
    rank: int = 0  # learner.lora_rank; 0: not given (merge only: it takes any rank each push brings)
    apply: str = "merge"

    def __post_init__(self) -> None:
        if not self.targets or self.scale <= 0:
            raise ValueError(f"LoraSpec(targets={self.targets}, scale={self.scale}): give at least one target and "
                             "a scale > 0 (lora_alpha / lora_rank)")
        if self.apply not in ("merge", "unmerged") or (self.apply == "unmerged" and self.rank < 1):
            raise ValueError(f"LoraSpec(apply={self.apply!r}, rank={self.rank}): apply is \"merge\" or "
                             "\"unmerged\", and \"unmerged\" needs the rank (learner.lora_rank >= 1)")


@dataclass(slots=True)
class _Target:
    pristine: Tensor  # W0 [out, in], engine dtype and device
    adapters: dict[str, Tensor] = field(default_factory=dict)  # "lora_A" [r, in], "lora_B" [out, r], fp32
    changed: bool = False  # W0 or an adapter arrived in the update in progress
    arrived: set[str] = field(default_factory=set)  # the adapter leaves of the update in progress


class AdapterMerge:
    """The pristine base of every targeted linear of one engine model, and the adapters last received."""

    def __init__(self, model: nn.Module, spec: LoraSpec) -> None:
        paths = check_targets([p for p, m in model.named_modules() if isinstance(m, nn.Linear)], spec.targets)
        self.scale = spec.scale
        self.targets = {p: _Target(pristine=model.get_submodule(p).weight.detach().clone()) for p in paths}

    @property
    def pristine_bytes(self) -> int:
        return sum(t.pristine.numel() * t.pristine.element_size() for t in self.targets.values())

    def take(self, named: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        """The stream minus what this class keeps (adapters, and targeted weights: the pristine base). The adapters
        are copied into buffers kept from one push to the next, all of a stream in one multi-tensor copy when it
        ends (also when the consumer stops early), not one copy call each: an adapter push is hundreds of small
        tensors, and a call each was most of the engine's host time in it."""
        copies: list[tuple[Tensor, Tensor]] = []  # (kept buffer, the stream's tensor: a view of a receive buffer)
        return copy_at_end(self._take(named, copies), copies)

    def _take(self, named: Iterable[tuple[str, Tensor]], copies: list[tuple[Tensor, Tensor]]
              ) -> Iterator[tuple[str, Tensor]]:
        for name, t in named:
            path, _, leaf = name.rpartition(".")
            target = self.targets.get(path)
            if target is None:
                if leaf in ADAPTER_LEAVES:
                    raise ValueError(f"adapter {name!r} for a module that is no LoRA target of this engine "
                                     f"(targets: {sorted({p.rsplit('.', 1)[-1] for p in self.targets})})")
                yield name, t
            elif leaf == "weight":
                if t.shape != target.pristine.shape:
                    raise ValueError(f"{name}: got {tuple(t.shape)}, want {tuple(target.pristine.shape)}")
                target.pristine.copy_(t)
                target.changed = True
            elif leaf in ADAPTER_LEAVES:
                check_adapter(name, leaf, t, target.pristine.shape)
                kept = target.adapters.get(leaf)
                if kept is None or kept.shape != t.shape:  # the first push, or a new rank
                    kept = target.adapters[leaf] = torch.empty(t.shape, dtype=torch.float32,
                                                               device=target.pristine.device)
                copies.append((kept, t.to(kept.device)))
                target.changed = True
                target.arrived.add(leaf)
            else:
                yield name, t  # the bias: frozen, loaded as it is

    @torch.no_grad()
    def apply(self, model: nn.Module) -> list[str]:
        """W = W0 + scale * B @ A (or W0 before any adapter came) for every module changed in this update;
        returns their paths. Writes in place: the fused q/k/v and gate/up weights are views of W."""
        done = []
        for path, target in self.targets.items():
            if not target.changed:
                continue
            weight = model.get_submodule(path).weight
            a, b = target.adapters.get("lora_A"), target.adapters.get("lora_B")
            arrived, target.arrived = target.arrived, set()
            if len(arrived) == 1 or (a is None) != (b is None):  # one without the other, in this update or ever
                only = next(iter(arrived)) if len(arrived) == 1 else "lora_A" if a is not None else "lora_B"
                raise ValueError(f"{path}: lora_A and lora_B must arrive together (got only {only})")
            if a is None or b is None:
                weight.copy_(target.pristine)
            elif a.shape[0] != b.shape[1]:
                raise ValueError(f"{path}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} differ in rank")
            else:
                merge_into(weight, target.pristine, a, b, self.scale)  # = weight.copy_(merge(...)), bit for bit
            target.changed = False
            done.append(path)
        return done


def check_targets(paths: Iterable[str], targets: tuple[str, ...]) -> list[str]:
    """The module paths among `paths` whose last name is a target; a target that names none is a ValueError."""
    found = [p for p in paths if p.rsplit(".", 1)[-1] in targets]
    missing = sorted(set(targets) - {p.rsplit(".", 1)[-1] for p in found})
    if missing:
        raise ValueError(f"LoRA targets {missing} name no linear layer of the engine's model: the learner's "
                         "learner.lora_targets must name the engine's q/k/v/o and gate/up/down projections")
    return found


def copy_at_end(stream: Iterator[tuple[str, Tensor]], copies: list[tuple[Tensor, Tensor]]
                ) -> Iterator[tuple[str, Tensor]]:
    """`stream` as it is; once it ends (also when its consumer stops early) every (kept, arrived) pair that it
    appended to `copies` is copied by multi-tensor copies (`multi_copy`: casting to the kept buffer's dtype)."""
    try:
        yield from stream
    finally:
        if copies:
            multi_copy(copies)


def check_adapter(name: str, leaf: str, t: Tensor, weight_shape: torch.Size) -> None:
    """A [r, in] / B [out, r] against the targeted weight [out, in], before anything is kept."""
    out, cols = weight_shape
    fits = t.dim() == 2 and (t.shape[1] == cols if leaf == "lora_A" else t.shape[0] == out)
    if not fits or not t.is_floating_point():
        want = f"[r, {cols}]" if leaf == "lora_A" else f"[{out}, r]"
        raise ValueError(f"{name}: got {t.dtype} {tuple(t.shape)}, want a float {want} for a weight "
                         f"{tuple(weight_shape)}")
