"""The engine's LoRA merge at every adapter push, timed: the torch form against the fused kernel, on one GPU.

    python -m bench.adapter_merge [--shape 7b] [--rank 64] [--repeats 5]

Builds the targeted weights of one model shape (every projection of every layer: q, k, v, o, gate, up, down; the
7B shape is Qwen2.5-7B's, 6.5 B parameters, 13 GB in bf16), a pristine copy and fp32 adapters of rank r, then
merges every target as `AdapterMerge.apply` does, W = W0 + scale * B @ A, once with `merge_into_torch` and once
with the kernel (kernels/lora_merge.py), interleaved. Per repeat: the GPU time of all merges (CUDA events around
them) and the host time of the loop that queues them. Prints one JSON line; the medians are what to quote.
GPU only: what the merge costs on a CPU is not what a paused GPU generator waits for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from asyncrl.engine.torch.adapter_merge import merge_into_torch
from asyncrl.engine.torch.kernels import lora_merge
from bench.make_model import SHAPES


def targets(shape: str) -> list[tuple[int, int]]:
    """[out, in] of every targeted linear of the shape (bench.make_model's), layer by layer."""
    s = SHAPES[shape]
    h, inter, kv = s.hidden, s.intermediate, s.kv_heads * (s.hidden // s.heads)  # kv: key/value width
    one = [(h, h), (kv, h), (kv, h), (h, h), (inter, h), (inter, h), (h, inter)]  # q k v o gate up down
    return one * s.layers


def timed(fn, pieces) -> tuple[float, float]:
    """(GPU ms, host ms) of fn over every piece."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    t0 = time.perf_counter()
    for out, w0, a, b in pieces:
        fn(out, w0, a, b, 0.25)
    host = time.perf_counter() - t0
    end.record()
    end.synchronize()
    return start.elapsed_time(end), host * 1e3


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench.adapter_merge")
    p.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or not lora_merge.HAS_TRITON:
        raise SystemExit("bench.adapter_merge needs a GPU and Triton")
    g = torch.Generator(device="cuda").manual_seed(0)
    pieces = []
    for m, n in targets(args.shape):
        w0 = (torch.randn(m, n, device="cuda", generator=g) * 0.02).bfloat16()
        a = torch.randn(args.rank, n, device="cuda", generator=g) / n ** 0.5
        b = torch.randn(m, args.rank, device="cuda", generator=g) * 0.01
        pieces.append((torch.empty_like(w0), w0, a, b))
    forms = {"torch": merge_into_torch, "kernel": lora_merge.merge_into}
    for fn in forms.values():  # warm-up: Triton compiles, cuBLAS picks its kernels
        timed(fn, pieces[:7])
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in forms}
    for _ in range(args.repeats):
        for name, fn in forms.items():
            runs[name].append(timed(fn, pieces))
    check = [torch.empty_like(pieces[0][0]) for _ in range(2)]
    merge_into_torch(check[0], *pieces[0][1:], 0.25)
    lora_merge.merge_into(check[1], *pieces[0][1:], 0.25)
    params = sum(m * n for m, n in targets(args.shape))
    result = {"bench": "adapter_merge", "shape": args.shape, "rank": args.rank, "targets": len(pieces),
              "params": params, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"),
              "max_abs_diff_torch_kernel": (check[0].float() - check[1].float()).abs().max().item()}
    for name, rs in runs.items():
        result[f"{name}_gpu_ms"] = round(statistics.median(r[0] for r in rs), 2)
        result[f"{name}_host_ms"] = round(statistics.median(r[1] for r in rs), 2)
        result[f"{name}_runs_gpu_ms"] = [round(r[0], 2) for r in rs]
    result["torch_over_kernel_gpu"] = round(result["torch_gpu_ms"] / result["kernel_gpu_ms"], 2)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
