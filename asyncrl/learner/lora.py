"""LoRA in the learner: low-rank adapters beside frozen base linears (`learner.lora_rank > 0`).

    y = x W^T + b + scale * (dropout(x) A^T) B^T      W [out, in], b [out] frozen; A [r, in], B [out, r] trained
    scale = lora_alpha / lora_rank

`apply` swaps every targeted `nn.Linear` of a Hugging Face model for a `LoraLinear` that owns the Linear's own
`weight` and `bias` tensors under the same names, so every base parameter keeps its Hugging Face name and
the adapters appear beside it as `<module>.lora_A` / `<module>.lora_B`. B starts at zero: the wrapped model
computes exactly the base model until the first update.

The rest of the learner sees adapters only through these functions:

    adapter_names / is_adapter    the adapter tensors
    trainable_paths / freeze_base which base parameters train beside the adapters (`learner.lora_trainable`, the
                                  norms' gains by default) and the freezing of the rest; the optimizer and the
                                  checkpoint hold the trained parameters only (requires_grad)
    merged_tensors                (HF name, tensor) of the merged model, W + scale * B @ A, computed fresh from
                                  the pristine base each call (never merged in place): the merged weight push
                                  (SGLang), the rescorer and the merged export read it
    adapter_push / base_push      the adapter-only push (`learner.lora_push = "adapter"`, the torch engine): each
                                  version sends A, B and the trained base tensors (norms), a joining generator gets
                                  the base and the adapters;
                                  the engine merges from its pristine base (asyncrl/engine/torch/adapter_merge.py)
    adapters_off                  the wrapped linears compute the frozen base alone, inside a `with` block (the
                                  KL reference pass, lora_reference.py)
    adopt_base                    the frozen matrices become views of a shared base image (generator.share_base:
                                  asyncrl/weights/base_image.py), kept out of FSDP
    peft_state_dict / peft_config an adapter folder in PEFT's layout (asyncrl/models/peft_adapter.py)
    check_targets                 the target and trainable names against a model folder, without loading weights
                                  (preflight)
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asyncrl.engine.torch.adapter_merge import merge
from asyncrl.engine.torch.model.loader import adopt
from asyncrl.learner import fsdp

log = logging.getLogger("asyncrl.learner.lora")
ADAPTERS = ("lora_A", "lora_B")


class LoraLinear(nn.Module):
    """A frozen `nn.Linear` plus a trained low-rank update (the module docstring's formula)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.rank, self.scale = rank, alpha / rank
        self.register_parameter("weight", base.weight)  # [out, in], the base's own tensor (same name)
        self.register_parameter("bias", base.bias)  # [out] or None
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=device))  # [r, in] fp32
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=device))  # [out, r] fp32
        bound = 1.0 / math.sqrt(self.in_features)  # nn.Linear's default (kaiming-uniform, a = sqrt(5)) bound
        with torch.no_grad():
            self.lora_A.uniform_(-bound, bound)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.adapter_on = True  # False inside `adapters_off`: the frozen base alone

    def forward(self, x: Tensor) -> Tensor:
        """x [..., in] -> [..., out]; the adapters run in the base weight's (compute) dtype."""
        if not self.adapter_on:
            return F.linear(x, self.weight, self.bias)
        dtype = self.weight.dtype
        low = F.linear(self.dropout(x), self.lora_A.to(dtype))  # [..., r]
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(low, self.lora_B.to(dtype))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}, scale={self.scale:g}"


