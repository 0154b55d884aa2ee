"""Merged q/k/v (merged_linear.py, used by lean_attention._qkv): only plain Linears merge; the fallback gives
the same q, k, v."""

import torch
from torch import nn
from transformers import AutoModelForCausalLM, Qwen2Config

from asyncrl.learner import lean_attention
from asyncrl.learner.merged_linear import mergeable, merged_linear


class Adapter(nn.Linear):  # e.g. a LoRA wrapper: its forward is more than x @ W^T + b
    pass


def test_only_plain_linears_with_one_input_size_and_bias_choice_merge():
    assert mergeable(nn.Linear(4, 4), nn.Linear(4, 2))
    assert not mergeable(Adapter(4, 4), nn.Linear(4, 4))
    assert not mergeable(nn.Linear(4, 4), nn.Linear(4, 4, bias=False))
    assert not mergeable(nn.Linear(4, 4), nn.Linear(5, 4))


def test_merged_equals_separate_outputs_and_grads():
    torch.manual_seed(0)
    layers = (nn.Linear(8, 6), nn.Linear(8, 2), nn.Linear(8, 2))
    x = torch.randn(5, 8, requires_grad=True)
    merged = merged_linear(x, layers)
    separate = torch.cat([layer(x) for layer in layers], dim=-1)
    torch.testing.assert_close(merged, separate, atol=1e-6, rtol=0)
    (gm,) = torch.autograd.grad(merged.square().sum(), x)
    (gs,) = torch.autograd.grad(separate.square().sum(), x)
    torch.testing.assert_close(gm, gs, atol=1e-5, rtol=0)


def test_attention_qkv_falls_back_to_three_projections():
    """An attention module whose q/k/v cannot merge still runs the lean forward, with three GEMMs."""
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=48, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    module = AutoModelForCausalLM.from_config(cfg).model.layers[0].self_attn
    x = torch.randn(7, 64)
    merged = lean_attention._qkv(module, x, 16)
    module.k_proj = Adapter(64, 32)  # not mergeable any more; same numbers
    module.k_proj.load_state_dict(module.v_proj.state_dict())
    separate = lean_attention._qkv(module, x, 16)
    assert [t.shape for t in merged] == [t.shape for t in separate] == [(7, 4, 16), (7, 2, 16), (7, 2, 16)]
    torch.testing.assert_close(separate[0], merged[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(separate[2], merged[2], atol=1e-6, rtol=0)
    torch.testing.assert_close(separate[1], merged[2], atol=1e-6, rtol=0)  # k_proj now holds v's weights
