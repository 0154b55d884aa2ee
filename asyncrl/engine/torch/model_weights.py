"""`ModelWeights`: what a weight update writes into a torch engine's model, and how.

The engine's side of a push, between `begin_weight_update` and `end_weight_update` (engine.py owns the update's
session: the drain before it, the version and the prefix cache's new epoch after it):

    load(named)              by Hugging Face name: parameters in place (model/loader.py), LoRA adapters into their
                             slots or merge buffers (adapter_slots.py / adapter_merge.py), a shared base's tensors
                             refused (read only)
    load_bucket(flat, ...)   a received flat bucket: its layout's plan replayed (load_plan.py), or `load` of its views
    finish()                 adapters merged or checked, fp8 images re-quantized from the updated weights

What it keeps: the parameter index (walked once), the adapters' apparatus, the fp8 images and the plans. Adapters and
fp8 images are made here, in the engine's setup, before the KV cache takes the free memory.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from asyncrl.engine.bucket_layout import BucketLayout, unflatten
from asyncrl.engine.torch.adapter_merge import AdapterMerge, LoraSpec
from asyncrl.engine.torch.adapter_slots import adapters_for
from asyncrl.engine.torch.load_plan import LoadPlans
from asyncrl.engine.torch.model import CausalLM, load_weights, parameter_index
from asyncrl.engine.torch.model.fp8 import fp8_weights
from asyncrl.engine.torch.model.loader import IGNORED_SUFFIXES


class ModelWeights:
    """The write side of one engine's model. `shared`: names whose tensors are a shared base image's (read only)."""

    def __init__(self, model: CausalLM, lora: LoraSpec | None, weights_dtype: str, shared: frozenset[str]) -> None:
        self.model = model
        self.adapters = adapters_for(model, lora, weights_dtype)
        self.fp8 = fp8_weights(model, weights_dtype)
        self.shared = shared
        self.params = parameter_index(model)  # what a push loads into, by name (walked once, not per bucket)
        # a bucket layout's copies, worked out once; a merging engine takes the general path (its merge needs
        # the adapters it was sent, by name, at the end of the update)
        self.plans = None if isinstance(self.adapters, AdapterMerge) else LoadPlans(
            self.params, self.adapters, IGNORED_SUFFIXES)

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_weights(self.model, self.adapters.take(named_tensors) if self.adapters else named_tensors, self.params,
                     read_only=self.shared)

    def load_bucket(self, flat: torch.Tensor, layout: BucketLayout) -> None:
        """`flat` (uint8 [nbytes]) as `layout` (validated by the caller) says."""
        if self.plans is None:
            self.load(unflatten(flat, layout, validated=True))
        else:
            self.plans.load(flat, layout, self.load)

    def finish(self) -> None:
        """The end of an update: adapters merged (or checked complete), fp8 images re-quantized."""
        if self.adapters:
            self.adapters.apply(self.model)
        if self.fp8:
            self.fp8.refresh()
