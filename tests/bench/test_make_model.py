"""bench.make_model: shards of random bf16 weights that Hugging Face loads, and the 7b shape's config."""

import json

import torch

import bench.make_model as mm
from asyncrl.learner.lora import check_targets
from asyncrl.learner.config import DEFAULT_LORA_TARGETS, DEFAULT_LORA_TRAINABLE


def test_a_tiny_untied_shape_writes_shards_that_load_with_qwen2_init(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(mm, "SHARD_BYTES", 1 << 20)  # several shards
    shape = mm.Shape(64, 2, 4, 2, 128, vocab=4096, tied=False, rope_theta=1e6)
    out = mm.make_model(shape, tmp_path / "m", device="cpu")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and "lm_head.weight" in index["weight_map"]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16 and not model.config.tie_word_embeddings
    assert model.config.rope_parameters["rope_theta"] == 1e6
    assert index["metadata"]["total_size"] == 2 * sum(p.numel() for p in model.parameters())
    assert abs(model.lm_head.weight.float().std().item() - 0.02) < 0.002
    assert torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    assert not model.model.layers[0].self_attn.q_proj.bias.any()
    assert (out / "tokenizer.json").exists() and (out / "generation_config.json").exists()


def test_the_7b_shape_is_qwen2_5_7b_and_takes_the_default_lora_targets(tmp_path):
    cfg = mm.model_config(mm.SHAPES["7b"])
    shapes = mm.tensor_shapes(cfg)
    assert 7.61e9 < sum(s.numel() for s in shapes.values()) < 7.62e9  # Qwen2.5-7B: 7.62 B
    assert shapes["lm_head.weight"] == (152064, 3584) and shapes["model.layers.0.self_attn.k_proj.bias"] == (512,)
    assert shapes["model.layers.27.mlp.down_proj.weight"] == (3584, 18944)
    cfg.save_pretrained(tmp_path)  # config.json only: what the preflight reads
    check_targets(tmp_path, DEFAULT_LORA_TARGETS, DEFAULT_LORA_TRAINABLE)
