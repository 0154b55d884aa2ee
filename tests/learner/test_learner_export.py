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


def test_export_writes_the_source_dtype_untied_weights_and_leaves_the_live_config_alone(tmp_path):
    import json

    from learner_helpers import make_tiny_model
    from safetensors import safe_open

    from asyncrl.learner.export import export_hf

    src = make_tiny_model(tmp_path / "untied", tie=False)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "dtype": "bfloat16"}))
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    before = hf.config.to_dict()
    out = export_hf(((k, v.detach()) for k, v in hf.named_parameters()), hf.config, src, tmp_path / "bf16")
    assert hf.config.to_dict() == before
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(out / "model.safetensors", "pt") as f:
        assert "lm_head.weight" in f.keys() and {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    loaded = dict(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).named_parameters())
    for k, v in hf.named_parameters():
        torch.testing.assert_close(loaded[k].detach(), v.detach().to(torch.bfloat16).float(), atol=0, rtol=0, msg=k)
    assert (out / "tokenizer_config.json").is_file()
