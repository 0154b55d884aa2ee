"""export: a plain Hugging Face folder that from_pretrained loads, equal to the trained policy."""

import torch
from learner_helpers import make_batch, params_snapshot
from transformers import AutoModelForCausalLM

from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer


def test_export_loads_and_matches(tiny_model, tmp_path):
    t = Trainer(LearnerConfig(lr=1e-3, micro_batch_tokens=32), str(tiny_model), device="cpu")
    t.train_step(make_batch(seed=0))
    out = t.export(tmp_path / "export")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert (out / "tokenizer_config.json").is_file()  # copied from the source folder
    assert not list(tmp_path.glob(".tmp-*"))
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    trained = params_snapshot(t)
    loaded = dict(hf.named_parameters())
    for k, v in trained.items():
        torch.testing.assert_close(loaded[k].detach(), v, atol=0, rtol=0, msg=k)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, t.policy.hf(input_ids=ids).logits)


def test_export_shards(tiny_model, tmp_path):
    from asyncrl.learner.export import export_hf

    t = Trainer(LearnerConfig(), str(tiny_model), device="cpu")
    out = export_hf(t.named_full_tensors(), t.policy.hf.config, tiny_model, tmp_path / "sharded", max_shard_bytes=20_000)
    assert (out / "model.safetensors.index.json").is_file()
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for k, v in params_snapshot(t).items():
        torch.testing.assert_close(dict(hf.named_parameters())[k].detach(), v, atol=0, rtol=0)
