"""model.residual_fp32 in the learner (residual_stream.py): the patched Hugging Face decoder computes exactly
the fp32-stream formula, its layers hand fp32 on, the Trainer trains with it, and the config refuses it with
SGLang."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from learner_helpers import make_batch
from torch import nn
from transformers import AutoModelForCausalLM

from asyncrl.learner import residual_stream
from asyncrl.learner.config import LearnerConfig
from asyncrl.learner.trainer import Trainer


def _by_hand(hf, ids: torch.Tensor) -> torch.Tensor:
    """The fp32-stream decoder written out with the model's own submodules -> final hidden [1, L, H]."""
    m = hf.model
    dtype = m.embed_tokens.weight.dtype

    def norm(ln, r):
        h = r.float() * torch.rsqrt(r.float().pow(2).mean(-1, keepdim=True) + ln.variance_epsilon)
        return ln.weight * h.to(dtype)

    h = m.embed_tokens(ids)
    cos, sin = m.rotary_emb(h, torch.arange(ids.shape[1])[None])
    r = h.float()
    for layer in m.layers:
        a, _ = layer.self_attn(hidden_states=norm(layer.input_layernorm, r), attention_mask=None,
                               position_embeddings=(cos, sin))
        r = r + a
        r = r + layer.mlp(norm(layer.post_attention_layernorm, r))
    return norm(m.norm, r)


def test_patched_decoder_is_the_fp32_stream_formula(tiny_model):
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16, attn_implementation="sdpa")
    ids = torch.randint(0, hf.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = hf.model(ids).last_hidden_state
        residual_stream.install(hf)
        seen = []
        hooks = [layer.register_forward_hook(lambda _m, _a, out: seen.append(out.dtype)) for layer in hf.model.layers]
        patched = hf.model(ids).last_hidden_state
        expected = _by_hand(hf, ids)
    for h in hooks:
        h.remove()
    assert seen == [torch.float32] * len(hf.model.layers)
    assert patched.dtype == torch.bfloat16
    assert torch.equal(patched, expected)
    assert not torch.equal(patched, plain)  # the stream really is rounded less


def test_fp32_model_is_unchanged(tiny_model):
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    ids = torch.randint(0, hf.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = hf(ids).logits
        residual_stream.install(hf)
        assert torch.equal(hf(ids).logits, plain)


def test_unsupported_decoder_is_a_config_error():
    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2)])

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = Decoder()

        def get_decoder(self):
            return self.decoder

    with pytest.raises(ValueError, match="model.residual_fp32 = false"):
        residual_stream.install(Model())


def test_trainer_trains_with_an_fp32_stream(tiny_model):
    cfg = LearnerConfig(algorithm="grpo", lr=1e-2, micro_batch_tokens=24)
    metrics = {}
    for flag in (False, True):
        trainer = Trainer(cfg, str(tiny_model), device="cpu", dtype="bfloat16", residual_fp32=flag)
        metrics[flag] = trainer.train_step(make_batch(seed=3, groups=3, n=4))
        dist.destroy_process_group()
    for m in metrics.values():
        assert m["grad_norm"] > 0 and m["loss"] == m["loss"]
    assert metrics[True]["entropy"] != metrics[False]["entropy"]  # the forward differs: the option reached it


def test_config_refuses_residual_fp32_with_sglang():
    from asyncrl.config.run import load_run_config

    with pytest.raises(ValueError, match="model.residual_fp32=true needs generator.engine='torch'"):
        load_run_config(None, ["model.residual_fp32=true", "generator.engine=sglang"])
    assert load_run_config(None, ["model.residual_fp32=true"]).model.residual_fp32
