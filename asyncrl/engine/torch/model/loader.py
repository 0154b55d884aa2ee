"""Build the compact model from a Hugging Face folder, and copy named weights into it in place.

A folder with one `model.safetensors`, a supported architecture and the default RoPE is read directly: its
config through `AutoConfig`, its tensors with safetensors (cast to the dtype as `from_pretrained` casts them),
RoPE by the rule of transformers' default rotary embedding. That skips importing and building transformers'
own model (~1.7 s of a generator's start-up on a 2-core VM, for every restart). Any other folder (sharded or
`.bin` weights, other RoPE types, names that do not match) goes through `AutoModelForCausalLM.from_pretrained`
(the same path the learner uses), and the compact model takes over that model's tensors (no second copy) and
its RoPE tables. `tests/engine/test_loader.py` holds both paths to the same model, bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from asyncrl.engine.torch.model.config import SUPPORTED_ARCHITECTURES, ArchConfig, rope_type
from asyncrl.engine.torch.model.decoder import CausalLM
from asyncrl.engine.torch.model.layers import default_inv_freq
from asyncrl.engine.torch.model.multi_copy import multi_copy

# Buffers that a learner's state_dict may carry but that are derived, not trained.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.original_inv_freq")


def load_hf_folder(path: str | os.PathLike, dtype: torch.dtype, device: torch.device,
                   image: Mapping[str, torch.Tensor] | None = None) -> CausalLM:
    """The compact model of folder `path` on `device`; with `image` (a shared base image on `device`) its matrices
    are the image's tensors (`adopt`) and only the rest (norms, biases) is copied to the device."""
    model = load_direct(path, dtype, image)
    if model is None:
        from transformers import AutoModelForCausalLM  # heavy import, only when a model is loaded

        hf_model = AutoModelForCausalLM.from_pretrained(os.fspath(path), dtype=dtype)
        model = build_from_hf(hf_model)
        del hf_model
    if image is not None:
        adopt(model, image)  # checks the image against the model (the direct path built it from the image already)
    model.to(device)
    model.tie_weights()
    return model


def load_direct(path: str | os.PathLike, dtype: torch.dtype,
                image: Mapping[str, torch.Tensor] | None = None) -> CausalLM | None:
    """The compact model of folder `path` (on CPU) without building transformers' model; None where the folder
    needs that path (see the module doc). With `image` its tensors are taken as they are (on their device) and only
    the file's other tensors are read: a shared base's matrices are never read from disk."""
    folder = Path(path)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return None
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(folder)
    names = getattr(config, "architectures", None) or []
    if len(names) != 1 or names[0] not in SUPPORTED_ARCHITECTURES or rope_type(config) != "default":
        return None
    generation = GenerationConfig.from_pretrained(folder) if (folder / "generation_config.json").is_file() else None
    arch = ArchConfig.from_hf(names[0], config, generation)
    state = _read(weights, dtype, skip=set(image or ()))
    model, _ = _assemble(arch, {**state, **(image or {})})  # an image of other names: None, and `adopt` says why
    if model is None:
        return None  # names of another layout: transformers' loading knows its renames
    model.model.rotary_emb.inv_freq = default_inv_freq(arch.head_dim, arch.rope_theta)
    model.model.rotary_emb.attention_scaling = 1.0
    return model


def _read(weights: Path, dtype: torch.dtype, skip: set[str]) -> dict[str, torch.Tensor]:
    """The file's tensors but `skip`, floating point ones cast to `dtype`."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        out = {k: f.get_tensor(k) for k in f.keys() if k not in skip}
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in out.items()}


def build_from_hf(hf_model: Any) -> CausalLM:
    """Compact model sharing `hf_model`'s tensors (same device and dtype)."""
    arch = ArchConfig.from_hf(type(hf_model).__name__, hf_model.config, getattr(hf_model, "generation_config", None))
    model, mismatch = _assemble(arch, hf_model.state_dict())
    if model is None:
        raise ValueError(f"{arch.architecture}: weights do not match the compact model ({mismatch})")
    _copy_rope(model, hf_model)
    return model


