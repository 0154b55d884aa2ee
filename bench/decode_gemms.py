"""The decode step's projections, cuBLAS against the Triton GEMMs of `asyncrl.engine.torch.triton_gemm`, per
shape and batch: microseconds per call inside a CUDA graph that walks `layers` separate weight copies (as the
decode graph does, so weights come from HBM, not L2), one JSON line per (shape, batch, op).

Each op is timed with what it replaces end to end:
* qkv: F.linear with bias | triton linear
* o_proj_norm: F.linear + add_rmsnorm | triton linear + add_rmsnorm | triton partials + add_rmsnorm_partials
* gate_up_silu: F.linear + silu_mul | triton silu_linear
* down_norm: F.linear + add_rmsnorm | triton linear + add_rmsnorm | triton partials + add_rmsnorm_partials
* lm_head: F.linear | triton linear

    python -m bench.decode_gemms [--shapes 0.5b,1.5b] [--batches 64,128,256] [--quick]

`saved_us_per_step` adds (cuBLAS - best) x layers over the layer ops and once for lm_head; `max_rel_err` is the
largest |candidate - cuBLAS| / max|cuBLAS| of the chosen configuration (one bf16 rounding is ~4e-3).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from bench.generation import SHAPES, VOCAB, commit, require_cuda

REPLAYS = 20

# (block_m, block_n, block_k, warps, stages)
SWEEP = [
    (64, 64, 64, 4, 4), (64, 64, 128, 4, 3), (64, 128, 64, 4, 4), (64, 128, 128, 4, 3),
    (128, 64, 64, 4, 4), (128, 64, 128, 4, 3), (128, 128, 64, 4, 3), (128, 128, 64, 8, 4),
    (128, 128, 128, 8, 3), (64, 256, 64, 4, 3), (128, 256, 64, 8, 3), (256, 64, 64, 8, 3),
    (256, 128, 64, 8, 3), (64, 32, 128, 4, 4), (128, 32, 128, 4, 4),
]
QUICK = [(64, 64, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 8, 4), (64, 128, 128, 4, 3)]


def graph_time_us(fn, calls: int) -> float:
    """fn() (which makes `calls` calls) captured once in a CUDA graph, replayed; -> us per call (median)."""
    fn()  # compile / warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    del graph
    return sorted(times)[len(times) // 2]


def op_cases(shape: str, m: int, layers: int):
    """-> {op: (baseline fn(i) -> out, {candidate name: fn(i) -> out}, weight layers)}: fn(i) uses layer i's weights."""
    from asyncrl.engine.torch import triton_gemm as tg
    from asyncrl.engine.torch import triton_ops

    s = SHAPES[shape]
    hidden, inter, heads, kv = s["hidden_size"], s["intermediate_size"], s["num_attention_heads"], s["num_key_value_heads"]
    d = hidden // heads
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*size, std=0.02):
        return (torch.randn(*size, generator=g, device=dev, dtype=torch.float32) * std).to(dt)

    x_h, x_i = rand(m, hidden, std=1.0), rand(m, inter, std=0.5)
    x_attn = rand(m, heads * d, std=0.5)
    residual = rand(m, hidden, std=1.0)
    norm_w = rand(hidden, std=0.1) + 1
    eps = 1e-6
    w_qkv = [rand((heads + 2 * kv) * d, hidden) for _ in range(layers)]
    b_qkv = [rand((heads + 2 * kv) * d) for _ in range(layers)]
    w_o = [rand(hidden, heads * d) for _ in range(layers)]
    w_gu = [rand(2 * inter, hidden) for _ in range(layers)]
    w_down = [rand(hidden, inter) for _ in range(layers)]
    w_head = [rand(VOCAB, hidden)]
    configs = [tg.GemmConfig(*c) for c in (QUICK if QUICK_ONLY else SWEEP)]
    splits = (2, 4, 8)

    def norm(h):
        return triton_ops.add_rmsnorm(h, residual, norm_w, eps)[0]

    def norm_parts(p):
        return triton_ops.add_rmsnorm_partials(p, residual, norm_w, eps, dt)[0]

    def lin_cands(x, ws, bs=None, after=lambda h: h):
        c = {}
        for cfg in configs:
            if tg.fits(x, ws[0], cfg):
                c[cfg.name] = (lambda cfg: lambda i: after(tg.linear(x, ws[i], bs[i] if bs else None, cfg)))(cfg)
        return c

    def part_cands(x, ws):
        c = {}
        for cfg in configs:
            for sp in splits:
                cs = tg.GemmConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.warps, cfg.stages, sp)
                if tg.fits(x, ws[0], cs):
                    c["p" + cs.name] = (lambda cs: lambda i: norm_parts(tg.linear_partials(x, ws[i], cs)))(cs)
        return c

    silu = {cfg.name: (lambda cfg: lambda i: tg.silu_linear(x_h, w_gu[i], None, cfg))(cfg)
            for cfg in configs if tg.fits(x_h, w_gu[0], cfg)}
    return {
        "qkv": (lambda i: F.linear(x_h, w_qkv[i], b_qkv[i]), lin_cands(x_h, w_qkv, b_qkv), layers),
        "o_proj_norm": (lambda i: norm(F.linear(x_attn, w_o[i])),
                        {**lin_cands(x_attn, w_o, after=norm), **part_cands(x_attn, w_o)}, layers),
        "gate_up_silu": (lambda i: triton_ops.silu_mul(F.linear(x_h, w_gu[i])), silu, layers),
        "down_norm": (lambda i: norm(F.linear(x_i, w_down[i])),
                      {**lin_cands(x_i, w_down, after=norm), **part_cands(x_i, w_down)}, layers),
        "lm_head": (lambda i: F.linear(x_h, w_head[0]), lin_cands(x_h, w_head), 1),
    }


