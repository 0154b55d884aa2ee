"""FP8 rollouts on CPU (torch's `_scaled_mm` runs there too): the row quantizer, the fp8 matmul against a bf16
one, and the engine with `weights_dtype="fp8"`: it generates, stays close to the bf16 engine, re-quantizes at
every weight update, and refuses what it cannot run. The Triton quantizer and graph replay: test_fp8_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asyncrl.engine.torch.model.fp8 import (
    E4M3,
    E4M3_MAX,
    Fp8Linear,
    Fp8Weights,
    fits,
    quantize_rows_reference,
)
from asyncrl.engine.torch.forced_group import ForcedGroup
from asyncrl.records import SamplingParams
from tests.engine.engine_helpers import drain, engine, request


def test_rows_are_scaled_to_e4m3s_range_and_round_trip_within_its_precision():
    torch.manual_seed(0)
    x = torch.randn(8, 64) * torch.logspace(-3, 3, 8)[:, None]  # rows of very different magnitude
    x[3] = 0.0
    x8, scale = quantize_rows_reference(x)
    assert x8.dtype == E4M3 and scale.shape == (8, 1) and scale.dtype == torch.float32
    assert torch.all(x8[3].float() == 0) and scale[3].item() > 0  # a zero row: zeros, a finite scale
    back = x8.float() * scale
    for row in (0, 1, 2, 4, 5, 6, 7):
        assert x8[row].float().abs().max().item() == E4M3_MAX  # each row's largest value maps to 448
        err = (back[row] - x[row]).abs() / x[row].abs().max()
        assert err.max().item() <= 2.0**-4  # e4m3 keeps 3 mantissa bits: half a step of 2^-3 at most


def test_fp8_matmul_is_close_to_the_bf16_one_and_adds_the_bias():
    torch.manual_seed(0)
    w = (torch.randn(96, 64) * 0.05).bfloat16()
    b = torch.randn(96).bfloat16()
    x = torch.randn(5, 64).bfloat16()
    ref = F.linear(x.float(), w.float(), b.float())  # [5, 96]
    got = Fp8Linear(w, b)(x)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 96)
    rel = (got.float() - ref).norm() / ref.norm()
    assert rel.item() < 0.05, rel
    no_bias = Fp8Linear(w, None)(x).float()
    assert torch.allclose(got.float() - no_bias, b.float().expand(5, -1), atol=0.1)


def test_refresh_reads_the_updated_source_in_place():
    w = torch.randn(32, 16).bfloat16()
    lin = Fp8Linear(w, None)
    w8_ptr, scale_ptr = lin.w8.data_ptr(), lin.w_scale.data_ptr()
    before = lin(torch.ones(1, 16).bfloat16()).clone()
    w.mul_(2.0)
    lin.refresh()
    after = lin(torch.ones(1, 16).bfloat16())
    assert (lin.w8.data_ptr(), lin.w_scale.data_ptr()) == (w8_ptr, scale_ptr)  # a captured graph keeps reading it
    assert torch.allclose(after.float(), 2.0 * before.float(), rtol=1e-2)


def test_only_shapes_the_scaled_matmul_takes_are_quantized():
    assert fits(torch.empty(32, 16)) and not fits(torch.empty(24, 16)) and not fits(torch.empty(32, 8))


def _tokens_and_logprobs(eng, prompt, n=12):
    out = drain(eng, {0: [request("r", prompt, max_new_tokens=n, temperature=0.0)]})[("r", 0)]
    return list(out.token_ids), torch.as_tensor(out.logprobs)


def test_fp8_engine_generates_close_to_the_bf16_engine(qwen2_path):
    prompt = [5, 9, 3, 17, 2, 40]
    bf16 = engine(qwen2_path, dtype="bfloat16")
    fp8 = engine(qwen2_path, dtype="bfloat16", weights_dtype="fp8")
    assert fp8.fp8 is not None and len(fp8.fp8.linears) == 4 * fp8.arch.num_layers and not fp8.fp8.skipped
    tokens, lp8 = _tokens_and_logprobs(fp8, prompt)
    assert len(tokens) > 0 and torch.isfinite(lp8).all()
    # the bf16 engine scores the fp8 engine's tokens: the two policies differ by fp8 rounding only
    group = ForcedGroup(prompt_token_ids=np.asarray(prompt), response_token_ids=[np.asarray(tokens)],
                        sampling=SamplingParams(temperature=0.0, max_new_tokens=12))
    lp16 = torch.as_tensor(bf16.score([group])[0][0], dtype=torch.float32)
    diff = (lp16 - lp8).abs()
    assert 0.0 < diff.mean().item() < 0.15, diff  # not the bf16 path, and close to it


def test_fp8_engine_requantizes_at_each_weight_update(qwen2_path, tiny_factory, tmp_path):
    other = tiny_factory(tmp_path / "other", "qwen2", seed=7)
    from transformers import AutoModelForCausalLM

    new_weights = AutoModelForCausalLM.from_pretrained(other).state_dict()
    prompt = [5, 9, 3, 17, 2, 40]
    fp8 = engine(qwen2_path, dtype="bfloat16", weights_dtype="fp8")
    old_tokens, _ = _tokens_and_logprobs(fp8, prompt)
    fp8.begin_weight_update()
    fp8.load_weights(new_weights.items())
    fp8.end_weight_update(1)
    tokens, lp = _tokens_and_logprobs(fp8, prompt)
    fresh_tokens, fresh_lp = _tokens_and_logprobs(engine(other, dtype="bfloat16", weights_dtype="fp8"), prompt)
    assert tokens == fresh_tokens and torch.equal(lp, fresh_lp)  # the images were rebuilt from the new weights
    assert tokens != old_tokens  # and the new weights answer differently


def test_fp8_refuses_what_it_cannot_run(qwen2_path):
    with pytest.raises(ValueError, match="weights_dtype='int4'"):
        engine(qwen2_path, dtype="bfloat16", weights_dtype="int4")
    with pytest.raises(ValueError, match="model.dtype='bfloat16'"):
        engine(qwen2_path, dtype="float32", weights_dtype="fp8")


def test_fp8_weights_need_fused_projections(qwen2_path):
    from asyncrl.engine.torch.model import load_hf_folder

    model = load_hf_folder(qwen2_path, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(AssertionError, match="fuse"):
        Fp8Weights(model)


@pytest.mark.parametrize("served", [None, "fp8", "awq"])
def test_sglang_adapter_checks_the_servers_quantization(served):
    from asyncrl.engine.sglang.config import SGLangConfig
    from asyncrl.engine.sglang.engine import SGLangEngine
    from tests.doubles.sglang_double import SGLangDouble

    with SGLangDouble(quantization=served) as d:
        cfg = SGLangConfig(base_url=d.url, request_timeout_s=10.0)
        for weights_dtype in ("model", "fp8"):
            agrees = (served == "fp8") == (weights_dtype == "fp8") and served != "awq"
            if agrees:
                with SGLangEngine(cfg, weights_dtype=weights_dtype):
                    pass
                continue
            with pytest.raises(ValueError, match=f"generator.weights_dtype='{weights_dtype}' .*--quantization") as e:
                SGLangEngine(cfg, weights_dtype=weights_dtype)
            assert ("set generator.weights_dtype" in str(e.value)) == (served != "awq")


def test_the_generator_config_reaches_the_engine(qwen2_path):
    from asyncrl.generator.build import build_engine
    from asyncrl.generator.config import GeneratorConfig
    from asyncrl.models.config import ModelConfig

    model = ModelConfig(dtype="bfloat16")
    eng = build_engine(GeneratorConfig(weights_dtype="fp8", max_running=8), model, "cpu", str(qwen2_path))
    assert eng.fp8 is not None and eng.fp8.nbytes > 0
    assert build_engine(GeneratorConfig(max_running=8), model, "cpu", str(qwen2_path)).fp8 is None
