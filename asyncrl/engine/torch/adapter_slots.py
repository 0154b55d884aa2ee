"""Adapter-only weight updates kept unmerged: the engine's matmuls add each push's adapters to their outputs.

`generator.lora_apply = "unmerged"` (torch engine, `learner.lora_push = "adapter"`): instead of merging
W = W0 + scale * B @ A at each version (adapter_merge.py, which keeps a pristine W0 of every targeted weight), the
engine keeps the weights as they are and runs the adapters beside them, y + scale * (x A^T) B^T, the form the
learner's own forward computes (model/low_rank.py has the buffers and the arithmetic).

    load_weights(stream) ──take()──► "<module>.lora_A" / ".lora_B"   copied into the target's slot of its
                            │                                         projection's buffers (cast to the engine's
                            │                                         dtype, as the learner casts them), all at once
                            │                                         when the stream ends
                            └──────► everything else                  the model, as before: a target's weight (a
                                                                      joining generator's base) goes into the
                                                                      weight itself; a trained norm replaces the
                                                                      base tensor
    end_weight_update(v) ──apply()─► checks that each target's A and B came together; nothing to compute

Against merging: no second copy of the targeted weights (13 GB for a 7B model in bf16), and a push costs the
copy of the adapters (MBs), not a pass over every targeted weight (~40-50 ms at 7B on an H200), so the engine is
paused for no more than the transfer. The price is two small matmuls beside each projection in every step
(2 r (in + out) against in x out multiply-adds: ~3 % at r 64 on a 7B shape) and buffers at the learner's rank,
made before the KV cache is sized and the CUDA graphs captured. FP8 weights (`weights_dtype = "fp8"`) are not
supported here: their projections take quantized inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet

from torch import Tensor, nn

from asyncrl.engine.torch.adapter_merge import (
    ADAPTER_LEAVES,
    AdapterMerge,
    LoraSpec,
    check_adapter,
    check_targets,
    copy_at_end,
)
from asyncrl.engine.torch.model.low_rank import Slot, attach


class AdapterSlots:
    """Where every target's adapters are kept inside the model's LowRank buffers, and what the update in progress
    has brought."""

    def __init__(self, model: nn.Module, spec: LoraSpec) -> None:
        self.slots: dict[str, Slot] = attach(model, spec.targets, spec.rank, spec.scale)
        check_targets(self.slots, spec.targets)
        self.rank = spec.rank
        self.weight_shapes = {p: model.get_submodule(p).weight.shape for p in self.slots}
        self.arrived: dict[str, set[str]] = {}  # target path -> adapter leaves of the update in progress
        # "<path>.lora_A" -> (path, leaf, the slot's buffer view): one lookup a tensor on the push's hot path
        self._index = {f"{path}.{leaf}": (path, leaf, getattr(slot, leaf))
                       for path, slot in self.slots.items() for leaf in ADAPTER_LEAVES}

    @property
    def pristine_bytes(self) -> int:
        return 0  # the weights are never rewritten, so no pristine copy is kept

    def take(self, named: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        """The stream minus the adapters, which are copied into their slots when it ends (one multi-tensor copy)."""
        copies: list[tuple[Tensor, Tensor]] = []  # (slot, the stream's tensor: a view of a receive buffer)
        return copy_at_end(self._take(named, copies), copies)

    def _take(self, named: Iterable[tuple[str, Tensor]], copies: list[tuple[Tensor, Tensor]]
              ) -> Iterator[tuple[str, Tensor]]:
        """A push's host work grows with its tensor count (449 at 7B, r 64, every projection and norm), and on a
        staged CUDA IPC push it is what the generator is paused for: each adapter costs one dict lookup, one shape
        comparison (its slot's shape implies check_adapter's rule) and the append; the checks that say what is
        wrong run only for a tensor that fails."""
        index, arrived = self._index, self.arrived
        for name, t in named:
            hit = index.get(name)
            if hit is None:
                if name.rpartition(".")[2] in ADAPTER_LEAVES:
                    raise ValueError(f"adapter {name!r} for a module that is no LoRA target of this engine "
                                     f"(targets: {sorted({p.rsplit('.', 1)[-1] for p in self.slots})})")
                yield name, t
                continue
            path, leaf, kept = hit
            if t.shape != kept.shape or not t.is_floating_point():
                self._refuse(name, path, leaf, t)
            copies.append((kept, t if t.device == kept.device else t.to(kept.device)))
            leaves = arrived.get(path)
            if leaves is None:
                arrived[path] = {leaf}
            else:
                leaves.add(leaf)

    def slot_of(self, name: str) -> tuple[str, str, Tensor] | None:
        """(target path, leaf, the slot's buffer view) of an adapter's pushed name; None for any other name."""
        return self._index.get(name)

    def arrive(self, adapters: Mapping[str, AbstractSet[str]]) -> None:
        """Count adapters copied into their slots by other means (a `LoadPlan`) as arrived in this update."""
        arrived = self.arrived
        for path, leaves in adapters.items():
            got = arrived.get(path)
            if got is None:
                arrived[path] = set(leaves)
            else:
                got |= leaves

    def _refuse(self, name: str, path: str, leaf: str, t: Tensor) -> None:
        """The one-line error for an adapter that does not fit its slot."""
        check_adapter(name, leaf, t, self.weight_shapes[path])
        raise ValueError(f"{name}: rank {t.shape[0] if leaf == 'lora_A' else t.shape[1]}, but this engine "
                         f"keeps its adapters unmerged at rank {self.rank} (learner.lora_rank when it "
                         "started); a new rank needs a new run, or generator.lora_apply = \"merge\"")

    def apply(self, model: nn.Module) -> list[str]:
        """End of an update: every target that got an adapter got both; -> their paths. The model already computes
        with them (they were copied into its buffers)."""
        arrived, self.arrived = self.arrived, {}
        for path, leaves in arrived.items():
            if len(leaves) != len(ADAPTER_LEAVES):
                (got,) = leaves
                raise ValueError(f"{path}: lora_A and lora_B must arrive together (got only {got})")
        return list(arrived)


def adapters_for(model: nn.Module, lora: LoraSpec | None, weights_dtype: str) -> AdapterMerge | AdapterSlots | None:
    """How a torch engine applies the adapters of LoRA pushes (None: every push is whole weights)."""
    if lora is None:
        return None
    if lora.apply == "merge":
        return AdapterMerge(model, lora)
    if weights_dtype != "model":
        raise ValueError(f"generator.lora_apply=\"unmerged\" with generator.weights_dtype={weights_dtype!r}: the fp8 "
                         "projections take quantized inputs the adapters cannot share; set generator.lora_apply = "
                         "\"merge\"")
    return AdapterSlots(model, lora)
