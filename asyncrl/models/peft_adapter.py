"""A LoRA adapter folder in PEFT's layout: adapter_config.json + adapter_model.safetensors, keys
"base_model.model.<module>.lora_A.weight". The learner exports one (learner/export.py) and the SGLang adapter
writes one per version for the server to load (engine/sglang/lora.py); `peft` and SGLang read it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class PeftAdapter:
    tensors: dict[str, Tensor]  # PEFT key -> fp32 tensor (peft_state_dict)
    config: dict[str, Any]  # adapter_config.json (peft_config)


def peft_state_dict(adapters: dict[str, Tensor]) -> dict[str, Tensor]:
    """{"<module>.lora_A": A} (HF module paths) -> PEFT's saved keys, "base_model.model.<module>.lora_A.weight"."""
    return {f"base_model.model.{name}.weight": t for name, t in adapters.items()}


def peft_config(targets: Sequence[str], rank: int, alpha: float, dropout: float, base_path: str) -> dict[str, Any]:
    """adapter_config.json of a PEFT LoRA adapter for a causal LM (scale alpha / r: no rsLoRA, no DoRA)."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_path,
        "r": rank, "lora_alpha": alpha, "lora_dropout": dropout, "target_modules": sorted(targets),
        "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "modules_to_save": None,
        "init_lora_weights": True, "use_rslora": False, "use_dora": False,
    }


def write_adapter(adapter: PeftAdapter, folder: Path) -> None:
    """A PEFT adapter folder: adapter_config.json and adapter_model.safetensors."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps(adapter.config, indent=1))
    tensors = {k: t.detach().to("cpu", torch.float32).contiguous() for k, t in adapter.tensors.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
