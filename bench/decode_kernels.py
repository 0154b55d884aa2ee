"""Where a decode step's GPU time goes, kernel by kernel: the captured decode graph replayed under
torch.profiler, kernels grouped by name, microseconds per step (one JSON line).

The engine generates `--warm` tokens for `--batch` prompts of `--prompt-len` tokens and pauses there, so the
staged rows are a real mid-generation step (contexts ~ prompt + warm); the replays repeat that step (the
one-pass attention variant when the runner would pick it). Each kernel group is reported with its
calls per step, microseconds per step and the share of the step; `gap_us` is the step's time outside
any kernel (launch gaps inside the graph).

    python -m bench.decode_kernels [--shape 0.5b --batch 256 --prompt-len 256 --warm 128]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from bench.generation import add_prompts, build_hf, make_engine, prompts, require_cuda, run_engine
from bench.provenance import commit

REPLAYS = 50


def short(name: str) -> str:
    """A kernel's family: template arguments and launch details dropped (cuBLAS tiles stay distinct)."""
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"\(.*", "", name)
    return name[:90]


def kernel_table(trace: Path, steps: int) -> tuple[list[dict], float, float]:
    """-> (groups sorted by time, us of kernels per step, us of the span per step)."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    if not events:
        return [], 0.0, 0.0
    by = defaultdict(lambda: [0, 0.0])
    for e in events:
        g = by[short(e["name"])]
        g[0] += 1
        g[1] += e["dur"]
    busy = sum(e["dur"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    rows = [{"kernel": k, "calls": round(c / steps, 2), "us": round(t / steps, 2), "share": round(t / busy, 4)}
            for k, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])]
    return rows, busy / steps, span / steps


def measure(step) -> tuple[list[dict], float, float]:
    """`step` run REPLAYS times under the profiler (after 5 unprofiled) -> kernel_table."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        return kernel_table(path, REPLAYS)


def gemm_choices(eng, batch: int) -> list[dict]:
    """Per weight of one layer (and the lm_head): ms of x [batch, in] @ W^T by cuBLAS and by the best kernel
    Inductor's max-autotune finds (its Triton templates and cuBLAS), same inputs."""
    import torch.nn.functional as F
    import triton.testing

    layer = eng.model.model.layers[0]
    weights = {"qkv": layer.self_attn.qkv[0], "o_proj": layer.self_attn.o_proj.weight,
               "gate_up": layer.mlp.gate_up[0], "down": layer.mlp.down_proj.weight,
               "lm_head": eng.model.lm_head.weight}
    out = []
    for name, w in weights.items():
        x = torch.randn(batch, w.shape[1], device=w.device, dtype=w.dtype)
        tuned = torch.compile(lambda a, b: F.linear(a, b), mode="max-autotune-no-cudagraphs", dynamic=False)
        tuned(x, w)
        out.append({"gemm": name, "n": w.shape[0], "k": w.shape[1],
                    "cublas_ms": round(triton.testing.do_bench(lambda: F.linear(x, w), return_mode="median"), 4),
                    "autotuned_ms": round(triton.testing.do_bench(lambda: tuned(x, w), return_mode="median"), 4)})
        torch._dynamo.reset()
    return out


def pause_mid_run(eng, batch_prompts: list[list[int]], steps: int) -> None:
    """Start generating for the prompts and stop once `steps` decode steps ran: the staged buffers then hold a
    real step of the run (every row its own sequence and table), which the replays repeat. (After a run ends
    they hold leftovers: rows of a shrinking batch repeat tables, and those rows' KV comes from the L2.)"""
    add_prompts(eng, batch_prompts, steps + 32, tag="mid")
    start = eng.counters["decode_steps"]
    while eng.counters["decode_steps"] - start < steps:
        eng.step()
    torch.cuda.synchronize()


def summary(rows: list[dict], busy: float, span: float, top: int) -> dict:
    return {"kernel_us_per_step": round(busy, 1), "span_us_per_step": round(span, 1), "gap_us": round(span - busy, 1),
            "kernels_per_step": round(sum(r["calls"] for r in rows), 1), "top": rows[:top]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="0.5b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--warm", type=int, default=128)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--autotune", action="store_true",
                        help="also time each of the step's GEMM shapes: cuBLAS (F.linear) vs Inductor max-autotune")
    args = parser.parse_args()
    require_cuda("bench.decode_kernels")

    max_len = args.prompt_len + args.warm + 64
    hf = build_hf(args.shape, max_len)
    eng = make_engine(hf, args.batch, max_len)
    run_engine(eng, prompts(args.batch, args.prompt_len, seed=1), 8)  # warm-up
    graphs, runner = eng.runner.graphs, eng.runner
    if graphs is None or args.batch not in graphs:
        raise SystemExit(f"no captured decode graph of size {args.batch}")
    pause_mid_run(eng, prompts(args.batch, args.prompt_len, seed=2), args.warm)
    single = runner.single_pass(args.batch)
    graph = measure(lambda: graphs.replay(args.batch, single))

    @torch.inference_mode()
    def eager() -> None:
        eng.runner.decode_step(args.batch, None, single)

    eager_rows = measure(eager)
    gemms = gemm_choices(eng, args.batch) if args.autotune else None
    eng.abort()
    eng.close()
    print(json.dumps({"bench": "decode_kernels", "shape": args.shape, "batch": args.batch,
                      "context": args.prompt_len + args.warm, "graph": summary(*graph, args.top),
                      "eager": summary(*eager_rows, args.top), "gemms": gemms, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": commit()}),
          flush=True)


if __name__ == "__main__":
    main()
