"""Export the policy as a plain Hugging Face folder that `AutoModelForCausalLM.from_pretrained` loads.

transformers' own `save_pretrained` writes it: config.json (the model's config, with the dtype of the
weights), generation_config.json, and safetensors weights sharded with an index past `max_shard_bytes`.
It is called on a weightless skeleton of the architecture (built on the meta device from a copy of the
config, so the live config is left untouched) with the gathered tensors passed as its state dict, so
tied weights, checkpoint names and shard layout are transformers', as any `from_pretrained` expects.
The tokenizer and generation files of the source folder are then copied in when present. The folder is
written under a temporary name and renamed into place.

With LoRA (`adapter`) the folder holds the merged weights, and its `adapter/` subfolder the adapters alone
in PEFT's layout (adapter_config.json, adapter_model.safetensors with keys
"base_model.model.<module>.lora_A.weight"), which `peft.PeftModel.from_pretrained(base, folder)` loads onto
the source model; both are written inside the temporary folder, so the rename publishes them together.

Weights are written in the source config's dtype (fp32 if it names none); adapters in fp32. Only `save_pretrained`'s
`state_dict` and `max_shard_size` arguments are used (present in every transformers 5 release).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

from asyncrl.models.peft_adapter import PeftAdapter, write_adapter
from asyncrl.precision import dtypes

SIDE_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json",
)


ADAPTER_DIR = "adapter"


def export_hf(named_tensors: Iterable[tuple[str, Tensor]], config: Any, src_path: str | Path, out_dir: str | Path,
              *, write: bool = True, max_shard_bytes: int = 5 * 2**30, adapter: PeftAdapter | None = None) -> Path:
    """Consume `named_tensors` (on every rank: it may be a collective) and, where `write`, write the folder
    (and, with `adapter`, its adapter/ subfolder)."""
    out_dir = Path(out_dir)
    src = Path(src_path)
    dtype = _source_dtype(src)
    tensors = {}
    for name, t in named_tensors:
        if write:
            tensors[name] = t.detach().to("cpu", dtype if t.is_floating_point() else t.dtype).contiguous()
    if not write:
        return out_dir
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _skeleton(config, dtype).save_pretrained(tmp, state_dict=tensors, max_shard_size=max_shard_bytes)
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    if adapter is not None:
        write_adapter(adapter, tmp / ADAPTER_DIR)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    return out_dir


def _skeleton(config: Any, dtype: torch.dtype) -> Any:
    """The architecture of `config` without storage (meta tensors): what `save_pretrained` needs of a model."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype)


def _source_dtype(src: Path) -> torch.dtype:
    try:
        cfg = json.loads((src / "config.json").read_text())
    except (OSError, ValueError):
        return torch.float32
    return dtypes.DTYPES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"), torch.float32)
