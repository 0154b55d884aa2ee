"""The engine's direct folder loading (safetensors + config, no transformers model) gives, bit for bit, the model
that loading through `AutoModelForCausalLM.from_pretrained` gives; folders it cannot read go that way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asyncrl.engine.torch.model import loader


def through_transformers(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return loader.build_from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=dtype))


def same_model(a, b) -> None:
    assert a.cfg == b.cfg
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    ra, rb = a.model.rotary_emb, b.model.rotary_emb
    assert ra.inv_freq.dtype == rb.inv_freq.dtype and torch.equal(ra.inv_freq, rb.inv_freq)
    assert ra.attention_scaling == rb.attention_scaling
    if a.cfg.tie_word_embeddings:
        assert a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_direct_loading_is_the_transformers_model_bit_for_bit(tiny_models, arch, dtype):
    direct = loader.load_direct(tiny_models[arch], dtype)
    assert direct is not None
    same_model(direct, through_transformers(tiny_models[arch], dtype))  # weights, RoPE table, config: what runs


def test_the_embedded_default_loads_directly():
    folder = Path(__file__).parents[2] / "asyncrl" / "task" / "assets" / "embedded"
    direct = loader.load_direct(folder, torch.float32)
    assert direct is not None
    same_model(direct, through_transformers(folder, torch.float32))


def test_other_folders_take_the_transformers_path(tiny_factory, tmp_path):
    folder = tiny_factory(tmp_path / "scaled", "llama")
    config = json.loads((folder / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    config.pop("rope_parameters", None)
    (folder / "config.json").write_text(json.dumps(config))
    assert loader.load_direct(folder, torch.float32) is None  # RoPE other than the default
    model = loader.load_hf_folder(folder, torch.float32, torch.device("cpu"))
    same_model(model, through_transformers(folder, torch.float32))

    renamed = tiny_factory(tmp_path / "renamed", "qwen2")
    from safetensors.torch import load_file, save_file

    state = load_file(renamed / "model.safetensors")
    save_file({k.replace("model.", "base.", 1): v for k, v in state.items()}, renamed / "model.safetensors",
              metadata={"format": "pt"})
    assert loader.load_direct(renamed, torch.float32) is None  # names of another layout
    (renamed / "model.safetensors").unlink()
    assert loader.load_direct(renamed, torch.float32) is None  # no single safetensors file
