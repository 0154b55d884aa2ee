"""TorchEngine on CUDA: fp32 parity with Hugging Face, device-independent sampling, bf16 sanity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from engine_helpers import drain, engine, hf_logprobs, request

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
PROMPT = [5, 6, 7, 8, 9, 10, 11]


def _requests():
    return [request("a", PROMPT, n=3, temperature=0.8, seed=1, max_new_tokens=24, ignore_eos=True),
            request("b", PROMPT[:4], temperature=0.0, max_new_tokens=24, ignore_eos=True),
            request("c", PROMPT[2:], n=2, temperature=1.0, top_p=0.9, top_k=30, seed=2, max_new_tokens=24)]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_cuda_fp32_matches_hf_and_cpu(tiny_models, arch):
    path = tiny_models[arch]
    on_gpu = drain(engine(path, device="cuda", dtype="float32"), {0: _requests()})
    on_cpu = drain(engine(path), {0: _requests()})
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
    prompts = {"a": PROMPT, "b": PROMPT[:4], "c": PROMPT[2:]}
    temps = {"a": 0.8, "b": 0.0, "c": 1.0}
    same = 0
    for (rid, i), out in on_gpu.items():
        ref = hf_logprobs(hf, prompts[rid], out.token_ids, temps[rid]).cpu()
        assert (ref - torch.from_numpy(out.logprobs)).abs().max().item() <= 1e-4
        same += out.token_ids.tolist() == on_cpu[(rid, i)].token_ids.tolist()
    assert same >= len(on_gpu) - 1  # counter-based noise: the same tokens on either device


def test_cuda_bf16_generates(tiny_models):
    eng = engine(tiny_models["qwen2"], device="cuda")
    assert eng.dtype == torch.bfloat16 and eng.kv_cache.k.dtype == torch.bfloat16
    outs = drain(eng, {0: _requests()})
    assert len(outs) == 6
    for out in outs.values():
        assert np.isfinite(out.logprobs).all() and (out.logprobs <= 0).all()
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_cuda_fp16_generates_and_agrees_with_hf(tiny_models):
    """model.dtype = "float16": fp16 KV cache and kernels; logprobs within fp16 noise of Hugging Face's fp16
    forward (the learner's side), and closer than bf16's (docs/learner.md, "Training in fp16")."""
    path = tiny_models["qwen2"]
    prompts = {"a": PROMPT, "b": PROMPT[:4], "c": PROMPT[2:]}
    temps = {"a": 0.8, "b": 0.0, "c": 1.0}
    mean = {}
    for dtype in ("float16", "bfloat16"):
        eng = engine(path, device="cuda", dtype=dtype)
        assert eng.kv_cache.k.dtype == getattr(torch, dtype)
        outs = drain(eng, {0: _requests()})
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).cuda()
        deltas = []
        for (rid, _), out in outs.items():
            assert np.isfinite(out.logprobs).all()
            ref = hf_logprobs(hf, prompts[rid], out.token_ids, temps[rid]).cpu()
            deltas.append((ref - torch.from_numpy(out.logprobs)).abs())
        mean[dtype] = torch.cat(deltas).mean().item()
    assert mean["float16"] <= 1e-3
    assert mean["float16"] <= mean["bfloat16"], mean


def test_single_pass_graphs_agree_with_split_graphs(tmp_path, tiny_factory):
    """A batch with a (row, kv head) program for every SM and contexts of at most two chunks replays the graphs whose
    decode attention runs in one pass; their tokens and logprobs are the split graphs' up to fp32 rounding (the
    contexts pass one chunk, so the two really differ in their summation order)."""
    import json

    path = tiny_factory(tmp_path / "qwen2", "qwen2")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    gen = np.random.default_rng(0)
    reqs = [request(f"r{i}", gen.integers(2, 97, 300).tolist(), temperature=1.0, seed=i, max_new_tokens=16,
                    ignore_eos=True) for i in range(128)]

    def run(single_pass: bool):
        eng = engine(path, device="cuda", dtype="float32", max_running=128, num_kv_blocks=128 * 24, kv_block_size=16,
                     max_model_len=1024)
        assert eng.runner.single_pass_sizes and 128 in eng.runner.single_pass_sizes
        if not single_pass:
            eng.runner.single_pass_sizes = set()
        graphs, used = eng.runner.graphs, []
        replay = graphs.replay
        graphs.replay = lambda size, single=False: (used.append(single), replay(size, single))[1]
        return drain(eng, {0: reqs}), used

    one, used_one = run(True)
    split, used_split = run(False)
    assert any(used_one) and not any(used_split)
    same = [k for k in one if one[k].token_ids.tolist() == split[k].token_ids.tolist()]
    assert len(same) >= 0.95 * len(one)
    for k in same:
        np.testing.assert_allclose(one[k].logprobs, split[k].logprobs, rtol=0, atol=1e-4)
