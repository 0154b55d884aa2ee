"""The merged gate/up MLP forward (lean_mlp.py) and merged q/k/v (lean_attention._qkv) against HF's forward:
same outputs and gradients, same parameters; modules they cannot merge keep their forward."""

import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from asyncrl.learner import lean_attention, lean_mlp
from asyncrl.learner.merged_linear import mergeable

SHAPE = dict(vocab_size=48, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {"qwen2": lambda: Qwen2Config(**SHAPE), "qwen3": lambda: Qwen3Config(**SHAPE, head_dim=24),
           "llama_bias": lambda: LlamaConfig(**SHAPE, mlp_bias=True)}


def _pair(kind: str) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(CONFIGS[kind](), dtype=torch.float32)
    for p in ref.parameters():
        p.data.add_(torch.randn_like(p) * 0.05)
    lean = copy.deepcopy(ref)
    assert lean_mlp.install(lean) == ref.config.num_hidden_layers
    return ref, lean


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_forward_and_grads_match_hf(kind):
    ref, lean = _pair(kind)
    ids = torch.randint(0, ref.config.vocab_size, (2, 11))
    out = {}
    for name, model in (("ref", ref), ("lean", lean)):
        logits = model(input_ids=ids).logits
        logits.logsumexp(-1).mean().backward()
        out[name] = logits.detach()
    torch.testing.assert_close(out["lean"], out["ref"], atol=1e-5, rtol=0)
    grads = dict(lean.named_parameters())
    for n, p in ref.named_parameters():
        torch.testing.assert_close(grads[n].grad, p.grad, atol=1e-5, rtol=1e-5, msg=n)


def test_parameters_unchanged_and_idempotent():
    ref, lean = _pair("qwen2")
    assert list(lean.state_dict()) == list(ref.state_dict())
    assert lean_mlp.install(lean) == ref.config.num_hidden_layers


def test_unmergeable_projections_keep_their_forward():
    _, lean = _pair("qwen2")
    mlp = lean.model.layers[0].mlp
    assert mergeable(mlp.gate_proj, mlp.up_proj)

    class Adapter(nn.Linear):  # e.g. a LoRA wrapper: its forward is more than x @ W^T + b
        pass

    assert not mergeable(Adapter(4, 4), nn.Linear(4, 4))
    assert not mergeable(nn.Linear(4, 4), nn.Linear(4, 4, bias=False))
    assert not mergeable(nn.Linear(4, 4), nn.Linear(5, 4))
    fresh = AutoModelForCausalLM.from_config(CONFIGS["qwen2"]())
    fresh.model.layers[0].mlp.up_proj = Adapter(64, 96)
    assert lean_mlp.install(fresh) == 1 and "forward" not in vars(fresh.model.layers[0].mlp)


def test_attention_qkv_falls_back_to_three_projections():
    """An attention module whose q/k/v cannot merge still runs the lean forward, with three GEMMs."""
    torch.manual_seed(0)
    module = AutoModelForCausalLM.from_config(CONFIGS["qwen2"]()).model.layers[0].self_attn
    x = torch.randn(7, 64)
    merged = lean_attention._qkv(module, x, 16)
    module.k_proj = nn.Linear(64, 32, bias=False)  # now the biases differ: not mergeable
    module.k_proj.weight.data.copy_(module.v_proj.weight.data)
    separate = lean_attention._qkv(module, x, 16)
    assert [t.shape for t in merged] == [t.shape for t in separate] == [(7, 4, 16), (7, 2, 16), (7, 2, 16)]
    torch.testing.assert_close(separate[0], merged[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(separate[2], merged[2], atol=1e-6, rtol=0)
