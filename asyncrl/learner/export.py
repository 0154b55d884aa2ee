"""Export the policy as a plain Hugging Face folder that `AutoModelForCausalLM.from_pretrained` loads:
config.json (the source's, so dtype and architecture stay as they were), safetensors weights (sharded
with an index past `max_shard_bytes`), and the tokenizer / generation files copied from the source
folder when present. Written under a temporary name and renamed into place.

Weights are written in the source config's dtype (fp32 if it names none). Tied embeddings appear once
(`lm_head.weight` is re-tied on load). Names are the model's in-memory parameter names, which equal the
checkpoint names for dense decoder models (Llama, Qwen2/3, Mistral); models that transformers converts
on load (fused MoE experts) are not handled here.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

SIDE_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json",
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_hf(named_tensors: Iterable[tuple[str, Tensor]], config: Any, src_path: str | Path, out_dir: str | Path,
              *, write: bool = True, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Consume `named_tensors` (on every rank: it may be a collective) and, where `write`, write the folder."""
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
    if (src / "config.json").is_file():
        shutil.copy2(src / "config.json", tmp / "config.json")
    else:
        config.save_pretrained(tmp)
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    _write_shards(tensors, tmp, max_shard_bytes)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    return out_dir


def _source_dtype(src: Path) -> torch.dtype:
    try:
        cfg = json.loads((src / "config.json").read_text())
    except (OSError, ValueError):
        return torch.float32
    return _DTYPES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"), torch.float32)


def _write_shards(tensors: dict[str, Tensor], out: Path, max_shard_bytes: int) -> None:
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=meta)
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata=meta)
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
