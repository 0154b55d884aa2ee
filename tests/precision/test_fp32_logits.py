"""fp32_logits: the exact fp32 products of half operands, never rounded to the half dtype; on CUDA through
cuBLAS's fp32-output GEMM (also inside a CUDA graph)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.precision.fp32_logits import fp32_logits, out_dtype_supported


def _operands(dtype: torch.dtype, device: str = "cpu", scale: float = 8.0) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    hidden = (torch.randn(6, 32, device=device) * scale).to(dtype)
    weight = torch.randn(50, 32, device=device).to(dtype)
    return hidden, weight


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_is_the_upcast_product_and_not_the_rounded_one(dtype):
    hidden, weight = _operands(dtype)
    out = fp32_logits(hidden, weight)
    assert out.dtype == torch.float32 and out.shape == (6, 50)
    assert torch.equal(out, hidden.float() @ weight.float().t())
    exact = hidden.double() @ weight.double().t()
    rounded = (hidden @ weight.t()).double()
    assert (out.double() - exact).abs().max() < 1e-4  # fp32 accumulation of exact products
    assert (rounded - exact).abs().max() > 1e-2  # logits of ~50 rounded to the half dtype: a step of 0.25 / 0.03


def test_full_precision_inputs_are_a_plain_matmul():
    for dtype in (torch.float32, torch.float64):
        hidden, weight = _operands(dtype)
        out = fp32_logits(hidden, weight)
        assert out.dtype == dtype and torch.equal(out, hidden @ weight.t())


def test_mixed_dtypes_are_refused():
    hidden, weight = _operands(torch.bfloat16)
    with pytest.raises(TypeError, match="hidden is torch.float32, weight is torch.bfloat16"):
        fp32_logits(hidden.float(), weight)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_output_is_fp32_and_graph_capturable(dtype):
    assert out_dtype_supported(), "this torch lacks mm(out_dtype=float32): the upcast fallback runs (slower)"
    hidden, weight = _operands(dtype, "cuda")
    out = fp32_logits(hidden, weight)
    exact = hidden.double() @ weight.double().t()
    assert out.dtype == torch.float32
    assert (out.double() - exact).abs().max() < 1e-4
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fp32_logits(hidden, weight)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        captured = fp32_logits(hidden, weight)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, out)
