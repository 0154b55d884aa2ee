"""Where a decode step's time goes (bench.generation's extra columns, GPU only but `weight_bytes`).

* the roofline's inputs: `copy_bandwidth` (a device-to-device copy, read + write counted) and `weight_bytes` (what
  a decode step reads of the weights, FP8 images in place of the projections they stand for);
* `graph_times`: a replayed step's GPU time and the gap between two replays, timed inside a run;
* `profile_parts`: the step's parts (sampler, lm_head, one layer's attention, MLP and projections), eager;
* `refresh_ms`: what an FP8 engine's push costs in re-quantization.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch


def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * 20 / (start.elapsed_time(end) / 1e3)


def weight_bytes(model, fp8=None) -> int:
    """Bytes of the weights a decode step reads (the tied embedding once, as the lm_head); with `fp8` (the
    engine's Fp8Weights) its images replace the projections they stand for."""
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen or name.endswith("embed_tokens.weight") and not model.cfg.tie_word_embeddings:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    if fp8 is not None:
        total += fp8.nbytes - sum(lin.source.numel() * lin.source.element_size() for lin in fp8.linears)
    return total


def refresh_ms(eng, repeats: int = 5) -> float:
    """Median wall time of an empty weight update on an fp8 engine (CUDA only): the re-quantization every push
    costs."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize(eng.device)
        t0 = time.perf_counter()
        eng.begin_weight_update()
        eng.end_weight_update(eng.weight_version)
        torch.cuda.synchronize(eng.device)
        times.append(time.perf_counter() - t0)
    return round(1e3 * float(np.median(times)), 2)


def graph_times(eng, run: Callable[[], object], size: int) -> dict:
    """`run()` (one more untimed run of `eng`) with CUDA events around every graph replay -> the median GPU time
    of a replay of `size` rows and the median time between two replays (the D2H / H2D copies and launch gaps),
    in ms.

    Replays measured here, in the middle of a run, are the decode step as it runs. Replaying a graph after a
    run reads whatever the buffers last held: when the batch shrank at the end, rows past the last step keep
    the tables of sequences that also sit in another row, so those rows read the same KV, from the L2, and
    the replay times ~10 % fast (H200, 0.5B batch 256: 1.67 ms after the run, 1.79 ms during it)."""
    graphs = eng.runner.graphs
    if graphs is None or size not in graphs:
        return {}
    marks, replay = [], graphs.replay

    def timed(n: int, single: bool = False):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = replay(n, single)
        end.record()
        marks.append((n, start, end))
        return out

    graphs.replay = timed
    try:
        run()
    finally:
        graphs.replay = replay
    torch.cuda.synchronize()
    steps = [s.elapsed_time(e) for n, s, e in marks if n == size]
    between = [a[2].elapsed_time(b[1]) for a, b in zip(marks, marks[1:]) if a[0] == b[0] == size]
    return {"graph_ms": round(float(np.median(steps)), 4) if steps else None,
            "between_graphs_ms": round(float(np.median(between)), 4) if between else None}


def profile_parts(eng, batch: int, ctx: int) -> dict:
    """Milliseconds of the decode step's parts at `batch` rows (eager launches, median of repeats)."""
    import triton.testing

    from asyncrl.engine.torch import kernels
    from asyncrl.engine.torch.kernels.sampler import sample_fused

    cfg, dev = eng.arch, eng.device
    h = torch.randn(batch, cfg.hidden_size, device=dev, dtype=eng.dtype)
    logits = eng.model.compute_logits(h, fp32=False)
    temps = torch.ones(batch, device=dev)
    seeds = torch.arange(batch, device=dev)
    q = torch.randn(batch, cfg.num_heads, cfg.head_dim, device=dev, dtype=eng.dtype)
    k_cache, v_cache = eng.kv_cache.layer(0)
    per_seq = -(-ctx // eng.blocks.block_size)
    tables = torch.arange(batch * per_seq, device=dev).view(batch, per_seq) % eng.blocks.num_blocks
    lens = torch.full((batch,), ctx, device=dev)
    layer = eng.model.model.layers[0]
    mlp_in = torch.randn(batch, cfg.hidden_size, device=dev, dtype=eng.dtype)

    def bench(fn):
        return round(triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median"), 4)

    return {
        "sampler_ms": bench(lambda: sample_fused(logits, temps, seeds, seeds)),
        "lm_head_ms": bench(lambda: eng.model.compute_logits(h, fp32=False)),
        "attention_layer_ms": bench(
            lambda: kernels.attention.decode_attention(q, k_cache, v_cache, tables, lens, cfg.head_dim**-0.5)),
        "mlp_layer_ms": bench(lambda: layer.mlp(mlp_in)),
        "qkv_o_proj_ms": bench(lambda: (layer.self_attn.project(mlp_in), layer.self_attn.o_proj(mlp_in))),
        "profile_ctx": ctx,
    }
