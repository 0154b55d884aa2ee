"""Where FP8 rollouts' time goes: one projection's matmul in bf16 against its fp8 forms, at decode and prefill row
counts, on the 0.5B and 1.5B shapes' projection sizes (CUDA, compute capability >= 8.9).

    python -m bench.fp8_gemm [--rows 256,4096] [--shapes 0.5b,1.5b] [--iters 200] [--graph]

Per (shape, projection, rows), in microseconds per call: CUDA events around `--iters` back-to-back calls after a
warm-up, which at decode sizes times the launches more than the kernels (upper bounds); with `--graph`, `--iters`
calls captured in one CUDA graph and replayed, as a decode step runs them (launch gaps of a graph included):

    bf16           F.linear(x, w)                       the model-dtype matmul
    quant          kernels.fp8.quantize_rows_fp8(x)     the engine's per-row input quantizer (one Triton kernel)
    rowwise        _scaled_mm, [rows, 1] x [1, out] scales (what model/fp8.py runs)
    rowwise_fast   the same with use_fast_accum
    tensorwise     _scaled_mm, one scale each (cuBLAS); tensorwise_fast with use_fast_accum
    fp8_total      quant + rowwise: an fp8 projection as the engine runs it now
    bf16_bias      F.linear(x, w, b) (qkv has a bias in the Qwen2 shapes)
    rowwise_add    rowwise, then + b in a kernel of its own (what model/fp8.py does with a bias)
    rowwise_bias   rowwise with _scaled_mm's own `bias` (null where this torch refuses it)

and per shape the sum over one layer's four projections (qkv, o, gate_up, down) of each column.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from bench.decode_attention import graph_ms
from bench.generation import SHAPES


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """(out, in) of one layer's fused projections."""
    s = SHAPES[shape]
    hidden, heads, kv, inter = (s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"],
                                s["intermediate_size"])
    head_dim = hidden // heads
    return {"qkv": ((heads + 2 * kv) * head_dim, hidden), "o": (hidden, heads * head_dim),
            "gate_up": (2 * inter, hidden), "down": (hidden, inter)}


def timed_eager(fn, iters: int) -> float:
    """Microseconds per call, launched one by one."""
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / iters


def timed_graph(fn, iters: int) -> float:
    """Microseconds per call, `iters` calls captured in one CUDA graph (bench.decode_attention's timer)."""
    return 1e3 * graph_ms(fn, iters, replays=5)


def refused(fn) -> bool:
    """Whether this torch refuses the call (a RuntimeError on a first, eager try)."""
    try:
        fn()
        return False
    except RuntimeError as err:
        print(f"bench.fp8_gemm: refused: {str(err).splitlines()[0]}", file=sys.stderr)
        return True


def case(out_f: int, in_f: int, rows: int, iters: int, graph: bool = False) -> dict[str, float | None]:
    from asyncrl.engine.torch.kernels import fp8 as fp8_kernels
    from asyncrl.engine.torch.model.fp8 import quantize_rows_reference

    w = (torch.randn(out_f, in_f, device="cuda") * 0.02).bfloat16()
    x = torch.randn(rows, in_f, device="cuda").bfloat16()
    w8, sw = quantize_rows_reference(w)
    sw = sw.view(1, -1).contiguous()
    x8, sx = fp8_kernels.quantize_rows_fp8(x)
    one = torch.ones((), device="cuda")
    b = (torch.randn(out_f, device="cuda") * 0.02).bfloat16()
    timed = timed_graph if graph else timed_eager
    t: dict[str, float | None] = {
        "bf16": timed(lambda: F.linear(x, w), iters),
        "quant": timed(lambda: fp8_kernels.quantize_rows_fp8(x), iters),
        "rowwise": timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16), iters),
        "rowwise_fast": timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16,
                                                       use_fast_accum=True), iters),
        "tensorwise": timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                            iters),
        "tensorwise_fast": timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16, use_fast_accum=True), iters),
    }
    t["fp8_total"] = t["quant"] + t["rowwise"]
    t["bf16_bias"] = timed(lambda: F.linear(x, w, b), iters)
    t["rowwise_add"] = timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
                             + b, iters)
    with_bias = lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, bias=b,  # noqa: E731
                                         out_dtype=torch.bfloat16)
    t["rowwise_bias"] = None if refused(with_bias) else timed(with_bias, iters)
    return {k: None if v is None else round(v, 2) for k, v in t.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fp8_gemm")
    p.add_argument("--rows", default="256,4096")
    p.add_argument("--shapes", default="0.5b,1.5b")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--graph", action="store_true", help="time calls replayed from one CUDA graph")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.fp8_gemm needs a CUDA device", file=sys.stderr)
        return 2
    for shape in args.shapes.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            layer: dict[str, float] = {}
            for name, (out_f, in_f) in projections(shape).items():
                row = case(out_f, in_f, rows, args.iters, args.graph)
                print(json.dumps({"bench": "fp8_gemm", "shape": shape, "proj": name, "out": out_f, "in": in_f,
                                  "rows": rows, "graph": args.graph, **row}), flush=True)
                layer = {k: layer.get(k, 0.0) + v for k, v in row.items() if v is not None}
            print(json.dumps({"bench": "fp8_gemm", "shape": shape, "proj": "layer", "rows": rows, "graph": args.graph,
                              **{k: round(v, 2) for k, v in layer.items()},
                              "device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
