"""model.residual_fp32 in the engine: the stream starts as the fp32 embedding, every add is fp32, the norm's
output is in the compute dtype; the fused Triton kernel computes the same bits as the torch path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import drain, engine, request

from asyncrl.engine.torch import kernels
from asyncrl.engine.torch.model.layers import RMSNorm


def _norm(dtype: torch.dtype, device: str = "cpu") -> RMSNorm:
    norm = RMSNorm(64, 1e-6).to(device)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64) + 0.5)
    return norm.to(dtype)


def test_fp32_stream_torch_path_roundings():
    torch.manual_seed(0)
    norm = _norm(torch.float16)
    x, y = torch.randn(5, 64).half(), torch.randn(5, 64).half()
    out0, r0 = norm.add_forward(x, None, stream_fp32=True)
    assert r0.dtype == torch.float32 and torch.equal(r0, x.float())
    assert out0.dtype == torch.float16 and torch.equal(out0, norm(x))
    out1, r1 = norm.add_forward(y, r0)
    assert r1.dtype == torch.float32 and torch.equal(r1, x.float() + y.float())
    h = r1 * torch.rsqrt(r1.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert out1.dtype == torch.float16 and torch.equal(out1, norm.weight * h.half())
    _, rounded = norm.add_forward(y, x)  # the default: the stream in the compute dtype, as before
    assert rounded.dtype == torch.float16 and torch.equal(rounded, x + y)


def test_fused_kernel_matches_the_torch_path(triton_device, monkeypatch):
    dtype = torch.float16  # the interpreter's float16 is exact; compiled kernels run every dtype
    torch.manual_seed(1)
    norm = _norm(dtype, triton_device)
    x, y = (torch.randn(7, 64, device=triton_device).to(dtype) for _ in range(2))
    with torch.no_grad():
        fused0, r0 = norm.add_forward(x, None, stream_fp32=True)
        fused1, r1 = norm.add_forward(y, r0)
        assert kernels.ops.enabled(y)
        monkeypatch.setattr(kernels.ops, "enabled", lambda t: False)
        ref1, ref_r1 = norm.add_forward(y, r0.clone())
    assert r1.dtype == torch.float32 and torch.equal(r1, ref_r1)
    assert torch.equal(fused1, ref1)


def test_engine_generates_with_an_fp32_stream(qwen2_path):
    """bf16 on CPU: the option changes the numbers (the stream is rounded less) but not the engine's contract."""
    reqs = [request("a", [5, 6, 7, 8], n=2, temperature=1.0, seed=3, max_new_tokens=12, ignore_eos=True)]
    base = drain(engine(qwen2_path, dtype="bfloat16"), {0: reqs})
    eng = engine(qwen2_path, dtype="bfloat16", residual_fp32=True)
    assert eng.model.model.residual_fp32
    fp32 = drain(eng, {0: reqs})
    assert base.keys() == fp32.keys()
    for k in base:
        assert len(fp32[k].token_ids) == 12 and np.isfinite(fp32[k].logprobs).all()
    assert any(not np.array_equal(base[k].logprobs, fp32[k].logprobs) for k in base)
    assert eng.blocks.num_free == eng.blocks.num_blocks


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("option", ["residual_fp32", "logits_fp32"])
def test_from_model_takes_the_precision_options(qwen2_path, option, flag):
    """model.residual_fp32 and model.logits_fp32 (tests/engine/test_engine_logits_fp32.py) reach the model."""
    import transformers

    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.engine.torch.model.loader import build_from_hf

    hf = transformers.AutoModelForCausalLM.from_pretrained(qwen2_path, dtype=torch.float32)
    eng = TorchEngine.from_model(build_from_hf(hf), num_kv_blocks=32, kv_block_size=4, max_running=4,
                                 **{option: flag})
    holder = eng.model.model if option == "residual_fp32" else eng.model
    assert getattr(holder, option) is flag
