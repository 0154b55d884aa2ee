"""The token-major attention forward (lean_attention.py) against HF's own forward with the same varlen
attention: packed rows give the same hidden states and gradients, everything else falls back untouched."""

import copy
import time

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from asyncrl.learner import attention, lean_attention

SHAPE = dict(vocab_size=48, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {
    "qwen2": lambda: Qwen2Config(**SHAPE),  # q/k/v biases
    "qwen3": lambda: Qwen3Config(**SHAPE, head_dim=24, attention_bias=True),  # q_norm/k_norm, D != hidden/H
    "llama": lambda: LlamaConfig(**SHAPE, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0,
                                                           "factor": 8.0, "low_freq_factor": 1.0,
                                                           "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": 16}),
}
LENGTHS = [5, 9, 4]


def _pair(kind: str) -> tuple[nn.Module, nn.Module]:
    """(HF forward, lean forward): the same fp32 weights, both on "asyncrl_varlen"."""
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(CONFIGS[kind](), dtype=torch.float32,
                                           attn_implementation=attention.register())
    for p in ref.parameters():  # norms start at exactly 1 and biases at 0: make every term count
        p.data.add_(torch.randn_like(p) * 0.05)
    lean = copy.deepcopy(ref)
    assert lean_attention.install(lean) == ref.config.num_hidden_layers
    return ref, lean


def _packed_call(model: nn.Module) -> torch.Tensor:
    """One row of three sequences, positions restarting at 0 -> hidden states [1, T, hidden]."""
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, sum(LENGTHS)))
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    cu = attention.cu_seqlens(LENGTHS)
    out = model.get_decoder()(input_ids=ids, position_ids=pos, use_cache=False, cu_seq_lens_q=cu,
                              cu_seq_lens_k=cu, max_length_q=max(LENGTHS), max_length_k=max(LENGTHS))
    return out.last_hidden_state


@pytest.fixture
def lean_calls(monkeypatch) -> list[int]:
    """Counts the calls that took the lean path (its rotary runs nowhere else)."""
    calls = []
    rotary = lean_attention.rotary
    monkeypatch.setattr(lean_attention, "rotary", lambda *a: calls.append(1) or rotary(*a))
    return calls


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_packed_forward_and_grads_match_hf(kind, lean_calls):
    ref, lean = _pair(kind)
    ref.train(), lean.train()
    hidden = {}
    for name, model in (("ref", ref), ("lean", lean)):
        h = _packed_call(model)
        (h.square().mean() + model.lm_head(h).logsumexp(-1).mean()).backward()
        hidden[name] = h.detach()
    assert len(lean_calls) == 2 * ref.config.num_hidden_layers  # q and k per layer, only in `lean`
    torch.testing.assert_close(hidden["lean"], hidden["ref"], atol=1e-5, rtol=0)
    grads = {n: p.grad for n, p in lean.named_parameters()}
    for n, p in ref.named_parameters():
        if "self_attn" in n:
            torch.testing.assert_close(grads[n], p.grad, atol=1e-5, rtol=1e-5, msg=n)


def test_parameter_names_and_state_dict_unchanged():
    ref, lean = _pair("qwen3")
    assert [n for n, _ in lean.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(lean.state_dict()) == list(ref.state_dict())
    assert lean_attention.install(lean) == ref.config.num_hidden_layers  # idempotent


def test_plain_call_falls_back(lean_calls):
    ref, lean = _pair("qwen2")
    ids = torch.randint(0, ref.config.vocab_size, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(lean(input_ids=ids).logits, ref(input_ids=ids).logits, atol=0, rtol=0)
    assert not lean_calls


def test_unsupported_modules_left_alone():
    class LlamaAttention(nn.Module):  # a supported name without the projections
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

    module = LlamaAttention()
    assert lean_attention.install(module) == 0 and "forward" not in vars(module)
    mistral = AutoModelForCausalLM.from_config(MistralConfig(**SHAPE))  # standard projections, other forward
    assert lean_attention.install(mistral) == 0


def _dense_causal(q, k, v, cu, max_len, scale):
    """Stand-in for varlen attention under CPU compile (its CPU path loops over `cu.tolist()`, which
    Dynamo cannot trace with dynamic shapes, patched or not): one causal row, [T, H, D] in and out."""
    k, v = attention._expand_kv(k, v, q.shape[1])
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale).transpose(0, 1)


def test_compiled_layer_traces_without_graph_breaks(monkeypatch):
    """A patched decoder layer compiles (dynamic shapes, forward and backward through AOT autograd) to one
    graph with the eager numbers. The backend is aot_eager: Inductor on 2 CPU cores takes ~30 s cold; the
    GPU test (test_learner_gpu.py) runs Inductor and the flash op."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(attention, "varlen_attention", _dense_causal)
    _, lean = _pair("qwen3")
    layer = lean.get_decoder().layers[0]
    x = torch.randn(1, sum(LENGTHS), lean.config.hidden_size, requires_grad=True)
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    kwargs = dict(position_embeddings=lean.get_decoder().rotary_emb(x, pos),
                  cu_seq_lens_q=attention.cu_seqlens(LENGTHS), max_length_q=max(LENGTHS))
    eager = layer(x, **kwargs)
    (grad_eager,) = torch.autograd.grad(eager.square().sum(), x)
    torch._dynamo.reset()
    counters.clear()
    start = time.perf_counter()
    compiled = torch.compile(layer, dynamic=True, backend="aot_eager")(x, **kwargs)
    if time.perf_counter() - start > 30:
        pytest.skip("CPU compile took > 30 s")
    (grad,) = torch.autograd.grad(compiled.square().sum(), x)
    assert not dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, grad_eager, atol=1e-5, rtol=1e-5)


def test_head_sizes_stay_static_under_fsdp_compile(monkeypatch):
    """Under FSDP, `compile(dynamic=True)` turns ints read from modules into symbolic sizes: HF's forward
    then views q/k/v with a symbolic head_dim and Inductor's rotary divides every index by runtime values
    (~8x slower on an H200). In the lean layer's graph the token count is the only symbolic size. (Dense
    stand-in attention: the CPU varlen path does not compile.)"""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    from asyncrl.learner import fsdp
    from asyncrl.learner.model import PolicyModel

    monkeypatch.setattr(attention, "varlen_attention", _dense_causal)
    _, lean = _pair("qwen2")
    fsdp.init_single_rank(torch.device("cpu"))  # the conftest fixture destroys the group afterwards
    root = PolicyModel(lean, value_head=False, chunk_tokens=64)
    fsdp.shard(root, lean, torch.float32, torch.device("cpu"))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    for layer in lean.get_decoder().layers:
        layer.compile(dynamic=True, backend=backend)
    ids = torch.randint(0, lean.config.vocab_size, (1, sum(LENGTHS)))
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    targets = 4  # logprob positions (any)
    root(ids, pos, torch.arange(targets), torch.zeros(targets, dtype=torch.long), torch.ones(targets),
         attention.cu_seqlens(LENGTHS), max(LENGTHS))
    assert graphs
    for gm in graphs:
        values = [nd.meta.get("example_value") for nd in gm.graph.nodes]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        tokens = free_symbols(next(v for v in tensors if v.dim() == 3).shape[1])  # hidden / cos [1, T, .]
        others = {s for v in tensors for s in free_symbols(v.shape)} - tokens
        assert not others, f"symbolic sizes besides the token count: {others}"
