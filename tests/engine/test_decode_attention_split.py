"""Split-context decode attention (`kernels.attention.decode_attention_split`) against the torch reference
(`paged_attention.decode_attention_torch`) and the one-pass kernel.

"cpu" runs the kernels in the Triton interpreter and needs TRITON_INTERPRET=1 in the environment
of the whole run (Triton picks the interpreter when it decorates a kernel, its own library functions
included, so it cannot be switched on for one test):

    TRITON_INTERPRET=1 python -m pytest -q tests/engine/test_decode_attention_split.py

"cuda" runs the compiled kernels. Without Triton everything skips (the CPU CI).
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.engine.torch.kernels import attention, ops
from asyncrl.engine.torch.paged_attention import decode_attention_torch

pytestmark = pytest.mark.filterwarnings(  # Triton < 3.7's interpreter under numpy 2.3
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

CUDA = torch.cuda.is_available()
CHUNK = attention.SPLIT_CHUNK
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def device(triton_device):
    return triton_device


def _skip_bf16_on_cpu(device: str, dtype: torch.dtype) -> None:
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("the interpreter's tl.dot multiplies bf16 as its raw uint16 bits (fp16 stands in on CPU)")


def _case(ctxs, width, device, dtype, *, group=7, d=64, kv=2, page=16, seed=0):
    """Random caches, q and a shuffled block table of `width` columns for rows of context `ctxs`."""
    gen = torch.Generator().manual_seed(seed)
    batch, num_blocks = len(ctxs), len(ctxs) * width + 1
    k_cache = torch.randn(num_blocks, page, kv, d, generator=gen)  # [blocks, page, kv, d]
    v_cache = torch.randn(num_blocks, page, kv, d, generator=gen)
    q = torch.randn(batch, kv * group, d, generator=gen)  # [batch, heads, d]
    tables = torch.randperm(num_blocks, generator=gen)[: batch * width].view(batch, width)
    return {
        "q": q.to(device, dtype), "k_cache": k_cache.to(device, dtype), "v_cache": v_cache.to(device, dtype),
        "block_tables": tables.to(device), "context_lens": torch.tensor(ctxs, device=device), "scale": d**-0.5,
    }


def _reference(case):
    """fp32 torch attention on CPU of the case's (possibly bf16) inputs."""
    cpu = {k: v.cpu() if torch.is_tensor(v) else v for k, v in case.items()}
    for name in ("q", "k_cache", "v_cache"):
        cpu[name] = cpu[name].float()
    return decode_attention_torch(**cpu)


def _row(case, i):
    return {k: v[i:i + 1] if k in ("q", "block_tables", "context_lens") else v for k, v in case.items()}


MIXED = [1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 64, 2 * CHUNK]  # 1 token .. 4 chunks
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group, d", [(7, 64), (2, 16)])
def test_split_matches_reference(device, dtype, group, d):
    _skip_bf16_on_cpu(device, dtype)
    case = _case(MIXED, 4 * CHUNK // 16 + 3, device, dtype, group=group, d=d)
    out = attention.decode_attention_split(**case)
    assert out.dtype == dtype and out.shape == case["q"].shape
    torch.testing.assert_close(out.cpu().float(), _reference(case), atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_one_chunk_match_one_pass_bitwise(device, dtype):
    """A context of at most one chunk is the one-pass kernel's tile loop and division: same bits,
    whichever path `decode_attention` takes for the batch."""
    _skip_bf16_on_cpu(device, dtype)
    case = _case([1, 63, 64, 65, CHUNK - 1, CHUNK], 2 * CHUNK // 16, device, dtype)
    assert torch.equal(attention.decode_attention_split(**case), attention.decode_attention_single(**case))


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_is_batch_invariant(device, dtype, monkeypatch):
    """A row's output is bitwise the same alone, in a batch, in another order, and with one program per
    row looping over all its chunks instead of one program per chunk."""
    _skip_bf16_on_cpu(device, dtype)
    case = _case([CHUNK + 1, 5, 3 * CHUNK + 17, 2 * CHUNK, 1], 4 * CHUNK // 16 + 2, device, dtype, seed=1)
    full = attention.decode_attention_split(**case)
    for i in (0, 2):
        assert torch.equal(attention.decode_attention_split(**_row(case, i))[0], full[i])
    perm = torch.tensor([4, 2, 0, 3, 1], device=device)
    shuffled = {k: v[perm] if k in ("q", "block_tables", "context_lens") else v for k, v in case.items()}
    assert torch.equal(attention.decode_attention_split(**shuffled), full[perm])
    monkeypatch.setattr(attention, "_SPLIT_PROGRAMS", 1)
    assert torch.equal(attention.decode_attention_split(**case), full)


def test_decode_attention_picks_by_table_width(device):
    narrow = _case([1, 40, CHUNK], CHUNK // 16, device, torch.float32)
    assert torch.equal(attention.decode_attention(**narrow), attention.decode_attention_single(**narrow))
    wide = _case([1, 40, 2 * CHUNK + 3], 2 * CHUNK // 16 + 1, device, torch.float32)
    assert torch.equal(attention.decode_attention(**wide), attention.decode_attention_split(**wide))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_under_cuda_graph_replays_for_new_contexts(dtype):
    """One capture at a fixed table width, replayed with other contexts, tables and values: each replay
    matches the reference and, bitwise, an eager call on the same inputs."""
    if not ops.HAS_TRITON:
        pytest.skip("needs Triton")
    width = 64  # 1,024 tokens: 8 chunks
    static = _case([1] * 8, width, "cuda", dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile outside the capture
        attention.decode_attention(**static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention.decode_attention(**static)
    for seed, ctxs in enumerate(([1, CHUNK, CHUNK + 1, 1000, 64, 2 * CHUNK, 1024, 3],
                                 [1024, 5, 3 * CHUNK + 17, CHUNK, 1, 700, 129, 2 * CHUNK + 1])):
        case = _case(ctxs, width, "cuda", dtype, seed=seed + 1)
        for name, value in case.items():
            if torch.is_tensor(value):
                static[name].copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu().float(), _reference(case), atol=TOL[dtype], rtol=0)
        assert torch.equal(out, attention.decode_attention_split(**case))
