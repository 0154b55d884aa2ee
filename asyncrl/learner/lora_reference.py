"""The KL reference policy with LoRA (`learner.lora_rank > 0` and `learner.kl_coef > 0`): the policy model itself,
for the length of a `with LoraReference.mode():` block, with every adapter switched off (each LoraLinear computes
its frozen base alone) and the base tensors trained beside the adapters (`learner.lora_trainable`, the norms'
gains by default) set back to their values from the model path. Without LoRA the trainer loads a second, frozen
model instead; with it the frozen base already is the reference's weights, so one base is held instead of two and
only a pristine copy of the few trained base tensors is kept (docs/lora.md: the bytes saved).

Where a trained base tensor lives, which `mode()` sets to its pristine value and restores afterwards:

    no process group (fp32, e.g. CPU)     the module's parameter, which is the fp32 master itself
    FSDP2, any number of ranks            the fp32 master's local shard (DTensor.to_local()), which each unshard
                                          all-gathers and casts to the compute dtype
    FSDP2, one rank (fsdp.ComputeCopy)    besides, the unsharded compute-dtype copy the module holds from the first
                                          forward on: forwards read it, not the master

The pristine copy is taken when the trainer is built (before any step or checkpoint load), in the masters' form:
fp32, this rank's shard. On exit every tensor set is copied back from a clone taken on entry (bit for bit, also
when the block raises), and a one-rank model that the block's forward unsharded is resharded again, as it was on
entry, so that the next forward unshards from the restored masters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn

from asyncrl.learner import fsdp, lora


class LoraReference:
    def __init__(self, model: nn.Module, modules: Iterable[lora.LoraLinear], masters: Iterable[tuple[str, Tensor]],
                 trained: Sequence[str]) -> None:
        """model: the policy (a PolicyModel: its HF model at `.hf`); modules: its LoraLinears; masters: (HF name,
        parameter) as captured while FSDP2 holds the masters (Trainer.masters); trained: the HF names of the
        `learner.lora_trainable` tensors (Trainer.lora_trainable)."""
        self.model = model
        self.modules = list(modules)
        keep = set(trained)
        self.masters = {name: p for name, p in masters if name in keep}
        assert self.masters.keys() == keep, f"trained base tensors without a master: {keep - self.masters.keys()}"
        # name -> fp32 [this rank's shard of the tensor], the values from the model path
        self.pristine = {name: fsdp.local_tensor(p.detach()).clone() for name, p in self.masters.items()}

    def pristine_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.pristine.values())

    @contextlib.contextmanager
    def mode(self) -> Iterator[None]:
        """Inside the block the policy computes the reference policy, in eval mode and without gradients."""
        was_training, was_resharded = self.model.training, self._resharded()
        saved: list[tuple[Tensor, Tensor]] = []  # (tensor set to its pristine value, a clone of what it held)
        try:
            with torch.no_grad(), lora.adapters_off(self.modules):
                if was_training:
                    self.model.eval()
                self._set_pristine(saved)
                yield
        finally:
            with torch.no_grad():
                for tensor, value in reversed(saved):
                    tensor.copy_(value)
            if was_resharded and not self._resharded():
                self.model.reshard()  # drop the compute copy the block's forward made from the pristine values
            if was_training:
                self.model.train()

    def _set_pristine(self, saved: list[tuple[Tensor, Tensor]]) -> None:
        """Every trained base tensor, and one rank's compute copy of it, to its pristine value; `saved` gets each
        tensor before it is written."""
        live = dict(self.model.hf.named_parameters())  # what forwards read now
        for name, master in self.masters.items():
            tensors = [fsdp.local_tensor(master.detach())]  # fp32 [local shard]
            if live[name] is not master:  # one rank, unsharded: the compute copy, [whole tensor] in the compute dtype
                tensors.append(live[name].detach())
            for tensor in tensors:
                saved.append((tensor, tensor.clone()))
                tensor.copy_(self.pristine[name])  # casts to a compute copy's dtype as FSDP2's unshard does

    def _resharded(self) -> bool:
        """Whether the module parameters are FSDP2's sharded DTensors (or there is nothing to reshard)."""
        return hasattr(self.model, "reshard") and all(
            hasattr(p, "device_mesh") for name, p in self.model.hf.named_parameters() if name in self.masters)