def target_paths(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """Module paths of the `nn.Linear`s whose last name component is one of `targets`. A target that names no
    linear layer, or names the output head, is a ValueError naming it."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = {path: m for path, m in model.named_modules() if isinstance(m, nn.Linear)}
    for target in targets:
        if any(path.rsplit(".", 1)[-1] == target and m is head for path, m in linears.items()):
            raise ValueError(f"learner.lora_targets: {target!r} is the output head, which the fused logprob reads "
                             "as a plain weight; LoRA covers the decoder's linear layers only, drop it")
    found = sorted(path for path in linears if path.rsplit(".", 1)[-1] in targets)
    names = {path.rsplit(".", 1)[-1] for path in found}
    for target in targets:
        if target not in names:
            known = sorted({p.rsplit(".", 1)[-1] for p, m in linears.items() if m is not head})
            raise ValueError(f"learner.lora_targets: {target!r} names no linear layer of {type(model).__name__} "
                             f"(its linear layers: {', '.join(known)}); fix or drop it")
    return found


def apply(model: nn.Module, targets: Sequence[str], rank: int, alpha: float, dropout: float) -> dict[str, LoraLinear]:
    """Wrap every target linear of `model` in place; returns {module path: LoraLinear}."""
    wrapped = {}
    for path in target_paths(model, targets):
        parent, _, child = path.rpartition(".")
        owner = model.get_submodule(parent)
        wrapped[path] = LoraLinear(getattr(owner, child), rank, alpha, dropout)
        setattr(owner, child, wrapped[path])
    return wrapped


@contextlib.contextmanager
def adapters_off(modules: Iterable[LoraLinear]) -> Iterator[None]:
    """Inside the block every module of `modules` computes x W^T + b alone (no adapter GEMM); each is switched
    back on when the block ends, however it ends. Compiled layers guard on the flag: the first pass with
    the adapters off compiles each layer's graph once more."""
    switched = []
    try:
        for module in modules:
            if module.adapter_on:
                module.adapter_on = False
                switched.append(module)
        yield
    finally:
        for module in switched:
            module.adapter_on = True


def is_adapter(name: str) -> bool:
    """Whether the parameter `name` (any prefix) is a LoRA adapter tensor."""
    return name.rsplit(".", 1)[-1] in ADAPTERS


def trainable_paths(model: nn.Module, trainable: Sequence[str], targets: Sequence[str] = ()) -> list[str]:
    """HF names of the base parameters trained beside the adapters: those owned directly by a module whose
    last name component ends with one of `trainable` ("norm": input_layernorm, post_attention_layernorm,
    model.norm). Tied aliases appear once, under `named_parameters`' name. A name matching no parameter, or
    a LoRA target, is a ValueError naming learner.lora_trainable."""
    owned: dict[int, str] = {}
    matched: set[str] = set()
    for path, module in model.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        hits = [name for name in trainable if leaf.endswith(name)]
        if not hits or not any(True for _ in module.parameters(recurse=False)):
            continue
        if leaf in targets or isinstance(module, LoraLinear):
            raise ValueError(f"learner.lora_trainable: {hits[0]!r} matches {path}, a LoRA target (it has adapters); "
                             "drop it from learner.lora_trainable or from learner.lora_targets")
        matched.update(hits)
        for name, p in module.named_parameters(recurse=False):
            owned.setdefault(id(p), f"{path}.{name}")
    for name in trainable:
        if name not in matched:
            leaves = sorted({p.rsplit(".", 1)[-1] for p, m in model.named_modules()
                             if p and any(True for _ in m.parameters(recurse=False))})
            raise ValueError(f"learner.lora_trainable: {name!r} ends no module name of {type(model).__name__} that "
                             f"holds parameters (its modules: {', '.join(leaves)}); fix or drop it")
    return [name for name, p in model.named_parameters() if id(p) in owned]


def freeze_base(model: nn.Module, dtype: torch.dtype, trainable: Sequence[str] = ()) -> None:
    """Every parameter of `model` except the adapters and the `trainable` base parameters (HF names,
    `trainable_paths`): no gradient, held in `dtype` (the compute dtype: no fp32 master is kept of what is never
    updated). The adapters and the trainable ones stay trained fp32 masters."""
    keep = set(trainable)
    for name, p in model.named_parameters():
        if is_adapter(name) or name in keep:
            p.requires_grad_(True)
            if p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()
            continue
        p.requires_grad_(False)
        if p.dtype != dtype and p.is_floating_point():
            p.data = p.data.to(dtype)


def adapter_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters() if is_adapter(name)]


def merge_weight(weight: Tensor, lora_a: Tensor, lora_b: Tensor, scale: float) -> Tensor:
    """W [out, in] + scale * B [out, r] @ A [r, in] -> [out, in] fp32 (a new tensor: W is left as it is). The
    engine's own merge, so that an adapter push and a merged push give the same weights bit for bit."""
    return merge(weight, lora_a, lora_b, scale)