def time_op(base, cands: dict, layers: int) -> dict:
    calls = layers if layers > 1 else 8  # lm_head: its weight alone exceeds the L2

    def walk(fn):
        return lambda: [fn(i % layers) for i in range(calls)]

    base_us = graph_time_us(walk(base), calls)
    want = [base(i).float() for i in range(min(layers, 2))]
    results = []
    for name, fn in cands.items():
        try:
            us = graph_time_us(walk(fn), calls)
        except Exception as e:  # a configuration the compiler refuses (resources): skipped, named
            print(f"# {name}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
            continue
        err = max(float((fn(i).float() - w).abs().max() / w.abs().max()) for i, w in enumerate(want))
        results.append((us, name, err))
    results.sort()
    best = results[0] if results else (float("nan"), "-", float("nan"))
    return {"cublas_us": round(base_us, 2), "best": best[1], "best_us": round(best[0], 2),
            "speedup": round(base_us / best[0], 3) if results else None, "max_rel_err": round(best[2], 5),
            "top": [[n, round(u, 2)] for u, n, _ in results[:4]]}


QUICK_ONLY = False


def main() -> None:
    global QUICK_ONLY
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="0.5b,1.5b")
    parser.add_argument("--batches", default="64,128,256")
    parser.add_argument("--quick", action="store_true", help="four configurations instead of the sweep")
    args = parser.parse_args()
    require_cuda("bench.decode_gemms")
    QUICK_ONLY = args.quick
    for shape in args.shapes.split(","):
        layers = SHAPES[shape]["num_hidden_layers"]
        for m in (int(b) for b in args.batches.split(",")):
            saved = 0.0
            for op, (base, cands, n_layers) in op_cases(shape, m, layers).items():
                row = time_op(base, cands, n_layers)
                if row["speedup"]:
                    saved += max(0.0, row["cublas_us"] - row["best_us"]) * n_layers
                print(json.dumps({"bench": "decode_gemms", "shape": shape, "batch": m, "op": op, **row,
                                  "device": torch.cuda.get_device_name(), "commit": commit()}), flush=True)
            print(json.dumps({"bench": "decode_gemms", "shape": shape, "batch": m,
                              "saved_us_per_step": round(saved, 1)}), flush=True)


if __name__ == "__main__":
    main()
