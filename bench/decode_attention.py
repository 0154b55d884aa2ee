"""python -m bench.decode_attention [--batch 256] [--context 384] [--max-len 512] [--chunk 128] [--dtype bf16]

GPU time of one layer's decode attention over the paged KV cache: the one-pass Triton kernel
(`kernels.attention.decode_attention_single`) against the split-context one (`decode_attention_split`), at the
Qwen2-0.5B attention shape by default (14 query heads, 2 KV heads, head_dim 64, 16-token pages).

Rows get contexts spread evenly over [context / 2, 3 * context / 2] (capped at --max-len), the mean
being --context (--uniform: every row at --context); block tables are a shuffled permutation of the cache's
blocks (--layout: or other layouts) and --max-len / page columns wide, as in the engine's captured graphs
(the split kernel's launch grows with that width).
Each kernel is captured `--calls` times in one CUDA graph (as the engine runs it; eager launches of
these small kernels would time the host), replayed after a warm-up, and timed with CUDA events. Call i
reads layer i % `--layers` of a cache with that many layers (default 24, the 0.5B model's), as a decode
step does: one layer's KV at batch 256 is ~50 MB, about the H200's L2, so repeating one layer's cache
(`--layers 1`) serves part of it from the L2 and times the kernel ~25 % faster than the engine runs it.

Prints one JSON line: the shape, single_ms and split_ms per call, single_ms / split_ms, the KV
bytes one call reads and the bandwidth that makes at split_ms, device, torch, triton, commit.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from bench.provenance import commit


def contexts(batch: int, mean: int, max_len: int, uniform: bool = False) -> torch.Tensor:
    if uniform:
        return torch.full((batch,), min(mean, max_len), dtype=torch.long)
    lo, hi = max(1, mean // 2), min(max_len, mean + mean // 2)
    return torch.linspace(lo, hi, batch).round().long()  # [batch]


def block_tables(layout: str, batch: int, width: int, skew: int) -> torch.Tensor:
    """[batch, width] block ids on the GPU, laid out as --layout says."""
    if layout == "shuffled":
        return torch.randperm(batch * width + 1, device="cuda")[: batch * width].view(batch, width)
    if layout == "contiguous":
        return torch.arange(batch * width, device="cuda").view(batch, width)
    k = torch.arange(width, device="cuda")[None, :]
    return k * (batch + skew) + torch.arange(batch, device="cuda")[:, None]


def graph_ms(fn: Callable[[], torch.Tensor], calls: int, replays: int) -> float:
    """Milliseconds per call of `fn`, captured `calls` times in one graph and replayed `replays` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and pick kernels outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (calls * replays)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--context", type=int, default=384, help="mean context length of the rows")
    p.add_argument("--max-len", type=int, default=512, help="max model length: sets the block tables' width")
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--layout", choices=["shuffled", "contiguous", "interleaved"], default="shuffled",
                   help="block tables: a random permutation of the blocks (a cache after many requests), each "
                        "row's blocks in one run (a fresh cache), or interleaved: block k of row r is k * "
                        "(batch + --skew) + r, as when every row takes its next block in the same decode step")
    p.add_argument("--uniform", action="store_true",
                   help="every row at --context (as in a batch of equal prompts decoding in step)")
    p.add_argument("--skew", type=int, default=0, help="interleaved layout: stride of a row's blocks minus the batch")
    p.add_argument("--chunk", type=int, default=0, help="tokens per split (default: kernels.attention.SPLIT_CHUNK)")
    p.add_argument("--layers", type=int, default=24,
                   help="layers of KV cache the calls cycle through (1: every call reads the same cache)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--calls", type=int, default=48, help="calls captured in one graph")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--warps", type=int, default=0,
                   help="warps of the split kernel (default: kernels.attention.DECODE_WARPS)")
    p.add_argument("--sweep", action="store_true",
                   help="also time the split kernel over chunk x tile x warps x stages (one JSON line each, fastest last)")
    p.add_argument("--sweep-chunks", type=lambda v: [int(c) for c in v.split(",")], default=[128, 256, 512],
                   help="comma list of the chunk lengths the sweep tries")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.decode_attention times Triton kernels on a CUDA GPU: no CUDA device found")
    from asyncrl.engine.torch import kernels

    if not kernels.ops.HAS_TRITON:
        raise SystemExit("bench.decode_attention needs Triton (it ships with CUDA builds of torch): not importable")
    import triton

    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    chunk = args.chunk or kernels.attention.SPLIT_CHUNK
    width = -(-args.max_len // args.page)
    tables = block_tables(args.layout, args.batch, width, args.skew)
    num_blocks = int(tables.max()) + 1
    caches = Caches(args.layers, (num_blocks, args.page, args.kv_heads, args.head_dim), dtype)
    lens = contexts(args.batch, args.context, args.max_len, args.uniform).cuda()
    q = torch.randn(args.batch, args.heads, args.head_dim, device="cuda", dtype=dtype)
    scale = args.head_dim**-0.5
    single = graph_ms(lambda: kernels.attention.decode_attention_single(q, *caches.next(), tables, lens, scale),
                      args.calls, args.replays)
    warps = args.warps or kernels.attention.DECODE_WARPS
    split = graph_ms(lambda: kernels.attention.decode_attention_split(q, *caches.next(), tables, lens, scale, chunk,
                                                               num_warps=warps), args.calls, args.replays)
    kv_bytes = int(lens.sum()) * 2 * args.kv_heads * args.head_dim * caches.element_size
    print(json.dumps({
        "bench": "decode_attention", "batch": args.batch, "context_mean": round(lens.float().mean().item(), 1),
        "context_min": int(lens.min()), "context_max": int(lens.max()), "max_len": args.max_len,
        "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "page": args.page,
        "layout": args.layout, "skew": args.skew, "layers": args.layers,
        "chunk": chunk, "warps": warps, "dtype": args.dtype, "single_ms": round(single, 5), "split_ms": round(split, 5),
        "single_over_split": round(single / split, 3), "kv_mb": round(kv_bytes / 1e6, 2),
        "single_gbps": round(kv_bytes / (single / 1e3) / 1e9, 1), "split_gbps": round(kv_bytes / (split / 1e3) / 1e9, 1), "device": torch.cuda.get_device_name(),
        "torch": torch.__version__, "triton": triton.__version__, "commit": commit(),
    }), flush=True)
    if args.sweep:
        sweep(q, caches, tables, lens, scale, args)


class Caches:
    """`layers` (k, v) cache pairs of `shape`; next() hands them out in turn, as the layers of a step read them."""

    def __init__(self, layers: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        if layers < 1:
            raise SystemExit(f"--layers {layers}: give at least 1")
        self.pairs = [(torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype))
                      for _ in range(layers)]
        self.element_size = self.pairs[0][0].element_size()
        self.i = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.i = (self.i + 1) % len(self.pairs)
        return self.pairs[self.i]


def sweep(q, caches, tables, lens, scale, args) -> None:
    from asyncrl.engine.torch import kernels

    rows = []
    for chunk in args.sweep_chunks:
        for block_n in (32, 64, 128):
            for warps in (2, 4):
                for stages in (1, 2, 3):
                    if chunk % block_n:
                        continue
                    ms = graph_ms(lambda: kernels.attention.decode_attention_split(
                        q, *caches.next(), tables, lens, scale, chunk, block_n=block_n, num_warps=warps,
                        num_stages=stages), args.calls, args.replays)
                    rows.append({"chunk": chunk, "block_n": block_n, "warps": warps, "stages": stages,
                                 "ms": round(ms, 5)})
    for r in sorted(rows, key=lambda r: -r["ms"]):
        print(json.dumps({"bench": "decode_attention_sweep", **r}))


if __name__ == "__main__":
    main()