def merged_tensors(named: Iterable[tuple[str, Tensor]], modules: dict[str, LoraLinear]) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of the wrapped model, in its order -> (HF name, tensor) of the merged model: each LoRA
    module's weight merged with its adapters (yielded once its last tensor has arrived), adapters dropped.
    Consumes every item (a collective stream under FSDP stays in step on every rank)."""
    held: dict[str, dict[str, Tensor]] = {}
    for name, t in named:
        path, _, leaf = name.rpartition(".")
        module = modules.get(path)
        if module is None:
            yield name, t
            continue
        parts = held.setdefault(path, {})
        parts[leaf] = t
        if len(parts) < (4 if module.bias is not None else 3):
            continue
        del held[path]
        yield f"{path}.weight", merge_weight(parts["weight"], parts["lora_A"], parts["lora_B"], module.scale)
        if "bias" in parts:
            yield f"{path}.bias", parts["bias"]
    assert not held, f"LoRA modules with missing tensors: {sorted(held)}"


def adapter_push(masters: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full fp32 tensor) of every trained tensor, nothing else: the adapters ("<module>.lora_A" /
    ".lora_B") and the base parameters of `learner.lora_trainable` (e.g. "model.norm.weight", which the engine
    loads as they are). One version's adapter-only push. Collective under FSDP (every rank iterates it); the
    frozen base is never gathered."""
    return ((name, fsdp.full_tensor(p.detach())) for name, p in masters if p.requires_grad)


def base_push(masters: Iterable[tuple[str, Tensor]], shared: frozenset[str] = frozenset()
              ) -> Iterator[tuple[str, Tensor]]:
    """Every tensor as the learner holds it, under its HF name: the frozen base in the compute dtype and the fp32
    adapters, minus `shared` (the matrices of a shared base image, which the generator maps itself). The full push
    to a (re)joining generator that merges the adapters itself. Collective under FSDP."""
    return ((name, fsdp.full_tensor(p.detach())) for name, p in masters if name not in shared)


def adopt_base(model: nn.Module, image: dict[str, Tensor], trainable: Sequence[str], dtype: torch.dtype,
               device: torch.device) -> frozenset[str]:
    """Make every frozen matrix of `model` (HF names) the tensor of that name in `image`, a shared base image's views
    (generator.share_base), dropping the model's own copy (the engine's `adopt`); -> the names adopted, which the
    caller keeps out of FSDP (they are never sharded, cast or updated). Call after `apply` and before the model
    moves to its device. The image must hold exactly the model's matrices, none of them trained, in the compute
    `dtype` on `device`."""
    first = next(iter(image.values()))
    if first.dtype != dtype or first.device.type != device.type:
        raise ValueError(f"generator.share_base: the base image is {first.dtype} on {first.device}, the learner "
                         f"computes in {dtype} on {device}; both follow model.dtype and one device")
    names = [n for n, p in model.named_parameters() if p.dim() == 2 and p.is_floating_point() and not is_adapter(n)]
    trained = sorted(set(trainable) & set(names))
    if trained:
        raise ValueError(f"generator.share_base: learner.lora_trainable trains {trained[0]}, a matrix of the shared "
                         "base (read only); train only vectors (norms) beside the adapters, or set "
                         "generator.share_base = false")
    adopted = adopt(model, image, names, owner="the learner's model", dtype=dtype)  # loaded in fp32, computed in dtype
    log.info("the frozen base is the shared image's: %d matrices, %.1f MB not held by this process", len(adopted),
             sum(image[n].numel() * image[n].element_size() for n in adopted) / 1e6)
    return adopted


def peft_saved(tensors: dict[str, Tensor], trainable: Sequence[str]) -> dict[str, Tensor]:
    """The trained base parameters among `tensors` (HF names) under PEFT's keys for a `modules_to_save` module,
    "base_model.model.<module>.weight" (what `get_peft_model_state_dict` writes and `PeftModel.from_pretrained`
    loads into the module's trained copy)."""
    return {f"base_model.model.{name}": tensors[name] for name in trainable}


def peft_modules_to_save(trainable: Sequence[str]) -> list[str] | None:
    """adapter_config.json's `modules_to_save`: the last name component of every module holding a trained base
    parameter (PEFT matches a module whose name is it or ends with "." + it), None when there is none."""
    return sorted({name.rsplit(".", 2)[-2] for name in trainable}) or None


def check_targets(model_path: str | Path, targets: Sequence[str], trainable: Sequence[str] = ()) -> None:
    """The launcher's preflight: `targets` (learner.lora_targets) and `trainable` (learner.lora_trainable) against
    the architecture of the folder `model_path` (config.json only; the skeleton is built on the meta device,
    nothing is loaded). ValueError naming the first bad name and its key."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_path), local_files_only=True)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    target_paths(skeleton, targets)
    trainable_paths(skeleton, trainable, targets)
