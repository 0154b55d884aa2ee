"""Deterministic mode: a sample's tokens and logprobs do not depend on what else is in the batch;
the fused GPU sampler agrees with the reference sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import drain, engine, request

from asyncrl.engine.torch import kernels
from asyncrl.engine.torch.sampler import SamplingBatch, sample

PROMPT = [5, 6, 7, 8, 9, 10, 11]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FUSED_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: the kernel under TRITON_INTERPRET=1
FUSED = pytest.mark.skipif(not kernels.ops.enabled(torch.empty(1, device=FUSED_DEVICE)),
                           reason="needs Triton on a CUDA device (or TRITON_INTERPRET=1)")


def _alone_and_crowded(path, device):
    target = request("x", PROMPT, n=2, temperature=1.0, seed=7, max_new_tokens=20, ignore_eos=True)
    alone = drain(engine(path, device=device, deterministic=True, max_running=8), {0: [target]})
    others = {0: [request("o1", PROMPT[:3], n=3, temperature=0.7, seed=1, max_new_tokens=9, ignore_eos=True)],
              2: [request("x", PROMPT, n=2, temperature=1.0, seed=7, max_new_tokens=20, ignore_eos=True),
                  request("o2", [3] * 11, n=2, temperature=1.0, seed=2, max_new_tokens=30, ignore_eos=True)],
              5: [request("o3", PROMPT[::-1], temperature=0.0, max_new_tokens=4)]}
    crowded = drain(engine(path, device=device, deterministic=True, max_running=8), others)
    for i in range(2):
        a, c = alone[("x", i)], crowded[("x", i)]
        assert a.token_ids.tolist() == c.token_ids.tolist()
        assert np.array_equal(a.logprobs, c.logprobs)  # bitwise


def test_deterministic_mode_is_batch_invariant_cpu(qwen2_path):
    _alone_and_crowded(qwen2_path, "cpu")


@pytest.mark.gpu
@CUDA
def test_deterministic_mode_is_batch_invariant_cuda_bf16(qwen2_path):
    _alone_and_crowded(qwen2_path, "cuda")


@pytest.mark.gpu
@CUDA
def test_fused_sampler_matches_reference():
    from asyncrl.engine.torch.kernels.sampler import sample_fused

    torch.manual_seed(0)
    batch, vocab = 64, 5003
    logits = (torch.randn(batch, vocab, device="cuda") * 3).bfloat16()
    temps = torch.rand(batch, device="cuda") + 0.3
    temps[:4] = 0.0  # greedy rows
    seeds = torch.randint(0, 2**62, (batch,), device="cuda")
    steps = torch.randint(0, 1000, (batch,), device="cuda")
    ref_batch = SamplingBatch(temperatures=temps, top_ps=torch.ones_like(temps), top_ks=torch.full_like(seeds, vocab),
                              seeds=seeds, steps=steps, needs_truncation=False)
    tokens, logprobs = sample(logits.float(), ref_batch)
    fused = sample_fused(logits, temps, seeds, steps)
    assert (fused[0].long() == tokens).float().mean().item() >= 0.98  # log() may differ by an ulp
    same = fused[0].long() == tokens
    assert torch.allclose(fused[1][same].float(), logprobs[same], atol=1e-5)
    assert kernels.ops.enabled(logits)


@FUSED
def test_fused_sampler_forced_rows_are_bitwise_the_sampled_ones():
    from asyncrl.engine.torch.kernels.sampler import sample_fused

    torch.manual_seed(0)
    batch, vocab = 16, 5003  # vocab > BLOCK_V: the forced token may sit in any chunk
    dev = FUSED_DEVICE
    logits = (torch.randn(batch, vocab, device=dev) * 3).bfloat16()
    temps = torch.rand(batch, device=dev) + 0.3
    temps[:3] = 0.0  # greedy rows
    seeds = torch.randint(0, 2**62, (batch,), device=dev)
    steps = torch.randint(0, 1000, (batch,), device=dev)
    sampled = sample_fused(logits, temps, seeds, steps)
    again = sample_fused(logits, temps, seeds, steps, sampled[0].long())  # force what was sampled
    assert torch.equal(again, sampled)
    forced = torch.full((batch,), -1, dtype=torch.int64, device=dev)
    forced[::2] = torch.randint(0, vocab, (batch // 2,), device=dev)
    mixed = sample_fused(logits, temps, seeds, steps, forced)
    free, pinned = forced < 0, forced >= 0
    assert torch.equal(mixed[:, free], sampled[:, free])  # sampled rows untouched
    assert torch.equal(mixed[0, pinned].long(), forced[pinned])
    scaled = logits.float() / torch.where(temps > 0, temps, 1.0)[:, None]
    want = torch.log_softmax(scaled, -1).gather(-1, forced.clamp(min=0)[:, None])[:, 0].double()
    assert torch.allclose(mixed[1, pinned], want[pinned], atol=1e-5)
