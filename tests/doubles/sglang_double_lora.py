"""The double's LoRA serving: /load_lora_adapter, /unload_lora_adapter and /generate's `lora_path`, with the rules
of SGLang's LoRA registry and manager (docs/sglang.md, "LoRA adapters").

* Every endpoint refuses when the server runs without --enable-lora (`DoubleConfig.enable_lora`); so does a
  /generate naming an adapter (stricter than servers that ignore `lora_path` then).
* Load reads a PEFT folder (adapter_config.json + adapter_model.safetensors) and refuses a name already loaded,
  a rank above --max-lora-rank and a target outside --lora-target-modules (q/k/v and gate/up may be named fused),
  with SGLang's messages and `{"success": false, "error_message": ...}` at HTTP 400.
* A /generate naming an adapter that is not loaded is a 400. An unload drops the name at once (new requests
  naming it fail), then waits until no request that uses it is in flight, as SGLang's does; an unknown name fails.
* The adapter is applied: a request's logits are the base's version key plus a digest of its adapter's tensors
  and scale (`lora_key`), so tests tell which version generated each token.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tests.doubles.sglang_double_generate import BadRequest

if TYPE_CHECKING:
    from tests.doubles.sglang_double import SGLangDouble

DISABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}  # fmt: skip


@dataclass(slots=True)
class LoadedLora:
    path: str
    rank: int
    key: str  # what the fake model's logits depend on (lora_key)
    in_use: int = 0  # requests in flight that name it


def lora_key(tensors: dict[str, torch.Tensor], scale: float) -> str:
    """Digest of an adapter (its PEFT tensors, fp32 bytes, and scale): part of the fake model's version key."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().to(torch.float32).contiguous().numpy().tobytes())
    h.update(repr(float(scale)).encode())
    return h.hexdigest()


def load(d: SGLangDouble, body: dict) -> tuple[int, Any]:
    if not d.config.enable_lora:
        return 400, _fail(DISABLED)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not isinstance(path, str):
        return 400, _fail("lora_name and lora_path must be strings")
    with d.cond:
        if name in d.loras:
            return 400, _fail(f"Failed to load LoRA adapter {name} because it is already loaded")
    try:
        rank, targets, key = _read_peft(Path(path))
    except (OSError, ValueError, KeyError) as e:
        return 400, _fail(f"Failed to load LoRA adapter {name}: {e}")
    c = d.config
    unsupported = [t for t in targets if not _served(t, c.lora_target_modules)]
    if (c.max_lora_rank is not None and rank > c.max_lora_rank) or unsupported:
        return 400, _fail(
            f"LoRA adapter {name} with rank {rank} is incompatible with the current LoRA memory pool configuration. "
            "Please ensure that the LoRA adapter's rank is within the configured `--max-lora-rank` and that the "
            "target modules are included in `--lora-target-modules`."
        )
    with d.cond:
        d.loras[name] = LoadedLora(path=path, rank=rank, key=key)
        loaded = {n: a.path for n, a in d.loras.items()}
    return 200, {"success": True, "error_message": "", "loaded_adapters": loaded}


def unload(d: SGLangDouble, body: dict) -> tuple[int, Any]:
    if not d.config.enable_lora:
        return 400, _fail(DISABLED)
    name = body.get("lora_name")
    with d.cond:
        adapter = d.loras.pop(str(name), None)  # unregistered at once: new requests naming it fail
        if adapter is None:
            return 400, _fail(f"LoRA with name {name} does not exist. Loaded LoRAs: {list(d.loras)}")
        d.unloading[str(name)] = adapter
        d.wait_for(lambda: adapter.in_use == 0, f"requests using LoRA adapter {name} to finish")
        del d.unloading[str(name)]
        d.unloaded.append(str(name))
        loaded = {n: a.path for n, a in d.loras.items()}
    return 200, {"success": True, "error_message": "", "loaded_adapters": loaded}


def acquire(d: SGLangDouble, names: list[str | None]) -> list[LoadedLora | None]:
    """The adapters of one /generate's prompts, counted in use; BadRequest for one not loaded. Caller holds cond."""
    wanted = [n for n in names if n is not None]
    if wanted and not d.config.enable_lora:
        raise BadRequest(DISABLED)
    missing = [n for n in wanted if n not in d.loras]
    if missing:
        raise BadRequest(f"The following requested LoRA adapters are not loaded: {missing[0]}\n"
                         f"Loaded adapters: {list(d.loras)}.")
    adapters = [d.loras[n] if n is not None else None for n in names]
    return adapters


def lora_names(value: Any, n_prompts: int) -> list[str | None]:
    """GenerateReqInput.lora_path: an adapter name for every prompt, or one per prompt."""
    values = value if isinstance(value, list) else [value] * n_prompts
    if len(values) != n_prompts or not all(v is None or isinstance(v, str) for v in values):
        raise BadRequest(f"lora_path must be a string or a list of {n_prompts} strings, got {value!r}")
    return values


def _read_peft(folder: Path) -> tuple[int, list[str], str]:
    from safetensors.torch import load_file

    config = json.loads((folder / "adapter_config.json").read_text())
    if config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise ValueError("only plain LoRA adapters are served")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    for k, t in tensors.items():
        if not k.startswith("base_model.model.") or not k.endswith((".lora_A.weight", ".lora_B.weight")):
            raise ValueError(f"unexpected tensor {k!r} in adapter_model.safetensors")
        if k.endswith(".lora_A.weight") and t.shape[0] != rank:
            raise ValueError(f"{k} has rank {t.shape[0]}, adapter_config.json says r={rank}")
    return rank, list(config["target_modules"]), lora_key(tensors, alpha / rank)


def _served(target: str, server_targets: tuple[str, ...] | None) -> bool:
    if server_targets is None or "all" in server_targets:
        return True
    return target in server_targets or FUSED.get(target) in server_targets


def _fail(message: str) -> dict[str, Any]:
    return {"success": False, "error_message": message, "loaded_adapters": None}


ROUTES = {"/load_lora_adapter": load, "/unload_lora_adapter": unload}