def _assemble(arch: ArchConfig, tensors: dict[str, torch.Tensor]) -> tuple[CausalLM | None, str]:
    """(the compact model taking over `tensors` by Hugging Face name, frozen, in eval mode, ""), or (None, which
    names are missing or unexpected). Its RoPE table is the caller's to set."""
    state = {k: v for k, v in tensors.items() if not k.endswith(IGNORED_SUFFIXES)}
    if arch.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = CausalLM(arch)
    result = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in result.missing_keys if not (arch.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        return None, f"missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
    model.tie_weights()
    model.requires_grad_(False)
    return model.eval(), ""


def _copy_rope(model: CausalLM, hf_model: Any) -> None:
    rotary = getattr(getattr(hf_model, "model", None), "rotary_emb", None)
    ours = model.model.rotary_emb
    if rotary is not None and getattr(rotary, "inv_freq", None) is not None:
        ours.inv_freq = rotary.inv_freq.detach().float().clone()
        ours.attention_scaling = float(getattr(rotary, "attention_scaling", 1.0))
    else:
        ours.inv_freq = default_inv_freq(model.cfg.head_dim, model.cfg.rope_theta)


def adopt(model: torch.nn.Module, image: Mapping[str, torch.Tensor], names: Iterable[str] | None = None,
          owner: str = "this model", dtype: torch.dtype | None = None) -> frozenset[str]:
    """Make each parameter of `names` (default: every matrix of `model`) the tensor of the same Hugging Face name
    in `image` (a shared base image's views: asyncrl/weights/base_image.py), in every module that holds it (a tied
    head too), dropping the model's own copy; -> the names. The image must hold exactly those names, with their
    shapes and dtypes (`dtype`: the one dtype the image must have, where the model's own copy is in another). The
    engine calls it before the projections are fused (they then fuse into views of the image: layers.fuse_linears)
    and before the model moves to its device (the image is there already); the learner with its frozen matrices
    (lora.adopt_base)."""
    params = dict(model.named_parameters())
    own = {n: params[n] for n in names} if names is not None else {
        n: p for n, p in params.items() if p.dim() == 2 and p.is_floating_point()}
    missing, extra = sorted(set(own) - set(image)), sorted(set(image) - set(own))
    if missing or extra:
        raise ValueError(f"generator.share_base: the base image does not match {owner} (missing {missing[:3]}, "
                         f"unexpected {extra[:3]}); the holder and every process must load one model.path")
    for name, old in own.items():
        t, want = image[name], dtype or old.dtype
        if t.shape != old.shape or t.dtype != want:
            raise ValueError(f"generator.share_base: {name} is {t.dtype} {tuple(t.shape)} in the base image, "
                             f"{want} {tuple(old.shape)} in {owner}; every process must use one model.dtype")
        new = torch.nn.Parameter(t, requires_grad=False)
        for module in model.modules():
            for leaf, p in module._parameters.items():
                if p is old:
                    module._parameters[leaf] = new
    return frozenset(own)


def load_weights(model: CausalLM, named_tensors: Iterable[tuple[str, torch.Tensor]],
                 params: Mapping[str, torch.Tensor] | None = None, read_only: frozenset[str] = frozenset()
                 ) -> list[str]:
    """Copy tensors by Hugging Face name into `model`'s parameters, in place (dtype and device are
    converted). Validates the whole batch first, so a bad name or shape changes nothing. Returns the
    names loaded. `params`: `parameter_index(model)`, kept by a caller that loads often (building it walks
    every module: ~1 ms a push at 28 layers, host time the engine is paused for). `read_only`: names no update
    may write (the matrices of a shared base image, `adopt`)."""
    items = [(name, t) for name, t in named_tensors if not name.endswith(IGNORED_SUFFIXES)]
    if not items:
        return []
    written = [name for name, _ in items if name in read_only]
    if written:
        raise ValueError(f"generator.share_base: a push writes {written[0]}, a tensor of the shared base image this "
                         "engine computes with (a learner.lora_trainable matrix, or a full push); the base is read "
                         "only. Train only vectors (norms) beside the adapters, or set generator.share_base = false")
    params = parameter_index(model) if params is None else params
    unknown = [name for name, _ in items if name not in params]
    if unknown:
        raise ValueError(f"load_weights: unknown parameter names {unknown[:10]} (model is {model.cfg.architecture})")
    bad = [f"{n}: got {tuple(t.shape)}, want {tuple(params[n].shape)}" for n, t in items if t.shape != params[n].shape]
    if bad:
        raise ValueError(f"load_weights: shape mismatch: {bad[:10]}")
    multi_copy([(params[n], t) for n, t in items])  # multi-tensor copies (casting): a copy per tensor was host-bound
    return [name for name, _ in items]


def parameter_index(model: CausalLM) -> dict[str, torch.Tensor]:
    """Every parameter of `model` by Hugging Face name (tied ones under each name): what load_weights writes."""
    return dict(model.named_parameters(remove_duplicate=False))
