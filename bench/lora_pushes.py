"""LoRA's weight pushes into fresh torch engines, for bench.logprob_agreement --lora-rank.

The learner side is a Hugging Face model wrapped as the learner wraps it (`asyncrl.learner.lora`: every
`learner.lora_targets` projection a LoraLinear, the `learner.lora_trainable` norms fp32 masters beside fp32
adapters, the rest frozen in the compute dtype), its adapters and norms drawn so that the model moves:

    A [r, in]   normal, std 1 / sqrt(in)
    B [out, r]  normal, rescaled so that scale * B @ A has LORA_DELTA times the std of the base weight W
    norm gains  each multiplied by 1 + NORM_JITTER * normal

Three engines start from copies of the base weights and get one weight update each, as `WeightReceiver` drives
it (pause -> begin_weight_update -> load_weights per bucket, from views of the bucket's flat buffer ->
end_weight_update -> resume), the stream packed into buckets as `WeightSender` packs it:

    adapter   an engine with the generator's LoraSpec gets `lora.adapter_push` (A, B and the norms, fp32, as
              the learner sends them with lora_push = "adapter"); its AdapterMerge merges at the update's end
    unmerged  the same push into an engine that keeps the adapters apart in its matmuls (generator.lora_apply =
              "unmerged": AdapterSlots)
    full      a plain engine gets `lora.merged_tensors` (W + scale * B @ A computed by the learner), cast to
              the compute dtype as the learner sends a merged push
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

import torch
from torch import nn

from asyncrl.engine.bucket_layout import unflatten
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.learner import lora
from asyncrl.learner.config import LearnerConfig
from asyncrl.weights.bucket import DEFAULT_BUCKET_BYTES, iter_buckets

LORA_DELTA = 0.5  # std of scale * B @ A over the std of the base weight it is added to
NORM_JITTER = 0.1  # relative std of the change drawn for each trained norm gain


def learner_lora(hf: nn.Module, cfg: LearnerConfig, dtype: torch.dtype, seed: int) -> dict[str, lora.LoraLinear]:
    """Wrap `hf` in place as the learner does for `cfg` (lora_rank > 0) and draw its trained tensors (module
    docstring); returns {module path: LoraLinear}. The trained tensors are fp32 masters afterwards."""
    modules = lora.apply(hf, cfg.lora_targets, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout)
    trainable = lora.trainable_paths(hf, cfg.lora_trainable, cfg.lora_targets)
    lora.freeze_base(hf, dtype, trainable)
    gen = torch.Generator().manual_seed(seed)
    params = dict(hf.named_parameters())
    with torch.no_grad():
        for module in modules.values():
            a = torch.randn(module.lora_A.shape, generator=gen) / module.in_features**0.5
            b = torch.randn(module.lora_B.shape, generator=gen)
            delta = module.scale * (b @ a)  # [out, in]
            b *= LORA_DELTA * module.weight.float().std().item() / delta.std().item()
            module.lora_A.copy_(a)
            module.lora_B.copy_(b)
        for name in trainable:
            p = params[name]
            p.mul_(1 + NORM_JITTER * torch.randn(p.shape, generator=gen).to(p.device))
    return modules


def engine_spec(cfg: LearnerConfig, apply: str = "merge") -> LoraSpec:
    """The LoraSpec a generator builds from the learner's config (services/generator.py, engine_lora), with
    `apply` as generator.lora_apply."""
    return LoraSpec(tuple(cfg.lora_targets), cfg.lora_alpha / cfg.lora_rank, cfg.lora_rank, apply)


def push(engine, named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None, version: int = 1) -> int:
    """One weight update of `engine` as WeightReceiver runs it, the stream bucketed as WeightSender buckets it
    (floating tensors cast to `dtype`; None: as given). Returns the bytes pushed."""
    nbytes = 0
    engine.pause("continue")
    engine.begin_weight_update()
    for flat, layout in iter_buckets(named, DEFAULT_BUCKET_BYTES, engine.device, dtype):
        engine.load_weights(unflatten(flat, layout))
        nbytes += flat.numel()
    engine.end_weight_update(version)
    engine.resume()
    return nbytes


def pushed_engines(base: nn.Module, hf: nn.Module, modules: dict[str, lora.LoraLinear], cfg: LearnerConfig,
                   dtype: torch.dtype, make: Callable[..., object]) -> dict[str, tuple[object, int]]:
    """{"adapter" | "unmerged" | "full": (engine, bytes pushed)}: three engines built by `make(model, lora=...)`
    from copies of `base`, given the learner model `hf`'s adapter push (merged by the engine, or kept unmerged in
    its matmuls: generator.lora_apply) and its merged push (module docstring)."""
    out = {}
    for kind in ("adapter", "unmerged"):
        engine = make(copy.deepcopy(base), lora=engine_spec(cfg, "merge" if kind == "adapter" else kind))
        out[kind] = engine, push(engine, lora.adapter_push(hf.named_parameters()), None)
    full = make(copy.deepcopy(base))
    merged = lora.merged_tensors(((n, p.detach()) for n, p in hf.named_parameters()), modules)
    out["full"] = full, push(full, merged, dtype)
    return out


def bitwise_differences(a: nn.Module, b: nn.Module) -> dict[str, float]:
    """{parameter name: max |a - b|} of every parameter whose bits differ between two models of one shape."""
    out = {}
    for (name, p), (other, q) in zip(a.named_parameters(remove_duplicate=False),
                                     b.named_parameters(remove_duplicate=False), strict=True):
        assert name == other, (name, other)
        if not torch.equal(p.detach().contiguous().view(torch.uint8), q.detach().contiguous().view(torch.uint8)):
            out[name] = (p.float() - q.float()).abs().max().item()
    return out


def to_compute_dtype(hf: nn.Module, dtype: torch.dtype) -> None:
    """The learner's forward copy of its parameters: fp32 masters (adapters, norms) cast to the compute dtype,
    as FSDP2's mixed precision does for the forward."""
    for p in hf.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
