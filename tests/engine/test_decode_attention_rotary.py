"""Decode attention that rotates and stores the step's own token (`kernels.attention.NewTokens`) against the two
launches it replaces (`rotary_store`, then `decode_attention` on the rotated q): bitwise the same output and the
same caches, in one pass and split over the context (the program that owns a row's last chunk stores), for contexts at
chunk borders, q/k/v as strided views of one projection, and under a CUDA graph.

"cpu" runs the kernels in the Triton interpreter (TRITON_INTERPRET=1 for the whole run), "cuda" compiled; the
interpreter's tl.dot multiplies bf16 as raw bits, so CPU runs fp32 and fp16.
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.engine.torch.kernels import attention, ops
from asyncrl.engine.torch.model.layers import RotaryEmbedding, default_inv_freq

pytestmark = pytest.mark.filterwarnings(  # Triton < 3.7's interpreter under numpy 2.3
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

CHUNK = attention.SPLIT_CHUNK


@pytest.fixture
def device(triton_device):
    return triton_device


def _dtypes(device):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])


def _case(ctxs, width, device, dtype, *, heads=14, kv=2, d=64, page=16, seed=0):
    """Caches holding every row's context but its last token, one qkv projection output for the new tokens, and
    the tables: the state a decode layer sees before its rotary."""
    gen = torch.Generator().manual_seed(seed)
    batch, num_blocks = len(ctxs), len(ctxs) * width + 1
    k_cache = torch.randn(num_blocks, page, kv, d, generator=gen)
    v_cache = torch.randn(num_blocks, page, kv, d, generator=gen)
    qkv = torch.randn(batch, (heads + 2 * kv) * d, generator=gen)  # the projection: q, k, v views of one row
    tables = torch.randperm(num_blocks, generator=gen)[: batch * width].view(batch, width)
    positions = torch.tensor(ctxs) - 1  # the new token is the context's last
    slots = tables.gather(1, (positions // page)[:, None])[:, 0] * page + positions % page
    rotary = RotaryEmbedding(default_inv_freq(d, 10000.0), max_positions=width * page).to(device)
    cos, sin = rotary.tables(width * page, dtype, torch.device(device))
    qkv = qkv.to(device, dtype)
    q, k, v = qkv.split([heads * d, kv * d, kv * d], -1)
    return {
        "q": q.view(batch, heads, d), "k": k.view(batch, kv, d), "v": v.view(batch, kv, d),
        "k_cache": k_cache.to(device, dtype), "v_cache": v_cache.to(device, dtype), "block_tables": tables.to(device),
        "context_lens": torch.tensor(ctxs, device=device), "positions": positions.to(device),
        "slots": slots.to(device), "cos": cos, "sin": sin, "scale": d**-0.5,
    }


def _two_launches(c, single_pass):
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    q, _ = ops.rotary_store(c["q"], c["k"], c["v"], c["positions"], c["cos"], c["sin"], c["slots"], kc, vc,
                                   want_k=False)
    out = attention.decode_attention(q, kc, vc, c["block_tables"], c["context_lens"], c["scale"], single_pass)
    return out, kc, vc


def _fused(c, single_pass):
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    new = attention.NewTokens(c["k"], c["v"], c["positions"], c["cos"], c["sin"], c["slots"])
    out = attention.decode_attention(c["q"], kc, vc, c["block_tables"], c["context_lens"], c["scale"], single_pass,
                                     new)
    return out, kc, vc


def _assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("single_pass", [True, False])
def test_fused_equals_rotary_then_attention(device, single_pass):
    ctxs = [1, 2, 63, 64, 65, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 17]
    for dtype in _dtypes(device):
        case = _case(ctxs, (3 * CHUNK + 17) // 16 + 2, device, dtype)
        _assert_same(_fused(case, single_pass), _two_launches(case, single_pass))


def test_split_store_by_the_last_chunks_owner_when_programs_loop(device, monkeypatch):
    """With fewer programs than chunks a program takes every programs-th chunk; the one holding the last
    chunk stores, whichever it is."""
    monkeypatch.setattr(attention, "_SPLIT_PROGRAMS", 2 * 3)  # batch 3 x kv 2: one program per row and head
    case = _case([CHUNK + 5, 3 * CHUNK, 2 * CHUNK + 1], 3 * CHUNK // 16 + 1, device, torch.float32, seed=1)
    _assert_same(_fused(case, False), _two_launches(case, False))
    monkeypatch.setattr(attention, "_SPLIT_PROGRAMS", 2 * 3 * 2)  # two programs per row: chunks 0, 2 | 1
    _assert_same(_fused(case, False), _two_launches(case, False))


def test_fused_writes_only_the_new_slots(device):
    case = _case([5, CHUNK + 3], CHUNK // 16 + 2, device, torch.float32, seed=2)
    _, kc, vc = _fused(case, False)
    changed = (kc != case["k_cache"]).any(-1).any(-1).flatten().nonzero().flatten()  # [slots] flat over pages
    assert sorted(changed.tolist()) == sorted(case["slots"].tolist())
    assert (vc != case["v_cache"]).any(-1).any(-1).flatten().nonzero().flatten().tolist() == changed.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_under_cuda_graph():
    """Captured once, replayed on new contexts and values: the same bits as the two launches, eagerly."""
    if not ops.HAS_TRITON:
        pytest.skip("needs Triton")
    width = 2 * CHUNK // 16 + 4
    static = _case([1] * 6, width, "cuda", torch.bfloat16)
    kc, vc = static["k_cache"], static["v_cache"]
    new = attention.NewTokens(static["k"], static["v"], static["positions"], static["cos"], static["sin"],
                               static["slots"])

    def run():
        return attention.decode_attention(static["q"], kc, vc, static["block_tables"], static["context_lens"],
                                           static["scale"], False, new)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed, ctxs in enumerate(([1, CHUNK, CHUNK + 1, 64, 2 * CHUNK, 3], [2 * CHUNK + 60, 5, 300, 17, 1, 129])):
        case = _case(ctxs, width, "cuda", torch.bfloat16, seed=seed + 3)
        for name in ("q", "k", "v", "k_cache", "v_cache", "block_tables", "context_lens", "positions", "slots"):
            static[name].copy_(case[name])
        graph.replay()
        torch.cuda.synchronize()
        want = _two_launches(case, False)
        _assert_same((out, kc, vc), want)
